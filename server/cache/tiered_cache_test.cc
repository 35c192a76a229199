#include "server/cache/tiered_cache.h"

#include <filesystem>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/cache/disk_store.h"
#include "server/cache/memory_store.h"
#include "server/cache/test_util.h"

namespace kiln::cache {
namespace {

using testing::ScratchDir;
using testing::TestKey;
using testing::TestValue;

// TEST DOUBLE for the failure path only: a shared tier whose server is down. Every call fails
// with UNAVAILABLE while `down` is true; otherwise it behaves as an empty, read-only tier.
class UnreachableSharedTier : public Store {
 public:
  std::atomic<bool> down{true};
  std::atomic<int> calls{0};

  absl::string_view Name() const override { return "unreachable-test-double"; }
  absl::StatusOr<std::optional<Bytes>> Read(absl::string_view, bool) override {
    if (Fail()) return Down();
    return std::optional<Bytes>();
  }
  absl::Status Touch(absl::string_view) override { return Fail() ? Down() : absl::OkStatus(); }
  absl::Status Put(absl::string_view, absl::string_view, const EntryMeta&) override {
    return Fail() ? Down() : absl::OkStatus();
  }
  absl::StatusOr<int64_t> Remove(absl::string_view) override {
    if (Fail()) return Down();
    return absl::NotFoundError("empty");
  }
  absl::StatusOr<std::optional<EntryMeta>> Stat(absl::string_view) override {
    if (Fail()) return Down();
    return std::optional<EntryMeta>();
  }
  absl::StatusOr<std::vector<EntryMeta>> List() override {
    if (Fail()) return Down();
    return std::vector<EntryMeta>();
  }
  StoreStats Stats() const override { return {}; }
  absl::StatusOr<PurgeResult> Purge(const PurgeOptions&) override {
    if (Fail()) return Down();
    return PurgeResult();
  }
  absl::StatusOr<VerifyResult> Verify() override {
    if (Fail()) return Down();
    return VerifyResult();
  }

 private:
  bool Fail() {
    ++calls;
    return down.load();
  }
  static absl::Status Down() { return absl::UnavailableError("connection refused (test double)"); }
};

std::unique_ptr<DiskStore> OpenDisk(const std::string& dir) {
  DiskStoreOptions o;
  o.dir = dir;
  o.index_flush_interval = absl::ZeroDuration();
  auto s = DiskStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

std::vector<TieredCache::TierSpec> MemoryAndDisk(const std::string& dir, MemoryStore** memory,
                                                 DiskStore** disk) {
  auto m = std::make_unique<MemoryStore>();
  auto d = OpenDisk(dir);
  *memory = m.get();
  *disk = d.get();
  std::vector<TieredCache::TierSpec> tiers;
  tiers.push_back({Tier::kMemory, std::move(m)});
  tiers.push_back({Tier::kDisk, std::move(d)});
  return tiers;
}

EntryMeta Meta() {
  EntryMeta m;
  m.target = "cpu:x86-64-v3";
  m.graph_summary = "forward, 2 nodes";
  m.debug_name = "f";
  return m;
}

TEST(TieredCacheTest, ReportsTheTierThatHitAndPromotes) {
  ScratchDir dir;
  MemoryStore* memory;
  DiskStore* disk;
  TieredCache cache(MemoryAndDisk(dir.path(), &memory, &disk));
  const std::string key = TestKey(1), value = TestValue(1, 3000);
  EXPECT_FALSE(cache.Get(key).has_value());
  EXPECT_EQ(cache.Put(key, value, Meta()), 2);  // written through
  EXPECT_TRUE(memory->Peek(key)->has_value());
  EXPECT_TRUE(disk->Peek(key)->has_value());

  auto hit = cache.Get(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tier, Tier::kMemory);
  EXPECT_EQ(hit->value, value);

  ASSERT_TRUE(memory->Remove(key).ok());  // e.g. evicted from memory
  hit = cache.Get(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tier, Tier::kDisk);
  EXPECT_EQ(hit->value, value);
  // Promoted with its metadata: the next hit is from memory.
  auto promoted = *memory->Stat(key);
  ASSERT_TRUE(promoted.has_value());
  EXPECT_EQ(promoted->debug_name, "f");
  EXPECT_EQ(promoted->created_unix_ms, (*disk->Stat(key))->created_unix_ms);
  hit = cache.Get(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->tier, Tier::kMemory);

  // Three hits: memory, disk, memory. The disk saw all three (two through Touch); the promoted
  // memory copy carried the disk's count.
  EXPECT_EQ((*disk->Stat(key))->hits, 3);
  EXPECT_EQ((*memory->Stat(key))->hits, 3);
  auto merged = cache.Stat(key);
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->hits, 3);
  auto list = cache.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].hits, 3);
  EXPECT_EQ(list[0].target, "cpu:x86-64-v3");

  TieredCacheStats stats = cache.Stats();
  EXPECT_EQ(stats.lookups, 4);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.tiers[0].hits, 2);
  EXPECT_EQ(stats.tiers[1].hits, 1);

  EXPECT_TRUE(cache.Remove(key).ok());
  EXPECT_EQ(cache.Remove(key).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(cache.Get(key).has_value());
}

TEST(TieredCacheTest, AnEntryHotInMemoryIsNotEvictedFromDisk) {
  ScratchDir dir;
  DiskStoreOptions o;
  o.dir = dir.path();
  o.max_bytes = 40 * 1024;
  o.index_flush_interval = absl::ZeroDuration();
  auto disk_or = DiskStore::Open(o);
  ASSERT_TRUE(disk_or.ok());
  DiskStore* disk = disk_or->get();
  std::vector<TieredCache::TierSpec> tiers;
  tiers.push_back({Tier::kMemory, std::make_unique<MemoryStore>()});
  tiers.push_back({Tier::kDisk, *std::move(disk_or)});
  TieredCache cache(std::move(tiers));
  cache.Put(TestKey(0), TestValue(0, 2000), Meta());
  for (int i = 1; i < 60; ++i) {  // three times what the disk holds
    cache.Put(TestKey(i), TestValue(i, 2000), Meta());
    ASSERT_EQ(cache.Get(TestKey(0))->tier, Tier::kMemory);
  }
  EXPECT_GT(disk->Stats().evictions, 0);
  EXPECT_TRUE(disk->Peek(TestKey(0))->has_value());
  EXPECT_FALSE(disk->Peek(TestKey(1))->has_value());
  EXPECT_EQ((*disk->Stat(TestKey(0)))->hits, 59);  // the disk counted memory's hits
  EXPECT_EQ(disk->Stats().hits, 0);                 // but did not serve them
}

TEST(TieredCacheTest, AfterRestartTheFirstHitIsFromDisk) {
  ScratchDir dir;
  const std::string key = TestKey(7);
  {
    MemoryStore* memory;
    DiskStore* disk;
    TieredCache cache(MemoryAndDisk(dir.path(), &memory, &disk));
    cache.Put(key, "artifact", Meta());
  }
  MemoryStore* memory;
  DiskStore* disk;
  TieredCache cache(MemoryAndDisk(dir.path(), &memory, &disk));
  EXPECT_EQ(cache.Get(key)->tier, Tier::kDisk);
  EXPECT_EQ(cache.Get(key)->tier, Tier::kMemory);
}

TEST(TieredCacheTest, RemovedDiskDirectoryIsSkippedCountedAndRetried) {
  ScratchDir dir;
  const std::string store_dir = dir.Sub("store");
  MemoryStore* memory;
  DiskStore* disk;
  TieredCacheOptions options;
  options.failure_backoff = absl::Milliseconds(200);
  TieredCache cache(MemoryAndDisk(store_dir, &memory, &disk), options);
  cache.Put(TestKey(1), "one", Meta());

  // The disk tier's directory disappears (an operator's rm -rf, a lost mount).
  std::filesystem::remove_all(store_dir);
  EXPECT_EQ(cache.Put(TestKey(2), "two", Meta()), 1);  // memory only; no error to the caller
  TieredCacheStats stats = cache.Stats();
  EXPECT_TRUE(stats.tiers[1].failed);
  EXPECT_EQ(stats.tiers[1].failures, 1);
  EXPECT_EQ(stats.tiers[1].store.errors, 1);
  EXPECT_NE(stats.tiers[1].last_error.find(store_dir), std::string::npos);

  // While marked failed it is skipped, not called.
  EXPECT_EQ(cache.Put(TestKey(3), "three", Meta()), 1);
  EXPECT_EQ(cache.Get(TestKey(3))->tier, Tier::kMemory);
  EXPECT_FALSE(cache.Get(TestKey(4)).has_value());
  stats = cache.Stats();
  EXPECT_GE(stats.tiers[1].skipped, 2);
  EXPECT_EQ(stats.tiers[1].store.errors, 1);

  // After the backoff it is tried again; the directory is back, so it recovers.
  std::filesystem::create_directories(store_dir);
  absl::SleepFor(absl::Milliseconds(250));
  EXPECT_EQ(cache.Put(TestKey(5), "five", Meta()), 2);
  EXPECT_FALSE(cache.Stats().tiers[1].failed);
  EXPECT_EQ(**disk->Peek(TestKey(5)), "five");
}

TEST(TieredCacheTest, DiskDirectoryReplacedByAFileFailsReadsWithoutFailingTheCaller) {
  ScratchDir dir;
  const std::string store_dir = dir.Sub("store");
  MemoryStore* memory;
  DiskStore* disk;
  TieredCache cache(MemoryAndDisk(store_dir, &memory, &disk));
  cache.Put(TestKey(1), "one", Meta());
  ASSERT_TRUE(memory->Remove(TestKey(1)).ok());
  std::filesystem::remove_all(store_dir);
  testing::WriteAll(store_dir, "a file where the cache directory was");
  EXPECT_FALSE(cache.Get(TestKey(1)).has_value());  // ENOTDIR: a tier failure, reported as a miss
  TieredCacheStats stats = cache.Stats();
  EXPECT_TRUE(stats.tiers[1].failed);
  EXPECT_EQ(stats.tiers[1].failures, 1);
  EXPECT_EQ(stats.misses, 1);
}

TEST(TieredCacheTest, UnreachableSharedTierIsSkippedAndRecovers) {
  ScratchDir dir;
  MemoryStore* memory;
  DiskStore* disk;
  auto tiers = MemoryAndDisk(dir.path(), &memory, &disk);
  auto shared = std::make_unique<UnreachableSharedTier>();
  UnreachableSharedTier* shared_ptr = shared.get();
  tiers.push_back({Tier::kShared, std::move(shared)});
  TieredCacheOptions options;
  options.failure_backoff = absl::Milliseconds(100);
  TieredCache cache(std::move(tiers), options);

  EXPECT_FALSE(cache.Get(TestKey(1)).has_value());  // falls through to the failing tier
  EXPECT_EQ(shared_ptr->calls.load(), 1);
  EXPECT_EQ(cache.Put(TestKey(1), "v", Meta()), 2);  // skipped: still 1 call
  EXPECT_EQ(shared_ptr->calls.load(), 1);
  EXPECT_EQ(cache.Get(TestKey(1))->tier, Tier::kMemory);
  EXPECT_EQ(cache.List().size(), 1u);  // admin still works without the shared tier
  EXPECT_EQ(cache.Stats().tiers[2].failures, 1);

  shared_ptr->down = false;
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_EQ(cache.Put(TestKey(2), "w", Meta()), 3);
  EXPECT_FALSE(cache.Stats().tiers[2].failed);
}

TEST(TieredCacheTest, ValueTooLargeForMemoryIsNotATierFailure) {
  ScratchDir dir;
  std::vector<TieredCache::TierSpec> tiers;
  tiers.push_back({Tier::kMemory, std::make_unique<MemoryStore>(MemoryStoreOptions{1024})});
  tiers.push_back({Tier::kDisk, OpenDisk(dir.path())});
  TieredCache cache(std::move(tiers));
  EXPECT_EQ(cache.Put(TestKey(1), TestValue(1, 4096), Meta()), 1);
  EXPECT_FALSE(cache.Stats().tiers[0].failed);
  EXPECT_EQ(cache.Get(TestKey(1))->tier, Tier::kDisk);
  EXPECT_FALSE(cache.Stats().tiers[0].failed);
  EXPECT_FALSE(cache.Get("../etc/passwd").has_value());
  EXPECT_FALSE(cache.Stats().tiers[0].failed);
  EXPECT_FALSE(cache.Stats().tiers[1].failed);
}

}  // namespace
}  // namespace kiln::cache
