#include <gtest/gtest.h>

#include "server/graph/infer.h"
#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

const v1::DType kF32 = v1::DTYPE_FLOAT32, kF16 = v1::DTYPE_FLOAT16, kBf16 = v1::DTYPE_BFLOAT16,
                kF64 = v1::DTYPE_FLOAT64, kI32 = v1::DTYPE_INT32, kI64 = v1::DTYPE_INT64, kI8 = v1::DTYPE_INT8,
                kU8 = v1::DTYPE_UINT8, kBool = v1::DTYPE_BOOL;

TEST(PointwiseTest, Broadcasting) {
  EXPECT_EQ(InferString("aten.add.Tensor", {F32({4, 1}), F32({8})}, {Ref("a0"), Ref("a1")}),
            "f32[4, 8] strides [8, 1] cuda");
  EXPECT_EQ(InferString("aten.mul.Tensor", {F32({2, 1, 3}), F32({5, 1})}, {Ref("a0"), Ref("a1")}),
            "f32[2, 5, 3] strides [15, 3, 1] cuda");
  EXPECT_EQ(InferString("aten.add.Tensor", {F32({4, 3}), F32({4, 2})}, {Ref("a0"), Ref("a1")}),
            "error: shapes [4, 3] and [4, 2] cannot be broadcast");
}

TEST(PointwiseTest, TypePromotion) {
  auto bin = [](v1::DType a, v1::DType b, std::vector<int64_t> sb = {4}) {
    return InferString("aten.add.Tensor", {T(a, {4}), T(b, sb)}, {Ref("a0"), Ref("a1")});
  };
  EXPECT_EQ(bin(kI64, kI32), "i64[4] strides [1] cuda");
  EXPECT_EQ(bin(kU8, kI8), "i16[4] strides [1] cuda");
  EXPECT_EQ(bin(kF16, kBf16), "f32[4] strides [1] cuda");
  EXPECT_EQ(bin(kBool, kBool), "b8[4] strides [1] cuda");
  EXPECT_EQ(bin(kF16, kF32), "f32[4] strides [1] cuda");
  // A zero-dim tensor of the same category does not promote; of a higher category it does.
  EXPECT_EQ(bin(kF16, kF32, {}), "f16[4] strides [1] cuda");
  EXPECT_EQ(bin(kI32, kF64, {}), "f64[4] strides [1] cuda");
  // Wrapped Python numbers: a float makes an int tensor float32, never float64.
  EXPECT_EQ(InferString("aten.mul.Tensor", {T(kI32, {4})}, {Ref("a0"), F(2.5)}), "f32[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.mul.Tensor", {T(kBf16, {4})}, {Ref("a0"), F(2.5)}), "bf16[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.add.Scalar", {T(kU8, {4})}, {Ref("a0"), I(300)}), "u8[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.add.Tensor", {T(kBool, {4})}, {Ref("a0"), I(1)}), "i64[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.pow.Scalar", {T(kI32, {4})}, {I(2), Ref("a0")}), "i32[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.pow.Tensor_Scalar", {T(kI32, {4})}, {Ref("a0"), F(0.5)}), "f32[4] strides [1] cuda");
  EXPECT_EQ(bin(v1::DTYPE_UINT16, kI32), "error: cannot promote u16 and i32");
}

TEST(PointwiseTest, DivisionAndFloatOps) {
  EXPECT_EQ(InferString("aten.div.Tensor", {T(kI64, {4}), T(kI64, {4})}, {Ref("a0"), Ref("a1")}),
            "f32[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.div.Tensor_mode", {T(kI64, {4}), T(kI64, {4})}, {Ref("a0"), Ref("a1")},
                        {{"rounding_mode", S("floor")}}),
            "i64[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.div.Tensor_mode", {T(kI64, {4}), T(kI64, {4})}, {Ref("a0"), Ref("a1")},
                        {{"rounding_mode", S("round")}}),
            "error: div expected rounding_mode to be one of None, 'trunc', or 'floor' but found 'round'");
  EXPECT_EQ(InferString("aten.sqrt.default", {T(kI32, {3})}, {Ref("a0")}), "f32[3] strides [1] cuda");
  EXPECT_EQ(InferString("aten.neg.default", {T(kI32, {3})}, {Ref("a0")}), "i32[3] strides [1] cuda");
  EXPECT_EQ(InferString("aten.abs.default", {T(v1::DTYPE_COMPLEX64, {3})}, {Ref("a0")}), "f32[3] strides [1] cuda");
  EXPECT_EQ(InferString("aten.gelu.default", {F32({3})}, {Ref("a0")}, {{"approximate", S("tanh")}}),
            "f32[3] strides [1] cuda");
  EXPECT_EQ(InferString("aten.gelu.default", {F32({3})}, {Ref("a0")}, {{"approximate", S("fast")}}),
            "error: approximate must be 'none' or 'tanh', got 'fast'");
  EXPECT_EQ(InferString("aten.sigmoid_backward.default", {F32({2, 3}), F32({2, 3})}, {Ref("a0"), Ref("a1")}),
            "f32[2, 3] strides [3, 1] cuda");
}

TEST(PointwiseTest, ComparisonsLogicalAndBitwise) {
  EXPECT_EQ(InferString("aten.lt.Scalar", {F32({2})}, {Ref("a0"), F(0.0)}), "b8[2] strides [1] cuda");
  EXPECT_EQ(InferString("aten.eq.Tensor", {T(kI64, {2, 1}), F32({3})}, {Ref("a0"), Ref("a1")}),
            "b8[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.logical_and.default", {F32({2}), T(kI32, {2})}, {Ref("a0"), Ref("a1")}),
            "b8[2] strides [1] cuda");
  EXPECT_EQ(InferString("aten.isnan.default", {F32({2})}, {Ref("a0")}), "b8[2] strides [1] cuda");
  EXPECT_EQ(InferString("aten.bitwise_and.Tensor", {T(kI32, {2}), T(kU8, {2})}, {Ref("a0"), Ref("a1")}),
            "i32[2] strides [1] cuda");
  EXPECT_EQ(InferString("aten.bitwise_or.Tensor", {F32({2}), F32({2})}, {Ref("a0"), Ref("a1")}),
            "error: bitwise ops need integral or bool tensors, got f32");
}

TEST(PointwiseTest, TernaryAndSelection) {
  EXPECT_EQ(InferString("aten.where.self", {T(kBool, {4, 1}), T(kF16, {4, 8}), F32({})},
                        {Ref("a0"), Ref("a1"), Ref("a2")}),
            "f16[4, 8] strides [8, 1] cuda");
  EXPECT_EQ(InferString("aten.masked_fill.Scalar", {T(kF16, {4, 8}), T(kBool, {8})}, {Ref("a0"), Ref("a1"), F(-1e9)}),
            "f16[4, 8] strides [8, 1] cuda");
  EXPECT_EQ(InferString("aten.clamp.default", {T(kI32, {4})}, {Ref("a0")}, {{"min", F(0.5)}}), "f32[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.addcmul.default", {F32({4}), F32({4}), F32({4})}, {Ref("a0"), Ref("a1"), Ref("a2")},
                        {{"value", F(0.5)}}),
            "f32[4] strides [1] cuda");
  EXPECT_EQ(InferString("aten.lerp.Scalar", {T(kBf16, {4}), T(kBf16, {4})}, {Ref("a0"), Ref("a1"), F(0.1)}),
            "bf16[4] strides [1] cuda");
}

TEST(PointwiseTest, OutputStridesFollowInputs) {
  // Both transposed: the result keeps the transposed layout (same-shape fast path).
  EXPECT_EQ(InferString("aten.add.Tensor", {F32({8, 4}, {1, 8}), F32({8, 4}, {1, 8})}, {Ref("a0"), Ref("a1")}),
            "f32[8, 4] strides [1, 8] cuda");
  // Mixed layouts: TensorIterator follows the first operand.
  EXPECT_EQ(InferString("aten.add.Tensor", {F32({8, 4}, {1, 8}), F32({8, 4})}, {Ref("a0"), Ref("a1")}),
            "f32[8, 4] strides [1, 8] cuda");
  // Channels-last stays channels-last.
  EXPECT_EQ(InferString("aten.relu.default", {F32({2, 3, 4, 5}, {60, 1, 15, 3})}, {Ref("a0")}),
            "f32[2, 3, 4, 5] strides [60, 1, 15, 3] cuda");
  // A broadcast bias added to a channels-last activation.
  EXPECT_EQ(InferString("aten.add.Tensor", {F32({2, 3, 4, 5}, {60, 1, 15, 3}), F32({3, 1, 1})}, {Ref("a0"), Ref("a1")}),
            "f32[2, 3, 4, 5] strides [60, 1, 15, 3] cuda");
}

TEST(PointwiseTest, CastsAndCopies) {
  EXPECT_EQ(InferString("aten._to_copy.default", {F32({2, 3})}, {Ref("a0")}, {{"dtype", Dt(kF16)}}),
            "f16[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten._to_copy.default", {F32({2, 3})}, {Ref("a0")}, {{"device", Dev(v1::DEVICE_KIND_CPU, -1)}}),
            "f32[2, 3] strides [3, 1] cpu");
  EXPECT_EQ(InferString("prims.convert_element_type.default", {F32({3, 2}, {1, 3})}, {Ref("a0"), Dt(kBf16)}),
            "bf16[3, 2] strides [1, 3] cuda");
  EXPECT_EQ(InferString("aten.clone.default", {F32({2, 3, 4, 5})}, {Ref("a0")},
                        {{"memory_format", Mf(v1::MEMORY_FORMAT_CHANNELS_LAST)}}),
            "f32[2, 3, 4, 5] strides [60, 1, 15, 3] cuda");
  EXPECT_EQ(InferString("aten.clone.default", {F32({3, 2}, {1, 3})}, {Ref("a0")}), "f32[3, 2] strides [1, 3] cuda");
  // A non-dense input (a strided slice) clones contiguous.
  EXPECT_EQ(InferString("aten.clone.default", {F32({3, 2}, {4, 1})}, {Ref("a0")}), "f32[3, 2] strides [2, 1] cuda");
  EXPECT_EQ(InferString("aten.native_dropout.default", {F32({4})}, {Ref("a0"), F(0.1), B(true)}),
            "(f32[4] strides [1] cuda, b8[4] strides [1] cuda)");
  EXPECT_EQ(InferString("aten.zeros_like.default", {F32({4})}, {Ref("a0")}, {{"dtype", Dt(kI64)}}),
            "i64[4] strides [1] cuda");
}

TEST(PromoteTypesTest, Table) {
  EXPECT_EQ(PromoteTypes(kI8, kU8), v1::DTYPE_INT16);
  EXPECT_EQ(PromoteTypes(kI64, kF16), kF16);
  EXPECT_EQ(PromoteTypes(kF64, v1::DTYPE_COMPLEX64), v1::DTYPE_COMPLEX128);
  EXPECT_EQ(PromoteTypes(kBool, kU8), kU8);
  EXPECT_EQ(PromoteTypes(v1::DTYPE_FLOAT8_E4M3FN, kF32), v1::DTYPE_UNSPECIFIED);
}

TEST(PointwiseTest, MseLossAndItsBackward) {
  // Mean (the default) and sum: 0-d; none: the operands' shape; the dtype promotes.
  EXPECT_EQ(InferString("aten.mse_loss.default", {F32({4, 6}), F32({4, 6})}, {Ref("a0"), Ref("a1")}),
            "f32[] strides [] cuda");
  EXPECT_EQ(InferString("aten.mse_loss.default", {T(kBf16, {4, 6}), F32({4, 6})}, {Ref("a0"), Ref("a1"), I(2)}),
            "f32[] strides [] cuda");
  EXPECT_EQ(InferString("aten.mse_loss.default", {F32({4, 6}), F32({4, 6})}, {Ref("a0"), Ref("a1"), I(0)}),
            "f32[4, 6] strides [6, 1] cuda");
  EXPECT_EQ(InferString("aten.mse_loss.default", {F32({4, 6}), F32({4, 6})}, {Ref("a0"), Ref("a1"), I(3)}),
            "error: mse_loss: reduction must be 0 (none), 1 (mean) or 2 (sum), got 3");
  EXPECT_EQ(InferString("aten.mse_loss_backward.default", {F32({}), F32({4, 6}), F32({4, 6})},
                        {Ref("a0"), Ref("a1"), Ref("a2"), I(1)}),
            "f32[4, 6] strides [6, 1] cuda");
}

}  // namespace
}  // namespace kiln::graph
