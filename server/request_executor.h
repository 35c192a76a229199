#ifndef KILN_SERVER_REQUEST_EXECUTOR_H_
#define KILN_SERVER_REQUEST_EXECUTOR_H_

// A fixed pool of threads with a bounded queue. kilnd runs request work here rather than on gRPC's
// callback threads, so that slow work (compiles) never blocks the transport. A full queue refuses
// new work instead of growing: callers answer RESOURCE_EXHAUSTED.

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace kiln {

class RequestExecutor {
 public:
  RequestExecutor(int threads, size_t max_queued);
  ~RequestExecutor();  // Runs what is queued, then joins.

  RequestExecutor(const RequestExecutor&) = delete;
  RequestExecutor& operator=(const RequestExecutor&) = delete;

  // False when the queue is full or the executor is stopping.
  bool TrySubmit(std::function<void()> work);

  // Stops accepting work, finishes what is queued and joins the threads. Idempotent.
  void Stop();

  size_t queued() const;
  size_t max_queued() const { return max_queued_; }

 private:
  void Loop();

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kiln

#endif  // KILN_SERVER_REQUEST_EXECUTOR_H_
