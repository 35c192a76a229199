#include "server/cache/memory_store.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kiln::cache {
namespace {

constexpr int64_t kPerEntryOverhead = 128;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

MemoryStore::MemoryStore(MemoryStoreOptions options) : options_(options) {
  stats_.max_bytes = options_.max_bytes;
}

int64_t MemoryStore::Charge(absl::string_view key, absl::string_view value,
                            const EntryMeta& meta) {
  return static_cast<int64_t>(key.size() + value.size() + meta.target.size() +
                              meta.graph_summary.size() + meta.debug_name.size()) +
         kPerEntryOverhead;
}

void MemoryStore::EraseLocked(Lru::iterator it) {
  stats_.bytes -= it->meta.size_bytes;
  --stats_.entries;
  index_.erase(it->meta.key);
  lru_.erase(it);
}

absl::StatusOr<std::optional<Bytes>> MemoryStore::Read(absl::string_view key, bool touch) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto found = index_.find(key);
  if (found == index_.end()) {
    if (touch) ++stats_.misses;
    return std::optional<Bytes>();
  }
  Lru::iterator it = found->second;
  if (touch) {
    ++stats_.hits;
    ++it->meta.hits;
    it->meta.last_hit_unix_ms = NowMs();
    lru_.splice(lru_.begin(), lru_, it);
  }
  return std::optional<Bytes>(it->value);
}

absl::Status MemoryStore::Touch(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (auto found = index_.find(key); found != index_.end()) {
    ++found->second->meta.hits;
    found->second->meta.last_hit_unix_ms = NowMs();
    lru_.splice(lru_.begin(), lru_, found->second);
  }
  return absl::OkStatus();
}

absl::Status MemoryStore::Put(absl::string_view key, absl::string_view value,
                              const EntryMeta& meta) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  const int64_t charge = Charge(key, value, meta);
  if (charge > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("entry of ", charge,
                                                     " bytes exceeds the memory tier's bound of ",
                                                     options_.max_bytes, " bytes"));
  }
  Item item{meta, Bytes(value)};
  item.meta.key = std::string(key);
  item.meta.size_bytes = charge;
  if (item.meta.created_unix_ms == 0) item.meta.created_unix_ms = NowMs();
  if (item.meta.last_hit_unix_ms == 0) item.meta.last_hit_unix_ms = item.meta.created_unix_ms;

  absl::MutexLock lock(&mu_);
  ++stats_.puts;
  if (auto found = index_.find(key); found != index_.end()) EraseLocked(found->second);
  while (!lru_.empty() && stats_.bytes + charge > options_.max_bytes) {
    EraseLocked(std::prev(lru_.end()));
    ++stats_.evictions;
  }
  lru_.push_front(std::move(item));
  index_.emplace(std::string(key), lru_.begin());
  stats_.bytes += charge;
  ++stats_.entries;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryStore::Remove(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto found = index_.find(key);
  if (found == index_.end()) return absl::NotFoundError(absl::StrCat("not cached: ", key));
  int64_t freed = found->second->meta.size_bytes;
  EraseLocked(found->second);
  return freed;
}

absl::StatusOr<std::optional<EntryMeta>> MemoryStore::Stat(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto found = index_.find(key);
  if (found == index_.end()) return std::optional<EntryMeta>();
  return std::optional<EntryMeta>(found->second->meta);
}

absl::StatusOr<std::vector<EntryMeta>> MemoryStore::List() {
  absl::MutexLock lock(&mu_);
  std::vector<EntryMeta> out;
  out.reserve(lru_.size());
  for (const Item& item : lru_) out.push_back(item.meta);
  return out;
}

StoreStats MemoryStore::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<PurgeResult> MemoryStore::Purge(const PurgeOptions& options) {
  absl::MutexLock lock(&mu_);
  PurgeResult result;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    const int64_t used = std::max(it->meta.created_unix_ms, it->meta.last_hit_unix_ms);
    if (options.all || used < options.older_than_unix_ms) {
      ++result.removed;
      result.freed_bytes += it->meta.size_bytes;
      EraseLocked(it);
    }
    it = next;
  }
  return result;
}

absl::StatusOr<VerifyResult> MemoryStore::Verify() {
  // Values live only in this process's memory and are never re-encoded: nothing to check.
  absl::MutexLock lock(&mu_);
  VerifyResult result;
  result.checked = result.ok = static_cast<int64_t>(lru_.size());
  return result;
}

}  // namespace kiln::cache
