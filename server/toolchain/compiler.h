#ifndef KILN_SERVER_TOOLCHAIN_COMPILER_H_
#define KILN_SERVER_TOOLCHAIN_COMPILER_H_

// Compiling generated C++ to a shared object, in a separate process per compile (never in
// kilnd's threads), with a time limit, a memory limit, a private temp dir and a bounded log.
//
// CompileSharedObject(source, options): writes the source into a fresh 0700 directory, runs
//   <compiler> -std=c++17 -O3 -fPIC -shared -fopenmp -fno-math-errno -fno-trapping-math -fwrapv
//   -fvisibility=hidden [-march=<isa>] [-mprefer-vector-width=512 on x86] (never -ffast-math:
//   NaN semantics must hold; clang gets -fopenmp-simd until libomp is installed), with TMPDIR
//   pointing into that directory, reads the .so back as bytes and removes the directory. g++
//   compiles to an object file (-c) that its `ld` links with libgomp alone (-z defs); a kernel
//   that calls into libc, libm or libgcc fails that link and is linked again by the driver with
//   -nodefaultlibs -lgomp -lm -lc -lgcc (clang: one driver process compiles and links). Errors:
//     INVALID_ARGUMENT   a bad -march value ("native", or not [a-z0-9.+-]+) or unknown compiler;
//     DEADLINE_EXCEEDED  the compile ran past `timeout` (its process group is killed);
//     RESOURCE_EXHAUSTED the compiler ran out of memory under `memory_limit_bytes`;
//     INTERNAL           the compiler failed; the message carries its log (truncated).
// CompilerIdentity(compiler): the first line of `<compiler> --version`, computed once per
//   compiler and cached, e.g. "g++ (Debian 12.2.0-14+deb12u1) 12.2.0". With CompileFlags() it
//   is what the cache key must include about the toolchain.
// CompilePool bounds the number of concurrent compiles (each is one process tree).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kiln::toolchain {

struct CompileOptions {
  std::string compiler = "g++";  // a name looked up on PATH, or an absolute path
  std::string march;             // Target.cpu_isa; empty = the compiler's default target
  absl::Duration timeout = absl::Seconds(120);
  int64_t memory_limit_bytes = int64_t{4} << 30;  // RLIMIT_AS of the compiler; 0 = none
  size_t max_log_bytes = 64 * 1024;
  std::string temp_root;  // where private dirs are made; default $TMPDIR or /tmp
  bool precompiled_prelude = true;  // g++: precompile a compile's prelude once per process
};

struct CompileTimings {
  absl::Duration write;
  absl::Duration compile;
  absl::Duration read;
};

struct CompiledBinary {
  std::string bytes;        // the ELF shared object
  std::string log;          // the compiler's stdout+stderr (warnings), truncated
  std::string compiler_id;  // CompilerIdentity()
  std::vector<std::string> flags;  // CompileFlags()
  bool direct_link = false;  // linked by `ld` with libgomp alone, not through the driver
  CompileTimings timings;
};

// OK for "x86-64-v3", "armv8.2-a", "znver4", ""; INVALID_ARGUMENT for "native" or anything that
// is not a plain token (so no option can be injected through a target).
absl::Status ValidateMarch(absl::string_view march);

// The flags CompileSharedObject passes (besides file names), for the cache key.
absl::StatusOr<std::vector<std::string>> CompileFlags(const CompileOptions& options);

absl::StatusOr<std::string> CompilerIdentity(const std::string& compiler);

absl::StatusOr<CompiledBinary> CompileSharedObject(absl::string_view source,
                                                   const CompileOptions& options);
// The same for a source split into parts (each a whole translation unit: prelude + some
// kernels): each part is compiled to an object file in its own process, all at once (time and
// memory limits per process), then one process links them. An error names the part.
absl::StatusOr<CompiledBinary> CompileSharedObject(absl::Span<const std::string> parts,
                                                   const CompileOptions& options);
// The same with a `prelude` that every part starts with: with g++ and
// options.precompiled_prelude it is precompiled once per process (a .gch in a private temp dir,
// built with the same flags) and each part includes it instead of parsing it again; otherwise,
// or if precompiling fails, it is pasted in front of each part. The object code is the same.
absl::StatusOr<CompiledBinary> CompileSharedObject(absl::string_view prelude,
                                                   absl::Span<const std::string> parts,
                                                   const CompileOptions& options);

class CompilePool {
 public:
  explicit CompilePool(int max_concurrent);
  // Waits for a free slot, then compiles in a worker process.
  absl::StatusOr<CompiledBinary> Compile(absl::string_view source, const CompileOptions& options) {
    const std::vector<std::string> parts = {std::string(source)};
    return Compile("", absl::MakeConstSpan(parts), options);
  }
  // A compile of several parts (CompileSharedObject) takes one slot.
  absl::StatusOr<CompiledBinary> Compile(absl::string_view prelude, absl::Span<const std::string> parts,
                                         const CompileOptions& options);
  int max_concurrent() const { return max_concurrent_; }
  int in_flight() const;

 private:
  const int max_concurrent_;
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln::toolchain

#endif  // KILN_SERVER_TOOLCHAIN_COMPILER_H_
