#include "server/cache/disk_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/cache/disk_format.h"
#include "server/cache/file_util.h"
#include "spdlog/spdlog.h"

namespace kiln::cache {
namespace {

constexpr size_t kMaxPrefixRead = 16 * 1024;  // header + meta; meta strings are one-liners

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

bool IsHexPair(absl::string_view name) {
  return name.size() == 2 && IsValidKey(absl::StrCat(name, std::string(62, '0')));
}

// Names in a directory (without "." and ".."). NOT_FOUND if the directory is missing.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "cannot list", dir);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    absl::string_view name(e->d_name);
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  return names;
}

absl::Status OpenError(const std::string& dir, absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat("cache directory ", dir, " is unusable: ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskStore>> DiskStore::Open(DiskStoreOptions options) {
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  if (options.dir.empty()) return absl::InvalidArgumentError("cache directory not set");
  if (options.max_bytes <= 0) return absl::InvalidArgumentError("cache max bytes must be > 0");
  if (absl::Status s = MakeDirs(options.dir); !s.ok()) return OpenError(options.dir, s.message());
  const std::string lock_path = options.dir + "/LOCK";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return OpenError(options.dir, ErrnoStatus(errno, "cannot open", lock_path).message());
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return OpenError(options.dir, "in use by another process (LOCK held)");
    return OpenError(options.dir, ErrnoStatus(err, "cannot lock", lock_path).message());
  }
  // A real write proves the directory is writable (and not on a full or read-only file system).
  const std::string probe = options.dir + "/.probe";
  if (absl::Status s = WriteFileAtomically(probe, {"kiln"}, options.sync); !s.ok()) {
    ::close(fd);
    return OpenError(options.dir, s.message());
  }
  ::unlink(probe.c_str());
  std::unique_ptr<DiskStore> store(new DiskStore(std::move(options), fd));
  if (absl::Status s = store->Load(); !s.ok()) return OpenError(store->dir(), s.message());
  if (store->options_.index_flush_interval > absl::ZeroDuration()) {
    store->flusher_ = std::thread([s = store.get()] { s->FlushLoop(); });
  }
  return store;
}

DiskStore::DiskStore(DiskStoreOptions options, int lock_fd)
    : options_(std::move(options)), lock_fd_(lock_fd) {
  stats_.max_bytes = options_.max_bytes;
}

DiskStore::~DiskStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_cv_.SignalAll();
  }
  if (flusher_.joinable()) flusher_.join();
  if (absl::Status s = Flush(); !s.ok()) {
    spdlog::warn("cache: could not write the index of {} at close: {}", options_.dir, s.ToString());
  }
  ::close(lock_fd_);
}

std::string DiskStore::EntryPath(absl::string_view key) const {
  return absl::StrCat(options_.dir, "/", key.substr(0, 2), "/", key);
}

absl::Status DiskStore::Load() {
  const absl::Time start = absl::Now();
  // 1. List the fan-out directories: sweep temp files, collect entry files.
  absl::StatusOr<std::vector<std::string>> top = ListDir(options_.dir);
  if (!top.ok()) return top.status();
  absl::flat_hash_map<std::string, int64_t> on_disk;  // entry files and their sizes
  for (const std::string& name : *top) {
    const std::string path = absl::StrCat(options_.dir, "/", name);
    if (absl::StartsWith(name, kTempPrefix)) {
      if (::unlink(path.c_str()) == 0) ++report_.temp_files_swept;
      continue;
    }
    if (!IsHexPair(name)) continue;
    absl::StatusOr<std::vector<std::string>> files = ListDir(path);
    if (!files.ok()) continue;  // not a directory
    for (std::string& file : *files) {
      const std::string file_path = absl::StrCat(path, "/", file);
      struct stat st;
      if (absl::StartsWith(file, kTempPrefix)) {
        if (::unlink(file_path.c_str()) == 0) ++report_.temp_files_swept;
      } else if (IsValidKey(file) && absl::StartsWith(file, name) &&
                 ::stat(file_path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        on_disk.emplace(std::move(file), static_cast<int64_t>(st.st_size));
      }
    }
  }
  // 2. The index gives metadata, hits and LRU order of what it knows.
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::string> index_bytes = ReadWholeFile(options_.dir + "/index");
  if (index_bytes.ok()) {
    absl::StatusOr<std::vector<EntryMeta>> index = DecodeIndex(*index_bytes);
    if (index.ok()) {
      report_.index_ok = true;
      for (EntryMeta& meta : *index) {  // oldest first
        if (!IsValidKey(meta.key) || index_.contains(meta.key)) continue;
        auto file = on_disk.find(meta.key);
        if (file == on_disk.end()) {
          ++report_.dropped;
          continue;
        }
        meta.size_bytes = file->second;  // the file may have been rewritten since the index
        on_disk.erase(file);
        ++report_.from_index;
        InsertMruLocked(std::move(meta));
      }
    } else {
      spdlog::warn("cache: ignoring damaged index of {} ({}); rebuilding from entry headers",
                   options_.dir, index.status().ToString());
    }
  } else if (!absl::IsNotFound(index_bytes.status())) {
    spdlog::warn("cache: cannot read the index of {}: {}", options_.dir,
                 index_bytes.status().ToString());
  }
  // 3. Entry files the index does not know (written after its last write): read their headers.
  std::vector<EntryMeta> scanned;
  for (const auto& [key, size] : on_disk) {
    const std::string path = EntryPath(key);
    int64_t file_size = 0;
    absl::StatusOr<std::string> prefix = ReadFilePrefix(path, kMaxPrefixRead, &file_size);
    if (!prefix.ok()) continue;
    if (absl::StatusOr<size_t> need = EntryPrefixSize(*prefix);
        need.ok() && *need > prefix->size() && static_cast<int64_t>(*need) <= file_size) {
      prefix = ReadFilePrefix(path, *need, &file_size);  // an unusually long meta
      if (!prefix.ok()) continue;
    }
    absl::StatusOr<EntryMeta> meta = DecodeEntryMetaOnly(*prefix, file_size, key);
    if (!meta.ok()) {
      spdlog::warn("cache: removing corrupt entry {}: {}", path, std::string(meta.status().message()));
      ::unlink(path.c_str());
      ++report_.corrupt;
      ++stats_.corruptions;
      continue;
    }
    meta->size_bytes = file_size;
    meta->last_hit_unix_ms = meta->created_unix_ms;
    scanned.push_back(*std::move(meta));
  }
  std::sort(scanned.begin(), scanned.end(), [](const EntryMeta& a, const EntryMeta& b) {
    return a.created_unix_ms < b.created_unix_ms;
  });
  report_.scanned = static_cast<int64_t>(scanned.size());
  for (EntryMeta& meta : scanned) InsertMruLocked(std::move(meta));
  EvictLocked("");
  dirty_ = !report_.index_ok || report_.scanned > 0 || report_.dropped > 0 || stats_.evictions > 0;
  report_.took = absl::Now() - start;
  spdlog::info(
      "cache: opened {}: {} entries, {} bytes (index {}, {} from index, {} scanned, {} dropped, "
      "{} corrupt, {} temp files swept) in {}",
      options_.dir, stats_.entries, stats_.bytes, report_.index_ok ? "ok" : "absent or damaged",
      report_.from_index, report_.scanned, report_.dropped, report_.corrupt,
      report_.temp_files_swept, absl::FormatDuration(report_.took));
  return absl::OkStatus();
}

void DiskStore::InsertMruLocked(EntryMeta meta) {
  stats_.bytes += meta.size_bytes;
  ++stats_.entries;
  std::string key = meta.key;
  lru_.push_front(Slot{std::move(meta), next_generation_++});
  index_[key] = lru_.begin();
  dirty_ = true;
}

void DiskStore::EraseLocked(Lru::iterator it, bool unlink_file) {
  if (unlink_file) {
    const std::string path = EntryPath(it->meta.key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("cache: cannot remove {}: {}", path, strerror(errno));
    }
  }
  stats_.bytes -= it->meta.size_bytes;
  --stats_.entries;
  index_.erase(it->meta.key);
  lru_.erase(it);
  dirty_ = true;
}

void DiskStore::EvictLocked(absl::string_view keep) {
  while (stats_.bytes > options_.max_bytes && !lru_.empty()) {
    auto victim = std::prev(lru_.end());
    if (victim->meta.key == keep) {
      if (victim == lru_.begin()) break;
      victim = std::prev(victim);
    }
    EraseLocked(victim, /*unlink_file=*/true);
    ++stats_.evictions;
  }
}

void DiskStore::DropIfGeneration(absl::string_view key, uint64_t generation, bool unlink_file) {
  absl::MutexLock lock(&mu_);
  auto found = index_.find(key);
  if (found != index_.end() && found->second->generation == generation) {
    EraseLocked(found->second, unlink_file);
  }
}

absl::StatusOr<std::optional<Bytes>> DiskStore::ReadChecked(absl::string_view key, bool touch,
                                                            bool* corrupt) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  uint64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    auto found = index_.find(key);
    if (found == index_.end()) {
      if (touch) ++stats_.misses;
      return std::optional<Bytes>();
    }
    generation = found->second->generation;
  }
  const std::string path = EntryPath(key);
  absl::StatusOr<std::string> data = ReadWholeFile(path);
  if (!data.ok()) {
    if (absl::IsNotFound(data.status())) {  // removed behind our back: a miss
      DropIfGeneration(key, generation, /*unlink_file=*/false);
      absl::MutexLock lock(&mu_);
      if (touch) ++stats_.misses;
      return std::optional<Bytes>();
    }
    absl::MutexLock lock(&mu_);
    ++stats_.errors;
    return data.status();
  }
  absl::StatusOr<DecodedEntry> entry = DecodeEntryFile(*data, key);
  if (!entry.ok()) {
    spdlog::warn("cache: corrupt entry {} ({}): removed, treated as a miss", path,
                 std::string(entry.status().message()));
    *corrupt = true;
    DropIfGeneration(key, generation, /*unlink_file=*/true);
    absl::MutexLock lock(&mu_);
    ++stats_.corruptions;
    if (touch) ++stats_.misses;
    return std::optional<Bytes>();
  }
  if (touch) {
    absl::MutexLock lock(&mu_);
    ++stats_.hits;
    auto found = index_.find(key);
    if (found != index_.end()) {
      ++found->second->meta.hits;
      found->second->meta.last_hit_unix_ms = NowMs();
      lru_.splice(lru_.begin(), lru_, found->second);
      dirty_ = true;
    }
  }
  data->erase(0, entry->payload_offset);
  return std::optional<Bytes>(*std::move(data));
}

absl::StatusOr<std::optional<Bytes>> DiskStore::Read(absl::string_view key, bool touch) {
  bool corrupt = false;
  return ReadChecked(key, touch, &corrupt);
}

absl::Status DiskStore::Touch(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (auto found = index_.find(key); found != index_.end()) {
    ++found->second->meta.hits;
    found->second->meta.last_hit_unix_ms = NowMs();
    lru_.splice(lru_.begin(), lru_, found->second);
    dirty_ = true;
  }
  return absl::OkStatus();
}

absl::Status DiskStore::Put(absl::string_view key, absl::string_view value,
                            const EntryMeta& meta_in) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  EntryMeta meta = meta_in;
  meta.key = std::string(key);
  for (std::string* field : {&meta.target, &meta.graph_summary, &meta.debug_name}) {
    if (field->size() > kMaxMetaField) field->resize(kMaxMetaField);
  }
  if (meta.created_unix_ms == 0) meta.created_unix_ms = NowMs();
  if (meta.last_hit_unix_ms == 0) meta.last_hit_unix_ms = meta.created_unix_ms;
  const std::string prefix = EncodeEntryPrefix(key, meta, value);
  meta.size_bytes = static_cast<int64_t>(prefix.size() + value.size());
  if (meta.size_bytes > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("entry of ", meta.size_bytes,
                                                     " bytes exceeds the disk cache's bound of ",
                                                     options_.max_bytes, " bytes"));
  }
  const std::string fanout = absl::StrCat(options_.dir, "/", key.substr(0, 2));
  absl::Status status;
  if (::mkdir(fanout.c_str(), 0755) != 0 && errno != EEXIST) {
    status = absl::UnavailableError(ErrnoStatus(errno, "cannot create", fanout).message());
  } else {
    status = WriteFileAtomically(EntryPath(key), {prefix, value}, options_.sync);
    // Even a missing directory here means the store's directory is gone: a tier failure.
    if (!status.ok()) status = absl::UnavailableError(status.message());
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    ++stats_.errors;
    return status;
  }
  ++stats_.puts;
  if (auto found = index_.find(key); found != index_.end()) {
    EraseLocked(found->second, /*unlink_file=*/false);  // the rename replaced the file
  }
  InsertMruLocked(std::move(meta));
  EvictLocked(key);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DiskStore::Remove(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto found = index_.find(key);
  if (found == index_.end()) return absl::NotFoundError(absl::StrCat("not cached: ", key));
  const int64_t freed = found->second->meta.size_bytes;
  EraseLocked(found->second, /*unlink_file=*/true);
  return freed;
}

absl::StatusOr<std::optional<EntryMeta>> DiskStore::Stat(absl::string_view key) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto found = index_.find(key);
  if (found == index_.end()) return std::optional<EntryMeta>();
  return std::optional<EntryMeta>(found->second->meta);
}

absl::StatusOr<std::vector<EntryMeta>> DiskStore::List() {
  absl::MutexLock lock(&mu_);
  std::vector<EntryMeta> out;
  out.reserve(lru_.size());
  for (const Slot& slot : lru_) out.push_back(slot.meta);
  return out;
}

StoreStats DiskStore::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::StatusOr<PurgeResult> DiskStore::Purge(const PurgeOptions& options) {
  absl::MutexLock lock(&mu_);
  PurgeResult result;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    const int64_t used = std::max(it->meta.created_unix_ms, it->meta.last_hit_unix_ms);
    if (options.all || used < options.older_than_unix_ms) {
      ++result.removed;
      result.freed_bytes += it->meta.size_bytes;
      EraseLocked(it, /*unlink_file=*/true);
    }
    it = next;
  }
  return result;
}

absl::StatusOr<VerifyResult> DiskStore::Verify() {
  std::vector<std::string> keys;
  {
    absl::MutexLock lock(&mu_);
    keys.reserve(lru_.size());
    for (const Slot& slot : lru_) keys.push_back(slot.meta.key);
  }
  VerifyResult result;
  for (const std::string& key : keys) {
    bool corrupt = false;
    absl::StatusOr<std::optional<Bytes>> value = ReadChecked(key, /*touch=*/false, &corrupt);
    if (!value.ok()) return value.status();
    if (corrupt) {
      ++result.checked;
      result.corrupt_keys.push_back(key);
    } else if (value->has_value()) {
      ++result.checked;
      ++result.ok;
    }  // else removed concurrently: not checked
  }
  return result;
}

absl::Status DiskStore::Flush() {
  absl::MutexLock flush_lock(&flush_mu_);
  std::vector<EntryMeta> oldest_first;
  {
    absl::MutexLock lock(&mu_);
    if (!dirty_) return absl::OkStatus();
    dirty_ = false;
    oldest_first.reserve(lru_.size());
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) oldest_first.push_back(it->meta);
  }
  absl::Status s =
      WriteFileAtomically(options_.dir + "/index", {EncodeIndex(oldest_first)}, options_.sync);
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    dirty_ = true;
    ++stats_.errors;
  }
  return s;
}

void DiskStore::FlushLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const absl::Time wake = absl::Now() + options_.index_flush_interval;
      while (!stopping_ && absl::Now() < wake) stop_cv_.WaitWithDeadline(&mu_, wake);
      if (stopping_) return;
    }
    if (absl::Status s = Flush(); !s.ok()) {
      spdlog::warn("cache: cannot write the index of {}: {}", options_.dir, s.ToString());
    }
  }
}

}  // namespace kiln::cache
