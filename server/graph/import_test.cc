#include "server/graph/import.h"

#include <gtest/gtest.h>

#include "server/graph/op_registry.h"
#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

TEST(ImportTest, KwargsMoveToSchemaPositionsAndDefaultsFill) {
  GraphBuilder b;
  b.Input("x", F32({4, 8}))
      .Call("s", "aten.sum.dim_IntList", {Ref("x")}, F32({4}), {{"keepdim", B(false)}, {"dim", Ints({1})}})
      .Output({"s"});
  auto g = ImportGraph(b.Build(), GraphLimits());
  ASSERT_TRUE(g.ok()) << g.status();
  const Node& n = g->nodes[1];
  ASSERT_NE(n.op, nullptr);
  ASSERT_EQ(n.args.size(), 4u);
  EXPECT_EQ(ArgToString(n.args[0]), "%0");
  EXPECT_EQ(ArgToString(n.args[1]), "[1]");
  EXPECT_EQ(ArgToString(n.args[2]), "False");
  EXPECT_EQ(ArgToString(n.args[3]), "None");
  EXPECT_TRUE(n.kwargs.empty());
}

TEST(ImportTest, NormalizesValues) {
  GraphBuilder b;
  b.Input("x", F32({4, 8}))
      .Call("ln", "aten.native_layer_norm.default", {Ref("x"), Ints({8}), None(), None(), I(0)},
            Tuple({F32({4, 8}), F32({4, 1}), F32({4, 1})}))
      .Output({"ln"});
  auto g = ImportGraph(b.Build(), GraphLimits());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->nodes[1].args[4].kind, Arg::Kind::kFloat);  // eps=0 written as an int
}

TEST(ImportTest, FallbackKeepsArgumentsAsWritten) {
  GraphBuilder b;
  b.Input("x", F32({4, 8}))
      .Call("f", "aten.upsample_nearest2d.vec", {Ref("x"), None()}, F32({4, 8}), {{"z", I(1)}, {"a", F(2)}})
      .Output({"f"});
  auto g = ImportGraph(b.Build(), GraphLimits());
  ASSERT_TRUE(g.ok()) << g.status();
  const Node& n = g->nodes[1];
  EXPECT_TRUE(n.is_fallback());
  EXPECT_EQ(n.args.size(), 2u);
  ASSERT_EQ(n.kwargs.size(), 2u);
  EXPECT_EQ(n.kwargs[0].first, "a");
  EXPECT_EQ(n.kwargs[1].first, "z");
}

TEST(ImportTest, ConvertsMetadataAndSymbols) {
  auto g = ImportGraph(DynamicGraph(), GraphLimits());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->symbols.size(), 1u);
  EXPECT_EQ(g->symbols[0].hint, 8);
  EXPECT_EQ(TypeToString(g->nodes[0].type), "f32[s0, 64] strides [64, 1] cuda");
  EXPECT_EQ(TypeToString(g->nodes[2].type), "sym 64*s0");
  EXPECT_EQ(g->nodes[0].input_index, 0);
}

TEST(ImportTest, NothingChangesForAlreadyCanonicalCalls) {
  GraphBuilder b;
  b.Input("x", F32({4, 8})).Call("r", "aten.relu.default", {Ref("x")}, F32({4, 8})).Output({"r"});
  auto g = ImportGraph(b.Build(), GraphLimits());
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->nodes[1].args.size(), 1u);
  EXPECT_EQ(ArgToString(g->nodes[1].args[0]), "%0");
}

TEST(ImportTest, ClaimedHugeTensorsCostNothing) {
  GraphBuilder b;
  b.Input("x", F32({int64_t{1} << 31, int64_t{1} << 31}, {int64_t{1} << 31, 1})).Output({"x"});
  auto g = ImportGraph(b.Build(), GraphLimits());
  ASSERT_TRUE(g.ok());  // import does not allocate per element; the verifier refuses the size
}

}  // namespace
}  // namespace kiln::graph
