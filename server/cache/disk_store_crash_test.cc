// Kills a real writer process with SIGKILL in the middle of 100 concurrent writes, then reopens
// the store: no partial entry may be served and no temp file may remain.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/cache/disk_store.h"
#include "server/cache/test_util.h"

namespace kiln::cache {
namespace {

using testing::ScratchDir;
using testing::TestKey;
using testing::TestValue;

constexpr int kKeys = 100;
constexpr int kThreads = 8;
constexpr int kRounds = 6;

size_t ValueSize(int k) { return 1000 + static_cast<size_t>(k) * 2500; }  // 1 KB .. 250 KB

DiskStoreOptions Options(const std::string& dir) {
  DiskStoreOptions o;
  o.dir = dir;
  o.max_bytes = int64_t{1} << 30;
  o.sync = true;  // the real write path: temp file, fsync, rename, fsync directory
  o.index_flush_interval = absl::Milliseconds(2);  // index rewrites get killed too
  return o;
}

// The child: writes the 100 keys from several threads, forever, until it is killed.
[[noreturn]] void Writer(const std::string& dir, int ready_fd) {
  auto store = DiskStore::Open(Options(dir));
  if (!store.ok()) ::_exit(2);
  std::atomic<bool> signalled{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0;; ++round) {
        for (int k = t; k < kKeys; k += kThreads) {
          EntryMeta meta;
          meta.debug_name = "crash";
          // Rewrite every key each round so a kill can land during a replacement too.
          if (!(*store)->Put(TestKey(k), TestValue(k, ValueSize(k)), meta).ok()) ::_exit(3);
          if (!signalled.exchange(true)) {
            char c = 'r';
            (void)!::write(ready_fd, &c, 1);
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ::_exit(0);
}

TEST(DiskStoreCrashTest, KillDuringConcurrentWritesServesNoPartialEntry) {
  ScratchDir dir;
  int temp_files_seen = 0;
  int entries_seen = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    std::fflush(nullptr);  // the child must not inherit unflushed output
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      Writer(dir.path(), fds[1]);
    }
    ::close(fds[1]);
    struct pollfd p = {fds[0], POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 30000), 1) << "the writer never wrote";
    char c;
    ASSERT_EQ(::read(fds[0], &c, 1), 1);
    ::close(fds[0]);
    absl::SleepFor(absl::Milliseconds(2 + 3 * round));  // a few milliseconds into the writes
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    // It died from the kill, in the middle of its endless loop (not from an error exit).
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "writer exited with " << WEXITSTATUS(wstatus);
    ASSERT_EQ(WTERMSIG(wstatus), SIGKILL);
    const int temps = static_cast<int>(testing::TempFiles(dir.path()).size());
    temp_files_seen += temps;

    auto store = DiskStore::Open(Options(dir.path()));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->open_report().temp_files_swept, temps);
    EXPECT_TRUE(testing::TempFiles(dir.path()).empty());
    int present = 0;
    for (int k = 0; k < kKeys; ++k) {
      auto got = (*store)->Get(TestKey(k));
      ASSERT_TRUE(got.ok()) << got.status();
      if (got->has_value()) {
        ++present;
        ASSERT_EQ(**got, TestValue(k, ValueSize(k))) << "key " << k << " served a wrong value";
      }
    }
    EXPECT_EQ((*store)->Stats().corruptions, 0);
    EXPECT_EQ((*store)->Stats().entries, present);
    EXPECT_EQ((*store)->Stats().bytes, testing::EntryFileBytes(dir.path()));
    entries_seen += present;
    std::printf("round %d: %d temp files left by the kill, %d of %d entries complete\n", round,
                temps, present, kKeys);
  }
  EXPECT_GT(entries_seen, 0);
  // The kills landed while writes were in progress (temp files existed) in at least one round.
  EXPECT_GT(temp_files_seen, 0);
}

}  // namespace
}  // namespace kiln::cache
