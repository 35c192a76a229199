#ifndef KILN_SERVER_SERVER_STATS_H_
#define KILN_SERVER_SERVER_STATS_H_

// Counters shared by kilnd's services: requests by outcome, and the start time.
// Outcomes are the names listed for kiln.v1.Stats.requests in admin.proto.

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

 private:
  const absl::Time start_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kiln

#endif  // KILN_SERVER_SERVER_STATS_H_
