#include "server/compiler/cuda_compiler.h"

#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/base/status_macros.h"
#include "server/compiler/pipeline.h"
#include "spdlog/spdlog.h"

namespace kiln::compiler {
namespace {

namespace v1 = ::kiln::v1;

// Consecutive kernel ranges [begin, end), one per NVRTC process.
std::vector<std::pair<size_t, size_t>> Groups(size_t kernels, const CudaCompilerOptions& o) {
  const size_t per = static_cast<size_t>(std::max(1, o.kernels_per_compile));
  const int parallel = o.parallel_compiles > 0 ? o.parallel_compiles
                                               : static_cast<int>(std::min(16u, std::thread::hardware_concurrency()));
  size_t groups = std::min<size_t>(static_cast<size_t>(std::max(1, parallel)), (kernels + per - 1) / per);
  groups = std::max<size_t>(groups, 1);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t g = 0; g < groups; ++g) out.push_back({kernels * g / groups, kernels * (g + 1) / groups});
  return out;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> CudaGraphCompiler::IdentityComponents(
    const CudaCompilerOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::string nvrtc, toolchain::NvrtcVersion(options.nvrtc));
  return std::map<std::string, std::string>{{"cuda_compiler", kCudaCompilerVersion}, {"nvrtc", nvrtc}};
}

absl::StatusOr<CompileResult> CudaGraphCompiler::Compile(const graph::PreparedGraph& prepared,
                                                         const v1::CompileRequest& request) {
  const v1::Target& target = request.target();
  if (target.device() != v1::DEVICE_KIND_CUDA) {
    return absl::InvalidArgumentError("the CUDA compiler got a target that is not CUDA");
  }
  KILN_RETURN_IF_ERROR(toolchain::ValidateCudaArch(target.cuda_arch()));
  const bool ptx = request.options().cuda_emit_ptx();
  CompileResult result;
  StageTimer timer(&result);
  KILN_ASSIGN_OR_RETURN(FrontEnd fe, LowerAndFuse(prepared, request, &timer));

  // codegen: one emission (global kernel numbering), then a source per group of kernels.
  codegen::CudaEmitOptions emit = options_.emit;
  emit.arch = target.cuda_arch();
  // kiln_<key>_<i>: a profile of several plans (a forward and its backward) tells their kernels apart.
  emit.symbol_prefix = absl::StrCat("kiln_", prepared.key.hex.substr(0, 8), "_");
  const std::vector<kernel::Kernel> ir = fe.KernelIr();
  std::vector<lower::KernelBinding> bindings(ir.size());
  std::vector<std::string> sources;
  if (!ir.empty()) {
    KILN_ASSIGN_OR_RETURN(codegen::CudaSource src, codegen::EmitCudaSource(ir, emit));
    // Identical kernels (same text but for their names: repeated blocks of a model) compile once;
    // their steps launch the first one's symbol.
    std::vector<size_t> unique;            // kernel indices that get compiled
    std::vector<size_t> same_as(ir.size());  // kernel -> the unique kernel it reuses
    {
      std::map<std::string, size_t> seen;
      for (size_t i = 0; i < ir.size(); ++i) {
        const std::string& sym = src.symbols[i];
        const std::string text = absl::StrReplaceAll(src.kernel_sources[i], {{sym + "(", "@("}, {sym + ":", "@:"}});
        auto [it, inserted] = seen.emplace(text, i);
        if (inserted) unique.push_back(i);
        same_as[i] = it->second;
      }
    }
    const auto groups = Groups(unique.size(), options_);
    std::vector<int32_t> binary_of(ir.size(), 0);
    for (size_t g = 0; g < groups.size(); ++g) {
      std::string text = src.prelude;
      for (size_t u = groups[g].first; u < groups[g].second; ++u) {
        absl::StrAppend(&text, "\n", src.kernel_sources[unique[u]]);
        binary_of[unique[u]] = static_cast<int32_t>(g);
      }
      result.sources.push_back({absl::StrCat("graph_", g, ".cu"), text});
      sources.push_back(std::move(text));
    }
    for (size_t i = 0; i < ir.size(); ++i) {
      const size_t u = same_as[i];
      const codegen::CudaLaunch& launch = src.launches[i];
      KILN_ASSIGN_OR_RETURN(int64_t grid, codegen::CudaGridSize(launch, {}));
      bindings[i] = {binary_of[u], src.symbols[u], grid, launch.block, launch.shared_bytes};
    }
    if (unique.size() < ir.size()) {
      spdlog::debug("compiler: {} of {} CUDA kernels are copies of others and reuse them", ir.size() - unique.size(),
                    ir.size());
    }
  }
  timer.Done("codegen");
  if (spdlog::should_log(spdlog::level::debug)) {
    std::string text;
    for (const auto& [name, source] : result.sources) absl::StrAppend(&text, "// ", name, "\n", source, "\n");
    DumpStage("codegen", text);
  }
  lower::PlanOptions plan_options;
  plan_options.library_gemms = true;  // GEMMs go to cuBLASLt through the client's runtime
  KILN_RETURN_IF_ERROR(BuildPlan(fe, bindings, plan_options, &result, &timer));

  // compile: every group at once, one NVRTC worker process each.
  toolchain::NvrtcOptions nvrtc = options_.nvrtc;
  const int64_t ms = request.options().compile_timeout_ms();
  if (ms > 0 && absl::Milliseconds(ms) < nvrtc.timeout) nvrtc.timeout = absl::Milliseconds(ms);
  std::vector<absl::StatusOr<toolchain::CudaBinary>> binaries(sources.size(),
                                                              absl::InternalError("not compiled"));
  {
    std::vector<std::thread> threads;
    for (size_t g = 0; g < sources.size(); ++g) {
      threads.emplace_back([&, g] { binaries[g] = toolchain::CompileCuda(sources[g], target.cuda_arch(), ptx, nvrtc); });
    }
    for (std::thread& t : threads) t.join();
  }
  for (size_t g = 0; g < binaries.size(); ++g) {
    if (!binaries[g].ok()) {
      const absl::Status& s = binaries[g].status();
      if (s.code() == absl::StatusCode::kInternal) {
        return absl::InternalError(absl::StrCat("NVRTC compile of ", result.sources[g].first, " for ",
                                                target.cuda_arch(), " failed: ", s.message()));
      }
      return s;
    }
    v1::Binary* b = result.artifact.add_binaries();
    b->set_kind(ptx ? v1::Binary::KIND_PTX : v1::Binary::KIND_CUBIN);
    b->set_data(std::move(binaries[g]->bytes));
    b->set_compiler(absl::StrCat("nvrtc ", toolchain::NvrtcVersion(nvrtc).value_or("?"), " ",
                                 target.cuda_arch(), ptx ? " ptx" : ""));
    if (!binaries[g]->log.empty()) absl::StrAppend(&result.log, result.sources[g].first, ":\n", binaries[g]->log);
  }
  timer.Done("compile");
  Finish(prepared, fe, &result);
  if (!sources.empty()) absl::StrAppend(&result.summary, ", ", sources.size(), " NVRTC binar", sources.size() == 1 ? "y" : "ies");
  return result;
}

}  // namespace kiln::compiler
