// Differential fuzzing of fusion: random graphs of pointwise ops (with broadcasting), reductions,
// softmax and transposes through computed values, compiled with fusion and with one kernel per op
// (CompileOptions.disable_fusion), run on the same inputs: the results must agree. A wrong index,
// grouping, pruning or workspace reuse in the fused plan shows up as a difference.

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/compiler/test_executor.h"
#include "server/compiler/test_util.h"
#include "server/graph/test_graphs.h"

namespace kiln::compiler {
namespace {

namespace v1 = ::kiln::v1;
using namespace ::kiln::graph::testing;     // NOLINT: graph builders
using namespace ::kiln::compiler::testing;  // NOLINT: test helpers

constexpr int64_t R = 6, C = 20;

struct Val {
  std::string name;
  int kind;  // 0: [R, C], 1: [C], 2: [R, 1]
};

v1::ValueMeta MetaOf(int kind) {
  if (kind == 0) return C32({R, C});
  if (kind == 1) return C32({C});
  return C32({R, 1});
}

v1::Graph RandomGraph(unsigned seed, std::vector<std::string>* outputs) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  GraphBuilder b;
  std::vector<Val> vals = {{"x0", 0}, {"x1", 1}, {"x2", 2}, {"x3", 0}};
  b.Input("x0", C32({R, C})).Input("x1", C32({C})).Input("x2", C32({R, 1})).Input("x3", C32({R, C}));
  auto of_kind = [&](int kind) {
    std::vector<std::string> c;
    for (const Val& v : vals) {
      if (v.kind == kind) c.push_back(v.name);
    }
    return c[pick(static_cast<int>(c.size()))];
  };
  for (int i = 0; i < 14; ++i) {
    const std::string n = absl::StrCat("n", i);
    const int op = pick(8);
    if (op <= 2) {  // unary on any value
      const Val& a = vals[pick(static_cast<int>(vals.size()))];
      static const char* kUnary[] = {"aten.tanh.default", "aten.neg.default", "aten.relu.default",
                                     "aten.sigmoid.default"};
      b.Call(n, kUnary[pick(4)], {Ref(a.name)}, MetaOf(a.kind));
      vals.push_back({n, a.kind});
    } else if (op <= 4) {  // binary [R, C] with a broadcast partner
      const std::string a = of_kind(0), c = of_kind(pick(3));
      static const char* kBinary[] = {"aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.maximum.default"};
      b.Call(n, kBinary[pick(4)], {Ref(a), Ref(c)}, MetaOf(0));
      vals.push_back({n, 0});
    } else if (op == 5) {  // reduction over the row
      static const char* kRed[] = {"aten.sum.dim_IntList", "aten.amax.default", "aten.mean.dim"};
      b.Call(n, kRed[pick(3)], {Ref(of_kind(0)), Ints({1}), B(true)}, MetaOf(2));
      vals.push_back({n, 2});
    } else if (op == 6) {  // transpose round trip through a computed value
      const std::string a = of_kind(0);
      b.Call(n + "t", "aten.t.default", {Ref(a)}, C32({C, R}, {1, C}));
      b.Call(n + "e", "aten.tanh.default", {Ref(n + "t")}, C32({C, R}, {1, C}));
      b.Call(n, "aten.t.default", {Ref(n + "e")}, C32({R, C}, {C, 1}));
      vals.push_back({n, 0});
    } else {
      b.Call(n, "aten._softmax.default", {Ref(of_kind(0)), I(1), B(false)}, MetaOf(0));
      vals.push_back({n, 0});
    }
  }
  outputs->clear();
  outputs->push_back(vals.back().name);
  for (int k = 0; k < 2; ++k) {
    const std::string o = vals[4 + pick(static_cast<int>(vals.size()) - 4)].name;
    outputs->push_back(o);
  }
  b.Output(*outputs);
  return b.Build();
}

TEST(CpuCompilerFuzzTest, FusedEqualsUnfused) {
  for (unsigned seed = 1; seed <= 8; ++seed) {
    std::vector<std::string> outputs;
    const v1::Graph g = RandomGraph(seed, &outputs);
    auto fused = CompileGraph(g, false);
    ASSERT_TRUE(fused.ok()) << "seed " << seed << ": " << fused.status();
    auto unfused = CompileGraph(g, true);
    ASSERT_TRUE(unfused.ok()) << "seed " << seed << ": " << unfused.status();
    EXPECT_LE(fused->kernels, unfused->kernels) << "seed " << seed;
    const std::vector<HostTensor> in = {Random({R, C}, {}, seed * 10 + 1), Random({C}, {}, seed * 10 + 2),
                                        Random({R, 1}, {}, seed * 10 + 3), Random({R, C}, {}, seed * 10 + 4)};
    auto a = RunPlan(fused->result.artifact, in, Aten);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = RunPlan(unfused->result.artifact, in, Aten);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->size(), b->size());
    for (size_t i = 0; i < a->size(); ++i) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, " output ", outputs[i], " (", fused->kernels, " vs ",
                                unfused->kernels, " kernels)"));
      ExpectNear(Values((*a)[i]), Values((*b)[i]), 1e-5);
    }
  }
}

}  // namespace
}  // namespace kiln::compiler
