#include "server/metrics.h"

#include "gtest/gtest.h"

namespace kiln {
namespace {

TEST(PrometheusTextTest, WritesFamiliesAndEscapesLabels) {
  PrometheusText text;
  text.Family("kiln_requests_total", "counter", "Requests by outcome.");
  text.Sample("kiln_requests_total", {{"outcome", "disk_hit"}}, 3);
  text.Sample("kiln_requests_total", {{"outcome", "we\"ird\\"}}, 0.5);
  EXPECT_EQ(text.text(),
            "# HELP kiln_requests_total Requests by outcome.\n"
            "# TYPE kiln_requests_total counter\n"
            "kiln_requests_total{outcome=\"disk_hit\"} 3\n"
            "kiln_requests_total{outcome=\"we\\\"ird\\\\\"} 0.5\n");
}

TEST(LatencyHistogramTest, BucketsAreCumulative) {
  LatencyHistogram h;
  h.Observe(absl::Microseconds(500));   // <= 1 ms
  h.Observe(absl::Milliseconds(30));    // <= 50 ms
  h.Observe(absl::Seconds(1000));       // only +Inf
  PrometheusText text;
  h.Write("lat", &text);
  const std::string& t = text.text();
  EXPECT_NE(t.find("lat_bucket{le=\"0.001\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_bucket{le=\"0.025\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_bucket{le=\"0.05\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_bucket{le=\"600\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lat_count 3\n"), std::string::npos) << t;
}

}  // namespace
}  // namespace kiln
