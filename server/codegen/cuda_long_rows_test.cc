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
  // f32 262144 needs 8 x 1024 threads x 32 values; twice that is too long for any cluster.
  c = ChooseClusterRows(Facts(262144, int64_t{64}, 1, 4), limits);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->cluster, 8);
  EXPECT_EQ(c->block, 1024);
  EXPECT_FALSE(ChooseClusterRows(Facts(524288, absl::nullopt, 1, 4), limits));
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

}  // namespace
}  // namespace kiln::codegen
