// MemoryStore: the in-memory tier, an exact LRU bounded in bytes.
//
// Contract: holds at most `max_bytes` of charged bytes (value + key + metadata strings + a fixed
// per-entry overhead); a Put that would exceed it evicts least recently used entries first; a
// value larger than the whole bound is refused with RESOURCE_EXHAUSTED (never stored). Get (touch)
// makes an entry most recently used and counts a hit; Peek does neither. Nothing survives the
// process. Thread-safe (one mutex; values are copied out under it).
#ifndef KILN_SERVER_CACHE_MEMORY_STORE_H_
#define KILN_SERVER_CACHE_MEMORY_STORE_H_

#include <list>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "server/cache/store.h"

namespace kiln::cache {

struct MemoryStoreOptions {
  int64_t max_bytes = int64_t{256} << 20;  // 256 MiB
};

class MemoryStore : public Store {
 public:
  explicit MemoryStore(MemoryStoreOptions options = {});

  absl::string_view Name() const override { return "memory"; }
  absl::StatusOr<std::optional<Bytes>> Read(absl::string_view key, bool touch) override;
  absl::Status Touch(absl::string_view key) override;
  absl::Status Put(absl::string_view key, absl::string_view value, const EntryMeta& meta) override;
  absl::StatusOr<int64_t> Remove(absl::string_view key) override;
  absl::StatusOr<std::optional<EntryMeta>> Stat(absl::string_view key) override;
  absl::StatusOr<std::vector<EntryMeta>> List() override;
  StoreStats Stats() const override;
  absl::StatusOr<PurgeResult> Purge(const PurgeOptions& options) override;
  absl::StatusOr<VerifyResult> Verify() override;

  // Bytes charged for an entry (exposed for tests).
  static int64_t Charge(absl::string_view key, absl::string_view value, const EntryMeta& meta);

 private:
  struct Item {
    EntryMeta meta;
    Bytes value;
  };
  using Lru = std::list<Item>;  // front = most recently used

  void EraseLocked(Lru::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MemoryStoreOptions options_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Lru::iterator> index_ ABSL_GUARDED_BY(mu_);
  StoreStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_MEMORY_STORE_H_
