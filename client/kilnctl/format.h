#ifndef KILN_CLIENT_KILNCTL_FORMAT_H_
#define KILN_CLIENT_KILNCTL_FORMAT_H_

// Output helpers for kilnctl: aligned text tables, human-readable sizes, times and durations.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kiln::kilnctl {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell, two spaces apart; the last column is not padded.
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string HumanBytes(int64_t bytes);         // "1.5 MiB"
std::string HumanTime(int64_t unix_ms);        // "2026-11-21 14:03:07" (UTC); "-" for 0
std::string HumanMicros(int64_t micros);       // "850 us", "12.3 ms", "4.20 s"

// "30s", "15m", "2h", "7d" (and anything absl::ParseDuration takes) -> a positive duration.
absl::StatusOr<absl::Duration> ParseAge(absl::string_view text);

}  // namespace kiln::kilnctl

#endif  // KILN_CLIENT_KILNCTL_FORMAT_H_
