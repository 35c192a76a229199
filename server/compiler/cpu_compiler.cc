#include "server/compiler/cpu_compiler.h"

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/status_macros.h"
#include "server/compiler/pipeline.h"

namespace kiln::compiler {
namespace {

// The emitted kernels as up to `parallel` parts (0: the machine's cores, at most 16) of
// consecutive kernels of about equal source size, each compiled after the prelude as its own
// translation unit; one part when there is a single kernel.
std::vector<std::string> SplitSource(const codegen::CpuSource& src, int parallel) {
  const size_t kernels = src.kernel_sources.size();
  if (parallel <= 0) parallel = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  const size_t n = std::min<size_t>(static_cast<size_t>(parallel), kernels);
  if (n <= 1) {
    std::string all;
    for (const std::string& k : src.kernel_sources) absl::StrAppend(&all, "\n", k);
    return {all};
  }
  size_t total = 0;
  for (const std::string& k : src.kernel_sources) total += k.size();
  std::vector<std::string> parts;
  size_t done = 0;
  for (size_t i = 0; i < kernels; ++i) {
    // A new part once this one holds its share (parts.size() / n of the total), leaving at least
    // one kernel for every part still to come.
    const bool start = parts.empty() ||
                       (parts.size() < n && (done * n >= total * parts.size() || kernels - i <= n - parts.size()));
    if (start) parts.emplace_back();
    absl::StrAppend(&parts.back(), "\n", src.kernel_sources[i]);
    done += src.kernel_sources[i].size();
  }
  return parts;
}

}  // namespace

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
  std::vector<std::string> parts;
  std::string prelude;
  if (!ir.empty()) {
    KILN_ASSIGN_OR_RETURN(codegen::CpuSource src, codegen::EmitCpuSource(ir, options_.emit));
    if (src.symbols != symbols) return absl::InternalError("emitter symbols differ from the plan's");
    parts = SplitSource(src, options_.parallel_compiles);
    prelude = src.prelude;
    result.sources.push_back({"graph.cc", std::move(src.source)});
  }
  timer.Done("codegen");

  if (!ir.empty()) {
    toolchain::CompileOptions tc = options_.toolchain;
    tc.march = target.cpu_isa();
    const int64_t ms = request.options().compile_timeout_ms();
    if (ms > 0 && absl::Milliseconds(ms) < tc.timeout) tc.timeout = absl::Milliseconds(ms);
    absl::StatusOr<toolchain::CompiledBinary> bin =
        options_.pool != nullptr ? options_.pool->Compile(prelude, parts, tc)
                                 : toolchain::CompileSharedObject(prelude, parts, tc);
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
