#include "server/codegen/cuda_long_rows.h"

#include <algorithm>

namespace kiln::codegen {

namespace {

constexpr int kThreadsPerSm = 2048;

// Registers per thread that the emitter may spend on cached values with blocks of `block`
// threads (as CudaKernelEmitter::EmitRow: at most half of what the block size leaves a thread).
int64_t CacheLimit(int block, const ClusterRowLimits& limits) {
  return std::min<int64_t>(limits.max_cached_values, 65536 / block / 2);
}

// Cached values per thread when `threads` threads share a row (whole vectors per chunk).
int64_t CachedValues(const ClusterRowFacts& f, int64_t threads) {
  const int64_t w = std::max(1, f.vector_width);
  return f.recurring_loads * ((f.length + threads * w - 1) / (threads * w)) * w;
}

// Blocks per row for parallelism alone: none (1) unless there are fewer rows than SMs; then
// about two blocks per SM, each with >= 8 values per thread.
int ParallelBlocks(const ClusterRowFacts& f, int block, const ClusterRowLimits& limits) {
  if (!f.rows || *f.rows >= limits.num_sms || *f.rows < 1) return 1;
  const int64_t want = (2 * int64_t{limits.num_sms} + *f.rows - 1) / *f.rows;
  const int64_t most = f.length / (int64_t{block} * 8);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, limits.max_cluster})));
}

// One block of the largest size already keeps the row in registers (or nothing recurs).
bool OneBlockCaches(const ClusterRowFacts& f, const ClusterRowLimits& limits) {
  const int large = limits.max_row_block;
  return f.recurring_loads == 0 || CachedValues(f, large) <= CacheLimit(large, limits);
}

}  // namespace

bool PreferUncachedRows(const ClusterRowFacts& facts, const ClusterRowLimits& limits) {
  if (limits.l2_row_bytes <= 0 || facts.row_bytes <= 0 || facts.length <= 0) return false;
  if (limits.max_row_block < 32 || OneBlockCaches(facts, limits)) return false;
  if (facts.rows && *facts.rows < int64_t{limits.cluster_rows_per_sm} * limits.num_sms) return false;
  return int64_t{limits.num_sms} * facts.row_bytes <= limits.l2_row_bytes;
}

int64_t UncachedRowGrid(const ClusterRowFacts& facts, const ClusterRowLimits& limits, int block) {
  if (limits.l2_row_bytes <= 0 || facts.row_bytes <= 0 || facts.length <= 0 || block <= 0) return 0;
  if (limits.max_row_block < 32 || OneBlockCaches(facts, limits)) return 0;
  // Whole blocks per SM: a grid-stride loop over rows on SMs holding unequal numbers of blocks
  // leaves the lightly loaded SMs idle at the end.
  const int64_t by_threads = std::max(1, kThreadsPerSm / block);
  const int64_t fit = limits.l2_row_bytes / facts.row_bytes / std::max(1, limits.num_sms);
  return int64_t{limits.num_sms} * std::max<int64_t>(1, std::min(fit, by_threads));
}

SharedMemorySize SharedMemoryOf(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return {};
  int number = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9' && number < 10000; ++i) {
    number = number * 10 + (arch[i] - '0');
  }
  constexpr int64_t kKiB = 1024;
  if (number == 80 || number == 87) return {164 * kKiB, 163 * kKiB};  // A100, Orin
  if (number == 86 || number == 89 || (number >= 120 && number < 130)) return {100 * kKiB, 99 * kKiB};
  if (number >= 90) return {228 * kKiB, 227 * kKiB};                   // H100/H200, B200
  return {};
}

int64_t SharedRowBytes(const ClusterRowFacts& facts, int block) {
  const int64_t w = std::max(1, facts.vector_width);
  const int64_t chunks = (facts.length + block * w - 1) / (block * w);
  return facts.element_bytes * chunks * w * block;
}

absl::optional<SharedRowChoice> ChooseSharedRows(const ClusterRowFacts& facts,
                                                 const ClusterRowLimits& limits, bool forced) {
  if (facts.length <= 0 || facts.recurring_loads == 0 || facts.element_bytes <= 0) return absl::nullopt;
  if (limits.shared_bytes_per_sm <= 0 || limits.max_row_block < 32) return absl::nullopt;
  if (!forced) {
    const int block = std::min(limits.shared_row_block, limits.max_row_block);
    const bool realign = facts.stray_stores && facts.length >= int64_t{block} * facts.vector_width;
    // A row of whole chunks for the largest block (f32 2048 x 32768) keeps registers in f32.
    const int64_t whole = int64_t{limits.max_row_block} * std::max(1, facts.vector_width);
    const bool wide = facts.recurring_loads == 1 && facts.other_loads == 0 &&
                      CachedValues(facts, block) > kWideRowValues &&
                      (facts.element_bytes == 2 || (facts.element_bytes == 4 && facts.length % whole != 0));
    if (limits.shared_row_blocks_per_sm < 1 || (OneBlockCaches(facts, limits) && !realign && !wide)) {
      return absl::nullopt;
    }
    // Few rows: a cluster spreads each over several SMs (where there are clusters).
    if (facts.rows && *facts.rows < limits.num_sms && limits.max_cluster >= 2) return absl::nullopt;
  }
  SharedRowChoice c;
  c.block = std::max(32, std::min(limits.shared_row_block, limits.max_row_block)) / 32 * 32;
  const int64_t cache = SharedRowBytes(facts, c.block);
  c.buffers = std::max(1, limits.shared_row_buffers);
  if (limits.shared_row_buffers == 0) {
    const bool vectors16 = facts.vector_width * facts.element_bytes == 16 * facts.recurring_loads;
    const bool fit2 = 2 * cache + kSharedBulkBytes + limits.static_shared_bytes <=
                      limits.max_shared_bytes_per_block;
    c.buffers = limits.bulk_copies && vectors16 && facts.other_loads == 0 && fit2 ? 2 : 1;
  }
  c.bytes = cache * c.buffers + (c.buffers == 2 ? kSharedBulkBytes : 0);
  const int64_t per_block = c.bytes + limits.static_shared_bytes;
  if (per_block > limits.max_shared_bytes_per_block) return absl::nullopt;
  const int64_t by_smem = limits.shared_bytes_per_sm / (per_block + limits.reserved_shared_bytes);
  const int64_t by_threads = kThreadsPerSm / c.block;
  c.blocks_per_sm = static_cast<int>(std::max<int64_t>(1, std::min(by_smem, by_threads)));
  if (!forced && by_smem < limits.shared_row_blocks_per_sm) return absl::nullopt;
  return c;
}

bool ArchHasClusters(const std::string& arch) {
  if (arch.rfind("sm_", 0) != 0) return false;
  int number = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9' && number < 10000; ++i) {
    number = number * 10 + (arch[i] - '0');
  }
  return number >= 90;
}

namespace {

// The most blocks a cluster of `block`-thread blocks may have: up to max_small_cluster where two
// blocks share an SM at <= 64 registers a thread.
int MostClusterBlocks(int block, const ClusterRowLimits& limits) {
  const bool two_per_sm = 2 * block <= kThreadsPerSm / 2;
  return two_per_sm ? std::max(limits.max_cluster, limits.max_small_cluster) : limits.max_cluster;
}

}  // namespace

int64_t LongestClusterRow(const ClusterRowLimits& limits) {
  if (limits.max_cluster < 2 || limits.max_row_block < 32) return 0;
  int64_t threads = 0;
  for (int block : {std::min(512, limits.max_row_block), limits.max_row_block}) {
    threads = std::max(threads, int64_t{block} * MostClusterBlocks(block, limits));
  }
  return threads * limits.row_values;
}

absl::optional<ClusterRowChoice> ChooseClusterRows(const ClusterRowFacts& facts,
                                                   const ClusterRowLimits& limits) {
  if (limits.max_cluster < 2 || facts.length <= 0 || limits.max_row_block < 32) return absl::nullopt;
  const int small = std::min(512, limits.max_row_block);
  const int large = limits.max_row_block;
  const int64_t target = std::max(limits.row_values, 4 * facts.recurring_loads);
  auto fits = [&](int block, int cluster) {
    const int64_t v = CachedValues(facts, int64_t{block} * cluster);
    return v <= std::min(target, CacheLimit(block, limits));
  };
  // One block of the largest size already keeps the row in registers (or nothing recurs):
  // clusters only for parallelism.
  if (OneBlockCaches(facts, limits)) {
    for (int block : {small, large}) {
      const int cluster = ParallelBlocks(facts, block, limits);
      if (cluster < 2) return absl::nullopt;
      if (facts.recurring_loads == 0 || fits(block, cluster)) return ClusterRowChoice{cluster, block};
    }
    return absl::nullopt;
  }
  // Rows enough, and a row per SM fits the L2: one block per row, read twice.
  if (PreferUncachedRows(facts, limits)) return absl::nullopt;
  for (int block : {small, large}) {
    for (int cluster = 2; cluster <= MostClusterBlocks(block, limits); ++cluster) {
      if (fits(block, cluster)) {
        return ClusterRowChoice{std::max(cluster, ParallelBlocks(facts, block, limits)), block};
      }
    }
  }
  // Too long for the cluster's registers: no cache, but still the cluster's parallelism.
  const int cluster = ParallelBlocks(facts, small, limits);
  if (cluster < 2) return absl::nullopt;
  return ClusterRowChoice{cluster, small};
}

}  // namespace kiln::codegen
