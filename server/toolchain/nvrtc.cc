#include "server/toolchain/nvrtc.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "server/toolchain/subprocess.h"

namespace kiln::toolchain {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string WorkerPath(const NvrtcOptions& options) {
  if (!options.worker.empty()) return options.worker;
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / "kiln_nvrtc_worker").string();
}

// A private directory for one worker run, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& root) {
    std::string base = root;
    if (base.empty()) {
      const char* tmp = getenv("TMPDIR");
      base = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
    }
    std::string pattern = base + "/kiln-nvrtc.XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

absl::Status WorkerFailure(const std::string& worker, const ProcessResult& r,
                           const std::string& output, const NvrtcOptions& options) {
  if (r.timed_out) {
    return absl::DeadlineExceededError(absl::StrCat("NVRTC did not finish within ",
                                                    absl::FormatDuration(options.timeout)));
  }
  if (r.term_signal != 0) {
    return absl::InternalError(absl::StrCat("the NVRTC worker died with signal ", r.term_signal,
                                            (absl::StrContains(output, "bad_alloc") ||
                                             absl::StrContains(output, "out of memory"))
                                                ? " (out of memory)"
                                                : "",
                                            ": ", output));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      worker, " failed: ", output,
      " (install NVRTC, e.g. `pip install nvidia-cuda-nvrtc`, and point kilnd's --nvrtc or "
      "KILN_NVRTC_PATH at its libnvrtc.so)"));
}

// The worker's whole environment. libnvrtc loads libnvrtc-builtins by soname, so NVRTC's own
// directory goes on the loader path (the wheel's libraries carry no rpath).
std::vector<std::string> WorkerEnv(const std::string& library) {
  std::vector<std::string> env = {"PATH=/usr/bin:/bin"};
  size_t slash = library.rfind('/');
  if (slash != std::string::npos) env.push_back("LD_LIBRARY_PATH=" + library.substr(0, slash));
  return env;
}

}  // namespace

std::string FindNvrtcLibrary(const std::string& hint) {
  if (!hint.empty()) return hint;
  if (const char* env = getenv("KILN_NVRTC_PATH"); env != nullptr && env[0] != '\0') return env;
  for (const char* candidate : {"/usr/local/cuda/lib64/libnvrtc.so",
                                "/usr/local/cuda/lib64/libnvrtc.so.13",
                                "/usr/local/cuda/lib64/libnvrtc.so.12"}) {
    if (access(candidate, R_OK) == 0) return candidate;
  }
  return "libnvrtc.so.13";
}

absl::Status ValidateCudaArch(absl::string_view arch) {
  absl::string_view digits = arch;
  if (!absl::ConsumePrefix(&digits, "sm_")) {
    return absl::InvalidArgumentError(absl::StrCat("'", arch, "' is not a CUDA architecture like sm_90"));
  }
  absl::ConsumeSuffix(&digits, "a");
  if (digits.size() < 2 || digits.size() > 3 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return absl::InvalidArgumentError(absl::StrCat("'", arch, "' is not a CUDA architecture like sm_90"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NvrtcVersion(const NvrtcOptions& options) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::pair<std::string, std::string>, std::string>();
  const std::string worker = WorkerPath(options);
  const std::string library = FindNvrtcLibrary(options.library);
  {
    absl::MutexLock lock(&mu);
    if (auto it = cache->find({worker, library}); it != cache->end()) return it->second;
  }
  TempDir dir(options.temp_root);
  if (dir.path().empty()) return absl::InternalError("cannot create a temp dir for NVRTC");
  ProcessOptions process;
  process.cwd = dir.path();
  process.output_path = dir.path() + "/out";
  process.timeout = absl::Seconds(30);
  process.env = WorkerEnv(library);
  absl::StatusOr<ProcessResult> r =
      RunProcess({worker, "--nvrtc=" + library, "--version"}, process);
  if (!r.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot run the NVRTC worker ", worker, ": ", r.status().message(),
        " (it ships next to kilnd; or set --nvrtc_worker)"));
  }
  std::string output = std::string(absl::StripAsciiWhitespace(ReadFile(process.output_path)));
  if (!r->ok()) return WorkerFailure(worker, *r, output, options);
  absl::MutexLock lock(&mu);
  (*cache)[{worker, library}] = output;
  return output;
}

absl::StatusOr<CudaBinary> CompileCuda(absl::string_view source, absl::string_view arch, bool ptx,
                                       const NvrtcOptions& options) {
  if (absl::Status s = ValidateCudaArch(arch); !s.ok()) return s;
  TempDir dir(options.temp_root);
  if (dir.path().empty()) return absl::InternalError("cannot create a temp dir for NVRTC");
  const std::string src = dir.path() + "/kiln.cu", out = dir.path() + "/kiln.bin",
                    log = dir.path() + "/kiln.log";
  {
    std::ofstream file(src, std::ios::binary);
    file.write(source.data(), static_cast<std::streamsize>(source.size()));
    if (!file) return absl::InternalError(absl::StrCat("cannot write ", src));
  }
  const std::string worker = WorkerPath(options);
  const std::string library = FindNvrtcLibrary(options.library);
  std::vector<std::string> argv = {worker, "--nvrtc=" + library,
                                   absl::StrCat("--arch=", arch), "--src=" + src, "--out=" + out,
                                   "--log=" + log};
  if (ptx) argv.push_back("--ptx");
  ProcessOptions process;
  process.cwd = dir.path();
  process.output_path = dir.path() + "/worker.out";
  process.timeout = options.timeout;
  process.memory_bytes = options.memory_limit_bytes;
  process.env = WorkerEnv(library);
  absl::StatusOr<ProcessResult> r = RunProcess(argv, process);
  if (!r.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot run the NVRTC worker ", worker, ": ", r.status().message(),
        " (it ships next to kilnd; or set --nvrtc_worker)"));
  }
  std::string log_text = ReadFile(log);
  if (log_text.size() > options.max_log_bytes) {
    log_text = absl::StrCat(log_text.substr(0, options.max_log_bytes), "\n[log truncated]");
  }
  if (!r->ok()) {
    if (!r->timed_out && r->term_signal == 0 && r->exit_code == 1) {
      return absl::InternalError(absl::StrCat("NVRTC rejected the generated source:\n", log_text));
    }
    return WorkerFailure(worker, *r, ReadFile(process.output_path), options);
  }
  CudaBinary binary;
  binary.bytes = ReadFile(out);
  binary.ptx = ptx;
  binary.log = std::move(log_text);
  binary.elapsed = r->elapsed;
  if (binary.bytes.empty()) return absl::InternalError("NVRTC produced an empty binary");
  return binary;
}

}  // namespace kiln::toolchain
