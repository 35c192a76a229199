#include "server/cache/compile_scheduler.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kiln::cache {
namespace {

// Polls `done` until it holds or 10 s pass.
template <typename F>
bool WaitFor(F done) {
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > limit) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(CompileSchedulerTest, SixtyFourIdenticalRequestsCompileOnce) {
  CompileScheduler scheduler;
  constexpr int kCallers = 64;
  std::atomic<int> compiles{0};
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    // Finish only once every other caller has joined, so that none can arrive late.
    EXPECT_TRUE(WaitFor([&] { return scheduler.Stats().joined == kCallers - 1; }));
    return std::string("artifact-bytes");
  };
  std::vector<CompileReply> replies(kCallers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kCallers; ++i) {
    threads.emplace_back([&, i] { replies[i] = scheduler.Run("k", compile); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 1);
  int compiled = 0, joined = 0;
  for (const CompileReply& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status;
    ASSERT_NE(r.bytes, nullptr);
    EXPECT_EQ(*r.bytes, "artifact-bytes");
    EXPECT_EQ(r.bytes.get(), replies[0].bytes.get());  // one shared buffer
    compiled += r.role == CompileRole::kCompiled;
    joined += r.role == CompileRole::kJoined;
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(joined, kCallers - 1);
  CompileSchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.compiles, 1);
  EXPECT_EQ(stats.joined, kCallers - 1);
  EXPECT_EQ(stats.in_flight, 0);
  EXPECT_EQ(stats.queued, 0);
}

TEST(CompileSchedulerTest, DistinctKeysCompileSeparately) {
  CompileScheduler scheduler;
  std::atomic<int> compiles{0};
  for (int i = 0; i < 3; ++i) {
    CompileReply r = scheduler.Run("key" + std::to_string(i), [&]() -> absl::StatusOr<std::string> {
      ++compiles;
      return std::string("x");
    });
    EXPECT_EQ(r.role, CompileRole::kCompiled);
  }
  EXPECT_EQ(compiles.load(), 3);
}

TEST(CompileSchedulerTest, FailuresAreCachedForTheTtlThenRetried) {
  CompileSchedulerOptions options;
  options.negative_ttl = absl::Milliseconds(300);
  CompileScheduler scheduler(options);
  std::atomic<int> compiles{0};
  auto bad = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return absl::InvalidArgumentError("node add_3: unsupported dtype");
  };
  CompileReply first = scheduler.Run("bad", bad);
  EXPECT_EQ(first.role, CompileRole::kCompiled);
  EXPECT_EQ(first.status.code(), absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < 100; ++i) {
    CompileReply again = scheduler.Run("bad", bad);
    ASSERT_EQ(again.role, CompileRole::kNegativeHit);
    ASSERT_EQ(again.status, first.status);
  }
  EXPECT_EQ(compiles.load(), 1);
  EXPECT_EQ(scheduler.Stats().negative_hits, 100);
  absl::SleepFor(absl::Milliseconds(350));
  CompileReply later = scheduler.Run("bad", bad);
  EXPECT_EQ(later.role, CompileRole::kCompiled);
  EXPECT_EQ(compiles.load(), 2);
}

TEST(CompileSchedulerTest, TransientFailuresAreNotCached) {
  CompileScheduler scheduler;
  std::atomic<int> compiles{0};
  auto flaky = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return absl::UnavailableError("worker process crashed");
  };
  EXPECT_EQ(scheduler.Run("k", flaky).status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(scheduler.Run("k", flaky).role, CompileRole::kCompiled);
  EXPECT_EQ(compiles.load(), 2);
}

TEST(CompileSchedulerTest, FullQueueGivesResourceExhaustedWithARetryHint) {
  CompileSchedulerOptions options;
  options.workers = 1;
  options.max_queued = 2;
  CompileScheduler scheduler(options);
  absl::Notification release;
  auto blocked = [&]() -> absl::StatusOr<std::string> {
    release.WaitForNotification();
    return std::string("ok");
  };
  std::vector<std::thread> threads;
  std::vector<CompileReply> replies(4);
  threads.emplace_back([&] { replies[0] = scheduler.Run("a", blocked); });
  ASSERT_TRUE(WaitFor([&] { return scheduler.Stats().in_flight == 1; }));
  threads.emplace_back([&] { replies[1] = scheduler.Run("b", blocked); });
  threads.emplace_back([&] { replies[2] = scheduler.Run("c", blocked); });
  ASSERT_TRUE(WaitFor([&] { return scheduler.Stats().queued == 2; }));

  CompileReply refused = scheduler.Run("d", blocked);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.role, CompileRole::kRejected);
  EXPECT_GT(refused.retry_after, absl::ZeroDuration());
  EXPECT_NE(refused.status.message().find("retry in about"), absl::string_view::npos)
      << refused.status;
  EXPECT_EQ(scheduler.Stats().rejected, 1);

  // Joining a queued compile is never refused.
  threads.emplace_back([&] { replies[3] = scheduler.Run("b", blocked); });
  ASSERT_TRUE(WaitFor([&] { return scheduler.Stats().joined == 1; }));
  release.Notify();
  for (auto& t : threads) t.join();
  for (const CompileReply& r : replies) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(replies[3].role, CompileRole::kJoined);
  EXPECT_EQ(replies[3].bytes.get(), replies[1].bytes.get());
}

TEST(CompileSchedulerTest, WaiterDeadlineExpiresWhileTheCompileFinishesForOthers) {
  CompileScheduler scheduler;
  absl::Notification release;
  std::atomic<bool> stored{false};
  auto slow = [&]() -> absl::StatusOr<std::string> {
    release.WaitForNotification();
    stored = true;  // where kilnd stores the artifact in the cache
    return std::string("artifact");
  };
  CompileReply patient;
  std::thread other([&] { patient = scheduler.Run("k", slow); });
  ASSERT_TRUE(WaitFor([&] { return scheduler.Stats().in_flight == 1; }));

  const absl::Time start = absl::Now();
  CompileReply hurried = scheduler.Run("k", slow, start + absl::Milliseconds(100));
  EXPECT_EQ(hurried.status.code(), absl::StatusCode::kDeadlineExceeded) << hurried.status;
  EXPECT_EQ(hurried.role, CompileRole::kJoined);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_FALSE(stored.load());

  release.Notify();
  other.join();
  ASSERT_TRUE(patient.status.ok()) << patient.status;
  EXPECT_EQ(*patient.bytes, "artifact");
  EXPECT_TRUE(stored.load());
  EXPECT_EQ(scheduler.Stats().compiles, 1);
  EXPECT_EQ(scheduler.Stats().deadline_exceeded, 1);
}

TEST(CompileSchedulerTest, TheStarterGivingUpDoesNotCancelTheCompile) {
  CompileScheduler scheduler;
  absl::Notification release;
  std::atomic<bool> finished{false};
  CompileReply gave_up = scheduler.Run("k", [&]() -> absl::StatusOr<std::string> {
    release.WaitForNotification();
    finished = true;
    return std::string("late");
  }, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(gave_up.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(gave_up.role, CompileRole::kCompiled);
  // A retry joins the compile still in flight instead of starting another.
  CompileReply retry;
  std::thread t([&] { retry = scheduler.Run("k", [] { return absl::StatusOr<std::string>("x"); }); });
  ASSERT_TRUE(WaitFor([&] { return scheduler.Stats().joined == 1; }));
  release.Notify();
  t.join();
  EXPECT_TRUE(finished.load());
  EXPECT_EQ(*retry.bytes, "late");
}

TEST(CompileSchedulerTest, PastDeadlineSchedulesNothing) {
  CompileScheduler scheduler;
  bool called = false;
  CompileReply r = scheduler.Run("k", [&]() -> absl::StatusOr<std::string> {
    called = true;
    return std::string();
  }, absl::Now() - absl::Seconds(1));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(scheduler.Stats().compiles, 0);
  EXPECT_FALSE(called);
}

TEST(CompileSchedulerTest, ShutdownFailsQueuedCompiles) {
  auto scheduler = std::make_unique<CompileScheduler>(CompileSchedulerOptions{1, 8});
  absl::Notification release;
  CompileReply running, queued;
  std::thread a([&] {
    running = scheduler->Run("a", [&]() -> absl::StatusOr<std::string> {
      release.WaitForNotification();
      return std::string("a");
    });
  });
  ASSERT_TRUE(WaitFor([&] { return scheduler->Stats().in_flight == 1; }));
  std::thread b([&] { queued = scheduler->Run("b", [] { return absl::StatusOr<std::string>("b"); }); });
  ASSERT_TRUE(WaitFor([&] { return scheduler->Stats().queued == 1; }));
  std::thread stop([&] { scheduler.reset(); });
  b.join();  // the queued caller is answered without waiting for the running compile
  EXPECT_EQ(queued.status.code(), absl::StatusCode::kUnavailable);
  release.Notify();
  stop.join();
  a.join();
  EXPECT_TRUE(running.status.ok());
}

}  // namespace
}  // namespace kiln::cache
