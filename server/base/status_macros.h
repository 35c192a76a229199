#ifndef KILN_SERVER_BASE_STATUS_MACROS_H_
#define KILN_SERVER_BASE_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr (Debian's abseil has none).

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include <utility>

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

#define KILN_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::absl::Status kiln_status_ = (expr);       \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(*tmp)

// Declares a temporary: use it as a statement of its own, inside braces (never after a bare `if`).
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_statusor_, __LINE__), lhs, expr)

#endif  // KILN_SERVER_BASE_STATUS_MACROS_H_
