#include "server/request_executor.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(RequestExecutorTest, RunsEverythingAcceptedBeforeStop) {
  std::atomic<int> ran{0};
  RequestExecutor executor(2, 1000);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(executor.TrySubmit([&] { ran++; }));
  executor.Stop();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_FALSE(executor.TrySubmit([] {}));
}

TEST(RequestExecutorTest, RefusesPastTheQueueBound) {
  absl::Notification release;
  RequestExecutor executor(1, 2);
  absl::Notification started;
  ASSERT_TRUE(executor.TrySubmit([&] {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();
  EXPECT_TRUE(executor.TrySubmit([] {}));
  EXPECT_TRUE(executor.TrySubmit([] {}));
  EXPECT_FALSE(executor.TrySubmit([] {})) << "a third queued item must be refused";
  release.Notify();
}

}  // namespace
}  // namespace kiln
