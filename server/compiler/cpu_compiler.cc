#include "server/compiler/cpu_compiler.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/kernel/printer.h"
#include "server/base/status_macros.h"
#include "server/lower/fuse.h"
#include "server/lower/kernelize.h"
#include "server/lower/lower.h"
#include "server/lower/plan_builder.h"
#include "spdlog/spdlog.h"

namespace kiln::compiler {
namespace {

namespace v1 = ::kiln::v1;

class StageTimer {
 public:
  explicit StageTimer(CompileResult* r) : r_(r), start_(absl::Now()) {}
  void Done(const char* stage) {
    const absl::Time now = absl::Now();
    r_->timings_us.push_back({stage, absl::ToInt64Microseconds(now - start_)});
    start_ = now;
  }

 private:
  CompileResult* r_;
  absl::Time start_;
};

void Dump(const char* stage, const std::string& text) {
  if (spdlog::should_log(spdlog::level::debug)) spdlog::debug("compiler: after {}:\n{}", stage, text);
}

std::string KernelsText(const lower::KernelSet& ks) {
  std::string s;
  for (const auto& k : ks.kernels) absl::StrAppend(&s, kernel::PrintKernel(k.kernel), "\n");
  return s;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> CpuGraphCompiler::IdentityComponents(
    const CpuCompilerOptions& options) {
  toolchain::CompileOptions tc = options.toolchain;
  tc.march.clear();
  KILN_ASSIGN_OR_RETURN(std::string cxx, toolchain::CompilerIdentity(tc.compiler));
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> flags, toolchain::CompileFlags(tc));
  return std::map<std::string, std::string>{
      {"cpu_compiler", kCpuCompilerVersion}, {"cxx", cxx}, {"cxx_flags", absl::StrJoin(flags, " ")}};
}

absl::StatusOr<CompileResult> CpuGraphCompiler::Compile(const graph::PreparedGraph& prepared,
                                                        const v1::CompileRequest& request) {
  const v1::Target& target = request.target();
  if (target.device() == v1::DEVICE_KIND_CUDA) return absl::UnimplementedError("CUDA codegen is not built yet");
  if (target.device() != v1::DEVICE_KIND_CPU) return absl::InvalidArgumentError("target device must be CPU or CUDA");
  CompileResult result;
  StageTimer timer(&result);

  KILN_ASSIGN_OR_RETURN(lower::OpGraph ops, lower::LowerGraph(prepared.graph, prepared.fallback_nodes));
  timer.Done("lower");
  Dump("lower", lower::PrintOpGraph(ops));

  lower::FuseOptions fuse_options;
  fuse_options.disable_fusion = request.options().disable_fusion();
  KILN_ASSIGN_OR_RETURN(lower::Schedule schedule, lower::ScheduleAndFuse(ops, fuse_options));
  KILN_ASSIGN_OR_RETURN(lower::KernelSet kernels, lower::BuildKernels(ops, schedule));
  timer.Done("fuse");
  Dump("fuse", lower::PrintSchedule(ops, schedule) + KernelsText(kernels));

  std::vector<std::string> symbols;
  for (size_t i = 0; i < kernels.kernels.size(); ++i) symbols.push_back(codegen::CpuKernelSymbol(static_cast<int>(i)));
  lower::PlanStats stats;
  KILN_ASSIGN_OR_RETURN(*result.artifact.mutable_plan(),
                        lower::AssemblePlan(ops, schedule, kernels, symbols, /*binary_index=*/0, &stats));
  timer.Done("plan");
  Dump("plan", result.artifact.plan().DebugString() + stats.memory_dump);

  std::vector<kernel::Kernel> ir;
  for (auto& k : kernels.kernels) ir.push_back(std::move(k.kernel));
  std::string source;
  if (!ir.empty()) {
    KILN_ASSIGN_OR_RETURN(codegen::CpuSource src, codegen::EmitCpuSource(ir, options_.emit));
    if (src.symbols != symbols) return absl::InternalError("emitter symbols differ from the plan's");
    source = std::move(src.source);
    result.sources.push_back({"graph.cc", source});
  }
  timer.Done("codegen");

  if (!ir.empty()) {
    toolchain::CompileOptions tc = options_.toolchain;
    tc.march = target.cpu_isa();
    const int64_t ms = request.options().compile_timeout_ms();
    if (ms > 0 && absl::Milliseconds(ms) < tc.timeout) tc.timeout = absl::Milliseconds(ms);
    absl::StatusOr<toolchain::CompiledBinary> bin =
        options_.pool != nullptr ? options_.pool->Compile(source, tc) : toolchain::CompileSharedObject(source, tc);
    if (!bin.ok()) {
      if (bin.status().code() == absl::StatusCode::kInternal) {
        return absl::InternalError(absl::StrCat("C++ compile of graph.cc failed: ", bin.status().message()));
      }
      return bin.status();
    }
    v1::Binary* b = result.artifact.add_binaries();
    b->set_kind(v1::Binary::KIND_SHARED_OBJECT);
    b->set_data(std::move(bin->bytes));
    b->set_compiler(bin->compiler_id);
    result.log = std::move(bin->log);
  }
  timer.Done("compile");

  for (size_t i = 0; i < stats.fallback_nodes.size(); ++i) {
    const graph::Node& node = prepared.graph.nodes[stats.fallback_nodes[i]];
    v1::Diagnostic d;
    d.set_severity(v1::Diagnostic::SEVERITY_INFO);
    d.set_code("op_fallback");
    d.set_message(absl::StrCat(node.target, " runs eagerly on the client: ", stats.fallback_reasons[i]));
    d.set_node(node.name);
    result.diagnostics.push_back(std::move(d));
  }
  result.summary = absl::StrCat(stats.kernels, stats.kernels == 1 ? " kernel, " : " kernels, ", stats.extern_steps,
                                " extern op", stats.extern_steps == 1 ? ", " : "s, ", stats.fallback_steps,
                                " fallback op", stats.fallback_steps == 1 ? "" : "s", ", workspace ",
                                result.artifact.plan().workspace_bytes(), " bytes");
  spdlog::debug("compiler: {}", result.summary);
  return result;
}

}  // namespace kiln::compiler
