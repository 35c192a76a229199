#include "server/lower/memory_plan.h"

#include "gtest/gtest.h"

namespace kiln::lower {
namespace {

TEST(MemoryPlanTest, ReusesByLiveness) {
  // a: steps 0-1, b: 1-2, c: 2-3. a and c never live together: c reuses a's bytes.
  auto p = PlanMemory({{100, 0, 1}, {100, 1, 2}, {100, 2, 3}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->offsets, (std::vector<int64_t>{0, 128, 0}));
  EXPECT_EQ(p->workspace_bytes, 256);
}

TEST(MemoryPlanTest, PeakIsTheSumOfWhatIsLiveTogether) {
  auto p = PlanMemory({{1000, 0, 5}, {64, 1, 2}, {64, 3, 4}, {512, 2, 3}});
  ASSERT_TRUE(p.ok()) << p.status();
  // 1000 -> 1024 at 0; 512 at 1024; the two 64-byte buffers overlap 512's range at its ends.
  EXPECT_EQ(p->offsets[0], 0);
  EXPECT_EQ(p->offsets[3], 1024);
  EXPECT_EQ(p->offsets[1], 1536);
  EXPECT_EQ(p->offsets[2], 1536);
  EXPECT_EQ(p->workspace_bytes, 1600);
}

TEST(MemoryPlanTest, AlignsEveryBuffer) {
  auto p = PlanMemory({{1, 0, 0}, {3, 0, 0}, {65, 0, 0}, {0, 0, 0}}, 64);
  ASSERT_TRUE(p.ok()) << p.status();
  for (int64_t o : p->offsets) EXPECT_EQ(o % 64, 0);
  EXPECT_EQ(p->workspace_bytes, 128 + 64 + 64 + 64);
}

TEST(MemoryPlanTest, BestFitChoosesTheSmallestGap) {
  // Long-lived 256 at 0 and 256 at 256+... then a hole is left by a short-lived buffer.
  // big0 [0,9] 256, small [0,0] 64, big1 [0,9] 256 -> layout: big0 0, big1 256, small 512.
  // later: x [5,6] 64 fits the 64-byte gap above big1 (small is dead by then).
  auto p = PlanMemory({{256, 0, 9}, {256, 0, 9}, {64, 0, 0}, {64, 5, 6}});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->offsets[2], 512);
  EXPECT_EQ(p->offsets[3], 512);
  EXPECT_EQ(p->workspace_bytes, 576);
}

TEST(MemoryPlanTest, EmptyAndInvalid) {
  auto p = PlanMemory({});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->workspace_bytes, 0);
  EXPECT_FALSE(PlanMemory({{-1, 0, 0}}).ok());
  EXPECT_FALSE(PlanMemory({{8, 3, 2}}).ok());
}

}  // namespace
}  // namespace kiln::lower
