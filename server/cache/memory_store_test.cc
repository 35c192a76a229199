#include "server/cache/memory_store.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

std::string Key(int i) {
  std::string k(64, '0');
  std::string n = std::to_string(i);
  k.replace(64 - n.size(), n.size(), n);
  return k;
}

TEST(MemoryStoreTest, BoundedLruEvictsLeastRecentlyUsedFirst) {
  const std::string value(1000, 'v');
  const int64_t charge = MemoryStore::Charge(Key(0), value, EntryMeta{});
  MemoryStore store(MemoryStoreOptions{10 * charge});
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(store.Put(Key(i), value, {}).ok());
  EXPECT_EQ(store.Stats().entries, 10);
  ASSERT_TRUE(store.Get(Key(0))->has_value());  // 0 is now most recently used
  for (int i = 10; i < 30; ++i) {
    ASSERT_TRUE(store.Put(Key(i), value, {}).ok());
    ASSERT_TRUE(store.Get(Key(0))->has_value());
    ASSERT_LE(store.Stats().bytes, 10 * charge);
  }
  EXPECT_TRUE(store.Peek(Key(0))->has_value());
  EXPECT_FALSE(store.Peek(Key(1))->has_value());
  EXPECT_TRUE(store.Peek(Key(29))->has_value());
  EXPECT_FALSE(store.Peek(Key(20))->has_value());  // 9 slots after key 0: keys 21..29
  EXPECT_EQ(store.Stats().evictions, 20);
  auto list = *store.List();
  ASSERT_EQ(list.size(), 10u);
  EXPECT_EQ(list.front().key, Key(0));  // touched last; Peek does not move entries
  EXPECT_EQ(list[1].key, Key(29));
  EXPECT_EQ(list.back().key, Key(21));
}

TEST(MemoryStoreTest, TooLargeValueIsRefusedAndHitsAreCounted) {
  MemoryStore store(MemoryStoreOptions{4096});
  EXPECT_EQ(store.Put(Key(1), std::string(5000, 'x'), {}).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.Stats().entries, 0);
  EntryMeta meta;
  meta.debug_name = "n";
  meta.hits = 3;  // seeded by a tier-to-tier copy
  ASSERT_TRUE(store.Put(Key(2), "abc", meta).ok());
  EXPECT_EQ(**store.Get(Key(2)), "abc");
  auto m = *store.Stat(Key(2));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->hits, 4);
  EXPECT_EQ(m->debug_name, "n");
  EXPECT_FALSE(store.Get(Key(3))->has_value());
  EXPECT_EQ(store.Stats().misses, 1);
  EXPECT_EQ(store.Get("not a key").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*store.Remove(Key(2)), MemoryStore::Charge(Key(2), "abc", meta));
  EXPECT_EQ(store.Remove(Key(2)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Stats().bytes, 0);
}

TEST(MemoryStoreTest, PurgeOlderThan) {
  MemoryStore store;
  EntryMeta old;
  old.created_unix_ms = 1000;
  ASSERT_TRUE(store.Put(Key(1), "a", old).ok());
  ASSERT_TRUE(store.Put(Key(2), "b", {}).ok());
  PurgeOptions options;
  options.older_than_unix_ms = 2000;
  EXPECT_EQ(store.Purge(options)->removed, 1);
  EXPECT_TRUE(store.Peek(Key(2))->has_value());
}

}  // namespace
}  // namespace kiln::cache
