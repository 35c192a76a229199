#include "server/toolchain/compiler.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/status_macros.h"
#include "server/toolchain/subprocess.h"

namespace kiln::toolchain {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
  std::string data;
  char buf[65536];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    data.append(buf, static_cast<size_t>(in.gcount()));
    if (data.size() > limit) break;
  }
  return data;
}

std::string Truncate(std::string log, size_t limit) {
  if (log.size() <= limit) return log;
  log.resize(limit);
  log += "\n[log truncated]\n";
  return log;
}

// A private directory removed (with everything in it) when this goes out of scope.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Make(const std::string& root_option) {
    std::string root = root_option;
    if (root.empty()) {
      const char* env = std::getenv("TMPDIR");
      root = env != nullptr && env[0] != '\0' ? env : "/tmp";
    }
    std::string templ = absl::StrCat(root, "/kiln-cc-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot create a temp dir under ", root));
    }
    return TempDir(templ);
  }
  TempDir(TempDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string p) : path_(std::move(p)) {}
  std::string path_;
};

std::vector<std::string> ChildEnv(const std::string& tmpdir) {
  const char* path = std::getenv("PATH");
  return {absl::StrCat("PATH=", path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin"),
          absl::StrCat("TMPDIR=", tmpdir), "LC_ALL=C", "LANG=C"};
}

bool LooksOutOfMemory(const std::string& log) {
  return absl::StrContains(log, "virtual memory exhausted") ||
         absl::StrContains(log, "out of memory") || absl::StrContains(log, "std::bad_alloc") ||
         absl::StrContains(log, "Cannot allocate memory") ||
         absl::StrContains(log, "cannot allocate");
}

// `<program> <question>` (e.g. --version), run in a private directory: its output, trimmed.
absl::StatusOr<std::string> AskDriver(const std::string& program, const std::string& question) {
  KILN_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make(""));
  ProcessOptions po;
  po.cwd = dir.path();
  po.output_path = absl::StrCat(dir.path(), "/answer.txt");
  po.env = ChildEnv(dir.path());
  po.timeout = absl::Seconds(30);
  KILN_ASSIGN_OR_RETURN(ProcessResult r, RunProcess({program, question}, po));
  KILN_ASSIGN_OR_RETURN(std::string out, ReadFile(po.output_path, 4096));
  if (!r.ok()) return absl::InternalError(absl::StrCat(program, " ", question, " failed: ", out));
  return std::string(absl::StripAsciiWhitespace(out));
}

}  // namespace

absl::Status ValidateMarch(absl::string_view march) {
  if (march == "native") {
    return absl::InvalidArgumentError(
        "cpu_isa \"native\" is refused: it would make the compiled code machine-dependent");
  }
  if (march.size() > 64) return absl::InvalidArgumentError("cpu_isa too long");
  for (char c : march) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '+' ||
                    c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          "cpu_isa must be a plain -march value: lowercase letters, digits, '.', '+', '-'");
    }
  }
  if (!march.empty() && march[0] == '-') {
    return absl::InvalidArgumentError("cpu_isa must not start with '-'");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CompileFlags(const CompileOptions& options) {
  KILN_RETURN_IF_ERROR(ValidateMarch(options.march));
  // clang needs libomp for -fopenmp (Debian: libomp-14-dev, not installed by default); without it
  // clang kernels honor `omp simd` but run on one thread.
  const bool clang = absl::StrContains(options.compiler, "clang");
  // -fno-trapping-math: FP exception flags are not observable to torch; without it g++ will
  // not if-convert (so not vectorize) NaN-aware selects. NaN/inf semantics are unaffected.
  std::vector<std::string> flags = {"-std=c++17",
                                    "-O3",
                                    "-fPIC",
                                    "-shared",
                                    clang ? "-fopenmp-simd" : "-fopenmp",
                                    "-fno-math-errno",
                                    "-fno-trapping-math",
                                    "-fwrapv",
                                    "-fvisibility=hidden"};
  if (!options.march.empty()) flags.push_back(absl::StrCat("-march=", options.march));
#if defined(__x86_64__)
  // g++ and clang tune Intel and AMD server cores (Sapphire Rapids, Zen 4) for 256-bit vectors
  // even where AVX-512 is there; Inductor's at::vec kernels use 512 bits. Measured on a Zen 4
  // core: an L2-resident row sum 7.6 -> 4.6 us. No effect on targets without AVX-512. (x86
  // only: kilnd's compiler builds for its own architecture.)
  flags.push_back("-mprefer-vector-width=512");
#endif
  if (!clang) {
    // Kernels need nothing from libstdc++: linking only what they use saves ~40% of the link
    // (~10 ms per graph). The -l flags go after the source (CompileSharedObject).
    flags.insert(flags.end(), {"-nodefaultlibs", "-lgomp", "-lm", "-lc", "-lgcc"});
  }
  return flags;
}

absl::StatusOr<std::string> CompilerIdentity(const std::string& compiler) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::string, std::string>();
  {
    absl::MutexLock lock(&mu);
    auto it = cache->find(compiler);
    if (it != cache->end()) return it->second;
  }
  KILN_ASSIGN_OR_RETURN(const std::string program, FindProgram(compiler));
  KILN_ASSIGN_OR_RETURN(std::string out, AskDriver(program, "--version"));
  std::string first = out.substr(0, out.find('\n'));
  if (first.empty()) return absl::InternalError(absl::StrCat(compiler, " --version printed nothing"));
  absl::MutexLock lock(&mu);
  (*cache)[compiler] = first;
  return first;
}

namespace {

// Runs one compiler command in `dir` with the limits of `options`; the log goes to `log_name`
// there and into *log. The errors of CompileSharedObject.
absl::Status RunCompiler(const std::vector<std::string>& argv, const std::string& dir,
                         const std::string& log_name, const CompileOptions& options,
                         const std::string& what, std::string* log) {
  ProcessOptions po;
  po.cwd = dir;
  po.output_path = absl::StrCat(dir, "/", log_name);
  po.env = ChildEnv(dir);
  po.timeout = options.timeout;
  po.memory_bytes = options.memory_limit_bytes;
  KILN_ASSIGN_OR_RETURN(ProcessResult r, RunProcess(argv, po));
  absl::StatusOr<std::string> text = ReadFile(po.output_path, options.max_log_bytes + 1);
  *log = Truncate(text.ok() ? *text : std::string("[no log]"), options.max_log_bytes);
  if (r.timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(
        "compile with ", what, " killed after ", absl::FormatDuration(options.timeout),
        "\n--- compiler log ---\n", *log));
  }
  if (!r.ok()) {
    const std::string how = r.term_signal != 0 ? absl::StrCat("killed by signal ", r.term_signal)
                                               : absl::StrCat("exit code ", r.exit_code);
    const std::string msg =
        absl::StrCat("compile with ", what, " failed (", how, ")\n--- compiler log ---\n", *log);
    if (options.memory_limit_bytes > 0 && LooksOutOfMemory(*log)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory limit of ", options.memory_limit_bytes, " bytes reached; ", msg));
    }
    return absl::InternalError(msg);
  }
  return absl::OkStatus();
}

// What a g++ driver would link kernels with, to link them without it: its `ld` and the path of
// its libgomp.so (`-print-prog-name=ld`, `-print-file-name=libgomp.so`), found once per compiler.
// The driver's link reads libc, libm and libgcc for the few kernels that call into them, and
// adds start files kernels do not need: about 6 ms of a 35-50 ms one-kernel compile.
struct DirectLinker {
  std::string ld;
  std::string libgomp;
};

absl::StatusOr<DirectLinker> DirectLinkerOf(const std::string& program) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::string, absl::StatusOr<DirectLinker>>();
  absl::MutexLock lock(&mu);
  if (auto it = cache->find(program); it != cache->end()) return it->second;
  absl::StatusOr<DirectLinker> found = [&]() -> absl::StatusOr<DirectLinker> {
    KILN_ASSIGN_OR_RETURN(std::string ld, AskDriver(program, "-print-prog-name=ld"));
    KILN_ASSIGN_OR_RETURN(std::string ld_path, FindProgram(ld));
    KILN_ASSIGN_OR_RETURN(std::string gomp, AskDriver(program, "-print-file-name=libgomp.so"));
    // An unknown file is printed back as its bare name.
    if (gomp.empty() || gomp[0] != '/' || access(gomp.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(program, " has no libgomp.so"));
    }
    return DirectLinker{ld_path, gomp};
  }();
  cache->emplace(program, found);
  return found;
}

constexpr char kPreludeHeader[] = "kiln_prelude.h";

// The directory holding kPreludeHeader and its precompiled form (.gch) for this compiler, these
// flags and this prelude: built once per process (later calls wait for the first), in a private
// directory under the temp root that the process removes at exit (never shared with another
// process, so no one else's .gch can be planted). The object code is the same as with the prelude
// pasted in; only the parse is saved (about 20 ms of a 75 ms compile). An error is remembered and
// returned again: the caller then pastes the prelude.
absl::StatusOr<std::string> PreludePch(const std::string& program, const std::vector<std::string>& compile_flags,
                                       absl::string_view prelude, const CompileOptions& options,
                                       const std::string& what) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* built = new std::map<std::string, absl::StatusOr<std::string>>();
  static auto* dirs = new std::vector<TempDir>();  // destroyed (removed) at exit
  static const int cleanup = std::atexit([] { dirs->clear(); });
  (void)cleanup;
  std::string key = absl::StrCat(program, "\n", options.temp_root, "\n", absl::StrJoin(compile_flags, " "), "\n");
  key.append(prelude.data(), prelude.size());
  absl::MutexLock lock(&mu);
  if (auto it = built->find(key); it != built->end()) return it->second;
  absl::StatusOr<std::string> result = [&]() -> absl::StatusOr<std::string> {
    KILN_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make(options.temp_root));
    const std::string header = absl::StrCat(dir.path(), "/", kPreludeHeader);
    {
      std::ofstream f(header, std::ios::binary);
      f.write(prelude.data(), static_cast<std::streamsize>(prelude.size()));
      if (!f) return absl::InternalError(absl::StrCat("cannot write ", header));
    }
    std::vector<std::string> argv = {program};
    for (const std::string& flag : compile_flags) {
      if (flag != "-shared") argv.push_back(flag);
    }
    argv.insert(argv.end(), {"-x", "c++-header", "-o", absl::StrCat(header, ".gch"), header});
    std::string log;
    KILN_RETURN_IF_ERROR(RunCompiler(argv, dir.path(), "pch.log", options, what, &log));
    std::string path = dir.path();
    dirs->push_back(std::move(dir));
    return path;
  }();
  built->emplace(std::move(key), result);
  return result;
}

}  // namespace

absl::StatusOr<CompiledBinary> CompileSharedObject(absl::string_view source,
                                                   const CompileOptions& options) {
  const std::vector<std::string> parts = {std::string(source)};
  return CompileSharedObject("", absl::MakeConstSpan(parts), options);
}

absl::StatusOr<CompiledBinary> CompileSharedObject(absl::Span<const std::string> parts,
                                                   const CompileOptions& options) {
  return CompileSharedObject("", parts, options);
}

absl::StatusOr<CompiledBinary> CompileSharedObject(absl::string_view prelude,
                                                   absl::Span<const std::string> parts,
                                                   const CompileOptions& options) {
  if (parts.empty()) return absl::InvalidArgumentError("no source to compile");
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> flags, CompileFlags(options));
  KILN_ASSIGN_OR_RETURN(const std::string program, FindProgram(options.compiler));
  CompiledBinary out;
  KILN_ASSIGN_OR_RETURN(out.compiler_id, CompilerIdentity(options.compiler));
  out.flags = flags;
  const std::string what = absl::StrCat(options.compiler, " (", out.compiler_id, ")");
  std::vector<std::string> compile_flags, libs;
  for (const std::string& flag : flags) {
    (absl::StartsWith(flag, "-l") ? libs : compile_flags).push_back(flag);
  }

  const bool clang = absl::StrContains(options.compiler, "clang");
  absl::Time t0 = absl::Now();
  // The prelude precompiled once per process (g++ only), else pasted into every part.
  std::string pch_dir;
  if (!prelude.empty() && options.precompiled_prelude && !clang) {
    absl::StatusOr<std::string> d = PreludePch(program, compile_flags, prelude, options, what);
    if (d.ok()) pch_dir = *d;
  }
  KILN_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make(options.temp_root));
  const std::string so = absl::StrCat(dir.path(), "/kernels.so");
  std::vector<std::string> srcs;
  for (size_t i = 0; i < parts.size(); ++i) {
    srcs.push_back(parts.size() == 1 ? absl::StrCat(dir.path(), "/kernels.cc")
                                     : absl::StrCat(dir.path(), "/kernels_", i, ".cc"));
    std::ofstream f(srcs.back(), std::ios::binary);
    if (!pch_dir.empty()) {
      f << "#include \"" << kPreludeHeader << "\"  // precompiled\n";
    } else {
      f.write(prelude.data(), static_cast<std::streamsize>(prelude.size()));
    }
    f.write(parts[i].data(), static_cast<std::streamsize>(parts[i].size()));
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", srcs.back()));
  }
  const absl::Time t1 = absl::Now();
  out.timings.write = t1 - t0;
  if (!pch_dir.empty()) compile_flags.push_back(absl::StrCat("-I", pch_dir));
  auto link_argv = [&](const std::vector<std::string>& inputs) {
    std::vector<std::string> argv = {program};
    argv.insert(argv.end(), compile_flags.begin(), compile_flags.end());
    argv.insert(argv.end(), {"-o", so});
    argv.insert(argv.end(), inputs.begin(), inputs.end());
    argv.insert(argv.end(), libs.begin(), libs.end());  // libraries after the inputs
    return argv;
  };
  // g++: each part to an object file in its own process, all at once (a graph's kernels
  // compile on as many cores as it has parts), then `ld` links them with libgomp alone
  // (-z defs: kernels that call into libc, libm or libgcc fail it and are linked again by the
  // driver). clang (no libgomp), or a g++ whose ld or libgomp is not found: one driver process
  // compiles and links a single part; several parts are linked by the driver.
  absl::StatusOr<DirectLinker> direct = clang ? absl::UnimplementedError("clang links through its driver")
                                              : DirectLinkerOf(program);
  if (parts.size() == 1 && !direct.ok()) {
    KILN_RETURN_IF_ERROR(RunCompiler(link_argv(srcs), dir.path(), "compile.log", options, what, &out.log));
  } else {
    std::vector<std::string> objects, logs(parts.size());
    std::vector<absl::Status> status(parts.size());
    auto compile_part = [&](size_t i, std::vector<std::string> argv) {
      status[i] = RunCompiler(argv, dir.path(), absl::StrCat("compile_", i, ".log"), options, what, &logs[i]);
    };
    std::vector<std::thread> threads;
    for (size_t i = 0; i < parts.size(); ++i) {
      objects.push_back(absl::StrCat(dir.path(), "/kernels_", i, ".o"));
      std::vector<std::string> argv = {program};
      for (const std::string& flag : compile_flags) {
        if (flag != "-shared") argv.push_back(flag);
      }
      argv.insert(argv.end(), {"-c", "-o", objects.back(), srcs[i]});
      if (parts.size() == 1) {
        compile_part(i, std::move(argv));  // no thread for a single part
      } else {
        threads.emplace_back(compile_part, i, std::move(argv));
      }
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < parts.size(); ++i) {
      if (logs[i].empty()) continue;
      absl::StrAppend(&out.log, parts.size() == 1 ? "" : absl::StrCat("--- part ", i, " ---\n"), logs[i]);
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!status[i].ok()) {
        if (parts.size() == 1) return status[i];
        return absl::Status(status[i].code(), absl::StrCat("part ", i, " of ", parts.size(), ": ",
                                                           status[i].message()));
      }
    }
    std::string link_log;
    out.direct_link = false;
    if (direct.ok()) {
      std::vector<std::string> argv = {direct->ld, "-shared", "-z", "defs", "--eh-frame-hdr",
                                       "--hash-style=gnu", "-o", so};
      argv.insert(argv.end(), objects.begin(), objects.end());
      argv.push_back(direct->libgomp);
      out.direct_link = RunCompiler(argv, dir.path(), "ld.log", options, what, &link_log).ok();
      link_log.clear();  // an undefined symbol there only means: link through the driver
    }
    if (!out.direct_link) {
      KILN_RETURN_IF_ERROR(RunCompiler(link_argv(objects), dir.path(), "link.log", options, what, &link_log));
    }
    if (!link_log.empty()) absl::StrAppend(&out.log, "--- link ---\n", link_log);
    out.log = Truncate(std::move(out.log), options.max_log_bytes);
  }
  const absl::Time t2 = absl::Now();
  out.timings.compile = t2 - t1;
  KILN_ASSIGN_OR_RETURN(out.bytes, ReadFile(so, size_t{1} << 31));
  out.timings.read = absl::Now() - t2;
  return out;
}

CompilePool::CompilePool(int max_concurrent) : max_concurrent_(std::max(1, max_concurrent)) {}

int CompilePool::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

absl::StatusOr<CompiledBinary> CompilePool::Compile(absl::string_view prelude,
                                                    absl::Span<const std::string> parts,
                                                    const CompileOptions& options) {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](CompilePool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
          return p->in_flight_ < p->max_concurrent_;
        },
        this));
    ++in_flight_;
  }
  absl::StatusOr<CompiledBinary> result = CompileSharedObject(prelude, parts, options);
  absl::MutexLock lock(&mu_);
  --in_flight_;
  return result;
}

}  // namespace kiln::toolchain
