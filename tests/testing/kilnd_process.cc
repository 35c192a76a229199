#include "tests/testing/kilnd_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kiln::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool HasFlag(const std::vector<std::string>& args, const std::string& name) {
  for (const std::string& a : args) {
    if (absl::StartsWith(a, "--" + name + "=") || a == "--" + name) return true;
  }
  return false;
}

// Spawns kilnd with stdout and stderr going to `log_path`.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<std::string> argv_storage = {KilndPath()};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

absl::StatusOr<ExitResult> WaitPid(pid_t pid, absl::Duration timeout, const std::string& log) {
  absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      ExitResult result;
      if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
      result.stderr_text = ReadFile(log);
      return result;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("kilnd (pid ", pid, ") did not exit within ",
                                                      absl::FormatDuration(timeout),
                                                      "; its output:\n", ReadFile(log)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace

std::string KilndPath() {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir != nullptr && workspace != nullptr) {
    return absl::StrCat(srcdir, "/", workspace, "/server/kilnd");
  }
  return "server/kilnd";
}

std::string MakeTempDir(const std::string& name) {
  // Under /tmp rather than TEST_TMPDIR: unix socket paths must stay under 108 bytes.
  std::string pattern = absl::StrCat("/tmp/kiln-test-", name, ".XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) return "/tmp";
  return pattern;
}

absl::StatusOr<ExitResult> RunKilndToExit(const std::vector<std::string>& args,
                                          absl::Duration timeout) {
  std::string log = MakeTempDir("run") + "/kilnd.log";
  pid_t pid = Spawn(args, log);
  absl::StatusOr<ExitResult> result = WaitPid(pid, timeout, log);
  if (!result.ok()) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
  return result;
}

absl::StatusOr<std::unique_ptr<KilndProcess>> KilndProcess::Start(std::vector<std::string> args) {
  std::string dir = MakeTempDir("kilnd");
  if (!HasFlag(args, "cache_dir")) args.push_back("--cache_dir=" + dir + "/cache");
  if (!HasFlag(args, "listen")) args.push_back("--listen=unix:" + dir + "/kilnd.sock");
  std::unique_ptr<KilndProcess> p(new KilndProcess());
  p->stderr_path_ = dir + "/kilnd.log";
  p->pid_ = Spawn(args, p->stderr_path_);
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    std::string text = ReadFile(p->stderr_path_);
    size_t at = text.find("listening on ");
    if (at != std::string::npos) {
      size_t end = text.find_first_of("\"\n", at);
      if (end != std::string::npos) {
        p->address_ = text.substr(at + 13, end - at - 13);
        return p;
      }
    }
    int status = 0;
    if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
      p->exited_ = true;
      return absl::InternalError(absl::StrCat("kilnd exited during startup:\n", text));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("kilnd did not start listening within 20 s:\n" +
                                     ReadFile(p->stderr_path_));
}

KilndProcess::~KilndProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::shared_ptr<grpc::Channel> KilndProcess::Channel() const {
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  channel_args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), channel_args);
}

void KilndProcess::Signal(int sig) const { kill(pid_, sig); }

absl::StatusOr<ExitResult> KilndProcess::Wait(absl::Duration timeout) {
  absl::StatusOr<ExitResult> result = WaitPid(pid_, timeout, stderr_path_);
  if (result.ok()) exited_ = true;
  return result;
}

std::string KilndProcess::StderrText() const { return ReadFile(stderr_path_); }

}  // namespace kiln::testing
