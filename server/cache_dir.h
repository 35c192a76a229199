#ifndef KILN_SERVER_CACHE_DIR_H_
#define KILN_SERVER_CACHE_DIR_H_

// Where kilnd keeps its on-disk cache, and the startup check that it is usable.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln. FAILED_PRECONDITION when neither variable is set.
absl::StatusOr<std::string> DefaultCacheDir();

// Creates `dir` (and parents) if needed and proves it writable by creating, syncing and removing a
// probe file. FAILED_PRECONDITION with the path and the OS's reason otherwise.
absl::Status EnsureWritableDir(const std::string& dir);

}  // namespace kiln

#endif  // KILN_SERVER_CACHE_DIR_H_
