#include "server/compiler/cpu_compiler.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/status_macros.h"
#include "server/compiler/pipeline.h"

namespace kiln::compiler {
namespace {

namespace v1 = ::kiln::v1;

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
  if (target.device() != v1::DEVICE_KIND_CPU) {
    return absl::InvalidArgumentError("the CPU compiler got a target that is not CPU");
  }
  CompileResult result;
  StageTimer timer(&result);
  KILN_ASSIGN_OR_RETURN(FrontEnd fe, LowerAndFuse(prepared, request, &timer));

  std::vector<std::string> symbols;
  for (size_t i = 0; i < fe.kernels.kernels.size(); ++i) {
    symbols.push_back(codegen::CpuKernelSymbol(static_cast<int>(i)));
  }
  lower::PlanOptions plan_options;
  plan_options.library_gemms = options_.library_gemms_for_tests;
  KILN_RETURN_IF_ERROR(
      BuildPlan(fe, lower::BindToBinary(symbols, /*binary=*/0), plan_options, &result, &timer));

  const std::vector<kernel::Kernel> ir = fe.KernelIr();
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
  Finish(prepared, fe, &result);
  return result;
}

}  // namespace kiln::compiler
