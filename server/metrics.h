#ifndef KILN_SERVER_METRICS_H_
#define KILN_SERVER_METRICS_H_

// Prometheus text exposition (format 0.0.4) for kilnd's /metrics, and a latency histogram.
// Debian ships no C++ Prometheus client, and the format is small: families are written one at a
// time with HELP and TYPE lines; label values are escaped.

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kiln {

class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // Starts a metric family; `type` is "counter", "gauge" or "histogram".
  void Family(const std::string& name, const std::string& type, const std::string& help);
  void Sample(const std::string& name, const Labels& labels, double value);
  void Sample(const std::string& name, double value) { Sample(name, {}, value); }

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// A histogram of durations with fixed buckets in seconds, safe to observe from many threads.
class LatencyHistogram {
 public:
  // Upper bounds in seconds: 1 ms .. 600 s.
  static constexpr std::array<double, 14> kBounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                     0.5,   1.0,   2.5,  5.0,   10,  60,  600};

  void Observe(absl::Duration d);
  // Writes the _bucket, _sum and _count samples of `name` (the family must already be started).
  void Write(const std::string& name, PrometheusText* out) const;

 private:
  mutable absl::Mutex mu_;
  std::array<int64_t, kBounds.size()> counts_ ABSL_GUARDED_BY(mu_) = {};
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  double sum_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln

#endif  // KILN_SERVER_METRICS_H_
