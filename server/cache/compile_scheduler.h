// CompileScheduler: single-flight, bounded compile execution for kilnd.
//
// Contract:
//  - Run(key, compile, deadline): at most one compile per key is in flight. A call for a key whose
//    compile is queued or running joins it; every caller of that flight receives the same bytes
//    (one shared buffer) or the same error. The reply says whether this call started the compile
//    (kCompiled), joined one (kJoined), was answered by a recent failure (kNegativeHit), or was
//    refused (kRejected).
//  - Compiles run on `workers` threads owned by the scheduler, never on a caller's thread, so a
//    caller that gives up does not stop the compile: it runs to the end for the other callers.
//  - At most `max_queued` distinct compiles wait for a worker; one more is refused with
//    RESOURCE_EXHAUSTED whose message says how long to wait before retrying (also in
//    `retry_after`). Joining a compile already queued or running is never refused.
//  - Deadlines: a caller waits at most until its deadline, then gets DEADLINE_EXCEEDED; the compile
//    continues. A deadline already past is DEADLINE_EXCEEDED without scheduling anything.
//  - Negative caching: a compile that fails with a deterministic error (anything but CANCELLED,
//    UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED) is remembered for `negative_ttl`; calls for the key
//    within it get the same status without compiling. After the TTL the next call compiles again.
//  - The scheduler does not touch the cache. The compile function should (1) look the key up in
//    the cache once more (closing the window between the caller's miss and this flight) and (2)
//    store its artifact before returning, so that it is stored even when every caller gave up.
//  - The compile function can outlive the call that scheduled it (it keeps running after that
//    caller's deadline): it must own what it uses (capture by value or shared_ptr, never a
//    reference to the caller's request or stack).
//  - Thread-safe. The destructor fails queued compiles with UNAVAILABLE, waits for running ones
//    and for the callers still inside Run to leave; no new Run may start once it has begun
//    (kilnd shuts the gRPC server down first).
#ifndef KILN_SERVER_CACHE_COMPILE_SCHEDULER_H_
#define KILN_SERVER_CACHE_COMPILE_SCHEDULER_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln::cache {

struct CompileSchedulerOptions {
  int workers = 4;                                  // compiles running at once
  int max_queued = 256;                             // distinct compiles waiting for a worker
  absl::Duration negative_ttl = absl::Seconds(30);  // 0 disables negative caching
  size_t max_negative_entries = 10000;
};

enum class CompileRole { kCompiled, kJoined, kNegativeHit, kRejected };
absl::string_view CompileRoleName(CompileRole role);  // "compiled", "joined", ...

struct CompileReply {
  absl::Status status;                       // OK, the compile's error, or the scheduler's
  std::shared_ptr<const std::string> bytes;  // set iff status.ok(); shared by all joiners
  CompileRole role = CompileRole::kRejected;
  absl::Duration waited;                     // time spent in Run
  absl::Duration retry_after;                // set with RESOURCE_EXHAUSTED
};

struct CompileSchedulerStats {
  int64_t workers = 0;
  int64_t in_flight = 0;  // running now
  int64_t queued = 0;     // waiting for a worker now
  int64_t compiles = 0;   // compiles started (scheduled)
  int64_t failures = 0;   // compiles that returned an error
  int64_t joined = 0;
  int64_t negative_hits = 0;
  int64_t rejected = 0;            // RESOURCE_EXHAUSTED
  int64_t deadline_exceeded = 0;   // callers that gave up
  int64_t negative_entries = 0;    // failures remembered now
};

class CompileScheduler {
 public:
  using CompileFn = std::function<absl::StatusOr<std::string>()>;

  explicit CompileScheduler(CompileSchedulerOptions options = {});
  ~CompileScheduler();
  CompileScheduler(const CompileScheduler&) = delete;
  CompileScheduler& operator=(const CompileScheduler&) = delete;

  CompileReply Run(absl::string_view key, CompileFn compile,
                   absl::Time deadline = absl::InfiniteFuture());

  CompileSchedulerStats Stats() const;

 private:
  struct Flight {
    std::string key;
    CompileFn compile;
    bool done = false;
    absl::Status status;
    std::shared_ptr<const std::string> bytes;
  };
  struct Failure {
    absl::Status status;
    absl::Time expires;
  };

  void WorkerLoop();
  void RememberFailureLocked(const std::string& key, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration EstimateWaitLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CompileSchedulerOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Flight>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Failure> negative_ ABSL_GUARDED_BY(mu_);
  CompileSchedulerStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Duration mean_compile_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);  // moving average
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int callers_ ABSL_GUARDED_BY(mu_) = 0;  // threads inside Run
  std::vector<std::thread> workers_;
};

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_COMPILE_SCHEDULER_H_
