// Runs the CPU or CUDA compiler on serialized CompileRequest files (the Python client's capture
// format):
//   bazel run //server/compiler:compile_graph -- [--no-compile] [--dump] [--cuda=sm_90] FILE...
// Prints one line per file: kernels, extern and fallback steps, workspace bytes, stage timings,
// or the error. Targets are retargeted to CPU ("x86-64"), or with --cuda to that CUDA arch
// (NVRTC from KILN_NVRTC_PATH; the worker from --nvrtc_worker=PATH or beside this binary).
// --dump prints every stage's output (debug log), the plan and the sources.

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kiln/v1/compiler.pb.h"
#include "server/compiler/cpu_compiler.h"
#include "server/compiler/cuda_compiler.h"
#include "server/graph/graph_path.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  bool compile = true, dump = false;
  std::string cuda_arch, worker;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-compile") {
      compile = false;
    } else if (a == "--dump") {
      dump = true;
      spdlog::set_level(spdlog::level::debug);  // every stage's dump, also for failed compiles
    } else if (a.rfind("--cuda=", 0) == 0) {
      cuda_arch = a.substr(7);
    } else if (a.rfind("--nvrtc_worker=", 0) == 0) {
      worker = a.substr(15);
    } else {
      files.push_back(a);
    }
  }
  int failures = 0;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    kiln::v1::CompileRequest req;
    if (!req.ParseFromString(s.str())) {
      std::cout << file << ": not a CompileRequest\n";
      ++failures;
      continue;
    }
    req.mutable_target()->Clear();
    if (cuda_arch.empty()) {
      req.mutable_target()->set_device(kiln::v1::DEVICE_KIND_CPU);
      req.mutable_target()->set_cpu_isa("x86-64");
    } else {
      req.mutable_target()->set_device(kiln::v1::DEVICE_KIND_CUDA);
      req.mutable_target()->set_cuda_arch(cuda_arch);
    }
    auto prepared = kiln::graph::PrepareGraph(req, kiln::graph::GraphLimits(), kiln::graph::CompilerIdentity());
    if (!prepared.ok()) {
      std::cout << file << ": prepare: " << prepared.status() << "\n";
      ++failures;
      continue;
    }
    kiln::compiler::CpuCompilerOptions options;
    if (!compile) options.toolchain.compiler = "/bin/true";
    kiln::compiler::CpuGraphCompiler cpu(options);
    kiln::compiler::CudaCompilerOptions cuda_options;
    cuda_options.nvrtc.worker = worker;
    if (!compile) cuda_options.nvrtc.worker = "/bin/true";
    kiln::compiler::CudaGraphCompiler cuda(cuda_options);
    kiln::GraphCompiler& compiler = cuda_arch.empty() ? static_cast<kiln::GraphCompiler&>(cpu) : cuda;
    auto r = compiler.Compile(*prepared, req);
    if (!r.ok()) {
      std::cout << file << ": " << r.status() << "\n";
      if (r.status().code() != absl::StatusCode::kUnimplemented) ++failures;
      continue;
    }
    std::string timings;
    for (const auto& [phase, us] : r->timings_us) absl::StrAppend(&timings, " ", phase, "=", us, "us");
    std::cout << file << ": " << r->summary << " |" << timings << "\n";
    for (const auto& d : r->diagnostics) std::cout << "    " << d.code() << " " << d.node() << ": " << d.message() << "\n";
    if (dump) {
      std::cout << r->artifact.plan().DebugString();
      for (const auto& [name, text] : r->sources) std::cout << "// " << name << "\n" << text << "\n";
    }
  }
  return failures == 0 ? 0 : 1;
}
