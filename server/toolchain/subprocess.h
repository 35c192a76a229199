#ifndef KILN_SERVER_TOOLCHAIN_SUBPROCESS_H_
#define KILN_SERVER_TOOLCHAIN_SUBPROCESS_H_

// RunProcess: runs a program in a separate process with limits, never a shell.
// The child gets its own process group, the working directory `cwd`, stdin from /dev/null,
// stdout and stderr into `output_path`, exactly the environment `env`, every other descriptor
// closed, and RLIMIT_AS = `memory_bytes` (inherited by what it starts, e.g. cc1plus). After
// `timeout` the whole process group is killed with SIGKILL; a process first seen finished after
// the deadline also counts as timed out (the limit is strict, not best effort). Safe to call from many threads of a
// multi-threaded server: between fork and exec the child only makes async-signal-safe calls.
// Errors: INVALID_ARGUMENT for an empty argv or a program not found on PATH, INTERNAL when the
// process cannot be started. A program that fails or is killed is not an error: see the result.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kiln::toolchain {

struct ProcessOptions {
  std::string cwd = ".";
  std::string output_path;  // required: receives stdout and stderr
  std::vector<std::string> env;  // "NAME=value" entries; the child's whole environment
  absl::Duration timeout = absl::Seconds(60);
  int64_t memory_bytes = 0;  // RLIMIT_AS; 0 = inherit
};

struct ProcessResult {
  bool timed_out = false;
  int exit_code = -1;    // when the process exited
  int term_signal = 0;   // when it was killed by a signal (SIGKILL after a timeout)
  absl::Duration elapsed;
  bool ok() const { return !timed_out && term_signal == 0 && exit_code == 0; }
};

// The absolute path of `program`: itself if it contains a '/', else the first match on `path`
// (a colon-separated list; the server's PATH when empty).
absl::StatusOr<std::string> FindProgram(const std::string& program, const std::string& path = "");

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                         const ProcessOptions& options);

}  // namespace kiln::toolchain

#endif  // KILN_SERVER_TOOLCHAIN_SUBPROCESS_H_
