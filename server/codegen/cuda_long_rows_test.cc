#include "server/codegen/cuda_long_rows.h"

#include "gtest/gtest.h"

namespace kiln::codegen {
namespace {

ClusterRowFacts Facts(int64_t length, absl::optional<int64_t> rows, int recurring, int width) {
  ClusterRowFacts f;
  f.length = length;
  f.rows = rows;
  f.recurring_loads = recurring;
  f.vector_width = width;
  return f;
}

TEST(ChooseClusterRows, RowsThatOneBlockCachesKeepOneBlock) {
  const ClusterRowLimits limits;
  EXPECT_FALSE(ChooseClusterRows(Facts(32768, absl::nullopt, 1, 4), limits));
  EXPECT_FALSE(ChooseClusterRows(Facts(8192, int64_t{8192}, 1, 4), limits));
  EXPECT_FALSE(ChooseClusterRows(Facts(32768, int64_t{2048}, 1, 4), limits));
}

TEST(ChooseClusterRows, LongerRowsAreCachedByAClusterWithAtMost32ValuesPerThread) {
  const ClusterRowLimits limits;
  // f32 65536: 4 x 512 threads x 32 values; bf16 50257 (odd: scalar): 4 x 512 x 25.
  absl::optional<ClusterRowChoice> c = ChooseClusterRows(Facts(65536, int64_t{4096}, 1, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 4);
  EXPECT_EQ(c->block, 512);
  c = ChooseClusterRows(Facts(50257, int64_t{4096}, 1, 1), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 4);
  EXPECT_EQ(c->block, 512);
  c = ChooseClusterRows(Facts(131072, absl::nullopt, 1, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster * c->block, 4096);
  // f32 262144 needs 8192 threads x 32 values: 16 x 512 (a non-portable size, two blocks an SM),
  // or 8 x 1024 where clusters stay within the portable 8; twice that is too long for any cluster.
  c = ChooseClusterRows(Facts(262144, int64_t{64}, 1, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 16);
  EXPECT_EQ(c->block, 512);
  ClusterRowLimits portable;
  portable.max_small_cluster = 0;
  c = ChooseClusterRows(Facts(262144, int64_t{64}, 1, 4), portable);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 8);
  EXPECT_EQ(c->block, 1024);
  EXPECT_FALSE(ChooseClusterRows(Facts(524288, absl::nullopt, 1, 4), limits));
  // What the lowering keeps in one row op: the longest row a cluster caches (and no longer).
  EXPECT_EQ(LongestClusterRow(limits), 262144);
  EXPECT_EQ(LongestClusterRow(portable), 262144);  // 8 x 1024 x 32
  EXPECT_FALSE(ChooseClusterRows(Facts(LongestClusterRow(limits) + 4, absl::nullopt, 1, 4), limits));
  ClusterRowLimits none;
  none.max_cluster = 0;
  EXPECT_EQ(LongestClusterRow(none), 0);
}

TEST(ChooseClusterRows, FewLongRowsAreSplitForParallelism) {
  const ClusterRowLimits limits;
  // 64 sums of 262144: 5 blocks a row (about two blocks per SM).
  absl::optional<ClusterRowChoice> c = ChooseClusterRows(Facts(262144, int64_t{64}, 0, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 5);
  EXPECT_EQ(c->block, 512);
  // One row (a full reduction): the largest cluster.
  c = ChooseClusterRows(Facts(1 << 20, int64_t{1}, 0, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 8);
  // Too short to split (fewer than 8 values per thread in two blocks), or rows enough.
  EXPECT_FALSE(ChooseClusterRows(Facts(4096, int64_t{1}, 0, 4), limits));
  EXPECT_FALSE(ChooseClusterRows(Facts(262144, int64_t{132}, 0, 4), limits));
  EXPECT_FALSE(ChooseClusterRows(Facts(262144, absl::nullopt, 0, 4), limits));
  // Too long to cache but few rows: the cluster's parallelism without the cache.
  c = ChooseClusterRows(Facts(1 << 22, int64_t{16}, 1, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 8);
}

ClusterRowFacts WithBytes(ClusterRowFacts f, int64_t element_bytes) {
  f.row_bytes = element_bytes * f.length;
  return f;
}

ClusterRowLimits WithL2Budget() {
  ClusterRowLimits limits;
  limits.l2_row_bytes = kL2RowBytes;
  return limits;
}

TEST(ChooseClusterRows, ByDefaultLongRowsTakeClusters) {
  const ClusterRowLimits limits;
  EXPECT_FALSE(PreferUncachedRows(WithBytes(Facts(50257, int64_t{4096}, 1, 4), 4), limits));
  EXPECT_TRUE(ChooseClusterRows(WithBytes(Facts(50257, int64_t{4096}, 1, 8), 2), limits));
}

TEST(ChooseClusterRows, RowsEnoughWhoseRowsFitTheL2StayOneUncachedBlock) {
  const ClusterRowLimits limits = WithL2Budget();
  // 4096 rows of 50257 (f32 201 KB, bf16 101 KB: 132 rows in flight fit the L2): one block.
  const ClusterRowFacts f32 = WithBytes(Facts(50257, int64_t{4096}, 1, 4), 4);
  const ClusterRowFacts bf16 = WithBytes(Facts(50257, int64_t{4096}, 1, 8), 2);
  EXPECT_TRUE(PreferUncachedRows(f32, limits));
  EXPECT_FALSE(ChooseClusterRows(f32, limits));
  EXPECT_FALSE(ChooseClusterRows(bf16, limits));
  EXPECT_FALSE(ChooseClusterRows(WithBytes(Facts(50257, absl::nullopt, 1, 8), 2), limits))
      << "an unknown number of rows counts as rows enough";
  // Fewer rows than kClusterRowsPerSm per SM: the cluster.
  const ClusterRowFacts few = WithBytes(Facts(50257, int64_t{2 * 132 - 1}, 1, 4), 4);
  EXPECT_FALSE(PreferUncachedRows(few, limits));
  EXPECT_TRUE(ChooseClusterRows(few, limits));
  // f32 65536 and 131072: a row per SM is more than kL2RowBytes: the cluster.
  EXPECT_TRUE(ChooseClusterRows(WithBytes(Facts(65536, int64_t{1024}, 1, 4), 4), limits));
  EXPECT_TRUE(ChooseClusterRows(WithBytes(Facts(131072, int64_t{512}, 1, 4), 4), limits));
  EXPECT_FALSE(ChooseClusterRows(WithBytes(Facts(65536, int64_t{1024}, 1, 8), 2), limits));
  // The rule flips with its constants.
  ClusterRowLimits clusters = limits;
  clusters.l2_row_bytes = 0;
  EXPECT_TRUE(ChooseClusterRows(f32, clusters));
  ClusterRowLimits more = limits;
  more.cluster_rows_per_sm = 64;
  EXPECT_TRUE(ChooseClusterRows(f32, more));
  // Rows one block caches never get here.
  EXPECT_FALSE(PreferUncachedRows(WithBytes(Facts(32768, int64_t{4096}, 1, 4), 4), limits));
}

TEST(UncachedRowGrid, WholeBlocksPerSmWhoseRowsFitTheL2) {
  const ClusterRowLimits limits = WithL2Budget();
  // f32 50257: one 1024-thread block per SM (two would hold 53 MB); bf16: two.
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(50257, int64_t{4096}, 1, 4), 4), limits, 1024), 132);
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(50257, int64_t{4096}, 1, 8), 2), limits, 1024), 264);
  // Never fewer than one per SM, never more than fit by threads.
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(262144, int64_t{64}, 1, 4), 4), limits, 1024), 132);
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(50257, int64_t{4096}, 1, 8), 2), limits, 512), 264);
  // No cap: the row is cached by one block, nothing recurs, or no L2 budget.
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(32768, int64_t{4096}, 1, 4), 4), limits, 1024), 0);
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(262144, int64_t{64}, 0, 4), 4), limits, 1024), 0);
  ClusterRowLimits none = limits;
  none.l2_row_bytes = 0;
  EXPECT_EQ(UncachedRowGrid(WithBytes(Facts(50257, int64_t{4096}, 1, 4), 4), none, 1024), 0);
}

TEST(ChooseClusterRows, NoClustersWhenDisabled) {
  ClusterRowLimits limits;
  limits.max_cluster = 1;
  EXPECT_FALSE(ChooseClusterRows(Facts(65536, int64_t{4096}, 1, 4), limits));
  EXPECT_FALSE(ChooseClusterRows(Facts(262144, int64_t{1}, 0, 4), limits));
}

TEST(ChooseClusterRows, ClustersFromSm90On) {
  EXPECT_TRUE(ArchHasClusters("sm_90"));
  EXPECT_TRUE(ArchHasClusters("sm_90a"));
  EXPECT_TRUE(ArchHasClusters("sm_100"));
  EXPECT_FALSE(ArchHasClusters("sm_80"));
  EXPECT_FALSE(ArchHasClusters("sm_89"));
  EXPECT_FALSE(ArchHasClusters("sm_75"));
  EXPECT_FALSE(ArchHasClusters("compute_90"));
}

TEST(ChooseClusterRows, SmallLimitsForEmulation) {
  ClusterRowLimits limits;
  limits.max_row_block = 128;
  limits.row_values = 8;
  limits.max_cached_values = 16;
  absl::optional<ClusterRowChoice> c = ChooseClusterRows(Facts(3001, absl::nullopt, 1, 1), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->block, 128);
  EXPECT_EQ(c->cluster, 3);
}

// A row of `length` elements of `element_bytes` each in one recurring load (shifted rows: the
// emitter passes length + width - 1).
ClusterRowFacts Row(int64_t length, absl::optional<int64_t> rows, int width, int64_t element_bytes) {
  ClusterRowFacts f = WithBytes(Facts(length, rows, 1, width), element_bytes);
  f.element_bytes = element_bytes;
  return f;
}

ClusterRowLimits Sm80() {
  ClusterRowLimits limits;
  limits.num_sms = 108;
  limits.max_cluster = 0;  // the emitter's limits for an arch without clusters
  limits.shared_bytes_per_sm = SharedMemoryOf("sm_80").per_sm;
  limits.max_shared_bytes_per_block = SharedMemoryOf("sm_80").per_block;
  limits.static_shared_bytes = 256;
  return limits;
}

TEST(ChooseSharedRows, SharedMemoryByArch) {
  EXPECT_EQ(SharedMemoryOf("sm_90").per_sm, 228 * 1024);
  EXPECT_EQ(SharedMemoryOf("sm_90a").per_block, 227 * 1024);
  EXPECT_EQ(SharedMemoryOf("sm_100").per_sm, 228 * 1024);
  EXPECT_EQ(SharedMemoryOf("sm_80").per_sm, 164 * 1024);
  EXPECT_EQ(SharedMemoryOf("sm_80").per_block, 163 * 1024);
  EXPECT_EQ(SharedMemoryOf("sm_89").per_sm, 100 * 1024);
  EXPECT_EQ(SharedMemoryOf("sm_75").per_sm, 0);
  EXPECT_EQ(SharedMemoryOf("compute_90").per_sm, 0);
}

TEST(ChooseSharedRows, RowsTooLongForRegistersWithRowsEnoughShareAnSmTwoBlocksAtATime) {
  ClusterRowLimits limits;
  limits.static_shared_bytes = 256;
  // bf16 4096 x 50257 (shifted vectors of 8: 50264): 512 threads x 13 chunks x 8 x 2 bytes.
  absl::optional<SharedRowChoice> c = ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->block, 512);
  EXPECT_EQ(c->bytes, 106496);
  EXPECT_EQ(c->blocks_per_sm, 2);
  // Rows unknown, or one per SM: the same. Fewer rows than SMs: clusters (split rows).
  EXPECT_TRUE(ChooseSharedRows(Row(50264, absl::nullopt, 8, 2), limits, false));
  EXPECT_TRUE(ChooseSharedRows(Row(50264, int64_t{132}, 8, 2), limits, false));
  EXPECT_FALSE(ChooseSharedRows(Row(50264, int64_t{131}, 8, 2), limits, false));
  // The layer norm of the same rows (one recurring load).
  EXPECT_TRUE(ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), limits, false));
  // bf16 65536 (128 KiB) and f32 50257 (196 KiB): one block per SM, by default...
  ClusterRowLimits two = limits;
  two.shared_row_blocks_per_sm = 2;
  EXPECT_FALSE(ChooseSharedRows(Row(65536, int64_t{4096}, 8, 2), two, false));
  EXPECT_FALSE(ChooseSharedRows(Row(50260, int64_t{4096}, 4, 4), two, false));
  // ...but not when the limits ask for two blocks per SM (above).
  const ClusterRowLimits& one = limits;
  c = ChooseSharedRows(Row(65536, int64_t{4096}, 8, 2), one, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes, 131072);
  EXPECT_EQ(c->blocks_per_sm, 1);
  c = ChooseSharedRows(Row(50260, int64_t{4096}, 4, 4), one, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes, 25 * 4 * 512 * 4);
  EXPECT_EQ(c->blocks_per_sm, 1);
  // f32 65536 (256 KiB) fits no block; rows a block's registers hold stay there.
  EXPECT_FALSE(ChooseSharedRows(Row(65536, int64_t{4096}, 4, 4), one, false));
  EXPECT_FALSE(ChooseSharedRows(Row(32768, int64_t{2048}, 4, 4), one, false));
  EXPECT_FALSE(ChooseSharedRows(Row(16384, int64_t{2048}, 8, 2), one, false));
  // Never automatically with 0 blocks per SM; never when nothing recurs.
  ClusterRowLimits never = limits;
  never.shared_row_blocks_per_sm = 0;
  EXPECT_FALSE(ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), never, false));
  ClusterRowFacts sums = Row(50264, int64_t{4096}, 8, 2);
  sums.recurring_loads = 0;
  sums.element_bytes = 0;
  EXPECT_FALSE(ChooseSharedRows(sums, limits, true));
}

TEST(ChooseSharedRows, RowsInRegistersWithStrayStoresTakeTheRowCache) {
  ClusterRowLimits limits;
  limits.static_shared_bytes = 256;
  // bf16 softmax of x[:, 1:], 4096 x 12001 (shifted vectors of 8: 12008): a block of 512
  // threads would hold it in registers, but its output lies differently from its input.
  ClusterRowFacts sliced = Row(12008, int64_t{4096}, 8, 2);
  EXPECT_FALSE(ChooseSharedRows(sliced, limits, false));
  sliced.stray_stores = true;
  absl::optional<SharedRowChoice> c = ChooseSharedRows(sliced, limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->block, 512);
  // Not for rows shorter than a vector for each of the block's threads (3001: 3008 < 512 x 8),
  // nor for fewer rows than SMs (clusters).
  ClusterRowFacts short_row = Row(3008, int64_t{4096}, 8, 2);
  short_row.stray_stores = true;
  EXPECT_FALSE(ChooseSharedRows(short_row, limits, false));
  sliced.rows = 64;
  EXPECT_FALSE(ChooseSharedRows(sliced, limits, false));
}

TEST(ChooseSharedRows, RowsThatNeedBlocksOf1024ThreadsInRegistersTakeTheRowCache) {
  ClusterRowLimits limits;
  limits.static_shared_bytes = 256;
  limits.shared_row_buffers = 0;  // kAuto on sm_90
  limits.bulk_copies = true;
  // bf16 4096 x 32000 (a 32K vocabulary): 64 values a thread at 512 threads -> two caches.
  absl::optional<SharedRowChoice> c = ChooseSharedRows(Row(32000, int64_t{4096}, 8, 2), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->block, 512);
  EXPECT_EQ(c->buffers, 2);
  // 16384 columns: 32 values a thread at 512 threads, registers.
  EXPECT_FALSE(ChooseSharedRows(Row(16384, int64_t{8192}, 8, 2), limits, false));
  // f32 32000 and 20000: the row cache (one: two do not fit 32000); f32 32768, whole chunks of a
  // 1024-thread block: registers.
  c = ChooseSharedRows(Row(32000, int64_t{4096}, 4, 4), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->buffers, 1);
  EXPECT_TRUE(ChooseSharedRows(Row(20000, int64_t{8192}, 4, 4), limits, false));
  EXPECT_FALSE(ChooseSharedRows(Row(32768, int64_t{2048}, 4, 4), limits, false));
  // Another load along the row (a layer norm's weight): registers.
  ClusterRowFacts norm = Row(32000, int64_t{4096}, 8, 2);
  norm.other_loads = 2;
  EXPECT_FALSE(ChooseSharedRows(norm, limits, false));
}

TEST(ChooseSharedRows, ForcedWheneverTheCacheFitsOneBlock) {
  ClusterRowLimits limits;
  limits.static_shared_bytes = 256;
  // f32 2048 x 32768 (registers by default): 128 KiB, one block per SM.
  absl::optional<SharedRowChoice> c = ChooseSharedRows(Row(32768, int64_t{2048}, 4, 4), limits, true);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes, 131072);
  EXPECT_EQ(c->blocks_per_sm, 1);
  // Few rows, bf16 65536 at one block per SM; f32 65536 does not fit.
  c = ChooseSharedRows(Row(65536, int64_t{64}, 8, 2), limits, true);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->blocks_per_sm, 1);
  EXPECT_FALSE(ChooseSharedRows(Row(65536, int64_t{4096}, 4, 4), limits, true));
  // Short rows: as many blocks as fit by threads.
  c = ChooseSharedRows(Row(4096, int64_t{4096}, 4, 4), limits, true);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes, 16384);
  EXPECT_EQ(c->blocks_per_sm, 4);
}

TEST(ChooseSharedRows, TwoCachesWithBulkCopiesWhereTheyFitOneBlock) {
  ClusterRowLimits limits;
  limits.static_shared_bytes = 256;
  limits.shared_row_buffers = 0;  // kAuto
  limits.bulk_copies = true;      // sm_90
  // bf16 50257: two 104 KiB caches and the mbarriers in one block per SM.
  absl::optional<SharedRowChoice> c = ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->buffers, 2);
  EXPECT_EQ(c->bytes, 2 * 106496 + kSharedBulkBytes);
  EXPECT_EQ(c->blocks_per_sm, 1);
  // No bulk copies (sm_80 or an older arch): one cache, two blocks per SM as before.
  ClusterRowLimits no_bulk = limits;
  no_bulk.bulk_copies = false;
  c = ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), no_bulk, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->buffers, 1);
  EXPECT_EQ(c->blocks_per_sm, 2);
  // Other loads along the row (a layer norm's weight and bias): one cache, two blocks per SM.
  ClusterRowFacts layer_norm = Row(50264, int64_t{4096}, 8, 2);
  layer_norm.other_loads = 2;
  c = ChooseSharedRows(layer_norm, limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->buffers, 1);
  EXPECT_EQ(c->blocks_per_sm, 2);
  // Vectors narrower than 16 bytes (bf16 by 4): one cache.
  c = ChooseSharedRows(Row(50264, int64_t{4096}, 4, 2), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->buffers, 1);
  // f32 50257 (201 KiB): two caches do not fit a block; one.
  c = ChooseSharedRows(Row(50260, int64_t{4096}, 4, 4), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->buffers, 1);
  EXPECT_EQ(c->bytes, SharedRowBytes(Row(50260, int64_t{4096}, 4, 4), 512));
  // Forced counts stay as asked.
  limits.shared_row_buffers = 1;
  EXPECT_EQ(ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), limits, false)->buffers, 1);
}

TEST(ChooseSharedRows, Sm80HasLessSharedMemoryAndNoClusters) {
  const ClusterRowLimits limits = Sm80();
  // bf16 50257: 104 KiB, two blocks do not fit 164 KiB: one per SM (refused when two are asked).
  ClusterRowLimits two = limits;
  two.shared_row_blocks_per_sm = 2;
  EXPECT_FALSE(ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), two, false));
  const ClusterRowLimits& one = limits;
  absl::optional<SharedRowChoice> c = ChooseSharedRows(Row(50264, int64_t{4096}, 8, 2), one, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->blocks_per_sm, 1);
  // No clusters: few rows are cached in shared memory too.
  EXPECT_TRUE(ChooseSharedRows(Row(50264, int64_t{16}, 8, 2), one, false));
  // bf16 40000 (80 KiB at 512 threads): two blocks per SM.
  c = ChooseSharedRows(Row(40000, int64_t{4096}, 8, 2), limits, false);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->bytes, 10 * 8 * 512 * 2);
  EXPECT_EQ(c->blocks_per_sm, 2);
  // f32 50257 fits no A100 block.
  EXPECT_FALSE(ChooseSharedRows(Row(50260, int64_t{4096}, 4, 4), limits, true));
}

}  // namespace
}  // namespace kiln::codegen
