#include <gtest/gtest.h>

#include "server/graph/op_registry.h"
#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

TEST(RegistryTest, AllSchemasParseAndTargetsAreUnique) {
  EXPECT_TRUE(RegistryErrors().empty()) << RegistryErrors()[0];
  EXPECT_GT(AllOps().size(), 200u);
  const OpDef* add = FindOp("aten.add.Tensor");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->schema.ToString(), "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
  EXPECT_EQ(add->op_class, OpClass::kPointwise);
  EXPECT_EQ(FindOp("aten.mm.default")->op_class, OpClass::kExtern);
  EXPECT_EQ(FindOp("aten.view.default")->op_class, OpClass::kView);
  EXPECT_EQ(FindOp("aten.sum.dim_IntList")->op_class, OpClass::kReduction);
  EXPECT_NE(FindOp("prims.convert_element_type.default"), nullptr);
  EXPECT_NE(FindOp("operator.getitem"), nullptr);
  EXPECT_NE(FindOp("operator.mul"), nullptr);
  EXPECT_EQ(FindOp("aten.not_an_op.default"), nullptr);
}

TEST(MatmulTest, Shapes) {
  EXPECT_EQ(InferString("aten.mm.default", {F32({4, 8}), F32({8, 16}, {1, 8})}, {Ref("a0"), Ref("a1")}),
            "f32[4, 16] strides [16, 1] cuda");
  EXPECT_EQ(InferString("aten.mm.default", {F32({4, 8}), F32({9, 16})}, {Ref("a0"), Ref("a1")}),
            "error: mat1 and mat2 shapes cannot be multiplied (8 vs 9)");
  EXPECT_EQ(InferString("aten.mm.default", {F32({4, 8}), T(v1::DTYPE_FLOAT16, {8, 16})}, {Ref("a0"), Ref("a1")}),
            "error: mm: expected both operands to have the same dtype, but got f32 and f16");
  EXPECT_EQ(InferString("aten.bmm.default", {F32({2, 4, 8}), F32({2, 8, 3})}, {Ref("a0"), Ref("a1")}),
            "f32[2, 4, 3] strides [12, 3, 1] cuda");
  EXPECT_EQ(InferString("aten.addmm.default", {F32({16}), F32({4, 8}), F32({8, 16})}, {Ref("a0"), Ref("a1"), Ref("a2")},
                        {{"beta", I(0)}}),
            "f32[4, 16] strides [16, 1] cuda");
}

TEST(ConvTest, Forward) {
  auto conv = [](v1::ValueMeta x, v1::ValueMeta w, std::vector<int64_t> stride, std::vector<int64_t> pad) {
    return InferString("aten.convolution.default", {std::move(x), std::move(w)},
                       {Ref("a0"), Ref("a1"), None(), Ints(stride), Ints(pad), Ints({1, 1}), B(false), Ints({0, 0}), I(1)});
  };
  EXPECT_EQ(conv(F32({2, 3, 32, 32}), F32({16, 3, 3, 3}), {2, 2}, {1, 1}), "f32[2, 16, 16, 16] strides [4096, 256, 16, 1] cuda");
  EXPECT_EQ(conv(F32({2, 3, 32, 32}, {3072, 1, 96, 3}), F32({16, 3, 3, 3}), {1, 1}, {1, 1}),
            "f32[2, 16, 32, 32] strides [16384, 1, 512, 16] cuda");
  EXPECT_EQ(conv(F32({2, 3, 2, 2}), F32({16, 3, 3, 3}), {1, 1}, {0, 0}),
            "error: convolution: calculated output size 0 is too small");
}

TEST(NnTest, NormsEmbeddingLoss) {
  EXPECT_EQ(InferString("aten.native_layer_norm.default", {T(v1::DTYPE_FLOAT16, {2, 8})},
                        {Ref("a0"), Ints({8}), None(), None(), F(1e-5)}),
            "(f16[2, 8] strides [8, 1] cuda, f32[2, 1] strides [1, 1] cuda, f32[2, 1] strides [1, 1] cuda)");
  EXPECT_EQ(InferString("aten.native_layer_norm.default", {F32({2, 8})}, {Ref("a0"), Ints({4}), None(), None(), F(1e-5)}),
            "error: native_layer_norm: normalized_shape does not match the input's trailing dims");
  EXPECT_EQ(InferString("aten.embedding.default", {F32({100, 16}), T(v1::DTYPE_INT64, {2, 5})}, {Ref("a0"), Ref("a1")}),
            "f32[2, 5, 16] strides [80, 16, 1] cuda");
  EXPECT_EQ(InferString("aten.embedding_dense_backward.default", {F32({2, 5, 16}), T(v1::DTYPE_INT64, {2, 5})},
                        {Ref("a0"), Ref("a1"), I(100), I(-1), B(false)}),
            "f32[100, 16] strides [16, 1] cuda");
  EXPECT_EQ(InferString("aten.nll_loss_forward.default", {F32({4, 10}), T(v1::DTYPE_INT64, {4})},
                        {Ref("a0"), Ref("a1"), None(), I(1), I(-100)}),
            "(f32[] strides [] cuda, f32[] strides [] cuda)");
  EXPECT_EQ(InferString("aten.index_select.default", {F32({10, 4}), T(v1::DTYPE_INT64, {3})}, {Ref("a0"), I(0), Ref("a1")}),
            "f32[3, 4] strides [4, 1] cuda");
  EXPECT_EQ(InferString("aten.gather.default", {F32({10, 4}), T(v1::DTYPE_INT64, {10, 1})}, {Ref("a0"), I(1), Ref("a1")}),
            "f32[10, 1] strides [1, 1] cuda");
  EXPECT_EQ(InferString("aten.index.Tensor", {F32({10, 4, 5}), T(v1::DTYPE_INT64, {3})}, {Ref("a0"), L({None(), Ref("a1")})}),
            "f32[10, 3, 5] strides [] cuda");
}

TEST(NnTest, BackwardForms) {
  EXPECT_EQ(InferString("aten.convolution_backward.default", {F32({2, 16, 16, 16}), F32({2, 3, 32, 32}), F32({16, 3, 3, 3})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), Ints({16}), Ints({2, 2}), Ints({1, 1}), Ints({1, 1}), B(false),
                         Ints({0, 0}), I(1), L({B(true), B(true), B(true)})}),
            "(f32[2, 3, 32, 32] strides [3072, 1024, 32, 1] cuda, f32[16, 3, 3, 3] strides [27, 9, 3, 1] cuda, "
            "f32[16] strides [1] cuda)");
  EXPECT_EQ(InferString("aten.native_layer_norm_backward.default",
                        {F32({2, 8}), F32({2, 8}), F32({2, 1}), F32({2, 1}), F32({8}), F32({8})},
                        {Ref("a0"), Ref("a1"), Ints({8}), Ref("a2"), Ref("a3"), Ref("a4"), Ref("a5"),
                         L({B(true), B(true), B(false)})}),
            "(f32[2, 8] strides [8, 1] cuda, f32[8] strides [1] cuda, None)");
  EXPECT_EQ(InferString("aten._native_batch_norm_legit_no_training.default",
                        {F32({2, 3, 4, 4}), F32({3}), F32({3}), F32({3}), F32({3})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), Ref("a3"), Ref("a4"), F(0.1), F(1e-5)}),
            "(f32[2, 3, 4, 4] strides [48, 16, 4, 1] cuda, ?, ?)");
  // bf16 running statistics: the update's dtype is the graph's (f32 from torch's decomposition on
  // CPU, bf16 from CUDA's kernel); f32 ones are checked.
  const auto bf16 = [](std::vector<int64_t> sizes) { return T(v1::DTYPE_BFLOAT16, std::move(sizes)); };
  EXPECT_EQ(InferString("aten._native_batch_norm_legit_functional.default",
                        {bf16({2, 3, 4, 4}), bf16({3}), bf16({3}), bf16({3}), bf16({3})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), Ref("a3"), Ref("a4"), B(true), F(0.1), F(1e-5)}),
            "(bf16[2, 3, 4, 4] strides [48, 16, 4, 1] cuda, f32[3] strides [1] cuda, f32[3] strides [1] cuda, "
            "?dtype[3] strides [1] cuda, ?dtype[3] strides [1] cuda)");
  EXPECT_EQ(InferString("aten._native_batch_norm_legit_functional.default",
                        {F32({2, 3, 4, 4}), F32({3}), F32({3}), F32({3}), F32({3})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), Ref("a3"), Ref("a4"), B(true), F(0.1), F(1e-5)}),
            "(f32[2, 3, 4, 4] strides [48, 16, 4, 1] cuda, f32[3] strides [1] cuda, f32[3] strides [1] cuda, "
            "f32[3] strides [1] cuda, f32[3] strides [1] cuda)");
  EXPECT_EQ(InferString("aten.native_batch_norm_backward.default",
                        {F32({2, 3, 4, 4}), F32({2, 3, 4, 4}), F32({3}), F32({3}), F32({3})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), None(), None(), Ref("a3"), Ref("a4"), B(true), F(1e-5),
                         L({B(true), B(true), B(true)})}),
            // grad_input's strides are not checked: torch's decomposition and CUDA kernel differ.
            "(f32[2, 3, 4, 4] strides [] cuda, f32[3] strides [1] cuda, f32[3] strides [1] cuda)");
  // grad_input unasked: torch's decomposition returns it anyway, so it is not checked.
  EXPECT_EQ(InferString("aten.native_batch_norm_backward.default",
                        {F32({2, 3, 4, 4}), F32({2, 3, 4, 4}), F32({3}), F32({3}), F32({3})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), None(), None(), Ref("a3"), Ref("a4"), B(true), F(1e-5),
                         L({B(false), B(true), B(true)})}),
            "(?, f32[3] strides [1] cuda, f32[3] strides [1] cuda)");
  EXPECT_EQ(InferString("aten._log_softmax_backward_data.default", {F32({4, 10}), F32({4, 10})},
                        {Ref("a0"), Ref("a1"), I(1), Dt(v1::DTYPE_FLOAT32)}),
            "f32[4, 10] strides [10, 1] cuda");
  EXPECT_EQ(InferString("aten.nll_loss_backward.default", {F32({}), F32({4, 10}), T(v1::DTYPE_INT64, {4}), F32({})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), None(), I(1), I(-100), Ref("a3")}),
            "f32[4, 10] strides [10, 1] cuda");
}

TEST(FactoryTest, DTypesAndDevices) {
  EXPECT_EQ(InferString("aten.full.default", {}, {Ints({2, 3}), I(1)}), "i64[2, 3] strides [3, 1] cpu");
  EXPECT_EQ(InferString("aten.full.default", {}, {Ints({2, 3}), F(1.0)}, {{"device", Dev(v1::DEVICE_KIND_CUDA, 3)}}),
            "f32[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.zeros.default", {}, {Ints({4})}, {{"dtype", Dt(v1::DTYPE_BFLOAT16)}}),
            "bf16[4] strides [1] cpu");
  EXPECT_EQ(InferString("aten.arange.start_step", {}, {I(0), I(10), I(3)}), "i64[4] strides [1] cpu");
  EXPECT_EQ(InferString("aten.arange.start_step", {}, {I(0), F(1.0), F(0.25)}), "f32[4] strides [1] cpu");
  EXPECT_EQ(InferString("aten.scalar_tensor.default", {}, {I(0)}), "f32[] strides [] cpu");
}

TEST(SymTest, GetItemAndSymInts) {
  EXPECT_EQ(InferString("operator.getitem", {Tuple({F32({2}), F32({3})})}, {Ref("a0"), I(1)}),
            "f32[3] strides [1] cuda");
  EXPECT_EQ(InferString("operator.getitem", {Tuple({F32({2})})}, {Ref("a0"), I(1)}),
            "error: getitem: index 1 out of range for 1 items");
  EXPECT_EQ(InferString("aten.sym_size.int", {F32({2, 7})}, {Ref("a0"), I(-1)}), "sym 7");
  EXPECT_EQ(InferString("aten.sym_numel.default", {F32({2, 7})}, {Ref("a0")}), "sym 14");
  EXPECT_EQ(InferString("operator.floordiv", {}, {I(7), I(2)}), "sym 3");
}

TEST(PoolTest, Shapes) {
  EXPECT_EQ(InferString("aten.max_pool2d_with_indices.default", {F32({2, 3, 32, 32})}, {Ref("a0"), Ints({3, 3}), Ints({2, 2}), Ints({1, 1})}),
            "(f32[2, 3, 16, 16] strides [768, 256, 16, 1] cuda, i64[2, 3, 16, 16] strides [768, 256, 16, 1] cuda)");
  EXPECT_EQ(InferString("aten.max_pool2d_with_indices.default", {F32({2, 3, 7, 7})}, {Ref("a0"), Ints({2, 2})},
                        {{"ceil_mode", B(true)}}),
            "(f32[2, 3, 4, 4] strides [48, 16, 4, 1] cuda, i64[2, 3, 4, 4] strides [48, 16, 4, 1] cuda)");
  EXPECT_EQ(InferString("aten.avg_pool2d.default", {F32({2, 3, 8, 8}, {192, 1, 24, 3})}, {Ref("a0"), Ints({2})}),
            "f32[2, 3, 4, 4] strides [48, 1, 12, 3] cuda");
  EXPECT_EQ(InferString("aten._adaptive_avg_pool2d.default", {F32({2, 3, 8, 8})}, {Ref("a0"), Ints({1, 1})}),
            "f32[2, 3, 1, 1] strides [3, 1, 1, 1] cuda");
  EXPECT_EQ(InferString("aten.max_pool2d_with_indices.default", {F32({2, 3, 1, 1})}, {Ref("a0"), Ints({3, 3})}),
            "error: pooling: output size 0 is too small");
}

TEST(FunctionalizationTest, ScatterCopies) {
  EXPECT_EQ(InferString("aten.slice_scatter.default", {F32({8, 4}), F32({2, 4})}, {Ref("a0"), Ref("a1"), I(0), I(2), I(4)}),
            "f32[8, 4] strides [4, 1] cuda");
  EXPECT_EQ(InferString("aten.select_scatter.default", {F32({8, 4}), F32({4})}, {Ref("a0"), Ref("a1"), I(0), I(3)}),
            "f32[8, 4] strides [4, 1] cuda");
  EXPECT_EQ(InferString("aten.repeat.default", {F32({2, 3})}, {Ref("a0"), Ints({4, 1, 2})}),
            "f32[4, 2, 6] strides [12, 6, 1] cuda");
  EXPECT_EQ(InferString("aten.triu.default", {F32({3, 3}, {1, 3})}, {Ref("a0"), I(1)}), "f32[3, 3] strides [3, 1] cuda");
}

TEST(CollectiveTest, Shapes) {
  EXPECT_EQ(InferString("_c10d_functional.all_gather_into_tensor.default", {F32({4, 8})}, {Ref("a0"), I(4), S("g")}),
            "f32[16, 8] strides [8, 1] cuda");
  EXPECT_EQ(InferString("_c10d_functional.reduce_scatter_tensor.default", {F32({4, 8})},
                        {Ref("a0"), S("sum"), I(2), S("g")}),
            "f32[2, 8] strides [8, 1] cuda");
}

}  // namespace
}  // namespace kiln::graph
