#include "server/cache/disk_store.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/cache/disk_format.h"
#include "server/cache/test_util.h"

namespace kiln::cache {
namespace {

using testing::EntryFileBytes;
using testing::Exists;
using testing::ScratchDir;
using testing::TestKey;
using testing::TestValue;

DiskStoreOptions Options(const std::string& dir, int64_t max_bytes = int64_t{1} << 30) {
  DiskStoreOptions o;
  o.dir = dir;
  o.max_bytes = max_bytes;
  o.index_flush_interval = absl::ZeroDuration();
  return o;
}

std::unique_ptr<DiskStore> OpenOrDie(const DiskStoreOptions& o) {
  absl::StatusOr<std::unique_ptr<DiskStore>> s = DiskStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

EntryMeta Meta(const std::string& name) {
  EntryMeta m;
  m.target = "cuda:sm_90";
  m.graph_summary = "forward, 3 nodes, 1 kernel";
  m.debug_name = name;
  return m;
}

std::vector<std::string> Keys(const std::vector<EntryMeta>& list) {
  std::vector<std::string> out;
  for (const EntryMeta& m : list) out.push_back(m.key);
  return out;
}

TEST(DiskStoreTest, PutGetKeepsBytesAndMetadata) {
  ScratchDir dir;
  auto store = OpenOrDie(Options(dir.path()));
  const std::string key = TestKey(1), value = TestValue(1, 5000);
  ASSERT_TRUE(store->Put(key, value, Meta("fwd_1")).ok());
  EXPECT_TRUE(Exists(dir.path() + "/" + key.substr(0, 2) + "/" + key));
  auto got = store->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, value);
  auto meta = store->Stat(key);
  ASSERT_TRUE(meta.ok() && meta->has_value());
  EXPECT_EQ((*meta)->key, key);
  EXPECT_EQ((*meta)->target, "cuda:sm_90");
  EXPECT_EQ((*meta)->graph_summary, "forward, 3 nodes, 1 kernel");
  EXPECT_EQ((*meta)->debug_name, "fwd_1");
  EXPECT_EQ((*meta)->hits, 1);
  EXPECT_GT((*meta)->created_unix_ms, 0);
  EXPECT_GE((*meta)->last_hit_unix_ms, (*meta)->created_unix_ms);
  EXPECT_GT((*meta)->size_bytes, 5000);
  // A miss is OK with no value, not an error.
  auto miss = store->Get(TestKey(2));
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->has_value());
  // Peek does not count.
  ASSERT_TRUE(store->Peek(key).ok());
  EXPECT_EQ((*store->Stat(key))->hits, 1);
  StoreStats stats = store->Stats();
  EXPECT_EQ(stats.entries, 1);
  EXPECT_EQ(stats.hits, 1);
  EXPECT_EQ(stats.misses, 1);
  EXPECT_EQ(stats.bytes, EntryFileBytes(dir.path()));
}

TEST(DiskStoreTest, RestartKeepsEntriesMetadataHitsAndLruOrder) {
  ScratchDir dir;
  std::vector<EntryMeta> before;
  {
    auto store = OpenOrDie(Options(dir.path()));
    for (int i = 0; i < 6; ++i) {
      ASSERT_TRUE(store->Put(TestKey(i), TestValue(i, 1000 + i), Meta("e" + std::to_string(i))).ok());
    }
    // Touch in an order unlike creation: 2, 0, 4, 2.
    for (int i : {2, 0, 4, 2}) ASSERT_TRUE(store->Get(TestKey(i)).ok());
    before = *store->List();
    ASSERT_EQ(before.front().key, TestKey(2));
    ASSERT_EQ(before.front().hits, 2);
  }
  auto store = OpenOrDie(Options(dir.path()));
  EXPECT_TRUE(store->open_report().index_ok);
  EXPECT_EQ(store->open_report().from_index, 6);
  EXPECT_EQ(store->open_report().scanned, 0);
  std::vector<EntryMeta> after = *store->List();
  EXPECT_EQ(Keys(after), Keys(before));
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].hits, before[i].hits) << i;
    EXPECT_EQ(after[i].created_unix_ms, before[i].created_unix_ms) << i;
    EXPECT_EQ(after[i].last_hit_unix_ms, before[i].last_hit_unix_ms) << i;
    EXPECT_EQ(after[i].size_bytes, before[i].size_bytes) << i;
    EXPECT_EQ(after[i].debug_name, before[i].debug_name) << i;
    EXPECT_EQ(after[i].target, before[i].target) << i;
  }
  for (int i = 0; i < 6; ++i) {
    auto got = store->Get(TestKey(i));
    ASSERT_TRUE(got.ok() && got->has_value()) << i;
    EXPECT_EQ(**got, TestValue(i, 1000 + i));
  }
  EXPECT_EQ(store->Stats().bytes, EntryFileBytes(dir.path()));
}

TEST(DiskStoreTest, MissingOrDamagedIndexIsRebuiltFromEntryHeaders) {
  ScratchDir dir;
  {
    auto store = OpenOrDie(Options(dir.path()));
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(store->Put(TestKey(i), TestValue(i, 300), Meta("x")).ok());
  }
  testing::FlipByte(dir.path() + "/index", 20);
  {
    auto store = OpenOrDie(Options(dir.path()));
    EXPECT_FALSE(store->open_report().index_ok);
    EXPECT_EQ(store->open_report().scanned, 4);
    EXPECT_EQ(store->Stats().entries, 4);
    EXPECT_EQ((*store->Stat(TestKey(3)))->debug_name, "x");
    EXPECT_EQ(**store->Get(TestKey(3)), TestValue(3, 300));
  }
  ASSERT_TRUE(std::filesystem::remove(dir.path() + "/index"));
  auto store = OpenOrDie(Options(dir.path()));
  EXPECT_EQ(store->open_report().scanned, 4);
  EXPECT_EQ(store->Stats().entries, 4);
}

// A crash after entries changed but before the index was rewritten: the stale index must not
// corrupt the accounting, and entries written since are found by the scan.
TEST(DiskStoreTest, StaleIndexAfterACrashIsReconciledWithTheFiles) {
  ScratchDir dir;
  std::string old_index;
  {
    auto store = OpenOrDie(Options(dir.path()));
    ASSERT_TRUE(store->Put(TestKey(1), TestValue(1, 100), Meta("a")).ok());
    ASSERT_TRUE(store->Put(TestKey(2), TestValue(2, 100), Meta("b")).ok());
    ASSERT_TRUE(store->Flush().ok());
    old_index = testing::ReadAll(dir.path() + "/index");
    ASSERT_TRUE(store->Put(TestKey(1), TestValue(1, 5000), Meta("a2")).ok());  // rewritten
    ASSERT_TRUE(store->Remove(TestKey(2)).ok());                               // removed
    ASSERT_TRUE(store->Put(TestKey(3), TestValue(3, 700), Meta("c")).ok());    // new
  }
  testing::WriteAll(dir.path() + "/index", old_index);  // as if the process had died here
  auto store = OpenOrDie(Options(dir.path()));
  EXPECT_EQ(store->open_report().from_index, 1);
  EXPECT_EQ(store->open_report().dropped, 1);
  EXPECT_EQ(store->open_report().scanned, 1);
  EXPECT_EQ(store->Stats().entries, 2);
  EXPECT_EQ(store->Stats().bytes, EntryFileBytes(dir.path()));
  EXPECT_EQ(**store->Get(TestKey(1)), TestValue(1, 5000));
  EXPECT_EQ(**store->Get(TestKey(3)), TestValue(3, 700));
  EXPECT_EQ(Keys(*store->List()).front(), TestKey(3));  // read last
}

TEST(DiskStoreTest, StaysWithinBoundAndEvictsLeastRecentlyUsedFirst) {
  ScratchDir dir;
  const int64_t max_bytes = 64 * 1024;
  auto store = OpenOrDie(Options(dir.path(), max_bytes));
  const size_t value_size = 4000;
  // Write twice the bound; keep touching entry 0 so that it stays recently used.
  int n = 0;
  for (int64_t written = 0; written < 2 * max_bytes; written += value_size, ++n) {
    ASSERT_TRUE(store->Put(TestKey(n), TestValue(n, value_size), Meta("v")).ok());
    ASSERT_TRUE(store->Get(TestKey(0)).ok());
    ASSERT_LE(store->Stats().bytes, max_bytes);
    ASSERT_LE(EntryFileBytes(dir.path()), max_bytes);
  }
  StoreStats stats = store->Stats();
  EXPECT_GT(stats.evictions, 0);
  EXPECT_EQ(stats.bytes, EntryFileBytes(dir.path()));
  EXPECT_GE(stats.bytes, max_bytes - 2 * static_cast<int64_t>(value_size));
  // The touched old entry survived; its untouched neighbours (oldest) went first.
  EXPECT_TRUE(store->Get(TestKey(0))->has_value());
  EXPECT_FALSE(store->Peek(TestKey(1))->has_value());
  EXPECT_FALSE(store->Peek(TestKey(2))->has_value());
  EXPECT_TRUE(store->Peek(TestKey(n - 1))->has_value());
  // Survivors are exactly a suffix of the write order (plus entry 0).
  auto list = *store->List();
  int first_kept = n;
  for (int i = n - 1; i >= 1 && store->Peek(TestKey(i))->has_value(); --i) first_kept = i;
  EXPECT_EQ(static_cast<int>(list.size()), 1 + (n - first_kept));
  // A value larger than the whole store is refused, not stored.
  auto big = store->Put(TestKey(9999), TestValue(1, max_bytes + 1), Meta("big"));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  // A smaller bound at reopen evicts down to it.
  store.reset();
  auto smaller = OpenOrDie(Options(dir.path(), max_bytes / 2));
  EXPECT_LE(smaller->Stats().bytes, max_bytes / 2);
  EXPECT_LE(EntryFileBytes(dir.path()), max_bytes / 2);
  EXPECT_TRUE(smaller->Peek(TestKey(0))->has_value());
}

// Each mutation damages an entry file in a different place; every one must read as a miss.
struct Damage {
  const char* name;
  void (*apply)(const std::string& path);
};

const Damage kDamages[] = {
    {"payload byte", [](const std::string& p) { testing::FlipByte(p, std::filesystem::file_size(p) - 7); }},
    {"first payload byte", [](const std::string& p) {
       testing::FlipByte(p, std::filesystem::file_size(p) - 2000); }},
    {"magic", [](const std::string& p) { testing::FlipByte(p, 0); }},
    {"version", [](const std::string& p) { testing::FlipByte(p, 8); }},
    {"meta length", [](const std::string& p) { testing::FlipByte(p, 12); }},
    {"payload length", [](const std::string& p) { testing::FlipByte(p, 17); }},
    {"hash", [](const std::string& p) { testing::FlipByte(p, 40); }},
    {"meta", [](const std::string& p) { testing::FlipByte(p, kEntryHeaderSize + 10); }},
    {"truncated", [](const std::string& p) {
       std::filesystem::resize_file(p, std::filesystem::file_size(p) - 1); }},
    {"truncated into header", [](const std::string& p) { std::filesystem::resize_file(p, 30); }},
    {"empty", [](const std::string& p) { std::filesystem::resize_file(p, 0); }},
    {"appended", [](const std::string& p) { testing::WriteAll(p, testing::ReadAll(p) + "x"); }},
};

TEST(DiskStoreTest, DamagedEntriesAreNeverServedAndAreRemoved) {
  ScratchDir dir;
  auto store = OpenOrDie(Options(dir.path()));
  int i = 0;
  for (const Damage& damage : kDamages) {
    SCOPED_TRACE(damage.name);
    const std::string key = TestKey(100 + i);
    ASSERT_TRUE(store->Put(key, TestValue(i, 2000), Meta("d")).ok());
    const std::string path = store->EntryPath(key);
    damage.apply(path);
    const int64_t corruptions = store->Stats().corruptions;
    auto got = store->Get(key);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->has_value());
    EXPECT_EQ(store->Stats().corruptions, corruptions + 1);
    EXPECT_FALSE(Exists(path));
    EXPECT_FALSE(store->Stat(key)->has_value());
    // A later good write of the same key works again.
    ASSERT_TRUE(store->Put(key, TestValue(i, 2000), Meta("d")).ok());
    EXPECT_EQ(**store->Get(key), TestValue(i, 2000));
    ++i;
  }
  EXPECT_EQ(store->Stats().bytes, EntryFileBytes(dir.path()));
}

TEST(DiskStoreTest, VerifyFindsAndRemovesCorruptEntries) {
  ScratchDir dir;
  auto store = OpenOrDie(Options(dir.path()));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store->Put(TestKey(i), TestValue(i, 500), Meta("v")).ok());
  testing::FlipByte(store->EntryPath(TestKey(1)), 300);
  testing::FlipByte(store->EntryPath(TestKey(3)), 0);
  auto result = store->Verify();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->checked, 5);
  EXPECT_EQ(result->ok, 3);
  std::vector<std::string> corrupt = result->corrupt_keys;
  std::sort(corrupt.begin(), corrupt.end());
  std::vector<std::string> want = {TestKey(1), TestKey(3)};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(corrupt, want);
  EXPECT_EQ(store->Stats().entries, 3);
  EXPECT_EQ(store->Stats().corruptions, 2);
  EXPECT_FALSE(Exists(store->EntryPath(TestKey(1))));
}

TEST(DiskStoreTest, CorruptEntryFoundAtStartupIsRemoved) {
  ScratchDir dir;
  {
    auto store = OpenOrDie(Options(dir.path()));
    ASSERT_TRUE(store->Put(TestKey(1), TestValue(1, 500), Meta("v")).ok());
  }
  std::filesystem::remove(dir.path() + "/index");
  const std::string path = dir.path() + "/" + TestKey(1).substr(0, 2) + "/" + TestKey(1);
  testing::FlipByte(path, 1);
  auto store = OpenOrDie(Options(dir.path()));
  EXPECT_EQ(store->open_report().corrupt, 1);
  EXPECT_EQ(store->Stats().corruptions, 1);
  EXPECT_FALSE(Exists(path));
}

TEST(DiskStoreTest, OverlongMetadataIsCutAndSurvivesARescan) {
  ScratchDir dir;
  {
    auto store = OpenOrDie(Options(dir.path()));
    EntryMeta m = Meta(std::string(10000, 'n'));
    m.graph_summary = std::string(9000, 's');
    ASSERT_TRUE(store->Put(TestKey(1), "v", m).ok());
    EXPECT_EQ((*store->Stat(TestKey(1)))->debug_name.size(), kMaxMetaField);
  }
  std::filesystem::remove(dir.path() + "/index");
  auto store = OpenOrDie(Options(dir.path()));
  EXPECT_EQ(store->open_report().scanned, 1);
  EXPECT_EQ((*store->Stat(TestKey(1)))->graph_summary, std::string(kMaxMetaField, 's'));
  EXPECT_EQ(**store->Get(TestKey(1)), "v");
}

TEST(DiskStoreTest, KeysThatAreNotSha256HexAreRefused) {
  ScratchDir dir;
  auto store = OpenOrDie(Options(dir.path() + "/cache"));
  const std::string bad[] = {
      "../../../../../../etc/passwd", std::string(64, 'A'), std::string(63, 'a'),
      std::string(65, 'a'), "../" + std::string(61, 'a'), std::string(62, 'a') + "/.",
      std::string(63, 'a') + std::string(1, '\0'), ""};
  for (const std::string& key : bad) {
    EXPECT_EQ(store->Put(key, "v", Meta("x")).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Get(key).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Remove(key).status().code(), absl::StatusCode::kInvalidArgument);
  }
  // Nothing was written next to the store's directory.
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename(), "cache");
  }
}

TEST(DiskStoreTest, OpenFailsClearlyOnUnusableDirectory) {
  ScratchDir dir;
  testing::WriteAll(dir.Sub("file"), "not a directory");
  auto under_file = DiskStore::Open(Options(dir.Sub("file") + "/cache"));
  ASSERT_FALSE(under_file.ok());
  EXPECT_EQ(under_file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(under_file.status().message().find(dir.Sub("file")), absl::string_view::npos)
      << under_file.status();
  auto is_file = DiskStore::Open(Options(dir.Sub("file")));
  EXPECT_EQ(is_file.status().code(), absl::StatusCode::kFailedPrecondition);
  // One process per directory.
  auto first = OpenOrDie(Options(dir.Sub("c")));
  auto second = DiskStore::Open(Options(dir.Sub("c")));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use"), absl::string_view::npos) << second.status();
}

// Opens `dir` as an unprivileged user (root ignores permissions): 0 = opened, 1 = refused with
// FAILED_PRECONDITION naming the reason, 2 = something else, 3 = could not drop privileges.
int OpenAsNobody(const std::string& dir) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    auto store = DiskStore::Open(Options(dir));
    if (store.ok()) ::_exit(0);
    const bool clear = store.status().code() == absl::StatusCode::kFailedPrecondition &&
                       store.status().message().find(dir) != absl::string_view::npos &&
                       store.status().message().find("Permission denied") != absl::string_view::npos;
    ::_exit(clear ? 1 : 2);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(DiskStoreTest, UnwritableDirectoryFailsAtOpen) {
  // Under /tmp, which any user may traverse (the test's own tmpdir may not be).
  char pattern[] = "/tmp/kiln_cache_perm_XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string base = pattern;
  ::chmod(base.c_str(), 0755);
  std::filesystem::create_directory(base + "/ro");
  std::filesystem::create_directory(base + "/rw");
  ::chmod((base + "/ro").c_str(), 0555);
  ::chmod((base + "/rw").c_str(), 0777);
  const int ro = OpenAsNobody(base + "/ro");
  if (ro == 3) {
    std::filesystem::remove_all(base);
    GTEST_SKIP() << "cannot drop privileges to uid 65534 here";
  }
  EXPECT_EQ(ro, 1);
  EXPECT_EQ(OpenAsNobody(base + "/ro/sub"), 1);
  EXPECT_EQ(OpenAsNobody(base + "/rw"), 0);  // the control: same user, writable directory
  std::filesystem::remove_all(base);
}

TEST(DiskStoreTest, IndexIsRewrittenPeriodicallyWithHits) {
  ScratchDir dir;
  DiskStoreOptions o = Options(dir.path());
  o.index_flush_interval = absl::Milliseconds(20);
  auto store = OpenOrDie(o);
  ASSERT_TRUE(store->Put(TestKey(1), "v", Meta("p")).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Get(TestKey(1)).ok());
  absl::StatusOr<std::vector<EntryMeta>> index;
  for (int attempt = 0; attempt < 200; ++attempt) {  // up to 2 s
    absl::SleepFor(absl::Milliseconds(10));
    index = DecodeIndex(testing::ReadAll(dir.path() + "/index"));
    if (index.ok() && index->size() == 1 && (*index)[0].hits == 3) break;
  }
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 1u);
  EXPECT_EQ((*index)[0].hits, 3);  // written while the store is still open
}

TEST(DiskStoreTest, TempFilesAreSweptAtOpen) {
  ScratchDir dir;
  {
    auto store = OpenOrDie(Options(dir.path()));
    ASSERT_TRUE(store->Put(TestKey(1), "value", Meta("v")).ok());
  }
  const std::string fan = dir.path() + "/" + TestKey(1).substr(0, 2);
  testing::WriteAll(fan + "/.tmp." + TestKey(1) + ".123.0", "partial");
  testing::WriteAll(dir.path() + "/.tmp.index.123.1", "partial index");
  auto store = OpenOrDie(Options(dir.path()));
  EXPECT_EQ(store->open_report().temp_files_swept, 2);
  EXPECT_TRUE(testing::TempFiles(dir.path()).empty());
  EXPECT_EQ(**store->Get(TestKey(1)), "value");
}

TEST(DiskStoreTest, RemoveAndPurge) {
  ScratchDir dir;
  auto store = OpenOrDie(Options(dir.path()));
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < 6; ++i) {
    EntryMeta m = Meta("p");
    if (i < 3) m.created_unix_ms = now - 3600 * 1000;  // an hour old, never hit
    ASSERT_TRUE(store->Put(TestKey(i), TestValue(i, 100), m).ok());
  }
  auto freed = store->Remove(TestKey(5));
  ASSERT_TRUE(freed.ok());
  EXPECT_GT(*freed, 100);
  EXPECT_EQ(store->Remove(TestKey(5)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Exists(store->EntryPath(TestKey(5))));
  PurgeOptions older;
  older.older_than_unix_ms = now - 60 * 1000;
  auto purged = store->Purge(older);
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(purged->removed, 3);
  EXPECT_EQ(store->Stats().entries, 2);
  PurgeOptions all;
  all.all = true;
  EXPECT_EQ(store->Purge(all)->removed, 2);
  EXPECT_EQ(store->Stats().bytes, 0);
  EXPECT_EQ(EntryFileBytes(dir.path()), 0);
}

TEST(DiskStoreTest, ConcurrentPutsAndGetsServeOnlyCompleteValues) {
  ScratchDir dir;
  DiskStoreOptions o = Options(dir.path(), 400 * 1024);
  o.sync = false;
  o.index_flush_interval = absl::Milliseconds(5);
  auto store = OpenOrDie(o);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int j = 0; j < 300; ++j) {
        const int k = (j * 7 + t) % 40;
        if (j % 3 == 0) {
          if (!store->Put(TestKey(k), TestValue(k, 3000 + k * 100), Meta("c")).ok()) ++bad;
        } else {
          auto got = store->Get(TestKey(k));
          if (!got.ok() || (got->has_value() && **got != TestValue(k, 3000 + k * 100))) ++bad;
        }
        if (j % 50 == 0) (void)store->List();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(store->Stats().bytes, 400 * 1024);
  EXPECT_EQ(store->Stats().bytes, EntryFileBytes(dir.path()));
  EXPECT_EQ(store->Stats().corruptions, 0);
}

TEST(DiskStoreTest, StartupWith100kEntriesTakesSeconds) {
  ScratchDir dir;
  DiskStoreOptions o = Options(dir.path());
  o.sync = false;  // creating the files is not what is measured
  constexpr int kEntries = 100000;
  {
    auto store = OpenOrDie(o);
    for (int i = 0; i < kEntries; ++i) {
      ASSERT_TRUE(store->Put(TestKey(i), TestValue(i, 64), Meta("s")).ok());
    }
  }
  absl::Time start = absl::Now();
  auto store = OpenOrDie(o);
  const absl::Duration with_index = absl::Now() - start;
  EXPECT_EQ(store->Stats().entries, kEntries);
  EXPECT_EQ(store->open_report().from_index, kEntries);
  store.reset();
  std::filesystem::remove(dir.path() + "/index");
  start = absl::Now();
  store = OpenOrDie(o);
  const absl::Duration without_index = absl::Now() - start;
  EXPECT_EQ(store->open_report().scanned, kEntries);
  std::printf("open with 100k entries: %s with the index, %s rebuilding from headers\n",
              absl::FormatDuration(with_index).c_str(),
              absl::FormatDuration(without_index).c_str());
  EXPECT_LT(with_index, absl::Seconds(20));
  EXPECT_LT(without_index, absl::Seconds(60));
}

}  // namespace
}  // namespace kiln::cache
