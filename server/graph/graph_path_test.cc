#include "server/graph/graph_path.h"

#include <gtest/gtest.h>

#include "server/graph/test_graphs.h"
#include "server/graph/verify.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

CompilerIdentity Compiler() { return CompilerIdentity{{{"nvrtc", "13.0"}, {"cxx", "g++ 12.2.0"}}}; }

TEST(GraphPathTest, RealisticGraphsPrepare) {
  int i = 0;
  for (const v1::Graph& g : AllTestGraphs()) {
    auto prepared = PrepareGraph(Request(g), GraphLimits(), Compiler());
    ASSERT_TRUE(prepared.ok()) << "graph " << i << ": " << prepared.status();
    EXPECT_EQ(prepared->key.hex.size(), 64u);
    ASSERT_EQ(prepared->timings_us.size(), 3u);
    EXPECT_EQ(prepared->timings_us[0].first, "import");
    EXPECT_EQ(prepared->timings_us[1].first, "verify");
    EXPECT_EQ(prepared->timings_us[2].first, "hash");
    EXPECT_TRUE(VerifyGraph(prepared->graph).ok());
    ++i;
  }
}

TEST(GraphPathTest, FallbackNodesAreListed) {
  auto prepared = PrepareGraph(Request(ConvBlock()), GraphLimits(), Compiler());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_EQ(prepared->fallback_nodes.size(), 1u);
  EXPECT_EQ(prepared->graph.nodes[prepared->fallback_nodes[0]].target, "aten.upsample_nearest2d.default");
  auto mlp = PrepareGraph(Request(MlpForward()), GraphLimits(), Compiler());
  ASSERT_TRUE(mlp.ok());
  EXPECT_TRUE(mlp->fallback_nodes.empty());
}

TEST(GraphPathTest, BadTargetIsRefusedBeforeImport) {
  v1::CompileRequest r = Request(MlpForward(), "compute_90");
  auto prepared = PrepareGraph(r, GraphLimits(), Compiler());
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(prepared.status().message().find("cuda_arch"), std::string::npos);
}

TEST(GraphPathTest, BadGraphNamesTheNode) {
  v1::Graph g = MlpForward();
  g.mutable_nodes(6)->mutable_meta()->mutable_tensor()->mutable_sizes(1)->set_constant(129);  // addmm
  auto prepared = PrepareGraph(Request(g), GraphLimits(), Compiler());
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prepared.status().message(),
            "node 'addmm' (aten.addmm.default): inferred shape [32, 128] but the graph says [32, 129]");
}

TEST(GraphPathTest, FreeLayoutOutputsAreCheckedAndHashed) {
  v1::Graph g = MlpForward();  // 4 outputs
  auto key = [](const v1::Graph& graph) {
    auto prepared = PrepareGraph(Request(graph), GraphLimits(), Compiler());
    EXPECT_TRUE(prepared.ok()) << prepared.status();
    return prepared.ok() ? prepared->key.hex : std::string();
  };
  const std::string plain = key(g);
  g.add_free_layout_outputs(1);
  g.add_free_layout_outputs(3);
  auto prepared = PrepareGraph(Request(g), GraphLimits(), Compiler());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->graph.free_layout_outputs, std::vector<int32_t>({1, 3}));
  EXPECT_NE(prepared->key.hex, plain);
  for (const auto& [bad, message] : std::vector<std::pair<std::vector<int32_t>, std::string>>{
           {{4}, "free_layout_outputs: position 4 is not one of the 4 graph outputs"},
           {{-1}, "free_layout_outputs: position -1 is not one of the 4 graph outputs"},
           {{2, 2}, "free_layout_outputs: position 2 comes after 2 (the list must ascend, each position once)"}}) {
    v1::Graph b = MlpForward();
    for (int32_t p : bad) b.add_free_layout_outputs(p);
    auto r = PrepareGraph(Request(b), GraphLimits(), Compiler());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), message);
  }
}

TEST(GraphPathTest, PrintedGraphIsReadable) {
  auto prepared = PrepareGraph(Request(MlpForward()), GraphLimits(), Compiler());
  ASSERT_TRUE(prepared.ok());
  const std::string text = PrintGraph(prepared->graph);
  EXPECT_NE(text.find("%6 = aten.addmm.default(%1, %2, %5, 1, 1) : f32[32, 128] strides [128, 1] cuda  # addmm"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace kiln::graph
