#include "server/cache/tiered_cache.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {

absl::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kMemory:
      return "memory";
    case Tier::kDisk:
      return "disk";
    case Tier::kShared:
      return "shared";
  }
  return "unknown";
}

TieredCache::TieredCache(std::vector<TierSpec> tiers, TieredCacheOptions options)
    : options_(options) {
  for (TierSpec& spec : tiers) {
    State state;
    state.tier = spec.tier;
    state.store = std::move(spec.store);
    tiers_.push_back(std::move(state));
  }
}

Store* TieredCache::store(Tier tier) const {
  for (const State& s : tiers_) {
    if (s.tier == tier) return s.store.get();
  }
  return nullptr;
}

bool TieredCache::Usable(size_t i) {
  absl::MutexLock lock(&mu_);
  State& s = tiers_[i];
  if (s.failed && absl::Now() < s.retry_at) {
    ++s.skipped;
    return false;
  }
  return true;
}

bool TieredCache::Report(size_t i, const absl::Status& status, absl::string_view op) {
  absl::MutexLock lock(&mu_);
  State& s = tiers_[i];
  if (status.ok() || !IsTierFailure(status)) {
    if (s.failed && status.ok()) {
      spdlog::info("cache: {} tier works again", std::string(TierName(s.tier)));
      s.failed = false;
    }
    if (!status.ok()) {
      spdlog::debug("cache: {} tier refused {}: {}", std::string(TierName(s.tier)), std::string(op),
                    status.ToString());
    }
    return status.ok();
  }
  ++s.failures;
  s.last_error = std::string(status.message());
  s.retry_at = absl::Now() + options_.failure_backoff;
  if (!s.failed) {
    spdlog::warn("cache: {} tier failed on {} ({}); skipping it for {}",
                 std::string(TierName(s.tier)), std::string(op),
                 status.ToString(), absl::FormatDuration(options_.failure_backoff));
  }
  s.failed = true;
  return false;
}

std::optional<CacheHit> TieredCache::Lookup(absl::string_view key, bool touch) {
  if (touch) {
    absl::MutexLock lock(&mu_);
    ++lookups_;
  }
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!Usable(i)) continue;
    absl::StatusOr<std::optional<Bytes>> got = tiers_[i].store->Read(key, touch);
    if (!Report(i, got.status(), "get") || !got->has_value()) continue;
    CacheHit hit{**std::move(got), tiers_[i].tier};
    if (touch) {
      {
        absl::MutexLock lock(&mu_);
        ++tiers_[i].hits;
      }
      Promote(i, key, hit.value);
      // Slower tiers learn that the entry is in use, so that they keep it.
      for (size_t j = i + 1; j < tiers_.size(); ++j) {
        if (Usable(j)) Report(j, tiers_[j].store->Touch(key), "touch");
      }
    }
    return hit;
  }
  if (touch) {
    absl::MutexLock lock(&mu_);
    ++misses_;
  }
  return std::nullopt;
}

std::optional<CacheHit> TieredCache::Get(absl::string_view key) { return Lookup(key, true); }
std::optional<CacheHit> TieredCache::Peek(absl::string_view key) { return Lookup(key, false); }

void TieredCache::Promote(size_t hit_tier, absl::string_view key, absl::string_view value) {
  if (hit_tier == 0) return;
  EntryMeta meta;
  if (absl::StatusOr<std::optional<EntryMeta>> m = tiers_[hit_tier].store->Stat(key);
      m.ok() && m->has_value()) {
    meta = **m;
  }
  meta.last_hit_unix_ms = absl::ToUnixMillis(absl::Now());
  for (size_t i = 0; i < hit_tier; ++i) {
    if (Usable(i)) Report(i, tiers_[i].store->Put(key, value, meta), "promote");
  }
}

int TieredCache::Put(absl::string_view key, absl::string_view value, const EntryMeta& meta) {
  int stored = 0;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (Usable(i) && Report(i, tiers_[i].store->Put(key, value, meta), "put")) ++stored;
  }
  return stored;
}

absl::StatusOr<int64_t> TieredCache::Remove(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  std::optional<int64_t> freed;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!Usable(i)) continue;
    absl::StatusOr<int64_t> r = tiers_[i].store->Remove(key);
    if (r.ok()) freed = std::max(freed.value_or(0), *r);
    if (!absl::IsNotFound(r.status())) Report(i, r.status(), "remove");
  }
  if (!freed.has_value()) return absl::NotFoundError(absl::StrCat("not cached: ", key));
  return *freed;
}

namespace {

void Merge(EntryMeta& into, const EntryMeta& from) {
  into.size_bytes = std::max(into.size_bytes, from.size_bytes);
  if (from.created_unix_ms != 0 &&
      (into.created_unix_ms == 0 || from.created_unix_ms < into.created_unix_ms)) {
    into.created_unix_ms = from.created_unix_ms;
  }
  into.last_hit_unix_ms = std::max(into.last_hit_unix_ms, from.last_hit_unix_ms);
  into.hits = std::max(into.hits, from.hits);
  if (into.target.empty()) into.target = from.target;
  if (into.graph_summary.empty()) into.graph_summary = from.graph_summary;
  if (into.debug_name.empty()) into.debug_name = from.debug_name;
}

}  // namespace

std::optional<EntryMeta> TieredCache::Stat(absl::string_view key) {
  std::optional<EntryMeta> out;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!Usable(i)) continue;
    absl::StatusOr<std::optional<EntryMeta>> m = tiers_[i].store->Stat(key);
    if (!Report(i, m.status(), "stat") || !m->has_value()) continue;
    if (out.has_value()) {
      Merge(*out, **m);
    } else {
      out = **m;
    }
  }
  return out;
}

std::vector<EntryMeta> TieredCache::List() {
  std::vector<EntryMeta> out;
  absl::flat_hash_map<std::string, size_t> position;
  // Slowest tier first: it holds the most, and its order breaks ties between equal timestamps.
  for (size_t i = tiers_.size(); i-- > 0;) {
    if (!Usable(i)) continue;
    absl::StatusOr<std::vector<EntryMeta>> list = tiers_[i].store->List();
    if (!Report(i, list.status(), "list")) continue;
    for (EntryMeta& m : *list) {
      auto [it, inserted] = position.try_emplace(m.key, out.size());
      if (inserted) {
        out.push_back(std::move(m));
      } else {
        Merge(out[it->second], m);
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const EntryMeta& a, const EntryMeta& b) {
    return a.last_hit_unix_ms > b.last_hit_unix_ms;
  });
  return out;
}

PurgeResult TieredCache::Purge(const PurgeOptions& options) {
  PurgeResult out;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!Usable(i)) continue;
    absl::StatusOr<PurgeResult> r = tiers_[i].store->Purge(options);
    if (!Report(i, r.status(), "purge")) continue;
    out.removed = std::max(out.removed, r->removed);
    out.freed_bytes = std::max(out.freed_bytes, r->freed_bytes);
  }
  return out;
}

VerifyResult TieredCache::Verify() {
  VerifyResult out;
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!Usable(i)) continue;
    absl::StatusOr<VerifyResult> r = tiers_[i].store->Verify();
    if (!Report(i, r.status(), "verify")) continue;
    out.checked = std::max(out.checked, r->checked);
    out.ok = std::max(out.ok, r->ok);
    for (std::string& key : r->corrupt_keys) {
      if (seen.insert(key).second) out.corrupt_keys.push_back(std::move(key));
    }
  }
  return out;
}

TieredCacheStats TieredCache::Stats() const {
  TieredCacheStats out;
  for (const State& s : tiers_) {
    TierStats t;
    t.tier = s.tier;
    t.store_name = std::string(s.store->Name());
    t.store = s.store->Stats();
    out.tiers.push_back(std::move(t));
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < tiers_.size(); ++i) {
    out.tiers[i].hits = tiers_[i].hits;
    out.tiers[i].failures = tiers_[i].failures;
    out.tiers[i].skipped = tiers_[i].skipped;
    out.tiers[i].failed = tiers_[i].failed;
    out.tiers[i].last_error = tiers_[i].last_error;
  }
  out.lookups = lookups_;
  out.misses = misses_;
  return out;
}

}  // namespace kiln::cache
