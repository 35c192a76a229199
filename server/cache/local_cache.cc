#include "server/cache/local_cache.h"

#include "server/cache/disk_store.h"
#include "server/cache/memory_store.h"

namespace kiln::cache {

absl::StatusOr<std::unique_ptr<TieredCache>> OpenLocalCache(const LocalCacheOptions& options) {
  DiskStoreOptions disk_options;
  disk_options.dir = options.dir;
  disk_options.max_bytes = options.disk_max_bytes;
  disk_options.index_flush_interval = options.index_flush_interval;
  absl::StatusOr<std::unique_ptr<DiskStore>> disk = DiskStore::Open(disk_options);
  if (!disk.ok()) return disk.status();
  std::vector<TieredCache::TierSpec> tiers;
  if (options.memory_max_bytes > 0) {
    tiers.push_back({Tier::kMemory, std::make_unique<MemoryStore>(
                                        MemoryStoreOptions{options.memory_max_bytes})});
  }
  tiers.push_back({Tier::kDisk, *std::move(disk)});
  TieredCacheOptions tiered_options;
  tiered_options.failure_backoff = options.failure_backoff;
  return std::make_unique<TieredCache>(std::move(tiers), tiered_options);
}

}  // namespace kiln::cache
