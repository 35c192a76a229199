#ifndef KILN_SERVER_LOGGING_H_
#define KILN_SERVER_LOGGING_H_

// Logging setup for kilnd: spdlog's default logger writes to stderr, either as human-readable text
// or as one JSON object per line ({"ts":..., "level":..., "msg":...}) for log collectors.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {

// `format` is "text" or "json"; `level` is one of trace, debug, info, warn, error, off.
absl::Status ConfigureLogging(absl::string_view format, absl::string_view level);

// Escapes `s` for use inside a JSON string literal (quotes not included).
std::string JsonEscape(absl::string_view s);

}  // namespace kiln

#endif  // KILN_SERVER_LOGGING_H_
