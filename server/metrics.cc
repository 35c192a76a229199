#include "server/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace {

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrFormat("%.9g", v);
}

}  // namespace

void PrometheusText::Family(const std::string& name, const std::string& type,
                            const std::string& help) {
  absl::StrAppend(&text_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void PrometheusText::Sample(const std::string& name, const Labels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += "{";
    for (size_t i = 0; i < labels.size(); ++i) {
      absl::StrAppend(&text_, i ? "," : "", labels[i].first, "=\"",
                      EscapeLabelValue(labels[i].second), "\"");
    }
    text_ += "}";
  }
  absl::StrAppend(&text_, " ", FormatValue(value), "\n");
}

void LatencyHistogram::Observe(absl::Duration d) {
  double s = absl::ToDoubleSeconds(d);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < kBounds.size(); ++i) {
    if (s <= kBounds[i]) {
      ++counts_[i];
      break;
    }
  }
  ++total_;
  sum_seconds_ += s;
}

void LatencyHistogram::Write(const std::string& name, PrometheusText* out) const {
  absl::MutexLock lock(&mu_);
  int64_t cumulative = 0;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += counts_[i];
    out->Sample(name + "_bucket", {{"le", FormatValue(kBounds[i])}}, cumulative);
  }
  out->Sample(name + "_bucket", {{"le", "+Inf"}}, total_);
  out->Sample(name + "_sum", sum_seconds_);
  out->Sample(name + "_count", total_);
}

}  // namespace kiln
