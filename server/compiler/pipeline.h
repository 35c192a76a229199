#ifndef KILN_SERVER_COMPILER_PIPELINE_H_
#define KILN_SERVER_COMPILER_PIPELINE_H_

// The stages every GraphCompiler shares, in pipeline order, so that the CPU and CUDA compilers
// (cpu_compiler.h, cuda_compiler.h) differ only in codegen and in how the source is compiled:
//   LowerAndFuse   graph IR -> op graph -> schedule + fusion -> kernel IR  ("lower", "fuse")
//   BuildPlan      kernels + where each one lives -> kiln.v1.Plan          ("plan")
//   Finish         op-fallback diagnostics and the one-line summary
// Each stage records its time in CompileResult.timings_us under its name and dumps its output at
// debug level ("compiler: after <stage>:\n...").

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/v1/compiler.pb.h"
#include "server/graph/graph_path.h"
#include "server/graph_compiler.h"
#include "server/kernel/kernel_ir.h"
#include "server/lower/fuse.h"
#include "server/lower/kernelize.h"
#include "server/lower/op_graph.h"
#include "server/lower/plan_builder.h"

namespace kiln::compiler {

// Appends (stage, microseconds since the previous Done or construction) to result->timings_us.
class StageTimer {
 public:
  explicit StageTimer(CompileResult* result);
  void Done(const char* stage);

 private:
  CompileResult* result_;
  absl::Time start_;
};

// Dumps `text` at debug level as the output of `stage`.
void DumpStage(const char* stage, const std::string& text);

struct FrontEnd {
  lower::OpGraph ops;
  lower::Schedule schedule;
  lower::KernelSet kernels;
  lower::PlanStats stats;  // filled by BuildPlan

  // The kernels' IR in plan order (kernels.kernels[i].kernel), copied for an emitter.
  std::vector<kernel::Kernel> KernelIr() const;
};

absl::StatusOr<FrontEnd> LowerAndFuse(const graph::PreparedGraph& prepared, const kiln::v1::CompileRequest& request,
                                      StageTimer* timer);

// Assembles fe's plan into result->artifact.plan.
absl::Status BuildPlan(FrontEnd& fe, const std::vector<lower::KernelBinding>& bindings,
                       const lower::PlanOptions& options, CompileResult* result, StageTimer* timer);

// One INFO diagnostic per op fallback (naming the node), and result->summary.
void Finish(const graph::PreparedGraph& prepared, const FrontEnd& fe, CompileResult* result);

}  // namespace kiln::compiler

#endif  // KILN_SERVER_COMPILER_PIPELINE_H_
