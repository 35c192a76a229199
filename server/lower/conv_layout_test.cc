// Which values around convolutions become channels-last on CUDA (conv_layout.h), and that the
// plan then states those strides for the kernels and the convolution steps.

#include "server/lower/conv_layout.h"

#include <vector>

#include "gtest/gtest.h"
#include "server/graph/graph_path.h"
#include "server/graph/test_graphs.h"
#include "server/lower/lower.h"

namespace kiln::lower {
namespace {

namespace v1 = ::kiln::v1;
using namespace ::kiln::graph::testing;  // NOLINT: graph builders

v1::ValueMeta Cu(std::vector<int64_t> sizes, v1::DType dtype = v1::DTYPE_BFLOAT16) {
  return T(dtype, std::move(sizes), {}, v1::DEVICE_KIND_CUDA, 0);
}


// conv(x, w) with stride 1, padding 1, no bias.
std::vector<v1::Argument> ConvArgs(const std::string& x, const std::string& w) {
  return {Ref(x), Ref(w), None(), Ints({1, 1}), Ints({1, 1}), Ints({1, 1}), B(false), Ints({0, 0}), I(1)};
}


v1::CompileRequest CudaRequest(GraphBuilder& b) {
  v1::CompileRequest req = Request(b.Build());
  req.mutable_target()->Clear();
  req.mutable_target()->set_device(v1::DEVICE_KIND_CUDA);
  req.mutable_target()->set_cuda_arch("sm_90");
  return req;
}

std::vector<int64_t> StridesOfNode(const OpGraph& g, const std::string& name) {
  for (size_t n = 0; n < g.graph->nodes.size(); ++n) {
    if (g.graph->nodes[n].name == name && g.node_value[n] >= 0) return g.values[g.node_value[n]].strides;
  }
  ADD_FAILURE() << "no value for " << name;
  return {};
}

TEST(ConvLayoutTest, ValuesBetweenConvolutionsBecomeChannelsLast) {
  // x -> conv1 -> relu -> conv2 -> relu_1 (output); the graph input and output keep their strides.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 6, 6})).Input("w1", Cu({16, 8, 3, 3})).Input("w2", Cu({16, 16, 3, 3}))
      .Call("conv1", "aten.convolution.default", ConvArgs("x", "w1"), Cu({2, 16, 6, 6}))
      .Call("relu", "aten.relu.default", {Ref("conv1")}, Cu({2, 16, 6, 6}))
      .Call("conv2", "aten.convolution.default", ConvArgs("relu", "w2"), Cu({2, 16, 6, 6}))
      .Call("relu_1", "aten.relu.default", {Ref("conv2")}, Cu({2, 16, 6, 6}))
      .Output({"relu_1"});
  const v1::CompileRequest req = CudaRequest(b);
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  auto ops = LowerGraph(prepared->graph, prepared->fallback_nodes);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ChooseConvLayouts(&*ops), 2);
  const std::vector<int64_t> nchw = {576, 36, 6, 1}, nhwc = {576, 1, 96, 16};
  EXPECT_EQ(StridesOfNode(*ops, "conv1"), nchw);   // its input x is NCHW: so is its result
  EXPECT_EQ(StridesOfNode(*ops, "relu"), nhwc);    // written by a kernel, read by conv2
  EXPECT_EQ(StridesOfNode(*ops, "conv2"), nhwc);   // a channels-last input: cuDNN returns NHWC
  EXPECT_EQ(StridesOfNode(*ops, "relu_1"), nchw);  // a graph output
  EXPECT_EQ(StridesOfNode(*ops, "x"), std::vector<int64_t>({288, 36, 6, 1}));
}

TEST(ConvLayoutTest, ValuesReadOtherwiseKeepTheirStrides) {
  // relu is also a graph output (a training forward saves it); view reads keep strides too.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 6, 6})).Input("w1", Cu({16, 8, 3, 3}))
      .Call("relu", "aten.relu.default", {Ref("x")}, Cu({2, 8, 6, 6}))
      .Call("conv1", "aten.convolution.default", ConvArgs("relu", "w1"), Cu({2, 16, 6, 6}))
      .Call("neg", "aten.neg.default", {Ref("x")}, Cu({2, 8, 6, 6}))
      .Call("view", "aten.view.default", {Ref("neg"), Ints({2, 288})}, Cu({2, 288}))
      .Call("conv2", "aten.convolution.default", ConvArgs("neg", "w1"), Cu({2, 16, 6, 6}))
      .Output({"conv1", "relu", "view", "conv2"});
  const v1::CompileRequest req = CudaRequest(b);
  auto prepared = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  auto ops = LowerGraph(prepared->graph, prepared->fallback_nodes);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ChooseConvLayouts(&*ops), 0);
}

}  // namespace
}  // namespace kiln::lower
