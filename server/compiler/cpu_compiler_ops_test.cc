// End to end, op coverage (reductions, row-fused composites, backward ops, dtypes, position-
// dependent ops): kiln.v1 graph -> PrepareGraph -> CpuGraphCompiler (real g++) -> runtime -> the plan's
// steps on random data (extern mm in a C++ reference) -> compared with straightforward C++ math.

#include "server/compiler/cpu_compiler.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "server/compiler/test_executor.h"
#include "server/compiler/test_util.h"
#include "server/base/status_macros.h"
#include "server/codegen/cpu_emitter.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"
#include "server/lower/fuse.h"
#include "server/lower/kernelize.h"
#include "server/lower/lower.h"
#include "server/lower/plan_builder.h"
#include "server/toolchain/compiler.h"

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


// softmax and log_softmax over the last and the first dim: one kernel per row each.
TEST(CpuCompilerOpsTest, SoftmaxAndLogSoftmaxAreOneKernelEach) {
  GraphBuilder b;
  b.Input("x", C32({16, 33}))
      .Call("sm", "aten._softmax.default", {Ref("x"), I(1), B(false)}, C32({16, 33}))
      .Call("lsm", "aten._log_softmax.default", {Ref("x"), I(-1), B(false)}, C32({16, 33}))
      .Call("sm0", "aten._softmax.default", {Ref("x"), I(0), B(false)}, C32({16, 33}))
      .Output({"sm", "lsm", "sm0"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 3);
  const HostTensor x = Random({16, 33}, {}, 7);
  auto out = testing::RunPlan(c->result.artifact, {x}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> sm(16 * 33), lsm(16 * 33), sm0(16 * 33);
  for (int i = 0; i < 16; ++i) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < 33; ++j) mx = std::max(mx, x.Get(i * 33 + j));
    for (int j = 0; j < 33; ++j) s += std::exp(x.Get(i * 33 + j) - mx);
    for (int j = 0; j < 33; ++j) {
      sm[i * 33 + j] = std::exp(x.Get(i * 33 + j) - mx) / s;
      lsm[i * 33 + j] = x.Get(i * 33 + j) - mx - std::log(s);
    }
  }
  for (int j = 0; j < 33; ++j) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < 16; ++i) mx = std::max(mx, x.Get(i * 33 + j));
    for (int i = 0; i < 16; ++i) s += std::exp(x.Get(i * 33 + j) - mx);
    for (int i = 0; i < 16; ++i) sm0[i * 33 + j] = std::exp(x.Get(i * 33 + j) - mx) / s;
  }
  ExpectNear(Values((*out)[0]), sm);
  ExpectNear(Values((*out)[1]), lsm);
  ExpectNear(Values((*out)[2]), sm0);
}

TEST(CpuCompilerOpsTest, LayerNormBackward) {
  GraphBuilder b;
  b.Input("go", C32({6, 16})).Input("x", C32({6, 16})).Input("mean", C32({6, 1})).Input("rstd", C32({6, 1}))
      .Input("w", C32({16})).Input("bias", C32({16}))
      .Call("lnb", "aten.native_layer_norm_backward.default",
            {Ref("go"), Ref("x"), Ints({16}), Ref("mean"), Ref("rstd"), Ref("w"), Ref("bias"),
             L({B(true), B(true), B(true)})},
            Tuple({C32({6, 16}), C32({16}), C32({16})}))
      .Call("gi", "operator.getitem", {Ref("lnb"), I(0)}, C32({6, 16}))
      .Call("gw", "operator.getitem", {Ref("lnb"), I(1)}, C32({16}))
      .Call("gb", "operator.getitem", {Ref("lnb"), I(2)}, C32({16}))
      .Output({"gi", "gw", "gb"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 2);
  const HostTensor go = Random({6, 16}, {}, 15), x = Random({6, 16}, {}, 16), w = Random({16}, {}, 17),
                   bias = Random({16}, {}, 18);
  HostTensor mean = Empty(kF, {6, 1}), rstd = Empty(kF, {6, 1});
  for (int i = 0; i < 6; ++i) {
    double m = 0, v = 0;
    for (int j = 0; j < 16; ++j) m += x.Get(i * 16 + j) / 16;
    for (int j = 0; j < 16; ++j) v += (x.Get(i * 16 + j) - m) * (x.Get(i * 16 + j) - m) / 16;
    mean.Set(i, m);
    rstd.Set(i, 1 / std::sqrt(v + 1e-5));
  }
  auto out = testing::RunPlan(c->result.artifact, {go, x, mean, rstd, w, bias}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> gi, gw(16, 0), gb(16, 0);
  for (int i = 0; i < 6; ++i) {
    double s1 = 0, s2 = 0;
    std::vector<double> xh(16), g(16);
    for (int j = 0; j < 16; ++j) {
      xh[j] = (x.Get(i * 16 + j) - mean.Get(i)) * rstd.Get(i);
      g[j] = go.Get(i * 16 + j) * w.Get(j);
      s1 += g[j];
      s2 += g[j] * xh[j];
      gw[j] += go.Get(i * 16 + j) * xh[j];
      gb[j] += go.Get(i * 16 + j);
    }
    for (int j = 0; j < 16; ++j) gi.push_back(rstd.Get(i) / 16 * (16 * g[j] - s1 - xh[j] * s2));
  }
  ExpectNear(Values((*out)[0]), gi, 1e-4);
  ExpectNear(Values((*out)[1]), gw, 1e-4);
  ExpectNear(Values((*out)[2]), gb, 1e-4);
}

TEST(CpuCompilerOpsTest, LayerNormIsOneWelfordKernel) {
  GraphBuilder b;
  b.Input("x", C32({4, 5, 32})).Input("w", C32({32})).Input("bias", C32({32}))
      .Call("ln", "aten.native_layer_norm.default", {Ref("x"), Ints({32}), Ref("w"), Ref("bias"), F(1e-5)},
            Tuple({C32({4, 5, 32}), C32({4, 5, 1}), C32({4, 5, 1})}))
      .Call("out", "operator.getitem", {Ref("ln"), I(0)}, C32({4, 5, 32}))
      .Call("mean", "operator.getitem", {Ref("ln"), I(1)}, C32({4, 5, 1}))
      .Call("rstd", "operator.getitem", {Ref("ln"), I(2)}, C32({4, 5, 1}))
      .Output({"out", "mean", "rstd"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kernels, 1);
  const HostTensor x = Random({4, 5, 32}, {}, 8), w = Random({32}, {}, 9), bias = Random({32}, {}, 10);
  auto out = testing::RunPlan(c->result.artifact, {x, w, bias}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> y, mean, rstd;
  for (int r = 0; r < 20; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 32; ++j) m += x.Get(r * 32 + j);
    m /= 32;
    for (int j = 0; j < 32; ++j) v += (x.Get(r * 32 + j) - m) * (x.Get(r * 32 + j) - m);
    const double rs = 1 / std::sqrt(v / 32 + 1e-5);
    for (int j = 0; j < 32; ++j) y.push_back((x.Get(r * 32 + j) - m) * rs * w.Get(j) + bias.Get(j));
    mean.push_back(m);
    rstd.push_back(rs);
  }
  ExpectNear(Values((*out)[0]), y, 1e-4);
  ExpectNear(Values((*out)[1]), mean, 1e-4);
  ExpectNear(Values((*out)[2]), rstd, 1e-4);
}

// sum(x, 1) and sum(x * x, 1) share one loop; mean/amax over dim 0 of a permuted view; var_mean.
TEST(CpuCompilerOpsTest, ReductionsWithSiblingsAndEpilogues) {
  GraphBuilder b;
  b.Input("x", C32({12, 40}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x"), Ints({1})}, C32({12}))
      .Call("sq", "aten.mul.Tensor", {Ref("x"), Ref("x")}, C32({12, 40}))
      .Call("ss", "aten.sum.dim_IntList", {Ref("sq"), Ints({1}), B(true)}, C32({12, 1}))
      .Call("ssv", "aten.view.default", {Ref("ss"), Ints({12})}, C32({12}))
      .Call("ratio", "aten.div.Tensor", {Ref("ssv"), Ref("s")}, C32({12}))
      .Call("xt", "aten.permute.default", {Ref("x"), Ints({1, 0})}, C32({40, 12}, {1, 40}))
      .Call("m", "aten.mean.dim", {Ref("xt"), Ints({0})}, C32({12}))
      .Call("mx", "aten.amax.default", {Ref("xt"), Ints({1})}, C32({40}))
      .Call("vm", "aten.var_mean.correction", {Ref("x"), Ints({1})}, Tuple({C32({12}), C32({12})}))
      .Call("var", "operator.getitem", {Ref("vm"), I(0)}, C32({12}))
      .Output({"s", "ratio", "m", "mx", "var"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  // {s, ss (+ ratio epilogue), var_mean} share the [12, 40] / dim 1 loop; mean over xt; amax.
  EXPECT_EQ(c->kernels, 3) << c->result.artifact.plan().DebugString();
  const HostTensor x = Random({12, 40}, {}, 11);
  auto out = testing::RunPlan(c->result.artifact, {x}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> s, ratio, m, mx(40, -INFINITY), var;
  for (int i = 0; i < 12; ++i) {
    double a = 0, q = 0;
    for (int j = 0; j < 40; ++j) {
      a += x.Get(i * 40 + j);
      q += x.Get(i * 40 + j) * x.Get(i * 40 + j);
      mx[j] = std::max(mx[j], x.Get(i * 40 + j));
    }
    s.push_back(a);
    ratio.push_back(q / a);
    m.push_back(a / 40);
    double v = 0;
    for (int j = 0; j < 40; ++j) v += (x.Get(i * 40 + j) - a / 40) * (x.Get(i * 40 + j) - a / 40);
    var.push_back(v / 39);
  }
  ExpectNear(Values((*out)[0]), s, 1e-4);
  ExpectNear(Values((*out)[1]), ratio, 1e-3);
  ExpectNear(Values((*out)[2]), m, 1e-4);
  ExpectNear(Values((*out)[3]), mx);
  ExpectNear(Values((*out)[4]), var, 1e-4);
}

TEST(CpuCompilerOpsTest, SoftmaxBackwardOps) {
  GraphBuilder b;
  b.Input("x", C32({8, 24})).Input("g", C32({8, 24}))
      .Call("sm", "aten._softmax.default", {Ref("x"), I(1), B(false)}, C32({8, 24}))
      .Call("sm2", "aten.mul.Tensor", {Ref("sm"), F(2.0)}, C32({8, 24}))
      .Call("lsm", "aten._log_softmax.default", {Ref("x"), I(1), B(false)}, C32({8, 24}))
      .Call("gs", "aten._softmax_backward_data.default", {Ref("g"), Ref("sm"), I(1), Dt(kF)}, C32({8, 24}))
      .Call("gl", "aten._log_softmax_backward_data.default", {Ref("g"), Ref("lsm"), I(1), Dt(kF)}, C32({8, 24}))
      .Output({"sm2", "gs", "gl"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  // Each backward is chained into its forward's kernel (fuse.h, rule 3b): softmax with sm2 and
  // gs, log_softmax with gl.
  EXPECT_EQ(c->kernels, 2);
  const HostTensor x = Random({8, 24}, {}, 13), g = Random({8, 24}, {}, 14);
  auto out = testing::RunPlan(c->result.artifact, {x, g}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> sm2, gs, gl;
  for (int i = 0; i < 8; ++i) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < 24; ++j) mx = std::max(mx, x.Get(i * 24 + j));
    for (int j = 0; j < 24; ++j) s += std::exp(x.Get(i * 24 + j) - mx);
    std::vector<double> sm(24), lsm(24);
    double dot = 0, gsum = 0;
    for (int j = 0; j < 24; ++j) {
      sm[j] = std::exp(x.Get(i * 24 + j) - mx) / s;
      lsm[j] = x.Get(i * 24 + j) - mx - std::log(s);
      dot += g.Get(i * 24 + j) * sm[j];
      gsum += g.Get(i * 24 + j);
    }
    for (int j = 0; j < 24; ++j) {
      sm2.push_back(2 * sm[j]);
      gs.push_back(sm[j] * (g.Get(i * 24 + j) - dot));
      gl.push_back(g.Get(i * 24 + j) - std::exp(lsm[j]) * gsum);
    }
  }
  ExpectNear(Values((*out)[0]), sm2);
  ExpectNear(Values((*out)[1]), gs, 1e-4);
  ExpectNear(Values((*out)[2]), gl, 1e-4);
}

TEST(CpuCompilerOpsTest, HalfBoolAndIntegerTypes) {
  const v1::DType kBf = v1::DTYPE_BFLOAT16;
  auto bf = [&](std::vector<int64_t> s) { return T(kBf, std::move(s), {}, v1::DEVICE_KIND_CPU); };
  GraphBuilder b;
  b.Input("x", bf({4, 32}))
      .Call("m", "aten.mul.Tensor", {Ref("x"), F(3.0)}, bf({4, 32}))
      .Call("y", "aten.add.Tensor", {Ref("m"), F(0.1)}, bf({4, 32}))
      .Call("s", "aten.sum.dim_IntList", {Ref("y"), Ints({1})}, bf({4}))
      .Call("pos", "aten.gt.Scalar", {Ref("x"), I(0)}, T(v1::DTYPE_BOOL, {4, 32}, {}, v1::DEVICE_KIND_CPU))
      .Call("w", "aten.where.ScalarOther", {Ref("pos"), Ref("y"), F(0.0)}, bf({4, 32}))
      .Call("am", "aten.argmax.default", {Ref("x"), I(1)}, T(v1::DTYPE_INT64, {4}, {}, v1::DEVICE_KIND_CPU))
      .Output({"s", "pos", "w", "am"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  HostTensor x = Empty(kBf, {4, 32});
  const HostTensor r = Random({4, 32}, {}, 19);
  for (int k = 0; k < 128; ++k) x.Set(k, r.Get(k));
  auto out = testing::RunPlan(c->result.artifact, {x}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> s, pos, w, am;
  for (int i = 0; i < 4; ++i) {
    float acc = 0;
    int best = 0;
    for (int j = 0; j < 32; ++j) {
      const float xv = static_cast<float>(x.Get(i * 32 + j));
      const float y = RoundBf16(RoundBf16(xv * 3.f) + 0.1f);
      acc += y;
      pos.push_back(xv > 0);
      w.push_back(xv > 0 ? y : 0.f);
      if (xv > x.Get(i * 32 + best)) best = j;
    }
    s.push_back(RoundBf16(acc));
    am.push_back(best);
  }
  ExpectNear(Values((*out)[0]), s, 1e-2);
  ExpectNear(Values((*out)[1]), pos, 0);
  ExpectNear(Values((*out)[2]), w, 0);
  ExpectNear(Values((*out)[3]), am, 0);
}

TEST(CpuCompilerOpsTest, CatPadAndSliceOps) {
  GraphBuilder b;
  b.Input("a", C32({3, 4})).Input("b", C32({3, 2}))
      .Call("e", "aten.exp.default", {Ref("b")}, C32({3, 2}))
      .Call("cat", "aten.cat.default", {L({Ref("a"), Ref("e")}), I(1)}, C32({3, 6}))
      .Call("pad", "aten.constant_pad_nd.default", {Ref("a"), Ints({1, 2}), F(-1.0)}, C32({3, 7}))
      .Call("row", "aten.select.int", {Ref("a"), I(0), I(1)}, C32({4}, {1}, 4))
      .Call("selb", "aten.select_backward.default", {Ref("row"), Ints({3, 4}), I(0), I(1)}, C32({3, 4}))
      .Call("slb", "aten.slice_backward.default", {Ref("b"), Ints({3, 5}), I(1), I(2), I(4), I(1)}, C32({3, 5}))
      .Call("tril", "aten.tril.default", {Ref("cat"), I(1)}, C32({3, 6}))
      .Call("st", "aten.stack.default", {L({Ref("a"), Ref("a")}), I(1)}, C32({3, 2, 4}))
      .Call("ar", "aten.arange.start_step", {I(2), I(14), I(3)}, T(v1::DTYPE_INT64, {4}, {}, v1::DEVICE_KIND_CPU),
            {{"dtype", Dt(v1::DTYPE_INT64)}})
      .Output({"cat", "pad", "selb", "slb", "tril", "st", "ar"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aten, 0);
  const HostTensor a = Random({3, 4}, {}, 29), bb = Random({3, 2}, {}, 30);
  auto out = testing::RunPlan(c->result.artifact, {a, bb}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<double> cat, pad, selb, slb, tril;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 6; ++j) {
      cat.push_back(j < 4 ? a.Get(i * 4 + j) : static_cast<float>(std::exp(bb.Get(i * 2 + j - 4))));
      tril.push_back(j - i <= 1 ? cat.back() : 0.0);
    }
    for (int j = 0; j < 7; ++j) pad.push_back(j >= 1 && j < 5 ? a.Get(i * 4 + j - 1) : -1.0);
    for (int j = 0; j < 4; ++j) selb.push_back(i == 1 ? a.Get(4 + j) : 0.0);
    for (int j = 0; j < 5; ++j) slb.push_back(j >= 2 && j < 4 ? bb.Get(i * 2 + j - 2) : 0.0);
  }
  ExpectNear(Values((*out)[0]), cat);
  ExpectNear(Values((*out)[1]), pad);
  ExpectNear(Values((*out)[2]), selb);
  ExpectNear(Values((*out)[3]), slb);
  ExpectNear(Values((*out)[4]), tril);
  std::vector<double> st;
  for (int i = 0; i < 3; ++i) {
    for (int k = 0; k < 2; ++k) {
      for (int j = 0; j < 4; ++j) st.push_back(a.Get(i * 4 + j));
    }
  }
  ExpectNear(Values((*out)[5]), st);
  ExpectNear(Values((*out)[6]), {2, 5, 8, 11}, 0);
}

// Batch norm: training (functional running-stat updates), inference and backward. The training
// forward and the backward each take partials per (n, c), per-channel statistics and a pointwise
// kernel (the forward's fused with the inference one): 6 kernels.
TEST(CpuCompilerOpsTest, BatchNorm) {
  auto c1 = [](std::vector<int64_t> s) { return C32(std::move(s)); };
  GraphBuilder b;
  b.Input("x", c1({2, 3, 4, 5})).Input("w", c1({3})).Input("bias", c1({3})).Input("rm", c1({3}))
      .Input("rv", c1({3})).Input("go", c1({2, 3, 4, 5}))
      .Call("bn", "aten._native_batch_norm_legit_functional.default",
            {Ref("x"), Ref("w"), Ref("bias"), Ref("rm"), Ref("rv"), B(true), F(0.1), F(1e-5)},
            Tuple({c1({2, 3, 4, 5}), c1({3}), c1({3}), c1({3}), c1({3})}))
      .Call("out", "operator.getitem", {Ref("bn"), I(0)}, c1({2, 3, 4, 5}))
      .Call("smean", "operator.getitem", {Ref("bn"), I(1)}, c1({3}))
      .Call("sinv", "operator.getitem", {Ref("bn"), I(2)}, c1({3}))
      .Call("nrm", "operator.getitem", {Ref("bn"), I(3)}, c1({3}))
      .Call("nrv", "operator.getitem", {Ref("bn"), I(4)}, c1({3}))
      .Call("inf", "aten._native_batch_norm_legit_no_training.default",
            {Ref("x"), Ref("w"), Ref("bias"), Ref("rm"), Ref("rv"), F(0.1), F(1e-5)},
            Tuple({c1({2, 3, 4, 5}), c1({0}), c1({0})}))
      .Call("iout", "operator.getitem", {Ref("inf"), I(0)}, c1({2, 3, 4, 5}))
      .Call("bwd", "aten.native_batch_norm_backward.default",
            {Ref("go"), Ref("x"), Ref("w"), Ref("rm"), Ref("rv"), Ref("smean"), Ref("sinv"), B(true), F(1e-5),
             L({B(true), B(true), B(true)})},
            Tuple({c1({2, 3, 4, 5}), c1({3}), c1({3})}))
      .Call("gi", "operator.getitem", {Ref("bwd"), I(0)}, c1({2, 3, 4, 5}))
      .Call("gw", "operator.getitem", {Ref("bwd"), I(1)}, c1({3}))
      .Call("gb", "operator.getitem", {Ref("bwd"), I(2)}, c1({3}))
      .Output({"out", "smean", "sinv", "nrm", "nrv", "iout", "gi", "gw", "gb"});
  auto c = CompileGraph(b.Build());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aten, 0);
  EXPECT_EQ(c->kernels, 6);
  const HostTensor x = Random({2, 3, 4, 5}, {}, 31), w = Random({3}, {}, 32), bias = Random({3}, {}, 33),
                   rm = Random({3}, {}, 34), go = Random({2, 3, 4, 5}, {}, 36);
  HostTensor rv = Random({3}, {}, 35);
  for (int k = 0; k < 3; ++k) rv.Set(k, std::fabs(rv.Get(k)) + 0.5);
  auto out = testing::RunPlan(c->result.artifact, {x, w, bias, rm, rv, go}, Aten);
  ASSERT_TRUE(out.ok()) << out.status();
  auto at = [](int n, int ch, int s) { return (n * 3 + ch) * 20 + s; };
  std::vector<double> o(120), io(120), gi(120), mean(3), inv(3), nrm(3), nrv(3), gw(3, 0), gb(3, 0);
  for (int ch = 0; ch < 3; ++ch) {
    double m = 0, v = 0;
    for (int n = 0; n < 2; ++n) for (int s = 0; s < 20; ++s) m += x.Get(at(n, ch, s)) / 40;
    for (int n = 0; n < 2; ++n) for (int s = 0; s < 20; ++s) v += (x.Get(at(n, ch, s)) - m) * (x.Get(at(n, ch, s)) - m) / 40;
    mean[ch] = m;
    inv[ch] = 1 / std::sqrt(v + 1e-5);
    nrm[ch] = 0.9 * rm.Get(ch) + 0.1 * m;
    nrv[ch] = 0.9 * rv.Get(ch) + 0.1 * v * 40 / 39;
    double sdy = 0, sdyx = 0;
    for (int n = 0; n < 2; ++n) {
      for (int s = 0; s < 20; ++s) {
        const int k = at(n, ch, s);
        const double xh = (x.Get(k) - m) * inv[ch];
        o[k] = xh * w.Get(ch) + bias.Get(ch);
        io[k] = (x.Get(k) - rm.Get(ch)) / std::sqrt(rv.Get(ch) + 1e-5) * w.Get(ch) + bias.Get(ch);
        sdy += go.Get(k);
        sdyx += go.Get(k) * xh;
      }
    }
    gw[ch] = sdyx;
    gb[ch] = sdy;
    for (int n = 0; n < 2; ++n) {
      for (int s = 0; s < 20; ++s) {
        const int k = at(n, ch, s);
        const double xh = (x.Get(k) - m) * inv[ch];
        gi[k] = w.Get(ch) * inv[ch] * (go.Get(k) - sdy / 40 - xh * sdyx / 40);
      }
    }
  }
  ExpectNear(Values((*out)[0]), o, 1e-4);
  ExpectNear(Values((*out)[1]), mean, 1e-4);
  ExpectNear(Values((*out)[2]), inv, 1e-4);
  ExpectNear(Values((*out)[3]), nrm, 1e-4);
  ExpectNear(Values((*out)[4]), nrv, 1e-4);
  ExpectNear(Values((*out)[5]), io, 1e-4);
  ExpectNear(Values((*out)[6]), gi, 1e-3);
  ExpectNear(Values((*out)[7]), gw, 1e-3);
  ExpectNear(Values((*out)[8]), gb, 1e-4);
}

// The graph lowered as for a GPU target (LowerOptions::gpu), then fused, planned, emitted and
// compiled for this CPU as CpuGraphCompiler does: the numbers of the GPU lowering (not of the CUDA
// emitter) on a machine without a GPU. Also returns the first row op's domain.
absl::StatusOr<std::pair<v1::Artifact, std::vector<int64_t>>> CompileGpuLowering(const v1::Graph& g) {
  v1::CompileRequest req = Request(g);
  req.mutable_target()->Clear();
  req.mutable_target()->set_device(v1::DEVICE_KIND_CPU);
  req.mutable_target()->set_cpu_isa("x86-64");
  KILN_ASSIGN_OR_RETURN(graph::PreparedGraph prepared,
                        graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity()));
  lower::LowerOptions options;
  options.gpu = true;
  KILN_ASSIGN_OR_RETURN(lower::OpGraph ops, lower::LowerGraph(prepared.graph, prepared.fallback_nodes, options));
  if (ops.row_ops.empty()) return absl::InternalError("no row op");
  KILN_ASSIGN_OR_RETURN(lower::Schedule schedule, lower::ScheduleAndFuse(ops, lower::FuseOptions()));
  KILN_ASSIGN_OR_RETURN(lower::KernelSet kernels, lower::BuildKernels(ops, schedule));
  std::vector<std::string> symbols;
  std::vector<kernel::Kernel> ir;
  for (size_t i = 0; i < kernels.kernels.size(); ++i) {
    symbols.push_back(codegen::CpuKernelSymbol(static_cast<int>(i)));
    ir.push_back(kernels.kernels[i].kernel);
  }
  v1::Artifact artifact;
  lower::PlanStats stats;
  KILN_ASSIGN_OR_RETURN(*artifact.mutable_plan(),
                        lower::AssemblePlan(ops, schedule, kernels, lower::BindToBinary(symbols, 0), &stats));
  KILN_ASSIGN_OR_RETURN(codegen::CpuSource src, codegen::EmitCpuSource(ir));
  toolchain::CompileOptions tc;
  tc.march = "x86-64";
  KILN_ASSIGN_OR_RETURN(toolchain::CompiledBinary bin, toolchain::CompileSharedObject(src.source, tc));
  v1::Binary* b = artifact.add_binaries();
  b->set_kind(v1::Binary::KIND_SHARED_OBJECT);
  b->set_data(std::move(bin.bytes));
  return std::make_pair(std::move(artifact), ops.row_ops[0].domain);
}

// A training batch norm and its backward on GPUs: partials per (n, c) and chunk of H, [N, S, C]
// (lower_norm.cc). Its outputs (out, save_mean, save_invstd, the new running stats, grad_input,
// grad_weight, grad_bias) equal the CPU lowering's (per (n, c)) up to the order of the additions.
TEST(CpuCompilerOpsTest, BatchNormSplitForGpusMatchesTheCpuLowering) {
  struct Case {
    std::vector<int64_t> sizes, strides, partial_domain;
  };
  const Case cases[] = {
      {{4, 8, 64, 32}, {16384, 1, 256, 8}, {4, 8, 8, 8, 32}},  // channels-last; 8 x 32 = 256 per partial
      {{2, 3, 64, 8, 8}, {}, {2, 16, 3, 4, 8, 8}},             // 3d; 4 x 64 = 256 per partial
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(absl::StrCat("[", absl::StrJoin(cs.sizes, ", "), "]"));
    const std::vector<int64_t> c = {cs.sizes[1]};
    const v1::Graph g = TrainingBatchNorm(cs.sizes, cs.strides);
    auto cpu = CompileGraph(g);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    auto gpu = CompileGpuLowering(g);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ(gpu->second, cs.partial_domain);
    // x and go as the graph lays them out; values away from 0 in the mean (x + 3) and the running stats.
    HostTensor x = Random(cs.sizes, cs.strides, 41), go = Random(cs.sizes, cs.strides, 42);
    for (int64_t k = 0; k < x.numel(); ++k) x.Set(k, x.Get(k) + 3);
    const HostTensor w = Random(c, {}, 43), bias = Random(c, {}, 44), rm = Random(c, {}, 45);
    HostTensor rv = Random(c, {}, 46);
    for (int64_t k = 0; k < c[0]; ++k) rv.Set(k, std::fabs(rv.Get(k)) + 0.5);
    const std::vector<HostTensor> inputs = {x, w, bias, rm, rv, go};
    auto want = testing::RunPlan(cpu->result.artifact, inputs, Aten);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = testing::RunPlan(gpu->first, inputs, Aten);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < got->size(); ++i) {
      SCOPED_TRACE(absl::StrCat("output ", i));
      ExpectNear(Values((*got)[i]), Values((*want)[i]), 1e-4);
    }
  }
}

}  // namespace
}  // namespace kiln::compiler
