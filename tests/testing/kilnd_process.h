#ifndef KILN_TESTS_TESTING_KILND_PROCESS_H_
#define KILN_TESTS_TESTING_KILND_PROCESS_H_

// Runs a real kilnd binary as a child process for end-to-end tests: starts it with flags, waits for
// its "listening on ADDRESS" log line, and gives access to its stderr, pid and exit status.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace kiln::testing {

// The path of the kilnd binary in the test's runfiles.
std::string KilndPath();

// A fresh directory under TEST_TMPDIR.
std::string MakeTempDir(const std::string& name);

struct ExitResult {
  int exit_code = -1;  // -1 if killed by a signal
  int signal = 0;
  std::string stderr_text;
};

// Runs kilnd with `args` to completion (for startup failures and --help) within `timeout`.
absl::StatusOr<ExitResult> RunKilndToExit(const std::vector<std::string>& args,
                                          absl::Duration timeout = absl::Seconds(20));

class KilndProcess {
 public:
  // Starts kilnd with `args` (a --cache_dir in a temp dir and --listen on a unix socket in a temp
  // dir are added unless given) and waits until it listens.
  static absl::StatusOr<std::unique_ptr<KilndProcess>> Start(std::vector<std::string> args);
  ~KilndProcess();  // SIGKILLs the process if it still runs.

  const std::string& address() const { return address_; }  // as gRPC clients spell it
  pid_t pid() const { return pid_; }
  std::shared_ptr<grpc::Channel> Channel() const;
  void Signal(int sig) const;
  // Waits for exit; the exit code, or an error on timeout.
  absl::StatusOr<ExitResult> Wait(absl::Duration timeout);
  std::string StderrText() const;

 private:
  KilndProcess() = default;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string address_;
  std::string stderr_path_;
};

}  // namespace kiln::testing

#endif  // KILN_TESTS_TESTING_KILND_PROCESS_H_
