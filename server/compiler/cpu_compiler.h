#ifndef KILN_SERVER_COMPILER_CPU_COMPILER_H_
#define KILN_SERVER_COMPILER_CPU_COMPILER_H_

// CpuGraphCompiler: the GraphCompiler for CPU targets. One straight-line pipeline (Compile); the
// lower, fuse and plan stages are shared with the CUDA compiler (pipeline.h):
//   lower    server/lower/lower.h        graph IR -> op graph (pointwise, views, row ops, steps)
//   fuse     server/lower/fuse.h         schedule + fusion decisions; kernelize.h: kernel IR
//   plan     server/lower/plan_builder.h memory plan (one workspace) + kiln.v1.Plan
//   codegen  server/codegen/cpu_emitter  all kernels -> ONE translation unit ("graph.cc")
//   compile  server/toolchain            g++ in worker processes (a graph's kernels split into up
//                                        to `parallel_compiles` translation units compiled at once,
//                                        then linked) -> one Binary KIND_SHARED_OBJECT
// After each stage the IR is dumped at debug level ("compiler: after <stage>:\n..."), and the
// stage's time goes into CompileResult.timings_us under the stage's name.
// Errors: UNIMPLEMENTED for graphs with symbolic sizes (the client runs them eagerly);
// INVALID_ARGUMENT for a target that is not CPU (CUDA targets: cuda_compiler.h);
// INTERNAL for a compiler failure (the compiler's log is in the message) or a lowering bug;
// DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED from the toolchain's limits. Thread-safe: Compile keeps
// no state between calls.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "server/codegen/cpu_emitter.h"
#include "server/graph_compiler.h"
#include "server/toolchain/compiler.h"

namespace kiln::compiler {

// Bump when lowering, fusion or planning changes generated code or plans for the same graph.
// 2: 64-bit CPU indices; 3: softmax in two passes over a row buffer, x * (1 / sum); 4: split
// few-output reductions (lower_split.cc).
inline constexpr char kCpuCompilerVersion[] = "kiln-cpu-compiler/5";  // 5: max_pool2d lowered

struct CpuCompilerOptions {
  // Compiler, time and memory limits; `march` is overwritten per request with target.cpu_isa.
  toolchain::CompileOptions toolchain;
  codegen::CpuEmitOptions emit;
  // Optional: bounds concurrent compiles across requests (not owned).
  toolchain::CompilePool* pool = nullptr;
  // Compiler processes one graph may use at once: its kernels are split into that many
  // translation units (compiled in parallel, then linked) when it has enough of them. 0: the
  // machine's cores, at most 16.
  int parallel_compiles = 0;
  // Tests only: GEMMs become LibrarySteps as in CUDA plans (CPU clients cannot run them), so that
  // host tests run plans with library steps through test_executor.h.
  bool library_gemms_for_tests = false;
};

class CpuGraphCompiler : public GraphCompiler {
 public:
  explicit CpuGraphCompiler(CpuCompilerOptions options) : options_(std::move(options)) {}

  absl::StatusOr<CompileResult> Compile(const graph::PreparedGraph& prepared,
                                        const kiln::v1::CompileRequest& request) override;

  // What the cache key must include about this compiler (graph::CompilerIdentity::components):
  // {"cpu_compiler": kCpuCompilerVersion, "cxx": `<compiler> --version` first line,
  //  "cxx_flags": the toolchain's flags (without -march, which the target supplies)}.
  static absl::StatusOr<std::map<std::string, std::string>> IdentityComponents(const CpuCompilerOptions& options);

 private:
  const CpuCompilerOptions options_;
};

}  // namespace kiln::compiler

#endif  // KILN_SERVER_COMPILER_CPU_COMPILER_H_
