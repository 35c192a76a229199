#include "server/compiler/pipeline.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/status_macros.h"
#include "server/codegen/cuda_long_rows.h"
#include "server/kernel/printer.h"
#include "server/lower/conv_layout.h"
#include "server/lower/lower.h"
#include "spdlog/spdlog.h"

namespace kiln::compiler {

namespace v1 = ::kiln::v1;

StageTimer::StageTimer(CompileResult* result) : result_(result), start_(absl::Now()) {}

void StageTimer::Done(const char* stage) {
  const absl::Time now = absl::Now();
  result_->timings_us.push_back({stage, absl::ToInt64Microseconds(now - start_)});
  start_ = now;
}

void DumpStage(const char* stage, const std::string& text) {
  if (spdlog::should_log(spdlog::level::debug)) spdlog::debug("compiler: after {}:\n{}", stage, text);
}

std::vector<kernel::Kernel> FrontEnd::KernelIr() const {
  std::vector<kernel::Kernel> ir;
  for (const auto& k : kernels.kernels) ir.push_back(k.kernel);
  return ir;
}

absl::StatusOr<FrontEnd> LowerAndFuse(const graph::PreparedGraph& prepared, const v1::CompileRequest& request,
                                      StageTimer* timer) {
  FrontEnd fe;
  lower::LowerOptions lower_options;
  lower_options.gpu = request.target().device() == v1::DEVICE_KIND_CUDA;
  if (lower_options.gpu && codegen::ArchHasClusters(request.target().cuda_arch())) {
    lower_options.cluster_row_columns = codegen::LongestClusterRow(codegen::ClusterRowLimits{});
  }
  KILN_ASSIGN_OR_RETURN(fe.ops, lower::LowerGraph(prepared.graph, prepared.fallback_nodes, lower_options));
  if (lower_options.gpu) lower::ChooseConvLayouts(&fe.ops);
  timer->Done("lower");
  DumpStage("lower", lower::PrintOpGraph(fe.ops));

  lower::FuseOptions fuse_options;
  fuse_options.disable_fusion = request.options().disable_fusion();
  KILN_ASSIGN_OR_RETURN(fe.schedule, lower::ScheduleAndFuse(fe.ops, fuse_options));
  KILN_ASSIGN_OR_RETURN(fe.kernels, lower::BuildKernels(fe.ops, fe.schedule));
  timer->Done("fuse");
  if (spdlog::should_log(spdlog::level::debug)) {
    std::string text = lower::PrintSchedule(fe.ops, fe.schedule);
    for (const auto& k : fe.kernels.kernels) absl::StrAppend(&text, kernel::PrintKernel(k.kernel), "\n");
    DumpStage("fuse", text);
  }
  return fe;
}

absl::Status BuildPlan(FrontEnd& fe, const std::vector<lower::KernelBinding>& bindings,
                       const lower::PlanOptions& options, CompileResult* result, StageTimer* timer) {
  KILN_ASSIGN_OR_RETURN(*result->artifact.mutable_plan(),
                        lower::AssemblePlan(fe.ops, fe.schedule, fe.kernels, bindings, &fe.stats, options));
  timer->Done("plan");
  if (spdlog::should_log(spdlog::level::debug)) {
    DumpStage("plan", result->artifact.plan().DebugString() + fe.stats.memory_dump);
  }
  return absl::OkStatus();
}

void Finish(const graph::PreparedGraph& prepared, const FrontEnd& fe, CompileResult* result) {
  const lower::PlanStats& stats = fe.stats;
  for (size_t i = 0; i < stats.fallback_nodes.size(); ++i) {
    const graph::Node& node = prepared.graph.nodes[stats.fallback_nodes[i]];
    v1::Diagnostic d;
    d.set_severity(v1::Diagnostic::SEVERITY_INFO);
    d.set_code("op_fallback");
    d.set_message(absl::StrCat(node.target, " runs eagerly on the client: ", stats.fallback_reasons[i]));
    d.set_node(node.name);
    result->diagnostics.push_back(std::move(d));
  }
  result->summary = absl::StrCat(stats.kernels, stats.kernels == 1 ? " kernel, " : " kernels, ",
                                 stats.extern_steps, " extern op", stats.extern_steps == 1 ? ", " : "s, ",
                                 stats.library_steps > 0 ? absl::StrCat(stats.library_steps, " library GEMM",
                                                                        stats.library_steps == 1 ? ", " : "s, ")
                                                         : "",
                                 stats.fallback_steps, " fallback op", stats.fallback_steps == 1 ? "" : "s",
                                 ", workspace ", result->artifact.plan().workspace_bytes(), " bytes");
  spdlog::debug("compiler: {}", result->summary);
}

}  // namespace kiln::compiler
