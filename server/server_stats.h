#ifndef KILN_SERVER_SERVER_STATS_H_
#define KILN_SERVER_SERVER_STATS_H_

// Counters shared by kilnd's services: requests by outcome, and the start time.
// Outcomes are the names listed for kiln.v1.Stats.requests in admin.proto.

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kiln {

class ServerStats {
 public:
  ServerStats() : start_(absl::Now()) {}

  void Count(const std::string& outcome, int64_t n = 1) {
    absl::MutexLock lock(&mu_);
    requests_[outcome] += n;
  }
  std::map<std::string, int64_t> Requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  absl::Time start() const { return start_; }

  // Activity, for --idle_exit_after: calls in flight and when the last one started or ended.
  void BeginCall() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
    last_activity_ = absl::Now();
  }
  void EndCall() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    last_activity_ = absl::Now();
  }
  // Set when shutdown begins: services refuse new calls from then on (UNAVAILABLE).
  void StartDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // How long no call has been in flight; zero while one is.
  absl::Duration IdleFor() const {
    absl::MutexLock lock(&mu_);
    return in_flight_ > 0 ? absl::ZeroDuration() : absl::Now() - last_activity_;
  }

 private:
  const absl::Time start_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> requests_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> draining_{false};
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

// Marks one call in flight for its lifetime.
class CallScope {
 public:
  explicit CallScope(ServerStats* stats) : stats_(stats) { stats_->BeginCall(); }
  ~CallScope() { stats_->EndCall(); }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  ServerStats* const stats_;
};

}  // namespace kiln

#endif  // KILN_SERVER_SERVER_STATS_H_
