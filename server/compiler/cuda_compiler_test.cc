// CudaGraphCompiler with real NVRTC on a machine without a GPU: every captured graph of
// server/graph/testdata (CPU and CUDA captures, forward and backward) and the builder graphs
// compile for sm_90 (and the small ones for sm_80) into cubins; plans launch every kernel with a
// grid and block, from a binary that holds its symbol; graphs with symbolic sizes are refused as
// UNIMPLEMENTED. Numerics are checked on the GPU machine (tests/gpu/).

#include "server/compiler/cuda_compiler.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/compiler/test_util.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"
#include "server/toolchain/nvrtc_testing.h"

namespace kiln::compiler {
namespace {

namespace v1 = ::kiln::v1;
using ::kiln::toolchain::testing::ElfMachine;
using ::kiln::toolchain::testing::HaveNvrtc;

CudaCompilerOptions Options() {
  CudaCompilerOptions o;
  o.nvrtc = toolchain::testing::TestNvrtcOptions();
  return o;
}

absl::StatusOr<CompileResult> CompileFor(v1::CompileRequest req, const std::string& arch,
                                         const CudaCompilerOptions& options = Options()) {
  req.mutable_target()->Clear();
  req.mutable_target()->set_device(v1::DEVICE_KIND_CUDA);
  req.mutable_target()->set_cuda_arch(arch);
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  if (!prepared.ok()) return prepared.status();
  CudaGraphCompiler compiler(options);
  return compiler.Compile(*prepared, req);
}

// "" when every kernel step is launchable from the artifact, else what is wrong.
std::string CheckLaunches(const CompileResult& r) {
  const v1::Artifact& a = r.artifact;
  for (int i = 0; i < a.binaries_size(); ++i) {
    if (a.binaries(i).kind() != v1::Binary::KIND_CUBIN) return absl::StrCat("binary ", i, " is not a cubin");
    if (ElfMachine(a.binaries(i).data()) != 190) return absl::StrCat("binary ", i, " is not EM_CUDA");
  }
  int kernels = 0;
  for (const v1::PlanStep& step : a.plan().steps()) {
    if (!step.has_kernel()) continue;
    const v1::KernelStep& k = step.kernel();
    ++kernels;
    if (k.binary() < 0 || k.binary() >= a.binaries_size()) return absl::StrCat(k.symbol(), ": binary ", k.binary());
    if (!absl::StrContains(a.binaries(k.binary()).data(), k.symbol())) {
      return absl::StrCat(k.symbol(), " is not in binary ", k.binary());
    }
    if (k.grid_size() != 1 || k.grid(0) < 1 || k.grid(0) > 2147483647) return absl::StrCat(k.symbol(), ": grid");
    if (k.block_size() != 1 || k.block(0) < 32 || k.block(0) > 1024 || k.block(0) % 32 != 0) {
      return absl::StrCat(k.symbol(), ": block");
    }
    if (k.scalar_args_size() != 0) return absl::StrCat(k.symbol(), ": scalar args in a static plan");
  }
  if (kernels > 0 && a.binaries_size() == 0) return "kernels but no binaries";
  return "";
}

TEST(CudaCompilerTest, BuilderGraphsCompileForSm80AndSm90) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  for (const std::string arch : {"sm_80", "sm_90"}) {
    // (The builders' attention and conv graphs return non-tensor outputs, which plans refuse.)
    int index = 0;
    for (v1::Graph g : {graph::testing::MlpForward(), graph::testing::MlpBackward()}) {
      const std::string name = absl::StrCat("graph ", index++);
      auto r = CompileFor(graph::testing::Request(std::move(g)), arch);
      ASSERT_TRUE(r.ok()) << name << " " << arch << ": " << r.status();
      EXPECT_EQ(CheckLaunches(*r), "") << name << " " << arch;
      EXPECT_GE(r->artifact.binaries_size(), 1) << name;
      EXPECT_TRUE(absl::StrContains(r->summary, "NVRTC binar")) << r->summary;
      std::set<std::string> phases;
      for (const auto& [phase, us] : r->timings_us) phases.insert(phase);
      EXPECT_EQ(phases, (std::set<std::string>{"lower", "fuse", "codegen", "plan", "compile"}));
    }
  }
}

TEST(CudaCompilerTest, ManyKernelsCompileInParallelIntoSeveralBinaries) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  CudaCompilerOptions o = Options();
  o.parallel_compiles = 3;
  o.kernels_per_compile = 1;
  v1::CompileRequest req = graph::testing::Request(graph::testing::MlpBackward());
  req.mutable_options()->set_disable_fusion(true);  // one kernel per op: many kernels
  auto r = CompileFor(req, "sm_90", o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(CheckLaunches(*r), "");
  int kernels = 0;
  for (const auto& s : r->artifact.plan().steps()) kernels += s.has_kernel();
  ASSERT_GE(kernels, 3);
  EXPECT_EQ(r->artifact.binaries_size(), 3);
  EXPECT_EQ(r->sources.size(), 3u);
  EXPECT_EQ(r->sources[2].first, "graph_2.cu");
}

TEST(CudaCompilerTest, IdenticalKernelsCompileOnce) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  // An unrolled RNN repeats the same cell: its kernels are copies of each other.
  std::ifstream in("server/graph/testdata/rnn_fwd.binpb", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  v1::CompileRequest req;
  ASSERT_TRUE(req.ParseFromString(ss.str()));
  auto r = CompileFor(req, "sm_90");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(CheckLaunches(*r), "");
  int steps = 0;
  std::set<std::pair<int, std::string>> launched;
  for (const auto& s : r->artifact.plan().steps()) {
    if (!s.has_kernel()) continue;
    ++steps;
    launched.insert({s.kernel().binary(), s.kernel().symbol()});
  }
  int compiled = 0;
  for (const auto& [name, text] : r->sources) {
    for (size_t at = text.find("__launch_bounds__("); at != std::string::npos; at = text.find("__launch_bounds__(", at + 1)) ++compiled;
  }
  EXPECT_LT(static_cast<int>(launched.size()), steps);
  EXPECT_EQ(compiled, static_cast<int>(launched.size()));
}

TEST(CudaCompilerTest, PtxOption) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  v1::CompileRequest req = graph::testing::Request(graph::testing::MlpForward());
  req.mutable_options()->set_cuda_emit_ptx(true);
  auto r = CompileFor(req, "sm_90");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->artifact.binaries_size(), 1);
  EXPECT_EQ(r->artifact.binaries(0).kind(), v1::Binary::KIND_PTX);
  // Kernels are named after the graph's key, so that a profile tells plans apart.
  req.mutable_target()->set_device(v1::DEVICE_KIND_CUDA);
  req.mutable_target()->set_cuda_arch("sm_90");
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const std::string prefix = absl::StrCat("kiln_", prepared->key.hex.substr(0, 8), "_");
  EXPECT_TRUE(absl::StrContains(r->artifact.binaries(0).data(), ".entry " + prefix + "0")) << prefix;
  for (const auto& step : r->artifact.plan().steps()) {
    if (step.has_kernel()) EXPECT_TRUE(absl::StartsWith(step.kernel().symbol(), prefix)) << step.kernel().symbol();
  }
}

TEST(CudaCompilerTest, RefusesOtherTargetsBadArchAndDynamicShapes) {
  v1::CompileRequest req = graph::testing::Request(graph::testing::MlpForward());
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  ASSERT_TRUE(prepared.ok());
  CudaGraphCompiler compiler(Options());
  v1::CompileRequest cpu = req;
  cpu.mutable_target()->set_device(v1::DEVICE_KIND_CPU);
  EXPECT_EQ(compiler.Compile(*prepared, cpu).status().code(), absl::StatusCode::kInvalidArgument);
  v1::CompileRequest bad = req;
  bad.mutable_target()->set_cuda_arch("sm_9x");
  EXPECT_EQ(compiler.Compile(*prepared, bad).status().code(), absl::StatusCode::kInvalidArgument);
  auto d = CompileFor(graph::testing::Request(graph::testing::DynamicGraph()), "sm_90");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented) << d.status();
}

TEST(CudaCompilerTest, MissingNvrtcIsFailedPrecondition) {
  CudaCompilerOptions o = Options();
  o.nvrtc.library = "/nonexistent/libnvrtc.so.13";
  auto r = CompileFor(graph::testing::Request(graph::testing::MlpForward()), "sm_90", o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_FALSE(CudaGraphCompiler::IdentityComponents(o).ok());
}

// An RMSNorm's weight gradient on a GPU: sum over (batch, position) of grad_out * x * rstd, 768
// columns over 8 x 512 rows. Its rows split into 16 partials (lower_split.cc), and the partials'
// kernel is still a column reduction although its per-row rstd now moves with an outer variable
// (the partial's index): a block's consecutive columns share it. (Taken for rows, it read each
// row's 256 elements 768 columns apart: 58 us on the H200 against 17 before the split.)
TEST(CudaCompilerTest, SplitColumnReductionStaysAColumnKernel) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  namespace gt = ::kiln::graph::testing;
  const std::vector<int64_t> s = {8, 512, 768};
  gt::GraphBuilder b;
  b.Input("go", testing::C32(s)).Input("x", testing::C32(s)).Input("rstd", testing::C32({8, 512, 1}))
      .Call("xhat", "aten.mul.Tensor", {gt::Ref("x"), gt::Ref("rstd")}, testing::C32(s))
      .Call("prod", "aten.mul.Tensor", {gt::Ref("go"), gt::Ref("xhat")}, testing::C32(s))
      .Call("gw", "aten.sum.dim_IntList", {gt::Ref("prod"), gt::Ints({0, 1})}, testing::C32({768}))
      .Output({"gw"});
  auto r = CompileFor(gt::Request(b.Build()), "sm_90");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(CheckLaunches(*r), "");
  std::string all;
  for (const auto& [name, source] : r->sources) all += source;
  EXPECT_TRUE(absl::StrContains(all, "_0: column, 2 outer dims, 2 reduction dims")) << all.substr(0, 4000);
  EXPECT_TRUE(absl::StrContains(all, "_1: column, 1 outer dims, 2 reduction dims")) << all.substr(0, 4000);
}

TEST(CudaCompilerTest, EveryCapturedGraphCompiles) {
  if (!HaveNvrtc()) GTEST_SKIP() << "NVRTC not found";
  const auto captured = testing::CapturedRequests();
  ASSERT_GE(captured.size(), 40u);
  int compiled = 0;
  for (const auto& [f, captured_request] : captured) {
    v1::CompileRequest req = captured_request;
    auto r = CompileFor(req, "sm_90");
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << f << ": " << r.status();
      EXPECT_TRUE(absl::StrContains(r.status().message(), "dynamic shapes")) << f << ": " << r.status();
      continue;
    }
    EXPECT_EQ(CheckLaunches(*r), "") << f;
    std::cout << f << ": " << r->summary << "\n";
    ++compiled;
  }
  EXPECT_GE(compiled, 30);
}

}  // namespace
}  // namespace kiln::compiler
