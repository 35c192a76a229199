#include "server/cache/store.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kiln::cache {

bool IsValidKey(absl::string_view key) {
  if (key.size() != 64) return false;
  for (char c : key) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status ValidateKey(absl::string_view key) {
  if (key.size() != 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache key must be 64 lowercase hex characters (a SHA-256), got ", key.size(),
        " characters"));
  }
  if (!IsValidKey(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache key must be 64 lowercase hex characters (a SHA-256), got \"",
                     absl::CHexEscape(key), "\""));
  }
  return absl::OkStatus();
}

bool IsTierFailure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kNotFound:
      return false;
    default:
      return true;
  }
}

}  // namespace kiln::cache
