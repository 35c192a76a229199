// End to end: kiln.v1 graph -> PrepareGraph -> CpuGraphCompiler (real g++) -> runtime -> the plan's
// steps on random data (extern mm in a C++ reference) -> compared with straightforward C++ math.

#include "server/compiler/cpu_compiler.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/compiler/test_executor.h"
#include "server/compiler/test_util.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"

namespace kiln::compiler {
namespace {

namespace v1 = ::kiln::v1;
using namespace ::kiln::graph::testing;  // NOLINT: graph builders
constexpr v1::DType kF = v1::DTYPE_FLOAT32;
using ::kiln::compiler::testing::Empty;
using ::kiln::compiler::testing::HostTensor;
using ::kiln::compiler::testing::Values;
using ::kiln::compiler::testing::C32;
using namespace ::kiln::compiler::testing;  // NOLINT: test helpers

// z = relu(x + t(y)) * b + 2 (b broadcast over rows), w = f64(z) - 1: one kernel, two outputs.
v1::Graph PointwiseChain() {
  GraphBuilder b;
  b.Input("x", C32({8, 16})).Input("y", C32({16, 8})).Input("b", C32({16}))
      .Call("t", "aten.t.default", {Ref("y")}, C32({8, 16}, {1, 8}))
      .Call("add", "aten.add.Tensor", {Ref("x"), Ref("t")}, C32({8, 16}))
      .Call("relu", "aten.relu.default", {Ref("add")}, C32({8, 16}))
      .Call("mul", "aten.mul.Tensor", {Ref("relu"), Ref("b")}, C32({8, 16}))
      .Call("z", "aten.add.Scalar", {Ref("mul"), F(2.0)}, C32({8, 16}))
      .Call("w64", "prims.convert_element_type.default", {Ref("z"), Dt(v1::DTYPE_FLOAT64)},
            T(v1::DTYPE_FLOAT64, {8, 16}, {}, v1::DEVICE_KIND_CPU))
      .Call("w", "aten.sub.Scalar", {Ref("w64"), I(1)}, T(v1::DTYPE_FLOAT64, {8, 16}, {}, v1::DEVICE_KIND_CPU))
      .Output({"z", "w"});
  return b.Build();
}

TEST(CpuCompilerTest, PointwiseChainIsOneKernel) {
  for (bool disable : {false, true}) {
    auto c = CompileGraph(PointwiseChain(), disable);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->kernels, disable ? 6 : 1) << c->result.artifact.plan().DebugString();
    const HostTensor x = Random({8, 16}, {}, 1), y = Random({16, 8}, {}, 2), b = Random({16}, {}, 3);
    auto out = testing::RunPlan(c->result.artifact, {x, y, b}, Aten);
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<double> z, w;
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 16; ++j) {
        const float s = static_cast<float>(x.Get(i * 16 + j)) + static_cast<float>(y.Get(j * 8 + i));
        const float v = std::max(s, 0.f) * static_cast<float>(b.Get(j)) + 2.f;
        z.push_back(v);
        w.push_back(static_cast<double>(v) - 1.0);
      }
    }
    ExpectNear(Values((*out)[0]), z);
    ExpectNear(Values((*out)[1]), w);
    EXPECT_EQ((*out)[1].dtype, v1::DTYPE_FLOAT64);
    std::vector<std::string> phases;
    for (const auto& [phase, us] : c->result.timings_us) phases.push_back(phase);
    EXPECT_EQ(phases, (std::vector<std::string>{"lower", "fuse", "plan", "codegen", "compile"}));
    ASSERT_EQ(c->result.sources.size(), 1u);
    EXPECT_EQ(c->result.sources[0].first, "graph.cc");
    ASSERT_EQ(c->result.artifact.binaries_size(), 1);
    EXPECT_EQ(c->result.artifact.binaries(0).kind(), v1::Binary::KIND_SHARED_OBJECT);
    EXPECT_FALSE(c->result.artifact.binaries(0).compiler().empty());
  }
}

// gelu(x @ W + b) written out as AOTAutograd decomposes it: the mm is an extern step, the bias add
// and the GELU arithmetic fuse into one kernel after it.
v1::Graph GeluMlp() {
  GraphBuilder b;
  b.Input("x", C32({6, 10})).Input("w", C32({10, 12})).Input("b", C32({12}))
      .Call("mm", "aten.mm.default", {Ref("x"), Ref("w")}, C32({6, 12}))
      .Call("y", "aten.add.Tensor", {Ref("mm"), Ref("b")}, C32({6, 12}))
      .Call("half", "aten.mul.Tensor", {Ref("y"), F(0.5)}, C32({6, 12}))
      .Call("scaled", "aten.mul.Tensor", {Ref("y"), F(0.7071067811865476)}, C32({6, 12}))
      .Call("erf", "aten.erf.default", {Ref("scaled")}, C32({6, 12}))
      .Call("one", "aten.add.Tensor", {Ref("erf"), I(1)}, C32({6, 12}))
      .Call("out", "aten.mul.Tensor", {Ref("half"), Ref("one")}, C32({6, 12}))
      .Output({"out"});
  return b.Build();
}

TEST(CpuCompilerTest, MmThenFusedGeluEpilogue) {
  auto c = CompileGraph(GeluMlp());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 1);
  EXPECT_EQ(c->aten, 1);
  EXPECT_EQ(c->result.artifact.plan().workspace_bytes(), 0);
  const HostTensor x = Random({6, 10}, {}, 4), w = Random({10, 12}, {}, 5), b = Random({12}, {}, 6);
  auto out = testing::RunPlan(c->result.artifact, {x, w, b}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 12; ++j) {
      double s = 0;
      for (int p = 0; p < 10; ++p) s += x.Get(i * 10 + p) * w.Get(p * 12 + j);
      const double y = static_cast<float>(s) + b.Get(j);
      want.push_back(0.5 * y * (1 + std::erf(y * M_SQRT1_2)));
    }
  }
  ExpectNear(Values((*out)[0]), want, 1e-5);
}

// softmax(x) * 2 stores only the product (a phase-1 epilogue); the backward ops are row kernels.
// bf16 arithmetic runs in f32 and rounds at each op's output (as eager torch); sums accumulate in
// f32; comparisons give bool; argmax gives int64.
// Views of inputs are plan views, never copies; an output view of an input aliases it.
TEST(CpuCompilerTest, ViewChainMakesNoCopies) {
  GraphBuilder b;
  b.Input("x", C32({4, 6}))
      .Call("v", "aten.view.default", {Ref("x"), Ints({2, 12})}, C32({2, 12}))
      .Call("sl", "aten.slice.Tensor", {Ref("v"), I(1), I(2), I(10)}, C32({2, 8}, {12, 1}, 2))
      .Call("p", "aten.permute.default", {Ref("sl"), Ints({1, 0})}, C32({8, 2}, {1, 12}, 2))
      .Call("e", "aten.exp.default", {Ref("p")}, C32({8, 2}, {1, 8}))
      .Call("t", "aten.t.default", {Ref("x")}, C32({6, 4}, {1, 6}))
      .Output({"e", "t", "x"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 1);
  const auto& plan = c->result.artifact.plan();
  int views = 0;
  for (const auto& v : plan.values()) views += v.storage() == v1::PlanValue::STORAGE_VIEW;
  EXPECT_GE(views, 2);
  EXPECT_EQ(plan.values(plan.outputs(1)).storage(), v1::PlanValue::STORAGE_VIEW);
  EXPECT_EQ(plan.values(plan.outputs(2)).storage(), v1::PlanValue::STORAGE_INPUT);
  const HostTensor x = Random({4, 6}, {}, 12);
  auto out = testing::RunPlan(c->result.artifact, {x}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> e, t;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 2; ++j) e.push_back(std::exp(x.Get(j * 12 + 2 + i)));
  }
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 4; ++j) t.push_back(x.Get(j * 6 + i));
  }
  ExpectNear(Values((*out)[0]), e);
  ExpectNear(Values((*out)[1]), t);
  EXPECT_EQ((*out)[1].storage, x.storage);  // aliases the input
}

// The realistic AOTAutograd graphs of server/graph/test_graphs (MLP forward and backward).
TEST(CpuCompilerTest, MlpForwardEndToEnd) {
  auto c = CompileGraph(MlpForward());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 2);  // relu, log_softmax
  EXPECT_EQ(c->aten, 2);     // addmm, addmm
  const HostTensor p1 = Random({128, 64}, {}, 20), p2 = Random({128}, {}, 21), p3 = Random({32, 64}, {}, 22),
                   p4 = Random({10, 128}, {}, 23), p5 = Random({10}, {}, 24);
  auto out = testing::RunPlan(c->result.artifact, {p1, p2, p3, p4, p5}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> h = MatMul(Values(p3), Transpose(Values(p1), 128, 64), 32, 64, 128);
  for (int i = 0; i < 32 * 128; ++i) h[i] = std::max(0.0, static_cast<double>(static_cast<float>(h[i] + p2.Get(i % 128))));
  std::vector<double> o = MatMul(h, Transpose(Values(p4), 10, 128), 32, 128, 10), lsm;
  for (int i = 0; i < 32; ++i) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < 10; ++j) mx = std::max(mx, o[i * 10 + j] + p5.Get(j));
    for (int j = 0; j < 10; ++j) s += std::exp(o[i * 10 + j] + p5.Get(j) - mx);
    for (int j = 0; j < 10; ++j) lsm.push_back(o[i * 10 + j] + p5.Get(j) - mx - std::log(s));
  }
  ExpectNear(Values((*out)[0]), lsm, 1e-4);
  EXPECT_EQ((*out)[1].storage, p3.storage);
  ExpectNear(Values((*out)[2]), h, 1e-4);
  ExpectNear(Values((*out)[3]), Transpose(Values(p4), 10, 128));
}

TEST(CpuCompilerTest, MlpBackwardEndToEnd) {
  auto c = CompileGraph(MlpBackward());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aten, 3);  // mm, mm_1, mm_2
  const HostTensor p3 = Random({32, 64}, {}, 25), t1 = Random({32, 10}, {}, 27), p4 = Random({10, 128}, {}, 28);
  HostTensor relu = Random({32, 128}, {}, 26);
  for (int k = 0; k < 32 * 128; ++k) relu.Set(k, std::max(0.0, relu.Get(k)));
  auto out = testing::RunPlan(c->result.artifact, {p3, relu, p4, t1}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 5u);
  EXPECT_EQ((*out)[2].storage, nullptr);  // None
  const std::vector<double> mm = MatMul(Values(t1), Values(p4), 32, 10, 128);
  std::vector<double> tb(32 * 128), sum2(128, 0), sum1(10, 0);
  for (int k = 0; k < 32 * 128; ++k) {
    const double v = static_cast<float>(mm[k]);
    tb[k] = relu.Get(k) <= 0 ? 0 : v;
    sum2[k % 128] += tb[k];
  }
  for (int k = 0; k < 320; ++k) sum1[k % 10] += t1.Get(k);
  std::vector<double> mm2 = MatMul(Transpose(tb, 32, 128), Values(p3), 128, 32, 64);
  for (double& v : mm2) v = 0.5 * static_cast<float>(v);
  ExpectNear(Values((*out)[0]), mm2, 1e-4);
  ExpectNear(Values((*out)[1]), sum2, 1e-4);
  ExpectNear(Values((*out)[3]), MatMul(Transpose(Values(t1), 32, 10), Values(relu), 10, 32, 128), 1e-4);
  ExpectNear(Values((*out)[4]), sum1, 1e-4);
}

// CUDA plans run GEMMs as cuBLASLt library steps (server/lower/gemm_step.h). With the test knob the
// CPU compiler plans them the same way; the test executor computes library steps naively, so a
// plan with library steps must give what the plan with aten steps gives (results of GEMMs in the
// workspace, read by kernels; biases as epilogues; transposed operands).
TEST(CpuCompilerTest, LibraryGemmsMatchAtenSteps) {
  CpuCompilerOptions lib;
  lib.library_gemms_for_tests = true;
  struct Case {
    v1::Graph graph;
    std::vector<HostTensor> inputs;
    int library;
  };
  HostTensor relu = Random({32, 128}, {}, 26);
  for (int k = 0; k < 32 * 128; ++k) relu.Set(k, std::max(0.0, relu.Get(k)));
  std::vector<Case> cases;
  cases.push_back({MlpForward(),
                   {Random({128, 64}, {}, 20), Random({128}, {}, 21), Random({32, 64}, {}, 22),
                    Random({10, 128}, {}, 23), Random({10}, {}, 24)},
                   2});
  cases.push_back({MlpBackward(), {Random({32, 64}, {}, 25), relu, Random({10, 128}, {}, 28), Random({32, 10}, {}, 27)}, 3});
  for (const Case& c : cases) {
    auto with_aten = CompileGraph(c.graph);
    auto with_lib = CompileGraph(c.graph, false, lib);
    ASSERT_TRUE(with_aten.ok()) << with_aten.status();
    ASSERT_TRUE(with_lib.ok()) << with_lib.status();
    int library = 0;
    for (const auto& st : with_lib->result.artifact.plan().steps()) library += st.has_library();
    EXPECT_EQ(library, c.library) << c.graph.debug_name();
    EXPECT_EQ(with_lib->aten, 0);
    auto want = testing::RunPlan(with_aten->result.artifact, c.inputs, Aten);
    auto got = testing::RunPlan(with_lib->result.artifact, c.inputs, Aten);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < got->size(); ++i) {
      if ((*want)[i].storage == nullptr) continue;
      ExpectNear(Values((*got)[i]), Values((*want)[i]), 1e-5);
    }
  }
}

TEST(CpuCompilerTest, LibraryBmmWithTransposedOperandAndEpilogue) {
  CpuCompilerOptions lib;
  lib.library_gemms_for_tests = true;
  GraphBuilder b;
  b.Input("q", C32({4, 8, 16})).Input("k", C32({4, 12, 16}))
      .Call("transpose", "aten.transpose.int", {Ref("k"), I(1), I(2)}, C32({4, 16, 12}, {192, 1, 16}))
      .Call("bmm", "aten.bmm.default", {Ref("q"), Ref("transpose")}, C32({4, 8, 12}))
      .Call("mul", "aten.mul.Tensor", {Ref("bmm"), F(0.25)}, C32({4, 8, 12}))
      .Output({"mul"});
  auto c = CompileGraph(b.Build(), false, lib);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 1);
  EXPECT_EQ(c->aten, 0);
  const HostTensor q = Random({4, 8, 16}, {}, 30), k = Random({4, 12, 16}, {}, 31);
  auto out = testing::RunPlan(c->result.artifact, {q, k}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> want;
  for (int bi = 0; bi < 4; ++bi) {
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 12; ++j) {
        double acc = 0;
        for (int p = 0; p < 16; ++p) acc += q.Get((bi * 8 + i) * 16 + p) * k.Get((bi * 12 + j) * 16 + p);
        want.push_back(0.25 * static_cast<float>(acc));
      }
    }
  }
  ExpectNear(Values((*out)[0]), want, 1e-5);
}

// Position-dependent ops: cat of an input and a computed value, constant_pad_nd, select_backward,
// slice_backward, tril.
TEST(CpuCompilerTest, CompilerFailureIsInternalWithLog) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string script = absl::StrCat(tmp ? tmp : "/tmp", "/failing_cxx.sh");
  {
    std::ofstream f(script);
    f << "#!/bin/sh\necho 'graph.cc:1:1: error: injected failure' >&2\nexit 1\n";
  }
  ASSERT_EQ(std::system(absl::StrCat("chmod +x ", script).c_str()), 0);
  CpuCompilerOptions options;
  options.toolchain.compiler = script;
  auto c = CompileGraph(PointwiseChain(), false, options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInternal) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "injected failure")) << c.status();
}

TEST(CpuCompilerTest, RefusesCudaAndDynamicShapes) {
  v1::CompileRequest req = Request(PointwiseChain());
  auto prepared = ::kiln::graph::PrepareGraph(req, ::kiln::graph::GraphLimits(), ::kiln::graph::CompilerIdentity());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  CpuGraphCompiler compiler{CpuCompilerOptions()};
  auto r = compiler.Compile(*prepared, req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "not CPU")) << r.status();

  auto d = CompileGraph(DynamicGraph());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented) << d.status();
  EXPECT_TRUE(absl::StrContains(d.status().message(), "dynamic shapes")) << d.status();
}

TEST(CpuCompilerTest, IdentityComponents) {
  auto id = CpuGraphCompiler::IdentityComponents(CpuCompilerOptions());
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->at("cpu_compiler"), kCpuCompilerVersion);
  EXPECT_FALSE(id->at("cxx").empty());
  EXPECT_TRUE(absl::StrContains(id->at("cxx_flags"), "-O3"));
}

}  // namespace
}  // namespace kiln::compiler
