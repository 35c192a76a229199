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

// The builder's graph prepared for sm_90 and lowered (the op graph points into `prepared`).
struct Lowered {
  graph::PreparedGraph prepared;
  OpGraph ops;

  // free: Graph.free_layout_outputs (a training forward's saved tensors).
  void Lower(GraphBuilder& b, std::vector<int32_t> free = {}) {
    v1::CompileRequest req = CudaRequest(b);
    for (int32_t f : free) req.mutable_graph()->add_free_layout_outputs(f);
    auto p = graph::PrepareGraph(req, graph::GraphLimits(), graph::CompilerIdentity());
    ASSERT_TRUE(p.ok()) << p.status();
    prepared = *std::move(p);
    auto o = LowerGraph(prepared.graph, prepared.fallback_nodes);
    ASSERT_TRUE(o.ok()) << o.status();
    ops = *std::move(o);
  }
};

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
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  EXPECT_EQ(ChooseConvLayouts(ops), 2);
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
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  EXPECT_EQ(ChooseConvLayouts(ops), 0);
}

std::vector<v1::Argument> MaxPoolArgs(const std::string& x) {
  return {Ref(x), Ints({3, 3}), Ints({2, 2}), Ints({1, 1})};
}

// ResNet's stem over the graph's NCHW input x: conv1 -> relu -> max_pool2d_with_indices (pooled,
// idx) -> conv2 -> relu_1, returning `outputs`.
GraphBuilder PoolingStem(std::vector<std::string> outputs) {
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 8, 8})).Input("w1", Cu({16, 8, 3, 3})).Input("w2", Cu({16, 16, 3, 3}))
      .Call("conv1", "aten.convolution.default", ConvArgs("x", "w1"), Cu({2, 16, 8, 8}))
      .Call("relu", "aten.relu.default", {Ref("conv1")}, Cu({2, 16, 8, 8}))
      .Call("pool", "aten.max_pool2d_with_indices.default", MaxPoolArgs("relu"),
            Tuple({Cu({2, 16, 4, 4}), Cu({2, 16, 4, 4}, v1::DTYPE_INT64)}))
      .Call("pooled", "operator.getitem", {Ref("pool"), I(0)}, Cu({2, 16, 4, 4}))
      .Call("idx", "operator.getitem", {Ref("pool"), I(1)}, Cu({2, 16, 4, 4}, v1::DTYPE_INT64))
      .Call("conv2", "aten.convolution.default", ConvArgs("pooled", "w2"), Cu({2, 16, 4, 4}))
      .Call("relu_1", "aten.relu.default", {Ref("conv2")}, Cu({2, 16, 4, 4}))
      .Output(std::move(outputs));
  return b;
}

TEST(ConvLayoutTest, LoweredPoolingFollowsItsChannelsLastInput) {
  // ResNet's stem as kiln lowers it: the pooling is a kernel reading relu through masked loads,
  // so relu is stored; it follows conv1's channels-last result (no transposes), and the pooled
  // value, read by conv2, is channels-last too.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 8, 8})).Input("w0", Cu({8, 8, 3, 3})).Input("w1", Cu({16, 8, 3, 3}))
      .Input("w2", Cu({16, 16, 3, 3}))
      .Call("x2", "aten.relu.default", {Ref("x")}, Cu({2, 8, 8, 8}))
      .Call("conv1", "aten.convolution.default", ConvArgs("x2", "w1"), Cu({2, 16, 8, 8}))
      .Call("relu", "aten.relu.default", {Ref("conv1")}, Cu({2, 16, 8, 8}))
      .Call("pool", "aten.max_pool2d_with_indices.default", MaxPoolArgs("relu"),
            Tuple({Cu({2, 16, 4, 4}), Cu({2, 16, 4, 4}, v1::DTYPE_INT64)}))
      .Call("pooled", "operator.getitem", {Ref("pool"), I(0)}, Cu({2, 16, 4, 4}))
      .Call("conv2", "aten.convolution.default", ConvArgs("pooled", "w2"), Cu({2, 16, 4, 4}))
      .Call("relu_1", "aten.relu.default", {Ref("conv2")}, Cu({2, 16, 4, 4}))
      .Output({"relu_1"});
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  ChooseConvLayouts(ops);
  EXPECT_EQ(StridesOfNode(*ops, "conv1"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "relu"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "pooled"), std::vector<int64_t>({256, 1, 64, 16}));
}

TEST(ConvLayoutTest, AStemOverTheImageTransposesBeforeThePoolingKernel) {
  // ResNet's stem over the graph's NCHW input: conv1 returns NCHW (its input does not change).
  // relu, read only by the pooling kernel, whose result conv2 reads channels-last, follows that
  // reader: relu's kernel transposes, and the pooling's windows read along channels.
  GraphBuilder b = PoolingStem({"relu_1"});
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  EXPECT_EQ(ChooseConvLayouts(ops), 3);  // pooled, conv2 (its step result), relu
  EXPECT_EQ(StridesOfNode(*ops, "conv1"), std::vector<int64_t>({1024, 64, 8, 1}));
  EXPECT_EQ(StridesOfNode(*ops, "relu"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "pooled"), std::vector<int64_t>({256, 1, 64, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "relu_1"), std::vector<int64_t>({256, 16, 4, 1}));  // the output
}

TEST(ConvLayoutTest, SavedTensorsOfATrainingForwardMayChange) {
  // A training forward returns the loss-side output (relu_1, position 0) and the tensors saved
  // for the backward (positions 1-3). relu and conv2 are returned only at free positions: they
  // become channels-last as if they were not returned. x_relu (conv1's result after relu, which
  // is also returned at the fixed position 4) keeps the strides the graph states.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 8, 8})).Input("w1", Cu({16, 8, 3, 3})).Input("w2", Cu({16, 16, 3, 3}))
      .Input("w3", Cu({16, 16, 3, 3}))
      .Call("conv1", "aten.convolution.default", ConvArgs("x", "w1"), Cu({2, 16, 8, 8}))
      .Call("relu", "aten.relu.default", {Ref("conv1")}, Cu({2, 16, 8, 8}))
      .Call("conv2", "aten.convolution.default", ConvArgs("relu", "w2"), Cu({2, 16, 8, 8}))
      .Call("x_relu", "aten.relu.default", {Ref("conv2")}, Cu({2, 16, 8, 8}))
      .Call("conv3", "aten.convolution.default", ConvArgs("x_relu", "w3"), Cu({2, 16, 8, 8}))
      .Call("relu_1", "aten.relu.default", {Ref("conv3")}, Cu({2, 16, 8, 8}))
      .Output({"relu_1", "relu", "conv2", "x_relu", "x_relu"});
  {
    Lowered fixed;
    ASSERT_NO_FATAL_FAILURE(fixed.Lower(b));
    EXPECT_EQ(ChooseConvLayouts(&fixed.ops), 0);  // every value read by a convolution is returned
  }
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b, {1, 2, 3}));
  OpGraph* ops = &l.ops;
  EXPECT_EQ(ChooseConvLayouts(ops), 2);  // relu, conv2 (its step result)
  EXPECT_EQ(StridesOfNode(*ops, "relu"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "conv2"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "x_relu"), std::vector<int64_t>({1024, 64, 8, 1}));
  EXPECT_EQ(StridesOfNode(*ops, "relu_1"), std::vector<int64_t>({1024, 64, 8, 1}));
}

TEST(ConvLayoutTest, SavedPoolingIndicesFollowTheirChannelsLastInput) {
  // A training forward's stem: relu (saved) is read only by the pooling kernel, whose result
  // conv2 reads channels-last; the pooling indices are only saved. relu follows its readers (the
  // saved indices aside), and the indices follow relu, so the pooling kernel's loads and stores
  // all go along channels.
  GraphBuilder b = PoolingStem({"relu_1", "relu", "idx"});
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b, {1, 2}));
  OpGraph* ops = &l.ops;
  ChooseConvLayouts(ops);
  EXPECT_EQ(StridesOfNode(*ops, "pooled"), std::vector<int64_t>({256, 1, 64, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "relu"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "idx"), std::vector<int64_t>({256, 1, 64, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "relu_1"), std::vector<int64_t>({256, 16, 4, 1}));
}

TEST(ConvLayoutTest, PoolingStepsBetweenConvolutionsKeepChannelsLast) {
  // conv -> relu -> avg_pool2d (a torch step) -> conv -> relu (output). The relu read by the
  // pooling becomes channels-last, and so does the pooling's result.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 8, 8})).Input("w1", Cu({16, 8, 3, 3})).Input("w2", Cu({16, 16, 3, 3}))
      .Call("conv1", "aten.convolution.default", ConvArgs("x", "w1"), Cu({2, 16, 8, 8}))
      .Call("relu", "aten.relu.default", {Ref("conv1")}, Cu({2, 16, 8, 8}))
      .Call("pooled", "aten.avg_pool2d.default", {Ref("relu"), Ints({2, 2})}, Cu({2, 16, 4, 4}))
      .Call("conv2", "aten.convolution.default", ConvArgs("pooled", "w2"), Cu({2, 16, 4, 4}))
      .Call("relu_1", "aten.relu.default", {Ref("conv2")}, Cu({2, 16, 4, 4}))
      .Output({"relu_1"});
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  ChooseConvLayouts(ops);
  EXPECT_EQ(StridesOfNode(*ops, "relu"), std::vector<int64_t>({1024, 1, 128, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "pooled"), std::vector<int64_t>({256, 1, 64, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "conv2"), std::vector<int64_t>({256, 1, 64, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "relu_1"), std::vector<int64_t>({256, 16, 4, 1}));
}

TEST(ConvLayoutTest, KernelWrittenWeightsOfChannelsLastConvolutionsFollow) {
  // Autocast: the weight is cast by a kernel; it follows conv2's channels-last input, while the
  // cast weight of conv1 (input x, NCHW) keeps its strides.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 6, 6})).Input("w1", Cu({16, 8, 3, 3}, v1::DTYPE_FLOAT32))
      .Input("w2", Cu({16, 16, 3, 3}, v1::DTYPE_FLOAT32))
      .Call("w1h", "aten._to_copy.default", {Ref("w1")}, Cu({16, 8, 3, 3}), {{"dtype", Dt(v1::DTYPE_BFLOAT16)}})
      .Call("w2h", "aten._to_copy.default", {Ref("w2")}, Cu({16, 16, 3, 3}), {{"dtype", Dt(v1::DTYPE_BFLOAT16)}})
      .Call("conv1", "aten.convolution.default", ConvArgs("x", "w1h"), Cu({2, 16, 6, 6}))
      .Call("relu", "aten.relu.default", {Ref("conv1")}, Cu({2, 16, 6, 6}))
      .Call("conv2", "aten.convolution.default", ConvArgs("relu", "w2h"), Cu({2, 16, 6, 6}))
      .Call("relu_1", "aten.relu.default", {Ref("conv2")}, Cu({2, 16, 6, 6}))
      .Output({"relu_1"});
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  EXPECT_EQ(ChooseConvLayouts(ops), 3);
  EXPECT_EQ(StridesOfNode(*ops, "w1h"), std::vector<int64_t>({72, 9, 3, 1}));
  EXPECT_EQ(StridesOfNode(*ops, "w2h"), std::vector<int64_t>({144, 1, 48, 16}));
  EXPECT_EQ(StridesOfNode(*ops, "relu"), std::vector<int64_t>({576, 1, 96, 16}));
}

TEST(ConvLayoutTest, InputsStayWhenAStepResultMustKeepItsStrides) {
  // A convolution whose result is viewed (flatten) and a pooling whose result is a graph output:
  // torch would return them channels-last for a channels-last input, but the view and the output
  // follow the recorded strides, so the inputs stay as recorded.
  GraphBuilder b;
  b.Input("x", Cu({2, 8, 4, 4})).Input("w1", Cu({8, 8, 3, 3}))
      .Call("relu", "aten.relu.default", {Ref("x")}, Cu({2, 8, 4, 4}))
      .Call("conv1", "aten.convolution.default", ConvArgs("relu", "w1"), Cu({2, 8, 4, 4}))
      .Call("flat", "aten.view.default", {Ref("conv1"), Ints({2, 128})}, Cu({2, 128}))
      .Call("neg", "aten.neg.default", {Ref("x")}, Cu({2, 8, 4, 4}))
      .Call("pool", "aten.max_pool2d_with_indices.default", MaxPoolArgs("neg"),
            Tuple({Cu({2, 8, 2, 2}), Cu({2, 8, 2, 2}, v1::DTYPE_INT64)}))
      .Call("pooled", "operator.getitem", {Ref("pool"), I(0)}, Cu({2, 8, 2, 2}))
      .Call("conv2", "aten.convolution.default", ConvArgs("neg", "w1"), Cu({2, 8, 4, 4}))
      .Output({"flat", "pooled", "conv2"});
  Lowered l;
  ASSERT_NO_FATAL_FAILURE(l.Lower(b));
  OpGraph* ops = &l.ops;
  EXPECT_EQ(ChooseConvLayouts(ops), 0);
}

}  // namespace
}  // namespace kiln::lower
