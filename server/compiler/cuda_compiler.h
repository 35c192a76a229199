#ifndef KILN_SERVER_COMPILER_CUDA_COMPILER_H_
#define KILN_SERVER_COMPILER_CUDA_COMPILER_H_

// CudaGraphCompiler: the GraphCompiler for CUDA targets. One straight-line pipeline (Compile):
//   lower, fuse  server/compiler/pipeline.h  graph IR -> kernel IR (shared with the CPU compiler)
//   codegen      server/codegen/cuda_emitter all kernels -> CUDA C++ plus a launch per kernel
//   plan         server/lower/plan_builder.h memory plan + kiln.v1.Plan whose KernelSteps carry
//                                            binary, symbol, grid, block
//   compile      server/toolchain/nvrtc.h    NVRTC in worker processes -> KIND_CUBIN (KIND_PTX
//                                            with CompileOptions.cuda_emit_ptx)
// Kernels whose text is identical but for their names (repeated blocks) are compiled once and
// launched under the first one's symbol. The rest are split into up to `parallel_compiles` groups
// of consecutive kernels, each compiled
// by its own NVRTC process at the same time into its own binary ("graph_<g>.cu"); a graph with
// few kernels is one binary. GEMMs, convolutions and op fallbacks are AtenSteps that torch runs
// on the client's CUDA device (cuBLAS/cuDNN through torch).
// The target's cuda_arch is the architecture compiled for; no GPU is needed here.
// Errors: INVALID_ARGUMENT for a target that is not CUDA or a bad arch; UNIMPLEMENTED for
// symbolic sizes (the client runs the graph eagerly); FAILED_PRECONDITION when NVRTC or its
// worker is missing (the message says what to install or which flag to set); INTERNAL with
// NVRTC's log when it rejects generated source; DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED from the
// limits. Thread-safe: Compile keeps no state between calls.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "server/codegen/cuda_emitter.h"
#include "server/graph_compiler.h"
#include "server/toolchain/nvrtc.h"

namespace kiln::compiler {

// Bump when lowering, fusion, planning or launch rules change generated code or plans.
inline constexpr char kCudaCompilerVersion[] = "kiln-cuda-compiler/8";  // 3: channels-last around convolutions; 4: shifted odd rows, split few-output reductions; 5: long rows uncached with pass 2 from L2; 6: channels-last through poolings; 7: long rows cached in shared memory; 8: shared rows filled with cp.async

struct CudaCompilerOptions {
  toolchain::NvrtcOptions nvrtc;  // library, worker, time and memory limits per compile
  codegen::CudaEmitOptions emit;  // `arch` is overwritten per request with target.cuda_arch
  int parallel_compiles = 0;      // NVRTC processes per graph; 0: the machine's cores, at most 16
  int kernels_per_compile = 2;    // a graph is split only into groups of at least this many
};

class CudaGraphCompiler : public GraphCompiler {
 public:
  explicit CudaGraphCompiler(CudaCompilerOptions options) : options_(std::move(options)) {}

  absl::StatusOr<CompileResult> Compile(const graph::PreparedGraph& prepared,
                                        const kiln::v1::CompileRequest& request) override;

  // What CUDA keys must include about this compiler: {"cuda_compiler": kCudaCompilerVersion,
  // "nvrtc": NVRTC's version} (kilnd adds the hash of the embedded kernels/cuda helpers).
  // FAILED_PRECONDITION when NVRTC or its worker cannot be loaded.
  static absl::StatusOr<std::map<std::string, std::string>> IdentityComponents(const CudaCompilerOptions& options);

 private:
  const CudaCompilerOptions options_;
};

}  // namespace kiln::compiler

#endif  // KILN_SERVER_COMPILER_CUDA_COMPILER_H_
