// OpenLocalCache: builds kilnd's embedded cache (memory LRU over the on-disk store) from its flags.
//
// Contract: returns a TieredCache with tiers {memory, disk} (or {disk} when memory_max_bytes is 0),
// or the DiskStore's FAILED_PRECONDITION when the directory is unusable, which kilnd reports as a
// startup error. A shared tier is added here when it exists, without changing callers.
#ifndef KILN_SERVER_CACHE_LOCAL_CACHE_H_
#define KILN_SERVER_CACHE_LOCAL_CACHE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/cache/tiered_cache.h"

namespace kiln::cache {

struct LocalCacheOptions {
  std::string dir;                                          // required (kilnd --cache_dir)
  int64_t disk_max_bytes = int64_t{10} << 30;               // 10 GiB
  int64_t memory_max_bytes = int64_t{256} << 20;            // 256 MiB; 0 = no memory tier
  absl::Duration failure_backoff = absl::Seconds(30);       // a failed tier is retried after this
  absl::Duration index_flush_interval = absl::Seconds(30);  // see DiskStoreOptions
};

absl::StatusOr<std::unique_ptr<TieredCache>> OpenLocalCache(const LocalCacheOptions& options);

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_LOCAL_CACHE_H_
