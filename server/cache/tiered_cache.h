// TieredCache: what kilnd's services call. Stores in order, fastest first: memory, disk, and later
// a shared tier (Redis), all behind the Store interface.
//
// Contract:
//  - A cache error never fails the caller: Get returns a hit or nothing, Put returns nothing.
//    A tier that returns a tier failure (see IsTierFailure) is logged, counted, marked failed and
//    skipped until `failure_backoff` has passed; then the next call tries it again (and a success
//    clears the mark). Per-request errors (bad key, value too large for a tier) are not failures.
//  - Get reports which tier hit and copies the entry into every faster usable tier (promotion),
//    carrying its metadata. Slower tiers are told of the hit with Store::Touch, so that an entry
//    hot in memory is not the disk's least recently used and the disk's hit count (which survives
//    restarts) includes the hits that memory served.
//  - Put writes through to every usable tier.
//  - Admin views merge the tiers: an entry's hits are the largest count of any tier (the slowest
//    tier sees every hit, through Touch), created is the earliest, last hit the latest, size the
//    largest copy.
//  - Thread-safe; calls into different tiers are not serialized.
#ifndef KILN_SERVER_CACHE_TIERED_CACHE_H_
#define KILN_SERVER_CACHE_TIERED_CACHE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cache/store.h"

namespace kiln::cache {

// Which tier answered; maps 1:1 to kiln.v1.CacheSource MEMORY_HIT, DISK_HIT, SHARED_HIT.
enum class Tier { kMemory, kDisk, kShared };
absl::string_view TierName(Tier tier);  // "memory", "disk", "shared"

struct TieredCacheOptions {
  absl::Duration failure_backoff = absl::Seconds(30);
};

struct CacheHit {
  Bytes value;
  Tier tier;
};

struct TierStats {
  Tier tier;
  std::string store_name;  // Store::Name()
  StoreStats store;        // the tier's own counters
  int64_t hits = 0;        // Gets answered by this tier
  int64_t failures = 0;    // tier failures seen
  int64_t skipped = 0;     // calls skipped while marked failed
  bool failed = false;     // marked failed now
  std::string last_error;
};

struct TieredCacheStats {
  std::vector<TierStats> tiers;  // fastest first
  int64_t lookups = 0;
  int64_t misses = 0;  // Gets that no tier answered
};

class TieredCache {
 public:
  struct TierSpec {
    Tier tier;
    std::unique_ptr<Store> store;
  };
  // `tiers` fastest first, e.g. {{Tier::kMemory, memory}, {Tier::kDisk, disk}}.
  explicit TieredCache(std::vector<TierSpec> tiers, TieredCacheOptions options = {});

  // A hit from the fastest tier that has the key, promoted to faster tiers.
  std::optional<CacheHit> Get(absl::string_view key);
  // Like Get without counting a hit, moving LRU order or promoting (for admin: kilnctl show).
  std::optional<CacheHit> Peek(absl::string_view key);
  // Writes through to every usable tier; returns how many tiers stored it (for logs and tests).
  int Put(absl::string_view key, absl::string_view value, const EntryMeta& meta);

  // Admin. Remove: bytes freed in the tier that held most; NOT_FOUND if no tier had the key.
  absl::StatusOr<int64_t> Remove(absl::string_view key);
  std::optional<EntryMeta> Stat(absl::string_view key);
  std::vector<EntryMeta> List();  // merged, most recently used first
  // removed/freed: the largest per-tier figures (an entry in two tiers counts once).
  PurgeResult Purge(const PurgeOptions& options);
  // checked/ok: the largest per-tier figures; corrupt_keys: the union over tiers.
  VerifyResult Verify();
  TieredCacheStats Stats() const;

  // The store of a tier, or nullptr (e.g. for kilnd's "cache_dir" stat).
  Store* store(Tier tier) const;

 private:
  struct State {
    Tier tier;
    std::unique_ptr<Store> store;
    absl::Time retry_at = absl::InfinitePast();
    bool failed = false;
    int64_t hits = 0;
    int64_t failures = 0;
    int64_t skipped = 0;
    std::string last_error;
  };

  // False (and counts a skip) while the tier is in its failure backoff.
  bool Usable(size_t i);
  // Records the outcome of a call into tier i; returns status.ok().
  bool Report(size_t i, const absl::Status& status, absl::string_view op);
  void Promote(size_t hit_tier, absl::string_view key, absl::string_view value);
  std::optional<CacheHit> Lookup(absl::string_view key, bool touch);

  const TieredCacheOptions options_;
  std::vector<State> tiers_;  // the vector itself is immutable after construction
  mutable absl::Mutex mu_;    // guards the mutable fields of tiers_ and the counters below
  int64_t lookups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_TIERED_CACHE_H_
