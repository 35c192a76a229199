// Which extern GEMMs become cuBLASLt LibrarySteps (PlanOptions::library_gemms) and how they are
// encoded (gemm_step.h); the ones that must stay AtenSteps; and that without the option nothing
// changes. Graphs go through PrepareGraph, LowerGraph, ScheduleAndFuse, BuildKernels, AssemblePlan.

#include "server/lower/gemm_step.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"
#include "server/lower/fuse.h"
#include "server/lower/kernelize.h"
#include "server/lower/lower.h"
#include "server/lower/plan_builder.h"

namespace kiln::lower {
namespace {

namespace v1 = ::kiln::v1;
using namespace ::kiln::graph::testing;  // NOLINT: graph builders

v1::ValueMeta G(v1::DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides = {}, int64_t offset = 0) {
  return T(dtype, std::move(sizes), std::move(strides), v1::DEVICE_KIND_CUDA, offset);
}
v1::ValueMeta Cu(std::vector<int64_t> sizes, std::vector<int64_t> strides = {}, int64_t offset = 0) {
  return G(v1::DTYPE_FLOAT32, std::move(sizes), std::move(strides), offset);
}

v1::Plan Plan(const v1::Graph& g, bool library_gemms = true, PlanStats* stats_out = nullptr) {
  v1::CompileRequest req = Request(g);
  req.mutable_target()->Clear();
  req.mutable_target()->set_device(v1::DEVICE_KIND_CUDA);
  req.mutable_target()->set_cuda_arch("sm_90");
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  EXPECT_TRUE(prepared.ok()) << prepared.status();
  if (!prepared.ok()) return {};
  auto ops = LowerGraph(prepared->graph, prepared->fallback_nodes);
  EXPECT_TRUE(ops.ok()) << ops.status();
  if (!ops.ok()) return {};
  auto s = ScheduleAndFuse(*ops, FuseOptions());
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  auto ks = BuildKernels(*ops, *s);
  EXPECT_TRUE(ks.ok()) << ks.status();
  if (!ks.ok()) return {};
  std::vector<std::string> symbols;
  for (size_t i = 0; i < ks->kernels.size(); ++i) symbols.push_back(absl::StrCat("k", i));
  PlanStats stats;
  PlanOptions options;
  options.library_gemms = library_gemms;
  auto plan = AssemblePlan(*ops, *s, *ks, BindToBinary(symbols, 0), &stats, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (stats_out != nullptr) *stats_out = stats;
  return plan.ok() ? *plan : v1::Plan();
}

std::vector<std::string> Kinds(const v1::Plan& p) {
  std::vector<std::string> out;
  for (const auto& s : p.steps()) {
    out.push_back(s.has_library() ? "library" : s.has_aten() ? s.aten().target() : "kernel");
  }
  return out;
}

const v1::LibraryStep& OnlyLibrary(const v1::Plan& p) {
  static const v1::LibraryStep none;
  for (const auto& s : p.steps()) {
    if (s.has_library()) return s.library();
  }
  ADD_FAILURE() << "no library step";
  return none;
}

std::vector<int64_t> Params(const v1::LibraryStep& s) { return {s.int_params().begin(), s.int_params().end()}; }

// [batch, m, n, k, dtype, A bs/rs/cs, B bs/rs/cs, D bs/rs, c_kind, C bs/rs, flags, workspace]
std::vector<int64_t> Expect(std::vector<int64_t> head, int64_t c_kind = kGemmNoC, int64_t c_bs = 0, int64_t c_rs = 0) {
  head.insert(head.end(), {c_kind, c_bs, c_rs, 0, kGemmWorkspaceBytes});
  return head;
}

TEST(GemmStepTest, MmOfContiguousOperands) {
  GraphBuilder b;
  b.Input("a", Cu({32, 64})).Input("w", Cu({64, 16}))
      .Call("mm", "aten.mm.default", {Ref("a"), Ref("w")}, Cu({32, 16}))
      .Output({"mm"});
  PlanStats stats;
  const v1::Plan p = Plan(b.Build(), true, &stats);
  ASSERT_EQ(Kinds(p), std::vector<std::string>({"library"}));
  EXPECT_EQ(stats.library_steps, 1);
  EXPECT_EQ(stats.extern_steps, 0);
  const v1::LibraryStep& s = OnlyLibrary(p);
  EXPECT_EQ(s.function(), "cublasLt.matmul");
  EXPECT_EQ(Params(s), Expect({1, 32, 16, 64, v1::DTYPE_FLOAT32, 0, 64, 1, 0, 16, 1, 0, 16}));
  ASSERT_EQ(s.args_size(), 5);
  EXPECT_EQ(s.args(1), 0);  // the inputs, as they are
  EXPECT_EQ(s.args(2), 1);
  EXPECT_EQ(s.args(3), -1);
  EXPECT_EQ(p.values(s.args(0)).storage(), v1::PlanValue::STORAGE_OUTPUT);  // a graph output
  const v1::PlanValue& ws = p.values(s.args(4));
  EXPECT_EQ(ws.storage(), v1::PlanValue::STORAGE_WORKSPACE);
  EXPECT_EQ(ws.meta().dtype(), v1::DTYPE_UINT8);
  EXPECT_EQ(ws.meta().sizes(0).constant(), kGemmWorkspaceBytes);
  EXPECT_GE(p.workspace_bytes(), ws.offset() + kGemmWorkspaceBytes);
  EXPECT_EQ(s.float_params(0), 1.0);
  EXPECT_EQ(s.float_params(1), 0.0);
  EXPECT_TRUE(CheckGemmStep(s).ok());
}

TEST(GemmStepTest, WithoutTheOptionNothingChanges) {
  GraphBuilder b;
  b.Input("a", Cu({32, 64})).Input("w", Cu({64, 16}))
      .Call("mm", "aten.mm.default", {Ref("a"), Ref("w")}, Cu({32, 16}))
      .Output({"mm"});
  const v1::Plan p = Plan(b.Build(), false);
  EXPECT_EQ(Kinds(p), std::vector<std::string>({"aten.mm.default"}));
  EXPECT_EQ(p.values(p.steps(0).aten().outputs(0)).storage(), v1::PlanValue::STORAGE_STEP);
}

TEST(GemmStepTest, TransposedViewsAreColumnMajorOperands) {
  // mm(t(a), t(w)): both operands have their unit stride along rows.
  GraphBuilder b;
  b.Input("a", Cu({64, 32})).Input("w", Cu({16, 64}))
      .Call("t", "aten.t.default", {Ref("a")}, Cu({32, 64}, {1, 32}))
      .Call("t_1", "aten.t.default", {Ref("w")}, Cu({64, 16}, {1, 64}))
      .Call("mm", "aten.mm.default", {Ref("t"), Ref("t_1")}, Cu({32, 16}))
      .Call("relu", "aten.relu.default", {Ref("mm")}, Cu({32, 16}))
      .Output({"relu"});
  const v1::Plan p = Plan(b.Build());
  ASSERT_EQ(Kinds(p), std::vector<std::string>({"library", "kernel"}));
  const v1::LibraryStep& s = OnlyLibrary(p);
  EXPECT_EQ(Params(s), Expect({1, 32, 16, 64, v1::DTYPE_FLOAT32, 0, 1, 32, 0, 1, 64, 0, 16}));
  EXPECT_EQ(p.values(s.args(1)).storage(), v1::PlanValue::STORAGE_VIEW);
  // The result lives in the workspace, where the relu kernel reads it.
  const int32_t d = s.args(0);
  EXPECT_EQ(p.values(d).storage(), v1::PlanValue::STORAGE_WORKSPACE);
  EXPECT_EQ(p.steps(1).kernel().args(0), d);
  // The scratch and the result are both live at the GEMM: they do not overlap.
  const v1::PlanValue& ws = p.values(s.args(4));
  EXPECT_TRUE(ws.offset() >= p.values(d).offset() + 32 * 16 * 4 || p.values(d).offset() >= ws.offset() + kGemmWorkspaceBytes);
}

// AOTAutograd returns weight gradients as t(mm(...)): the graph output is a view of the GEMM's
// result, which must then be allocated as an output, not in the workspace that later steps (and
// the next call) reuse. (Found on the H200: backward graphs returned another GEMM's result.)
TEST(GemmStepTest, ResultViewedByAGraphOutputIsAnOutput) {
  GraphBuilder b;
  b.Input("g", Cu({8, 4})).Input("x", Cu({8, 32})).Input("y", Cu({32, 16})).Input("z", Cu({16, 8}))
      .Call("t", "aten.t.default", {Ref("g")}, Cu({4, 8}, {1, 4}))
      .Call("mm", "aten.mm.default", {Ref("t"), Ref("x")}, Cu({4, 32}))
      .Call("t_1", "aten.t.default", {Ref("mm")}, Cu({32, 4}, {1, 32}))
      .Call("mm_1", "aten.mm.default", {Ref("y"), Ref("z")}, Cu({32, 8}))
      .Call("relu", "aten.relu.default", {Ref("mm_1")}, Cu({32, 8}))
      .Output({"t_1", "relu"});
  const v1::Plan p = Plan(b.Build());
  ASSERT_EQ(Kinds(p), std::vector<std::string>({"library", "library", "kernel"}));
  const v1::LibraryStep& first = p.steps(0).library();
  EXPECT_EQ(p.values(first.args(0)).storage(), v1::PlanValue::STORAGE_OUTPUT);
  const v1::PlanValue& out0 = p.values(p.outputs(0));
  EXPECT_EQ(out0.storage(), v1::PlanValue::STORAGE_VIEW);
  EXPECT_EQ(out0.index(), first.args(0));
}

TEST(GemmStepTest, LinearBiasIsAnEpilogue) {
  PlanStats stats;
  const v1::Plan p = Plan(MlpForward(), true, &stats);
  EXPECT_EQ(stats.library_steps, 2);
  int seen = 0;
  for (const auto& st : p.steps()) {
    if (!st.has_library()) continue;
    const v1::LibraryStep& s = st.library();
    EXPECT_TRUE(CheckGemmStep(s).ok());
    EXPECT_EQ(s.int_params(kGemmCKind), kGemmBias);
    EXPECT_EQ(s.float_params(1), 1.0);
    // addmm(bias, x, t(w)): w [n, k] transposed -> B with unit stride along k.
    EXPECT_EQ(s.int_params(kGemmBRowStride), 1);
    EXPECT_EQ(s.int_params(kGemmBColStride), s.int_params(kGemmK));
    const v1::PlanValue& bias = p.values(s.args(3));
    EXPECT_EQ(bias.storage(), v1::PlanValue::STORAGE_INPUT);
    EXPECT_EQ(bias.meta().sizes_size(), 1);
    ++seen;
  }
  EXPECT_EQ(seen, 2);
}

TEST(GemmStepTest, AddmmScalesAndMatrixInput) {
  GraphBuilder b;
  b.Input("c", Cu({8, 16})).Input("bias", Cu({16})).Input("a", Cu({8, 4})).Input("w", Cu({4, 16}))
      .Call("addmm", "aten.addmm.default", {Ref("c"), Ref("a"), Ref("w")}, Cu({8, 16}),
            {{"beta", F(0.5)}, {"alpha", F(2.0)}})
      .Call("addmm_1", "aten.addmm.default", {Ref("bias"), Ref("a"), Ref("w")}, Cu({8, 16}),
            {{"beta", F(0.5)}})  // a bias with beta != 1: not an epilogue
      .Call("addmm_2", "aten.addmm.default", {Ref("bias"), Ref("a"), Ref("w")}, Cu({8, 16}),
            {{"beta", I(0)}, {"alpha", F(3.0)}})  // beta 0: self is ignored
      .Output({"addmm", "addmm_1", "addmm_2"});
  const v1::Plan p = Plan(b.Build());
  ASSERT_EQ(Kinds(p), std::vector<std::string>({"library", "aten.addmm.default", "library"}));
  const v1::LibraryStep& m = p.steps(0).library();
  EXPECT_EQ(m.int_params(kGemmCKind), kGemmMatrix);
  EXPECT_EQ(m.int_params(kGemmCRowStride), 16);
  EXPECT_EQ(m.float_params(0), 2.0);
  EXPECT_EQ(m.float_params(1), 0.5);
  const v1::LibraryStep& z = p.steps(2).library();
  EXPECT_EQ(z.int_params(kGemmCKind), kGemmNoC);
  EXPECT_EQ(z.args(3), -1);
  EXPECT_EQ(z.float_params(0), 3.0);
  EXPECT_EQ(z.float_params(1), 0.0);
}

TEST(GemmStepTest, BmmWithTransposedOperand) {
  // q @ k^T as attention computes it: k viewed with its last two dims swapped.
  GraphBuilder b;
  b.Input("q", G(v1::DTYPE_BFLOAT16, {8, 16, 32})).Input("k", G(v1::DTYPE_BFLOAT16, {8, 24, 32}))
      .Call("transpose", "aten.transpose.int", {Ref("k"), I(1), I(2)}, G(v1::DTYPE_BFLOAT16, {8, 32, 24}, {768, 1, 32}))
      .Call("bmm", "aten.bmm.default", {Ref("q"), Ref("transpose")}, G(v1::DTYPE_BFLOAT16, {8, 16, 24}))
      .Output({"bmm"});
  const v1::Plan p = Plan(b.Build());
  ASSERT_EQ(Kinds(p), std::vector<std::string>({"library"}));
  EXPECT_EQ(Params(OnlyLibrary(p)),
            Expect({8, 16, 24, 32, v1::DTYPE_BFLOAT16, 512, 32, 1, 768, 1, 32, 384, 24}));
}

TEST(GemmStepTest, WhatCuBlasCannotExpressStaysAten) {
  GraphBuilder b;
  b.Input("a", Cu({32, 64}, {128, 2}))  // no unit stride
      .Input("w", Cu({64, 16})).Input("x", G(v1::DTYPE_FLOAT64, {4, 4}))
      .Input("y", Cu({2, 4, 4}, {0, 4, 1}))  // a batch stride of 0
      .Input("e", Cu({0, 64}))
      .Call("mm", "aten.mm.default", {Ref("a"), Ref("w")}, Cu({32, 16}))
      .Call("mm_1", "aten.mm.default", {Ref("x"), Ref("x")}, G(v1::DTYPE_FLOAT64, {4, 4}))
      .Call("bmm", "aten.bmm.default", {Ref("y"), Ref("y")}, Cu({2, 4, 4}))
      .Call("mm_2", "aten.mm.default", {Ref("e"), Ref("w")}, Cu({0, 16}))
      .Output({"mm", "mm_1", "bmm", "mm_2"});
  PlanStats stats;
  const v1::Plan p = Plan(b.Build(), true, &stats);
  EXPECT_EQ(Kinds(p), std::vector<std::string>({"aten.mm.default", "aten.mm.default", "aten.bmm.default",
                                                "aten.mm.default"}));
  EXPECT_EQ(stats.library_steps, 0);
  EXPECT_EQ(p.workspace_bytes(), 0);
}

std::vector<v1::Argument> Conv(const std::string& x, const std::string& w, v1::Argument bias,
                               std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0}) {
  return {Ref(x), Ref(w), std::move(bias), Ints(std::move(stride)), Ints(std::move(padding)), Ints({1, 1}),
          B(false), Ints({0, 0}), I(1)};
}

TEST(GemmStepTest, Conv1x1OfChannelsLastHalfImagesIsOneGemm) {
  // [2, 8, 5, 6] channels-last: pixel rows of 8 channels; the weight [4, 8, 1, 1] is W^T's
  // column-major [8, 4]; the bias an epilogue over rows; the result [2, 4, 5, 6] channels-last.
  for (v1::DType dt : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    GraphBuilder b;
    b.Input("x", G(dt, {2, 8, 5, 6}, {240, 1, 48, 8})).Input("w", G(dt, {4, 8, 1, 1})).Input("bias", G(dt, {4}))
        .Call("conv", "aten.convolution.default", Conv("x", "w", Ref("bias")), G(dt, {2, 4, 5, 6}, {120, 1, 24, 4}))
        .Output({"conv"});
    PlanStats stats;
    const v1::Plan p = Plan(b.Build(), true, &stats);
    ASSERT_EQ(Kinds(p), std::vector<std::string>({"library"}));
    EXPECT_EQ(stats.extern_steps, 0);
    const v1::LibraryStep& s = OnlyLibrary(p);
    EXPECT_EQ(Params(s), Expect({1, 60, 4, 8, dt, 0, 8, 1, 0, 1, 8, 0, 4}, kGemmBias));
    EXPECT_EQ(s.args(1), 0);
    EXPECT_EQ(s.args(2), 1);
    EXPECT_EQ(s.args(3), 2);
    EXPECT_EQ(s.float_params(0), 1.0);
    EXPECT_EQ(s.float_params(1), 1.0);
    EXPECT_TRUE(CheckGemmStep(s).ok());
  }
}

TEST(GemmStepTest, OtherConvolutionsStayAtenSteps) {
  const v1::DType bf = v1::DTYPE_BFLOAT16;
  const v1::ValueMeta cl_in = G(bf, {2, 8, 6, 6}, {288, 1, 48, 8});
  struct Case {
    std::string name;
    v1::ValueMeta x, w, out;
    std::vector<int64_t> stride, padding;
  };
  const std::vector<Case> cases = {
      // f32: torch gives cuDNN TF32 under torch.backends.cudnn.allow_tf32, not the GEMM's flag
      {"f32", Cu({2, 8, 6, 6}, {288, 1, 48, 8}), Cu({4, 8, 1, 1}), Cu({2, 4, 6, 6}, {144, 1, 24, 4}), {1, 1}, {0, 0}},
      {"3x3", cl_in, G(bf, {4, 8, 3, 3}, {72, 1, 24, 8}), G(bf, {2, 4, 6, 6}, {144, 1, 24, 4}), {1, 1}, {1, 1}},
      {"stride 2", cl_in, G(bf, {4, 8, 1, 1}), G(bf, {2, 4, 3, 3}, {36, 1, 12, 4}), {2, 2}, {0, 0}},
      {"NCHW", G(bf, {2, 8, 6, 6}), G(bf, {4, 8, 1, 1}), G(bf, {2, 4, 6, 6}), {1, 1}, {0, 0}},
  };
  for (const Case& c : cases) {
    GraphBuilder b;
    b.Input("x", c.x).Input("w", c.w)
        .Call("conv", "aten.convolution.default", Conv("x", "w", None(), c.stride, c.padding), c.out)
        .Output({"conv"});
    PlanStats stats;
    const v1::Plan p = Plan(b.Build(), true, &stats);
    EXPECT_EQ(Kinds(p), std::vector<std::string>({"aten.convolution.default"})) << c.name;
    EXPECT_EQ(stats.library_steps, 0) << c.name;
  }
}

TEST(GemmStepTest, Conv1x1OverOnePixelIsAGemmInEitherLayout) {
  // [N, C, 1, 1]: the rows are the batch, whatever the memory format says.
  const v1::DType bf = v1::DTYPE_BFLOAT16;
  GraphBuilder b;
  b.Input("x", G(bf, {3, 16, 1, 1})).Input("w", G(bf, {8, 16, 1, 1}))
      .Call("conv", "aten.convolution.default", Conv("x", "w", None()), G(bf, {3, 8, 1, 1}))
      .Output({"conv"});
  const v1::Plan p = Plan(b.Build());
  ASSERT_EQ(Kinds(p), std::vector<std::string>({"library"}));
  EXPECT_EQ(Params(OnlyLibrary(p)), Expect({1, 3, 8, 16, bf, 0, 16, 1, 0, 1, 16, 0, 8}));
}

TEST(GemmStepTest, CheckRefusesBadSteps) {
  GraphBuilder b;
  b.Input("a", Cu({32, 64})).Input("w", Cu({64, 16}))
      .Call("mm", "aten.mm.default", {Ref("a"), Ref("w")}, Cu({32, 16}))
      .Output({"mm"});
  const v1::LibraryStep good = OnlyLibrary(Plan(b.Build()));
  ASSERT_TRUE(CheckGemmStep(good).ok());
  v1::LibraryStep s = good;
  s.set_function("cublas.gemm");
  EXPECT_FALSE(CheckGemmStep(s).ok());
  s = good;
  s.set_int_params(kGemmARowStride, 63);  // ld < k
  EXPECT_FALSE(CheckGemmStep(s).ok());
  s = good;
  s.set_int_params(kGemmCKind, kGemmBias);  // no C value
  EXPECT_FALSE(CheckGemmStep(s).ok());
  s = good;
  s.mutable_int_params()->RemoveLast();
  EXPECT_FALSE(CheckGemmStep(s).ok());
}

}  // namespace
}  // namespace kiln::lower
