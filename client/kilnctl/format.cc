#include "client/kilnctl/format.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln::kilnctl {

std::string Table::Render() const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += row[i];
      if (i + 1 < row.size()) out += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out += "\n";
  }
  return out;
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string HumanTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string HumanMicros(int64_t micros) {
  if (micros < 1000) return absl::StrCat(micros, " us");
  if (micros < 1000000) return absl::StrFormat("%.1f ms", micros / 1e3);
  return absl::StrFormat("%.2f s", micros / 1e6);
}

absl::StatusOr<absl::Duration> ParseAge(absl::string_view text) {
  absl::Duration d;
  if (!text.empty() && text.back() == 'd') {
    int64_t days = 0;
    if (absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) && days > 0) {
      return absl::Hours(24 * days);
    }
  } else if (absl::ParseDuration(text, &d) && d > absl::ZeroDuration()) {
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a positive duration; write e.g. 30m, 12h or 7d"));
}

}  // namespace kiln::kilnctl
