#include "server/cache/local_cache.h"

#include "gtest/gtest.h"
#include "server/cache/entry_record.h"
#include "server/cache/test_util.h"

namespace kiln::cache {
namespace {

using testing::ScratchDir;
using testing::TestKey;

// The path kilnd takes: encode a record, store it, read it back from each tier after a restart.
TEST(LocalCacheTest, StoresRecordsAcrossRestartAndReportsTiers) {
  ScratchDir dir;
  LocalCacheOptions options;
  options.dir = dir.Sub("cache");
  EntryRecord record;
  record.artifact = "serialized kiln.v1.Artifact";
  record.sections.push_back({"source/k0.cpp", "void k0() {}"});
  record.sections.push_back({"log", "g++ -O3: ok"});
  EntryMeta meta;
  meta.target = "cpu:x86-64-v3";
  meta.graph_summary = "forward, 4 nodes, 1 kernel";
  meta.debug_name = "model.forward";
  {
    auto cache = OpenLocalCache(options);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ((*cache)->Put(TestKey(1), EncodeEntryRecord(record), meta), 2);
    EXPECT_EQ((*cache)->Get(TestKey(1))->tier, Tier::kMemory);
  }
  auto cache = OpenLocalCache(options);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto hit = (*cache)->Get(TestKey(1));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tier, Tier::kDisk);
  auto decoded = DecodeEntryRecord(hit->value);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->artifact, record.artifact);
  EXPECT_EQ(decoded->Find("log")->data, "g++ -O3: ok");
  auto listed = (*cache)->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].debug_name, "model.forward");
  EXPECT_EQ(listed[0].hits, 2);  // the memory hit before the restart was recorded on disk
}

TEST(LocalCacheTest, WithoutMemoryTierAndOnAnUnusableDirectory) {
  ScratchDir dir;
  LocalCacheOptions options;
  options.dir = dir.Sub("c");
  options.memory_max_bytes = 0;
  auto cache = OpenLocalCache(options);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->Stats().tiers.size(), 1u);
  EXPECT_EQ((*cache)->store(Tier::kMemory), nullptr);
  testing::WriteAll(dir.Sub("f"), "x");
  options.dir = dir.Sub("f") + "/c";
  auto bad = OpenLocalCache(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kiln::cache
