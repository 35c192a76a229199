// Golden tests of the fused kernel IR (printer output) and negative tests where nothing fuses.
// Graphs are written with the client's builders, run through PrepareGraph, LowerGraph,
// ScheduleAndFuse and BuildKernels; every kernel is re-verified.

#include "server/lower/fuse.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"
#include "server/kernel/printer.h"
#include "server/kernel/verifier.h"
#include "server/lower/kernelize.h"
#include "server/lower/lower.h"
#include "server/lower/plan_builder.h"

namespace kiln::lower {
namespace {

namespace v1 = ::kiln::v1;
using namespace ::kiln::graph::testing;  // NOLINT: graph builders

v1::ValueMeta C32(std::vector<int64_t> sizes, std::vector<int64_t> strides = {}, int64_t offset = 0) {
  return T(v1::DTYPE_FLOAT32, std::move(sizes), std::move(strides), v1::DEVICE_KIND_CPU, offset);
}

struct Result {
  graph::PreparedGraph prepared;
  OpGraph ops;
  Schedule schedule;
  KernelSet kernels;
  v1::Plan plan;
  std::string text;  // every kernel, printed
  int aten = 0;
};

Result Pipeline(const v1::Graph& g, bool disable_fusion = false, const LowerOptions& lower = {}) {
  Result r;
  v1::CompileRequest req = Request(g);
  req.mutable_target()->Clear();
  req.mutable_target()->set_device(v1::DEVICE_KIND_CPU);
  req.mutable_target()->set_cpu_isa("x86-64");
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  EXPECT_TRUE(prepared.ok()) << prepared.status();
  if (!prepared.ok()) return r;
  r.prepared = std::move(*prepared);
  auto ops = LowerGraph(r.prepared.graph, r.prepared.fallback_nodes, lower);
  EXPECT_TRUE(ops.ok()) << ops.status();
  if (!ops.ok()) return r;
  r.ops = std::move(*ops);
  auto s = ScheduleAndFuse(r.ops, FuseOptions{disable_fusion});
  EXPECT_TRUE(s.ok()) << s.status();
  r.schedule = std::move(*s);
  auto ks = BuildKernels(r.ops, r.schedule);
  EXPECT_TRUE(ks.ok()) << ks.status();
  if (!ks.ok()) return r;
  r.kernels = std::move(*ks);
  std::vector<std::string> symbols;
  for (const auto& k : r.kernels.kernels) {
    EXPECT_TRUE(kernel::VerifyKernel(k.kernel).ok());
    r.text += kernel::PrintKernel(k.kernel);
    symbols.push_back(absl::StrCat("k", symbols.size()));
  }
  PlanStats stats;
  auto plan = AssemblePlan(r.ops, r.schedule, r.kernels, BindToBinary(symbols, 0), &stats);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (plan.ok()) r.plan = std::move(*plan);
  r.aten = stats.extern_steps + stats.fallback_steps;
  return r;
}

std::string Log(const Result& r) { return absl::StrJoin(r.schedule.log, "\n"); }

// Compares with the expectation and prints the actual text between markers (to refresh goldens).
void ExpectGolden(const std::string& name, const std::string& actual, const std::string& expected) {
  if (actual != expected) std::cout << "<<<GOLDEN " << name << "\n" << actual << ">>>\n";
  EXPECT_EQ(actual, expected) << name;
}

TEST(FuseTest, PointwiseChainGolden) {
  GraphBuilder b;
  b.Input("x", C32({8, 16})).Input("b", C32({16}))
      .Call("add", "aten.add.Tensor", {Ref("x"), Ref("b")}, C32({8, 16}))
      .Call("relu", "aten.relu.default", {Ref("add")}, C32({8, 16}))
      .Call("mul", "aten.mul.Tensor", {Ref("relu"), F(0.5)}, C32({8, 16}))
      .Output({"mul"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u);
  ExpectGolden("pointwise", r.text, R"(kernel "group 0: mul"
  scalars: 0
  buffers: b0: f32 read [128], b1: f32 read [16], b2: f32 write [128]
  outer: o0 < 8, o1 < 16
  body:
    b2[16*o0 + o1] = mul(relu(add(load(b0, 16*o0 + o1), load(b1, o1))), 0.5:f32)
)");
}

// gelu(x @ W + b), decomposed: mm stays an extern step; bias and GELU fuse after it; y = mm + b has
// two consumers but is computed once per element inside the one kernel and never stored.
TEST(FuseTest, MmWithGeluEpilogueGolden) {
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
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u);
  EXPECT_EQ(r.aten, 1);
  EXPECT_EQ(r.plan.workspace_bytes(), 0);
  ExpectGolden("gelu", r.text, R"(kernel "group 0: mul"
  scalars: 0
  buffers: b0: f32 read [72], b1: f32 read [12], b2: f32 write [72]
  outer: o0 < 6, o1 < 12
  body:
    b2[12*o0 + o1] = mul(mul(add(load(b0, 12*o0 + o1), load(b1, o1)), 0.5:f32), add(erf(mul(add(load(b0, 12*o0 + o1), load(b1, o1)), 0.70710676908493042:f32)), 1:f32))
)");
}

// A full sum of 2^20 elements (one output: the row kernels alone would use a few SMs): a kernel
// of 512 partial sums over 2048 elements each, into the workspace, then the sum of the partials.
TEST(FuseTest, FewOutputReductionSplitsIntoPartialsGolden) {
  GraphBuilder b;
  b.Input("x", C32({1 << 20}))
      .Call("s", "aten.sum.default", {Ref("x")}, C32({}))
      .Output({"s"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 2u);
  EXPECT_EQ(r.plan.workspace_bytes(), 2048);
  ExpectGolden("split_sum", r.text, R"(kernel "group 0: sum_partial"
  scalars: 0
  buffers: b0: f32 read [1048576], b1: f32 write [512]
  outer: o0 < 512
  reduce: r0 < 2048
  accumulators: a0: sum f32
  phase 0:
    a0 <- load(b0, 2048*o0 + r0)
  body:
    b1[o0] = a0.value
kernel "group 1: sum"
  scalars: 0
  buffers: b0: f32 read [512], b1: f32 write [1]
  outer: (none)
  reduce: r0 < 512
  accumulators: a0: sum f32
  phase 0:
    a0 <- load(b0, r0)
  body:
    b1[0] = a0.value
)");
  // 64 outputs (enough rows), or 4096 elements an output (too few): one kernel.
  GraphBuilder many;
  many.Input("x", C32({64, 1 << 16}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1})}, C32({64}))
      .Output({"s"});
  EXPECT_EQ(Pipeline(many.Build()).kernels.kernels.size(), 1u);
  GraphBuilder small;
  small.Input("x", C32({4096}))
      .Call("s", "aten.sum.default", {Ref("x")}, C32({}))
      .Output({"s"});
  EXPECT_EQ(Pipeline(small.Build()).kernels.kernels.size(), 1u);
}

// On GPUs a column sum with a few hundred outputs (Llama's RMSNorm weight gradient: 768 outputs
// over 8 x 512 rows) splits its rows: p = 16 partials of the 512 (12288 partial outputs of 256
// rows), then the sum of the 16 partials. CPUs, and smaller reductions, keep one row op.
TEST(FuseTest, ColumnSumSplitsRowsOnGpus) {
  auto graph = [](int64_t n, int64_t t, int64_t c) {
    GraphBuilder b;
    b.Input("x", C32({n, t, c}))
        .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({0, 1})}, C32({c}))
        .Output({"s"});
    return b.Build();
  };
  LowerOptions gpu;
  gpu.gpu = true;
  const Result r = Pipeline(graph(8, 512, 768), false, gpu);
  ASSERT_EQ(r.ops.row_ops.size(), 2u);
  EXPECT_EQ(r.ops.row_ops[0].name, "sum_partial");
  EXPECT_EQ(r.ops.row_ops[0].domain, (std::vector<int64_t>{8, 16, 32, 768}));
  EXPECT_EQ(r.ops.row_ops[0].reduce_dims, (std::vector<int>{0, 2}));
  EXPECT_EQ(r.ops.values[r.ops.row_ops[0].outputs[0].value].sizes, (std::vector<int64_t>{16, 768}));
  EXPECT_EQ(r.ops.row_ops[1].domain, (std::vector<int64_t>{1, 16, 768}));
  EXPECT_EQ(r.kernels.kernels.size(), 2u);
  EXPECT_EQ(r.plan.workspace_bytes(), 16 * 768 * 4);
  // The outermost dim when it reaches 8192 partial outputs alone: 64 x 4096 rows of 256 outputs.
  const Result outer = Pipeline(graph(64, 4096, 256), false, gpu);
  ASSERT_EQ(outer.ops.row_ops.size(), 2u);
  EXPECT_EQ(outer.ops.row_ops[0].domain, (std::vector<int64_t>{32, 2, 4096, 256}));
  EXPECT_EQ(Pipeline(graph(8, 512, 768)).kernels.kernels.size(), 1u);            // CPU
  EXPECT_EQ(Pipeline(graph(2, 512, 768), false, gpu).kernels.kernels.size(), 1u);  // 786432 elements
  EXPECT_EQ(Pipeline(graph(8, 512, 2048), false, gpu).kernels.kernels.size(), 1u);  // 2048 outputs
}

TEST(FuseTest, SoftmaxGolden) {
  GraphBuilder b;
  b.Input("x", C32({16, 33}))
      .Call("sm", "aten._softmax.default", {Ref("x"), I(1), B(false)}, C32({16, 33}))
      .Output({"sm"});
  const Result r = Pipeline(b.Build());
  ExpectGolden("softmax", r.text, R"(kernel "group 0: _softmax"
  scalars: 0
  buffers: b0: f32 read [528], b1: f32 write [528]
  outer: o0 < 16
  reduce: r0 < 33
  accumulators: a0: online_softmax f32
  phase 0:
    a0 <- load(b0, 33*o0 + r0)
  phase 1:
    b1[33*o0 + r0] = true_div(exp(sub(load(b0, 33*o0 + r0), a0.max)), a0.sum)
  body:
)");
}

// native_layer_norm_backward with all three gradients: the grad_input row op is added before the
// weight/bias one is built; the second must not read the input's sizes through a reference into
// the value table the first one grew (it used to: garbage sizes, a fallback, or worse). The
// leading pointwise ops vary the table's size so that some graph crosses a capacity boundary.
TEST(FuseTest, LayerNormBackwardWithAllThreeGradientsCompiles) {
  for (int extra = 0; extra < 20; ++extra) {
    GraphBuilder b;
    b.Input("go", C32({8, 16})).Input("x", C32({8, 16})).Input("mean", C32({8, 1}))
        .Input("rstd", C32({8, 1})).Input("w", C32({16})).Input("bias", C32({16}));
    std::string g = "go";
    for (int i = 0; i < extra; ++i) {
      const std::string next = absl::StrCat("g", i);
      b.Call(next, "aten.mul.Tensor", {Ref(g), F(1.0 + i)}, C32({8, 16}));
      g = next;
    }
    b.Call("lnb", "aten.native_layer_norm_backward.default",
           {Ref(g), Ref("x"), Ints({16}), Ref("mean"), Ref("rstd"), Ref("w"), Ref("bias"), L({B(true), B(true), B(true)})},
           Tuple({C32({8, 16}), C32({16}), C32({16})}))
        .Call("gi", "operator.getitem", {Ref("lnb"), I(0)}, C32({8, 16}))
        .Call("gw", "operator.getitem", {Ref("lnb"), I(1)}, C32({16}))
        .Call("gb", "operator.getitem", {Ref("lnb"), I(2)}, C32({16}))
        .Output({"gi", "gw", "gb"});
    const Result r = Pipeline(b.Build());
    EXPECT_EQ(r.aten, 0) << "extra " << extra << "\n" << Log(r);
    EXPECT_EQ(r.kernels.kernels.size(), 2u) << "extra " << extra;  // per row, per column
  }
}

// On GPUs the weight and bias gradients of a layer norm over 768 columns of 8 x 512 rows (two sums
// in one column reduction) split their rows as one sum does: a partials op with both sums (p = 16
// of the 512), then both sums of the 16 partials.
TEST(FuseTest, LayerNormBackwardParamsSplitRowsOnGpus) {
  GraphBuilder b;
  const std::vector<int64_t> s = {8, 512, 768};
  b.Input("go", C32(s)).Input("x", C32(s)).Input("mean", C32({8, 512, 1}))
      .Input("rstd", C32({8, 512, 1})).Input("w", C32({768})).Input("bias", C32({768}))
      .Call("lnb", "aten.native_layer_norm_backward.default",
            {Ref("go"), Ref("x"), Ints({768}), Ref("mean"), Ref("rstd"), Ref("w"), Ref("bias"),
             L({B(true), B(true), B(true)})},
            Tuple({C32(s), C32({768}), C32({768})}))
      .Call("gi", "operator.getitem", {Ref("lnb"), I(0)}, C32(s))
      .Call("gw", "operator.getitem", {Ref("lnb"), I(1)}, C32({768}))
      .Call("gb", "operator.getitem", {Ref("lnb"), I(2)}, C32({768}))
      .Output({"gi", "gw", "gb"});
  LowerOptions gpu;
  gpu.gpu = true;
  const Result r = Pipeline(b.Build(), false, gpu);
  EXPECT_EQ(r.aten, 0) << Log(r);
  ASSERT_EQ(r.ops.row_ops.size(), 3u);
  const RowOp& partial = r.ops.row_ops[1];
  EXPECT_EQ(partial.name, "native_layer_norm_backward_params_partial");
  EXPECT_EQ(partial.domain, (std::vector<int64_t>{8, 16, 32, 768}));
  ASSERT_EQ(partial.accs.size(), 2u);
  ASSERT_EQ(partial.outputs.size(), 2u);
  for (const RowOutput& o : partial.outputs) {
    EXPECT_EQ(r.ops.values[o.value].sizes, (std::vector<int64_t>{16, 768}));
  }
  EXPECT_EQ(r.ops.row_ops[2].domain, (std::vector<int64_t>{1, 16, 768}));
  EXPECT_EQ(r.ops.row_ops[2].inputs.size(), 2u);
  EXPECT_EQ(r.kernels.kernels.size(), 3u);  // per row, partials, sums of the partials
  EXPECT_EQ(r.plan.workspace_bytes(), 2 * 16 * 768 * 4);
  EXPECT_EQ(Pipeline(b.Build()).kernels.kernels.size(), 2u);  // CPU: as before
}

TEST(FuseTest, LayerNormGolden) {
  GraphBuilder b;
  b.Input("x", C32({4, 5, 32})).Input("w", C32({32})).Input("bias", C32({32}))
      .Call("ln", "aten.native_layer_norm.default", {Ref("x"), Ints({32}), Ref("w"), Ref("bias"), F(1e-5)},
            Tuple({C32({4, 5, 32}), C32({4, 5, 1}), C32({4, 5, 1})}))
      .Call("out", "operator.getitem", {Ref("ln"), I(0)}, C32({4, 5, 32}))
      .Call("rstd", "operator.getitem", {Ref("ln"), I(2)}, C32({4, 5, 1}))
      .Output({"out", "rstd"});
  const Result r = Pipeline(b.Build());
  ExpectGolden("layer_norm", r.text, R"(kernel "group 0: native_layer_norm+native_layer_norm+native_layer_norm"
  scalars: 0
  buffers: b0: f32 read [640], b1: f32 read [32], b2: f32 read [32], b3: f32 write [640], b4: f32 write [20]
  outer: o0 < 4, o1 < 5
  reduce: r0 < 32
  accumulators: a0: welford f32
  phase 0:
    a0 <- load(b0, 160*o0 + 32*o1 + r0)
  phase 1:
    b3[160*o0 + 32*o1 + r0] = add(mul(mul(sub(load(b0, 160*o0 + 32*o1 + r0), a0.mean), rsqrt(add(true_div(a0.m2, a0.count), 9.9999997473787516e-06:f32))), load(b1, r0)), load(b2, r0))
  body:
    b4[5*o0 + o1] = rsqrt(add(true_div(a0.m2, a0.count), 9.9999997473787516e-06:f32))
)");
}

TEST(FuseTest, SumAndSumOfSquaresSiblingsGolden) {
  GraphBuilder b;
  b.Input("x", C32({12, 40}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1})}, C32({12}))
      .Call("sq", "aten.mul.Tensor", {Ref("x"), Ref("x")}, C32({12, 40}))
      .Call("ss", "aten.sum.dim_IntList", {Ref("sq"), Ints({1})}, C32({12}))
      .Output({"s", "ss"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u);
  ExpectGolden("siblings", r.text, R"(kernel "group 0: sum+sum"
  scalars: 0
  buffers: b0: f32 read [480], b1: f32 write [12], b2: f32 write [12]
  outer: o0 < 12
  reduce: r0 < 40
  accumulators: a0: sum f32, a1: sum f32
  phase 0:
    a0 <- load(b0, 40*o0 + r0)
    a1 <- mul(load(b0, 40*o0 + r0), load(b0, 40*o0 + r0))
  body:
    b1[o0] = a0.value
    b2[o0] = a1.value
)");
}

TEST(FuseTest, ViewChainGolden) {
  GraphBuilder b;
  b.Input("x", C32({4, 6}))
      .Call("v", "aten.view.default", {Ref("x"), Ints({2, 12})}, C32({2, 12}))
      .Call("sl", "aten.slice.Tensor", {Ref("v"), I(1), I(2), I(10)}, C32({2, 8}, {12, 1}, 2))
      .Call("p", "aten.permute.default", {Ref("sl"), Ints({1, 0})}, C32({8, 2}, {1, 12}, 2))
      .Call("e", "aten.neg.default", {Ref("p")}, C32({8, 2}, {1, 8}))
      .Output({"e"});
  const Result r = Pipeline(b.Build());
  ExpectGolden("view_chain", r.text, R"(kernel "group 0: neg"
  scalars: 0
  buffers: b0: f32 read [20], b1: f32 write [16]
  outer: o0 < 8, o1 < 2
  body:
    b1[o0 + 8*o1] = neg(load(b0, o0 + 12*o1))
)");
  // The kernel reads the input through a STORAGE_VIEW value: no copy.
  ASSERT_EQ(r.plan.steps_size(), 1);
  const v1::PlanValue& arg = r.plan.values(r.plan.steps(0).kernel().args(0));
  EXPECT_EQ(arg.storage(), v1::PlanValue::STORAGE_VIEW);
  EXPECT_EQ(arg.offset(), 2);
}

// Views of computed intermediates fold into index expressions (no copy, no extra kernel).
TEST(FuseTest, ViewOfIntermediateFoldsIntoIndex) {
  GraphBuilder b;
  b.Input("x", C32({4, 6}))
      .Call("e", "aten.exp.default", {Ref("x")}, C32({4, 6}))
      .Call("v", "aten.view.default", {Ref("e"), Ints({2, 2, 6})}, C32({2, 2, 6}))
      .Call("p", "aten.permute.default", {Ref("v"), Ints({2, 0, 1})}, C32({6, 2, 2}, {1, 12, 6}))
      .Call("n", "aten.neg.default", {Ref("p")}, C32({6, 2, 2}, {1, 12, 6}))
      .Output({"n"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u) << r.text;
  EXPECT_EQ(r.plan.workspace_bytes(), 0);
}

// Attention's masked and scaled scores: the producers of a softmax's input (a select on a
// bitwise_not of the mask, a division by a power of two, a cast) are cheap, so they are computed
// inline in the softmax's kernel rather than stored and read back.
TEST(FuseTest, CheapProducersOfASoftmaxAreItsPrologue) {
  const v1::ValueMeta mask = T(v1::DTYPE_BOOL, {8, 8}, {}, v1::DEVICE_KIND_CPU);
  GraphBuilder b;
  b.Input("x", C32({2, 8, 8})).Input("m", mask)
      .Call("scaled", "aten.div.Tensor", {Ref("x"), F(8.0)}, C32({2, 8, 8}))
      .Call("not", "aten.bitwise_not.default", {Ref("m")}, mask)
      .Call("filled", "aten.masked_fill.Scalar", {Ref("scaled"), Ref("not"), F(-1e30)}, C32({2, 8, 8}))
      .Call("sm", "aten._softmax.default", {Ref("filled"), I(2), B(false)}, C32({2, 8, 8}))
      .Output({"sm"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u) << Log(r) << "\n" << r.text;
  EXPECT_FALSE(absl::StrContains(Log(r), "not cheap")) << Log(r);
  // Dividing by 3 is not exact as a multiply: that producer is stored once.
  GraphBuilder c;
  c.Input("x", C32({2, 8, 8}))
      .Call("scaled", "aten.div.Tensor", {Ref("x"), F(3.0)}, C32({2, 8, 8}))
      .Call("sm", "aten._softmax.default", {Ref("scaled"), I(2), B(false)}, C32({2, 8, 8}))
      .Output({"sm"});
  EXPECT_EQ(Pipeline(c.Build()).kernels.kernels.size(), 2u);
}

// A softmax recomputed in a backward and its softmax backward: one kernel, the backward's sum
// folded in the softmax's phase and its result in a third one; the probabilities are never
// stored. A softmax backward of a softmax that is a graph input stays a kernel of its own.
TEST(FuseTest, SoftmaxBackwardChainsIntoItsSoftmax) {
  GraphBuilder b;
  b.Input("x", C32({4, 24})).Input("g", C32({4, 24}))
      .Call("sm", "aten._softmax.default", {Ref("x"), I(1), B(false)}, C32({4, 24}))
      .Call("gs", "aten._softmax_backward_data.default", {Ref("g"), Ref("sm"), I(1), Dt(v1::DTYPE_FLOAT32)},
            C32({4, 24}))
      .Output({"gs"});
  const Result r = Pipeline(b.Build());
  ASSERT_EQ(r.kernels.kernels.size(), 1u) << Log(r) << "\n" << r.text;
  EXPECT_TRUE(absl::StrContains(Log(r), "chain _softmax_backward_data")) << Log(r);
  EXPECT_EQ(r.kernels.kernels[0].kernel.phases.size(), 3u) << r.text;
  EXPECT_EQ(r.plan.workspace_bytes(), 0);

  GraphBuilder c;
  c.Input("y", C32({4, 24})).Input("g", C32({4, 24}))
      .Call("gs", "aten._softmax_backward_data.default", {Ref("g"), Ref("y"), I(1), Dt(v1::DTYPE_FLOAT32)},
            C32({4, 24}))
      .Output({"gs"});
  const Result q = Pipeline(c.Build());
  EXPECT_EQ(q.kernels.kernels.size(), 1u);
  EXPECT_EQ(q.kernels.kernels[0].kernel.phases.size(), 2u) << q.text;
}

// A graph output that is a transpose of a computed value (AOTAutograd saves such views for the
// backward's matmuls) is that value's storage, allocated as an output, not a copy; a slice of
// one is copied (its root would hold more memory than the output).
TEST(FuseTest, OutputTransposesAliasTheirRootAndSlicesAreCopied) {
  GraphBuilder b;
  b.Input("x", C32({4, 6}))
      .Call("e", "aten.exp.default", {Ref("x")}, C32({4, 6}))
      .Call("t", "aten.t.default", {Ref("e")}, C32({6, 4}, {1, 6}))
      .Output({"t"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u) << r.text;
  ASSERT_EQ(r.plan.outputs_size(), 1);
  const v1::PlanValue& out = r.plan.values(r.plan.outputs(0));
  ASSERT_EQ(out.storage(), v1::PlanValue::STORAGE_VIEW);
  EXPECT_EQ(r.plan.values(out.index()).storage(), v1::PlanValue::STORAGE_OUTPUT);
  EXPECT_EQ(r.plan.workspace_bytes(), 0);

  GraphBuilder c;
  c.Input("x", C32({4, 6}))
      .Call("e", "aten.exp.default", {Ref("x")}, C32({4, 6}))
      .Call("s", "aten.slice.Tensor", {Ref("e"), I(1), I(0), I(2), I(1)}, C32({4, 2}, {6, 1}))
      .Output({"s"});
  const Result q = Pipeline(c.Build());
  ASSERT_EQ(q.plan.outputs_size(), 1);
  EXPECT_EQ(q.plan.values(q.plan.outputs(0)).storage(), v1::PlanValue::STORAGE_OUTPUT);
  EXPECT_TRUE(absl::StrContains(q.text, "copy_of_view")) << q.text;
}

// Negative: two pointwise ops separated by an mm never fuse; the mm's input is stored.
TEST(FuseTest, NothingFusesAcrossMm) {
  GraphBuilder b;
  b.Input("x", C32({4, 8})).Input("w", C32({8, 8}))
      .Call("a", "aten.exp.default", {Ref("x")}, C32({4, 8}))
      .Call("mm", "aten.mm.default", {Ref("a"), Ref("w")}, C32({4, 8}))
      .Call("c", "aten.tanh.default", {Ref("mm")}, C32({4, 8}))
      .Output({"c"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 2u);
  ASSERT_EQ(r.plan.steps_size(), 3);
  EXPECT_TRUE(r.plan.steps(0).has_kernel());
  EXPECT_TRUE(r.plan.steps(1).has_aten());
  EXPECT_TRUE(r.plan.steps(2).has_kernel());
  EXPECT_EQ(r.plan.workspace_bytes(), 256);  // exp(x) (128 bytes) lives in the workspace (256-byte units)
  EXPECT_TRUE(absl::StrContains(Log(r), "realize v2 (exp): read by step aten.mm.default")) << Log(r);
}

// A consumer that broadcasts a reduction along the reduced dims is a phase epilogue of the row
// kernel: x is read once (kept in registers on CUDA), the sum is never stored.
TEST(FuseTest, BroadcastOfReductionAlongRowsIsAPhaseEpilogue) {
  GraphBuilder b;
  b.Input("x", C32({4, 8}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1}), B(true)}, C32({4, 1}))
      .Call("d", "aten.div.Tensor", {Ref("x"), Ref("s")}, C32({4, 8}))
      .Output({"d"});
  const Result r = Pipeline(b.Build());
  EXPECT_TRUE(absl::StrContains(Log(r), "fuse v2 (div) into group 0 as a phase epilogue")) << Log(r);
  ExpectGolden("sum_div", r.text, R"(kernel "group 0: sum+div"
  scalars: 0
  buffers: b0: f32 read [32], b1: f32 write [32]
  outer: o0 < 4
  reduce: r0 < 8
  accumulators: a0: sum f32
  phase 0:
    a0 <- load(b0, 8*o0 + r0)
  phase 1:
    b1[8*o0 + r0] = true_div(load(b0, 8*o0 + r0), a0.value)
  body:
)");
}

// The same along dim 0 (a column sum): the broadcast is along the reduced dim, so it fuses too.
TEST(FuseTest, BroadcastOfColumnReductionIsAPhaseEpilogue) {
  GraphBuilder b;
  b.Input("x", C32({4, 8}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({0}), B(true)}, C32({1, 8}))
      .Call("d", "aten.div.Tensor", {Ref("x"), Ref("s")}, C32({4, 8}))
      .Output({"d"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u) << Log(r);
  EXPECT_TRUE(absl::StrContains(r.text, "b1[o0 + 8*r0] = true_div(load(b0, o0 + 8*r0), a0.value)")) << r.text;
}

// RMS norm as written in models: x * rsqrt(mean(x^2, -1, keepdim) + eps) * w, one kernel.
TEST(FuseTest, RmsNormGolden) {
  GraphBuilder b;
  b.Input("x", C32({6, 16})).Input("w", C32({16}))
      .Call("sq", "aten.pow.Tensor_Scalar", {Ref("x"), I(2)}, C32({6, 16}))
      .Call("ms", "aten.mean.dim", {Ref("sq"), Ints({-1}), B(true)}, C32({6, 1}))
      .Call("eps", "aten.add.Tensor", {Ref("ms"), F(1e-6)}, C32({6, 1}))
      .Call("rs", "aten.rsqrt.default", {Ref("eps")}, C32({6, 1}))
      .Call("xn", "aten.mul.Tensor", {Ref("x"), Ref("rs")}, C32({6, 16}))
      .Call("out", "aten.mul.Tensor", {Ref("xn"), Ref("w")}, C32({6, 16}))
      .Output({"out"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 1u) << Log(r);
  EXPECT_EQ(r.plan.workspace_bytes(), 0);
  ExpectGolden("rms_norm", r.text, R"(kernel "group 0: mean+mul"
  scalars: 0
  buffers: b0: f32 read [96], b1: f32 read [16], b2: f32 write [96]
  outer: o0 < 6
  reduce: r0 < 16
  accumulators: a0: sum f32
  phase 0:
    a0 <- mul(load(b0, 16*o0 + r0), load(b0, 16*o0 + r0))
  phase 1:
    b2[16*o0 + r0] = mul(mul(load(b0, 16*o0 + r0), rsqrt(add(true_div(a0.value, 16:f32), 9.9999999747524271e-07:f32))), load(b1, r0))
  body:
)");
}

// Negative: broadcasting a row reduction along another dim (here through a transpose) would
// read other rows' results: it needs another kernel.
TEST(FuseTest, BroadcastOfReductionAcrossRowsIsRefused) {
  GraphBuilder b;
  b.Input("x", C32({4, 4}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1}), B(true)}, C32({4, 1}))
      .Call("st", "aten.permute.default", {Ref("s"), Ints({1, 0})}, C32({1, 4}, {1, 1}))
      .Call("d", "aten.div.Tensor", {Ref("x"), Ref("st")}, C32({4, 4}))
      .Output({"d"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 2u);
  EXPECT_TRUE(absl::StrContains(Log(r), "refuse v3 (div) into group 0")) << Log(r);
}

TEST(FuseTest, DisableFusionGivesOneKernelPerOp) {
  GraphBuilder b;
  b.Input("x", C32({8, 16})).Input("b", C32({16}))
      .Call("add", "aten.add.Tensor", {Ref("x"), Ref("b")}, C32({8, 16}))
      .Call("relu", "aten.relu.default", {Ref("add")}, C32({8, 16}))
      .Call("s", "aten.sum.dim_IntList", {Ref("relu"), Ints({1})}, C32({8}))
      .Output({"s"});
  EXPECT_EQ(Pipeline(b.Build(), false).kernels.kernels.size(), 1u);
  const Result r = Pipeline(b.Build(), true);
  EXPECT_EQ(r.kernels.kernels.size(), 3u);
  // add and relu's results are workspace intermediates that reuse memory by liveness.
  EXPECT_EQ(r.plan.workspace_bytes(), 2 * 512);
}

// A cheap value read by several kernels is recomputed in each from its stored inputs, unless that
// loads more than storing it once: a sum of four inputs read by three reductions is stored
// ((3 - 1) x 4 loads > (3 + 1) x 1), a sum of two read by two is not ((2 - 1) x 2 < (2 + 1) x 1).
TEST(FuseTest, CheapValueOfManyInputsWithSeveralReadersIsStored) {
  GraphBuilder b;
  b.Input("a", C32({64, 64})).Input("b", C32({64, 64})).Input("c", C32({64, 64})).Input("d", C32({64, 64}))
      .Call("s1", "aten.add.Tensor", {Ref("a"), Ref("b")}, C32({64, 64}))
      .Call("s2", "aten.add.Tensor", {Ref("s1"), Ref("c")}, C32({64, 64}))
      .Call("s3", "aten.add.Tensor", {Ref("s2"), Ref("d")}, C32({64, 64}))
      .Call("rows", "aten.sum.dim_IntList", {Ref("s3"), Ints({1})}, C32({64}))
      .Call("cols", "aten.sum.dim_IntList", {Ref("s3"), Ints({0})}, C32({64}))
      .Call("m", "aten.amax.default", {Ref("s3"), Ints({1})}, C32({64}))
      .Call("t", "aten.add.Tensor", {Ref("a"), Ref("b")}, C32({64, 64}))
      .Call("t_rows", "aten.sum.dim_IntList", {Ref("t"), Ints({1})}, C32({64}))
      .Call("t_cols", "aten.sum.dim_IntList", {Ref("t"), Ints({0})}, C32({64}))
      .Output({"rows", "cols", "m", "t_rows", "t_cols"});
  const Result r = Pipeline(b.Build());
  const std::string log = Log(r);
  EXPECT_TRUE(absl::StrContains(log, "(add): 3 consumers would each load its 4 stored inputs (65536 bytes) to "
                                     "recompute it (16384 bytes)")) << log;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(log, "consumers would")).size(), 2u)
      << log;  // s1, s2 and t are not stored
}

// Unsupported ops become counted fallbacks; the graph still compiles around them.
TEST(FuseTest, UnsupportedOpsFallBack) {
  GraphBuilder b;
  b.Input("x", C32({4, 8}))
      .Call("a", "aten.exp.default", {Ref("x")}, C32({4, 8}))
      .Call("c", "aten.cumsum.default", {Ref("a"), I(1)}, C32({4, 8}))
      .Call("d", "aten.neg.default", {Ref("c")}, C32({4, 8}))
      .Output({"d"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.kernels.kernels.size(), 2u);
  ASSERT_EQ(r.plan.steps_size(), 3);
  EXPECT_TRUE(r.plan.steps(1).aten().fallback());
  EXPECT_EQ(r.plan.steps(1).aten().target(), "aten.cumsum.default");
}

// max_pool2d_with_indices_backward: one kernel over [N, C, H / 2, 2, W / 2, 2] (a gather over the
// windows of each input element), whose 4-D view is the result with the graph's strides; the
// graph's output is that view (its root is allocated as the output). When the stride does not
// divide H, torch's kernel runs it and the reason says so.
TEST(FuseTest, MaxPoolBackwardIsAKernelOverAStrideSplit) {
  auto graph = [](int64_t h) {
    const int64_t oh = (h + 2 - 3) / 2 + 1;
    GraphBuilder b;
    b.Input("go", C32({2, 3, oh, oh}))
        .Input("x", C32({2, 3, h, h}))
        .Input("idx", T(v1::DTYPE_INT64, {2, 3, oh, oh}, {}, v1::DEVICE_KIND_CPU))
        .Call("gi", "aten.max_pool2d_with_indices_backward.default",
              {Ref("go"), Ref("x"), Ints({3, 3}), Ints({2, 2}), Ints({1, 1}), Ints({1, 1}), B(false), Ref("idx")},
              C32({2, 3, h, h}))
        .Output({"gi"});
    return b.Build();
  };
  const Result r = Pipeline(graph(8));
  EXPECT_EQ(r.aten, 0);
  ASSERT_EQ(r.kernels.kernels.size(), 1u);
  bool found = false;
  for (const LValue& v : r.ops.values) {
    if (v.op != "max_pool2d_backward") continue;
    found = true;
    EXPECT_EQ(v.sizes, std::vector<int64_t>({2, 3, 4, 2, 4, 2}));
    EXPECT_EQ(v.strides, std::vector<int64_t>({192, 64, 16, 8, 2, 1}));
  }
  EXPECT_TRUE(found);
  const Result odd = Pipeline(graph(9));
  ASSERT_EQ(odd.plan.steps_size(), 1);
  EXPECT_TRUE(odd.plan.steps(0).aten().fallback());
  ASSERT_EQ(odd.ops.steps.size(), 1u);
  EXPECT_TRUE(absl::StrContains(odd.ops.steps[0].reason, "input 9 x 9 is not a multiple of the stride 2 x 2"))
      << odd.ops.steps[0].reason;
}

// A view op run by torch (reshape is not lowered) may return an alias of its input: the input
// gets its own allocation instead of workspace bytes that a later kernel could reuse.
TEST(FuseTest, AliasingStepInputsAreNotWorkspace) {
  GraphBuilder b;
  b.Input("x", C32({4, 6}))
      .Call("e", "aten.exp.default", {Ref("x")}, C32({4, 6}))
      .Call("r", "aten.reshape.default", {Ref("e"), Ints({24})}, C32({24}))
      .Call("n", "aten.neg.default", {Ref("r")}, C32({24}))
      .Output({"n"});
  const Result r = Pipeline(b.Build());
  EXPECT_EQ(r.plan.workspace_bytes(), 0);
  ASSERT_TRUE(r.plan.steps(1).has_aten());
  const int32_t arg = std::stoi(r.plan.steps(1).aten().args(0).node().substr(1));
  EXPECT_EQ(r.plan.values(arg).storage(), v1::PlanValue::STORAGE_OUTPUT);
}

// A training batch norm's partials (forward and backward) and per-channel combines: the partial
// domain is [N, C, H, W] on CPUs; on GPUs [N, S, C, H / S, W], S the smallest divisor of H giving
// N * S * C >= 8192 partials of at least 256 elements each (or the largest S keeping 256).
TEST(FuseTest, BatchNormPartialsSplitRowsOnGpus) {
  struct Case {
    std::vector<int64_t> sizes;
    bool gpu;
    std::vector<int64_t> partial, combine;  // forward
    std::vector<int64_t> backward_partial, backward_combine;  // empty: as the forward's
  };
  const Case cases[] = {
      {{32, 64, 56, 56}, false, {32, 64, 56, 56}, {32, 64}},
      // forward 32 * 8 * 64 = 16384 (S = 14 would leave 224 elements), backward 32 * 4 * 64 = 8192
      {{32, 64, 56, 56}, true, {32, 8, 64, 7, 56}, {32, 8, 64}, {32, 4, 64, 14, 56}, {32, 4, 64}},
      {{8, 16, 64, 64}, true, {8, 16, 16, 4, 64}, {8, 16, 16}},    // S = 64 would leave 64 elements
      {{2, 8, 8, 8}, true, {2, 8, 8, 8}, {2, 8}},                  // 64 elements already
      {{64, 128, 8, 8}, true, {64, 128, 8, 8}, {64, 128}},         // 8192 partials, 64 elements
      {{4, 3, 1024}, true, {4, 4, 3, 256}, {4, 4, 3}},             // rank 3: 1024 / 4 = 256 elements
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("[", absl::StrJoin(c.sizes, ", "), "] gpu ", c.gpu));
    LowerOptions options;
    options.gpu = c.gpu;
    const Result r = Pipeline(TrainingBatchNorm(c.sizes), false, options);
    EXPECT_EQ(r.aten, 0);
    ASSERT_EQ(r.ops.row_ops.size(), 4u);
    for (int i : {0, 2}) {  // forward, backward
      const bool own = i == 2 && !c.backward_partial.empty();
      const std::vector<int64_t>& want_partial = own ? c.backward_partial : c.partial;
      const std::vector<int64_t>& want_combine = own ? c.backward_combine : c.combine;
      const size_t rank = want_partial.size();
      std::vector<int> reduce, combine_reduce;
      for (size_t d = rank - (c.sizes.size() - 2); d < rank; ++d) reduce.push_back(static_cast<int>(d));
      for (size_t d = 0; d + 1 < want_combine.size(); ++d) combine_reduce.push_back(static_cast<int>(d));
      const RowOp& partial = r.ops.row_ops[i];
      const RowOp& combine = r.ops.row_ops[i + 1];
      EXPECT_EQ(partial.name, i == 0 ? "batch_norm_partial" : "batch_norm_backward_partial");
      EXPECT_EQ(partial.domain, want_partial);
      EXPECT_EQ(partial.reduce_dims, reduce);
      for (const RowOutput& o : partial.outputs) EXPECT_EQ(r.ops.values[o.value].sizes, want_combine);
      EXPECT_EQ(combine.domain, want_combine);
      EXPECT_EQ(combine.reduce_dims, combine_reduce);
    }
    EXPECT_EQ(r.kernels.kernels.size(), 6u);  // 3 forward, 3 backward (none fuse across)
  }
}

// The split partials read x at [n, c, s * H / S + h, w]: here S = 2 (two rows of 8 x 32 = 256).
TEST(FuseTest, BatchNormSplitPartialsGolden) {
  LowerOptions options;
  options.gpu = true;
  const Result r = Pipeline(TrainingBatchNorm({2, 4, 16, 32}), false, options);
  ASSERT_EQ(r.kernels.kernels.size(), 6u);
  std::string text;
  for (int k : {0, 1, 3, 4}) text += kernel::PrintKernel(r.kernels.kernels[k].kernel);
  ExpectGolden("batch_norm_split", text, R"(kernel "group 0: batch_norm_partial+batch_norm_partial"
  scalars: 0
  buffers: b0: f32 read [4096], b1: f32 write [16], b2: f32 write [16]
  outer: o0 < 2, o1 < 2, o2 < 4
  reduce: r0 < 8, r1 < 32
  accumulators: a0: welford f32
  phase 0:
    a0 <- load(b0, 2048*o0 + 256*o1 + 512*o2 + 32*r0 + r1)
  body:
    b1[8*o0 + 4*o1 + o2] = a0.mean
    b2[8*o0 + 4*o1 + o2] = a0.m2
kernel "group 1: batch_norm_stats+batch_norm_stats+batch_norm_stats+batch_norm_stats"
  scalars: 0
  buffers: b0: f32 read [16], b1: f32 read [16], b2: f32 write [4], b3: f32 write [4], b4: f32 read [4], b5: f32 write [4], b6: f32 read [4], b7: f32 write [4]
  outer: o0 < 4
  reduce: r0 < 2, r1 < 2
  accumulators: a0: welford f32, a1: sum f32
  phase 0:
    a0 <- load(b0, o0 + 8*r0 + 4*r1)
    a1 <- load(b1, o0 + 8*r0 + 4*r1)
  body:
    b2[o0] = a0.mean
    b3[o0] = rsqrt(add(true_div(add(a1.value, mul(256:f32, a0.m2)), 1024:f32), 9.9999997473787516e-06:f32))
    b5[o0] = add(mul(0.89999997615814209:f32, load(b4, o0)), mul(0.10000000149011612:f32, a0.mean))
    b7[o0] = add(mul(0.89999997615814209:f32, load(b6, o0)), mul(0.10009775310754776:f32, true_div(add(a1.value, mul(256:f32, a0.m2)), 1024:f32)))
kernel "group 3: batch_norm_backward_partial+batch_norm_backward_partial"
  scalars: 0
  buffers: b0: f32 read [4096], b1: f32 read [4], b2: f32 read [4], b3: f32 read [4096], b4: f32 write [16], b5: f32 write [16]
  outer: o0 < 2, o1 < 2, o2 < 4
  reduce: r0 < 8, r1 < 32
  accumulators: a0: sum f32, a1: sum f32
  phase 0:
    a0 <- load(b0, 2048*o0 + 256*o1 + 512*o2 + 32*r0 + r1)
    a1 <- mul(load(b0, 2048*o0 + 256*o1 + 512*o2 + 32*r0 + r1), mul(sub(load(b3, 2048*o0 + 256*o1 + 512*o2 + 32*r0 + r1), load(b2, o2)), load(b1, o2)))
  body:
    b4[8*o0 + 4*o1 + o2] = a0.value
    b5[8*o0 + 4*o1 + o2] = a1.value
kernel "group 4: batch_norm_backward_sums+batch_norm_backward_sums+batch_norm_backward_sums+batch_norm_backward_sums"
  scalars: 0
  buffers: b0: f32 read [16], b1: f32 read [16], b2: f32 write [4], b3: f32 write [4], b4: f32 write [4], b5: f32 write [4]
  outer: o0 < 4
  reduce: r0 < 2, r1 < 2
  accumulators: a0: sum f32, a1: sum f32
  phase 0:
    a0 <- load(b0, o0 + 8*r0 + 4*r1)
    a1 <- load(b1, o0 + 8*r0 + 4*r1)
  body:
    b2[o0] = a0.value
    b3[o0] = a1.value
    b4[o0] = a1.value
    b5[o0] = a0.value
)");
}

// The realistic graphs of server/graph lower, fuse and plan without error.
TEST(FuseTest, TestGraphsPlan) {
  for (const v1::Graph& g : {MlpForward(), MlpBackward(), ConvBlock()}) {
    const Result r = Pipeline(g);
    EXPECT_GT(r.plan.steps_size(), 0) << g.debug_name();
  }
  // AttentionBlock returns whole tuples as graph outputs (AOTAutograd never does): refused cleanly.
  auto prepared = graph::PrepareGraph(Request(AttentionBlock()), graph::GraphLimits(), graph::CompilerIdentity());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  auto ops = LowerGraph(prepared->graph, prepared->fallback_nodes);
  EXPECT_EQ(ops.status().code(), absl::StatusCode::kUnimplemented) << ops.status();
}

}  // namespace
}  // namespace kiln::lower
