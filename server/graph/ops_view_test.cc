#include <gtest/gtest.h>

#include <limits>

#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

TEST(ViewTest, View) {
  EXPECT_EQ(InferString("aten.view.default", {F32({4, 6})}, {Ref("a0"), Ints({2, 12})}),
            "f32[2, 12] strides [12, 1] cuda");
  EXPECT_EQ(InferString("aten.view.default", {F32({4, 6})}, {Ref("a0"), Ints({-1, 3})}),
            "f32[8, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.view.default", {F32({4, 6})}, {Ref("a0"), Ints({5, -1})}),
            "error: shape '[5, 4]' is invalid for input of size 24");
  // Splitting a dim of a transposed tensor is a view; merging its dims is not.
  EXPECT_EQ(InferString("aten.view.default", {F32({6, 4}, {1, 6})}, {Ref("a0"), Ints({2, 3, 4})}),
            "f32[2, 3, 4] strides [3, 1, 6] cuda");
  EXPECT_EQ(InferString("aten.view.default", {F32({6, 4}, {1, 6})}, {Ref("a0"), Ints({24})}),
            "error: view size is not compatible with input tensor's size and stride (at least one dimension spans "
            "across two contiguous subspaces). Use .reshape(...) instead.");
  EXPECT_EQ(InferString("aten.reshape.default", {F32({6, 4}, {1, 6})}, {Ref("a0"), Ints({24})}),
            "f32[24] strides [1] cuda");
  // A view keeps the storage offset.
  EXPECT_EQ(InferString("aten.view.default", {F32({2, 16, 64}, {3072, 192, 1}, 64)}, {Ref("a0"), Ints({2, 16, 4, 16})}),
            "f32[2, 16, 4, 16] strides [3072, 192, 16, 1] offset 64 cuda");
}

TEST(ViewTest, PermuteTransposeExpand) {
  EXPECT_EQ(InferString("aten.permute.default", {F32({2, 3, 4})}, {Ref("a0"), Ints({2, 0, 1})}),
            "f32[4, 2, 3] strides [1, 12, 4] cuda");
  EXPECT_EQ(InferString("aten.permute.default", {F32({2, 3, 4})}, {Ref("a0"), Ints({0, 0, 1})}),
            "error: permute: repeated dim");
  EXPECT_EQ(InferString("aten.transpose.int", {F32({2, 3, 4})}, {Ref("a0"), I(-1), I(0)}),
            "f32[4, 3, 2] strides [1, 4, 12] cuda");
  EXPECT_EQ(InferString("aten.t.default", {F32({2, 3, 4})}, {Ref("a0")}),
            "error: t() expects a tensor with <= 2 dimensions, but self is 3D");
  EXPECT_EQ(InferString("aten.expand.default", {F32({3, 1})}, {Ref("a0"), Ints({2, 3, 4})}),
            "f32[2, 3, 4] strides [0, 1, 0] cuda");
  EXPECT_EQ(InferString("aten.expand.default", {F32({3, 1})}, {Ref("a0"), Ints({-1, 5})}),
            "f32[3, 5] strides [1, 0] cuda");
  EXPECT_EQ(InferString("aten.expand.default", {F32({3, 2})}, {Ref("a0"), Ints({3, 5})}),
            "error: expand: the expanded size of the tensor (5) must match the existing size (2) at non-singleton "
            "dimension 1");
}

TEST(ViewTest, SqueezeUnsqueeze) {
  EXPECT_EQ(InferString("aten.unsqueeze.default", {F32({3, 4})}, {Ref("a0"), I(1)}),
            "f32[3, 1, 4] strides [4, 4, 1] cuda");
  EXPECT_EQ(InferString("aten.unsqueeze.default", {F32({3, 4})}, {Ref("a0"), I(-1)}),
            "f32[3, 4, 1] strides [4, 1, 1] cuda");
  EXPECT_EQ(InferString("aten.squeeze.dim", {F32({3, 1, 4})}, {Ref("a0"), I(1)}), "f32[3, 4] strides [4, 1] cuda");
  EXPECT_EQ(InferString("aten.squeeze.dim", {F32({3, 1, 4})}, {Ref("a0"), I(0)}),
            "f32[3, 1, 4] strides [4, 4, 1] cuda");
  EXPECT_EQ(InferString("aten.squeeze.dims", {F32({1, 3, 1})}, {Ref("a0"), Ints({0, 2})}), "f32[3] strides [1] cuda");
}

TEST(ViewTest, SliceSelectSplit) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(InferString("aten.slice.Tensor", {F32({8, 6})}, {Ref("a0"), I(1), I(2), I(kMax)}),
            "f32[8, 4] strides [6, 1] offset 2 cuda");
  EXPECT_EQ(InferString("aten.slice.Tensor", {F32({8, 6})}, {Ref("a0"), I(0), I(-3), None(), I(2)}),
            "f32[2, 6] strides [12, 1] offset 30 cuda");
  EXPECT_EQ(InferString("aten.slice.Tensor", {F32({8, 6})}, {Ref("a0")}), "f32[8, 6] strides [6, 1] cuda");
  EXPECT_EQ(InferString("aten.select.int", {F32({8, 6})}, {Ref("a0"), I(1), I(-1)}),
            "f32[8] strides [6] offset 5 cuda");
  EXPECT_EQ(InferString("aten.select.int", {F32({8, 6})}, {Ref("a0"), I(1), I(6)}),
            "error: select(): index 6 out of range for tensor of size [8, 6] at dimension 1");
  EXPECT_EQ(InferString("aten.split.Tensor", {F32({5, 2})}, {Ref("a0"), I(2)}),
            "(f32[2, 2] strides [2, 1] cuda, f32[2, 2] strides [2, 1] offset 4 cuda, f32[1, 2] strides [2, 1] offset 8 "
            "cuda)");
  EXPECT_EQ(InferString("aten.split_with_sizes.default", {F32({5, 2})}, {Ref("a0"), Ints({1, 4})}),
            "(f32[1, 2] strides [2, 1] cuda, f32[4, 2] strides [2, 1] offset 2 cuda)");
  EXPECT_EQ(InferString("aten.split_with_sizes.default", {F32({5, 2})}, {Ref("a0"), Ints({1, 3})}),
            "error: split_with_sizes expects split_sizes to sum exactly to 5");
  EXPECT_EQ(InferString("aten.narrow.default", {F32({5, 2})}, {Ref("a0"), I(0), I(1), I(3)}),
            "f32[3, 2] strides [2, 1] offset 2 cuda");
  EXPECT_EQ(InferString("aten.unbind.int", {F32({2, 3})}, {Ref("a0")}),
            "(f32[3] strides [1] cuda, f32[3] strides [1] offset 3 cuda)");
  EXPECT_EQ(InferString("aten.as_strided.default", {F32({16})}, {Ref("a0"), Ints({2, 2}), Ints({4, 1}), I(1)}),
            "f32[2, 2] strides [4, 1] offset 1 cuda");
}

TEST(ViewTest, CatStack) {
  EXPECT_EQ(InferString("aten.cat.default", {F32({2, 3}), F32({4, 3})}, {L({Ref("a0"), Ref("a1")})}),
            "f32[6, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.cat.default", {F32({2, 3}), T(v1::DTYPE_FLOAT16, {2, 5})}, {L({Ref("a0"), Ref("a1")}), I(-1)}),
            "f32[2, 8] strides [8, 1] cuda");
  EXPECT_EQ(InferString("aten.cat.default", {F32({2, 3}), F32({0})}, {L({Ref("a0"), Ref("a1")})}),
            "f32[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.cat.default", {F32({2, 3}), F32({2, 4})}, {L({Ref("a0"), Ref("a1")})}),
            "error: Sizes of tensors must match except in dimension 0: expected 3 but got 4 for tensor number 1");
  EXPECT_EQ(InferString("aten.stack.default", {F32({2, 3}), F32({2, 3})}, {L({Ref("a0"), Ref("a1")}), I(1)}),
            "f32[2, 2, 3] strides [6, 3, 1] cuda");
}

TEST(ViewTest, Symbolic) {
  symbols_for_infer().Clear();
  v1::Symbol* s = symbols_for_infer().Add();
  s->set_name("s0");
  s->set_hint(8);
  v1::ValueMeta x;
  *x.mutable_tensor() = TMeta(v1::DTYPE_FLOAT32, {1, 64});
  *x.mutable_tensor()->mutable_sizes(0)->mutable_expr() = SymS(0);
  EXPECT_EQ(InferString("aten.view.default", {x}, {Ref("a0"), Ints({-1})}), "f32[64*s0] strides [1] cuda");
  EXPECT_EQ(InferString("aten.view.default", {x}, {Ref("a0"), L({SymArg(SymS(0)), I(8), I(-1)})}),
            "f32[s0, 8, 8] strides [64, 8, 1] cuda");
  EXPECT_EQ(InferString("aten.add.Tensor", {x, F32({64})}, {Ref("a0"), Ref("a1")}), "f32[s0, 64] strides [64, 1] cuda");
  EXPECT_EQ(InferString("aten.slice.Tensor", {x}, {Ref("a0"), I(0), I(1)}),
            "f32[s0 - 1, 64] strides [64, 1] offset 64 cuda");
  symbols_for_infer().Clear();
}

}  // namespace
}  // namespace kiln::graph
