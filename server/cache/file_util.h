// POSIX file helpers for DiskStore: whole-file reads, crash-safe writes (temp file in the same
// directory, fsync, rename, fsync of the directory), and errno-to-status conversion.
//
// Contract: WriteFileAtomically leaves either the old file or the complete new one at `path`, never
// a mix, even if the process is killed at any instruction (a temp file may be left behind; its
// name starts with kTempPrefix so that a sweep can find it). With sync=false the rename is still
// atomic against a process crash but not against a power loss (tests only).
// Errors are UNAVAILABLE with the path and strerror, except a missing file, which is NOT_FOUND.
#ifndef KILN_SERVER_CACHE_FILE_UTIL_H_
#define KILN_SERVER_CACHE_FILE_UTIL_H_

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cache {

inline constexpr absl::string_view kTempPrefix = ".tmp.";

absl::Status ErrnoStatus(int err, absl::string_view what, absl::string_view path);

// Reads the whole file. NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);
// Reads at most `max_bytes` from the start of the file and reports its size.
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes,
                                           int64_t* file_size);

// Writes the concatenation of `parts` to `path` through a temp file in the same directory.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<absl::string_view> parts, bool sync);

absl::Status FsyncDir(const std::string& dir);
// mkdir -p; OK when it already exists as a directory.
absl::Status MakeDirs(const std::string& dir);

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_FILE_UTIL_H_
