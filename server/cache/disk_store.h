// DiskStore: the embedded, durable, content-addressed tier (kilnd's default cache).
//
// Layout: <dir>/<key[0:2]>/<key> entry files (format in disk_format.h), <dir>/index (LRU order and
// hit counts), <dir>/LOCK (flock: one process per directory).
//
// Contract:
//  - Open() fails with a clear FAILED_PRECONDITION naming the directory when it cannot be created,
//    written, or is locked by another process; kilnd reports that as a startup error.
//  - Writes are crash-safe: temp file in the entry's directory, fsync, rename, fsync of the
//    directory. A reader sees the old entry, the new one, or none, never a partial one. Temp files
//    left by a crash are removed by the next Open().
//  - Every Read verifies the whole entry (magic, version, lengths, SHA-256, key). A corrupt or
//    truncated entry is a miss: logged, counted in `corruptions`, removed, never served.
//  - Bounded: when a Put returns, the sum of entry file sizes is within max_bytes (while it runs,
//    the new file exists before older ones are evicted); it evicts the least recently used entries
//    first (exact LRU while running). A value that cannot fit is RESOURCE_EXHAUSTED.
//  - Restart keeps entries, their metadata, hit counts and LRU order: the index file is rewritten
//    atomically every index_flush_interval when something changed (any hit does), by Flush(), and
//    on destruction. A write copies the metadata under the lock and costs ~160 bytes per entry.
//    After a crash, hits and LRU moves since the last index write are lost (entries are not):
//    entry files missing from the index are found by the startup scan (which reads only their
//    headers) and count as the most recently used. Startup reads the index and lists the 256
//    fan-out directories; it does not hash payloads, so 100k entries open in about a second.
//  - Keys are validated (64 lowercase hex) before they become paths: nothing escapes `dir`.
//  - Thread-safe. File I/O runs outside the index lock; only renames of the index and unlinks of
//    evicted entries happen under it.
#ifndef KILN_SERVER_CACHE_DISK_STORE_H_
#define KILN_SERVER_CACHE_DISK_STORE_H_

#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cache/store.h"

namespace kiln::cache {

// Longer target / graph_summary / debug_name strings are cut to this many bytes by Put.
inline constexpr size_t kMaxMetaField = 4096;

struct DiskStoreOptions {
  std::string dir;                                          // required
  int64_t max_bytes = int64_t{10} << 30;                    // 10 GiB
  bool sync = true;                                         // fsync; false only in tests
  absl::Duration index_flush_interval = absl::Seconds(30);  // <= 0: only Flush() and close
};

// What Open() found, for kilnd's startup log line and for tests.
struct DiskOpenReport {
  int64_t from_index = 0;     // entries known to the index and present on disk
  int64_t scanned = 0;        // entry files missing from the index, read from their headers
  int64_t dropped = 0;        // index entries whose file was gone
  int64_t corrupt = 0;        // unreadable entry headers found by the scan, removed
  int64_t temp_files_swept = 0;
  bool index_ok = false;      // the index file existed and was intact
  absl::Duration took;
};

class DiskStore : public Store {
 public:
  static absl::StatusOr<std::unique_ptr<DiskStore>> Open(DiskStoreOptions options);
  ~DiskStore() override;  // writes the index

  absl::string_view Name() const override { return "disk"; }
  absl::StatusOr<std::optional<Bytes>> Read(absl::string_view key, bool touch) override;
  absl::Status Touch(absl::string_view key) override;
  absl::Status Put(absl::string_view key, absl::string_view value, const EntryMeta& meta) override;
  absl::StatusOr<int64_t> Remove(absl::string_view key) override;
  absl::StatusOr<std::optional<EntryMeta>> Stat(absl::string_view key) override;
  absl::StatusOr<std::vector<EntryMeta>> List() override;
  StoreStats Stats() const override;
  absl::StatusOr<PurgeResult> Purge(const PurgeOptions& options) override;
  absl::StatusOr<VerifyResult> Verify() override;

  // Writes the index now if anything changed since the last write.
  absl::Status Flush();

  const std::string& dir() const { return options_.dir; }
  const DiskOpenReport& open_report() const { return report_; }
  // The entry file of a key (for tests and `kilnctl` diagnostics).
  std::string EntryPath(absl::string_view key) const;

 private:
  struct Slot {
    EntryMeta meta;
    uint64_t generation = 0;  // changes on every Put: a stale reader never removes a newer entry
  };
  using Lru = std::list<Slot>;  // front = most recently used

  explicit DiskStore(DiskStoreOptions options, int lock_fd);
  absl::Status Load();
  void InsertMruLocked(EntryMeta meta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(Lru::iterator it, bool unlink_file) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(absl::string_view keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads and verifies one entry; removes it when corrupt (setting *corrupt).
  absl::StatusOr<std::optional<Bytes>> ReadChecked(absl::string_view key, bool touch,
                                                   bool* corrupt);
  void DropIfGeneration(absl::string_view key, uint64_t generation, bool unlink_file);
  void FlushLoop();

  const DiskStoreOptions options_;
  const int lock_fd_;
  DiskOpenReport report_;
  absl::Mutex flush_mu_;  // serializes index writes

  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
  StoreStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar stop_cv_;
  std::thread flusher_;
};

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_DISK_STORE_H_
