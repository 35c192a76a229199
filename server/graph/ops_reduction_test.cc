#include <gtest/gtest.h>

#include "server/graph/test_graphs.h"

namespace kiln::graph {
namespace {

using namespace ::kiln::graph::testing;  // NOLINT

TEST(ReductionTest, SumDims) {
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8, 16})}, {Ref("a0"), Ints({1})}),
            "f32[4, 16] strides [16, 1] cuda");
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8, 16})}, {Ref("a0"), Ints({-1, 0}), B(true)}),
            "f32[1, 8, 1] strides [8, 1, 1] cuda");
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8})}, {Ref("a0"), Ints({})}), "f32[] strides [] cuda");
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8})}, {Ref("a0"), None()}), "f32[] strides [] cuda");
  EXPECT_EQ(InferString("aten.sum.default", {T(v1::DTYPE_BOOL, {4})}, {Ref("a0")}), "i64[] strides [] cuda");
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {T(v1::DTYPE_FLOAT16, {4, 2})}, {Ref("a0"), Ints({0})},
                        {{"dtype", Dt(v1::DTYPE_FLOAT32)}}),
            "f32[2] strides [1] cuda");
  // A permuted input still reduces into a contiguous output.
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8, 16}, {1, 64, 4})}, {Ref("a0"), Ints({1})}),
            "f32[4, 16] strides [16, 1] cuda");
}

TEST(ReductionTest, Errors) {
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8})}, {Ref("a0"), Ints({2})}),
            "error: dimension out of range (expected to be in range of [-2, 1], but got 2)");
  EXPECT_EQ(InferString("aten.sum.dim_IntList", {F32({4, 8})}, {Ref("a0"), Ints({1, -1})}),
            "error: dim 1 appears multiple times");
  EXPECT_EQ(InferString("aten.mean.dim", {T(v1::DTYPE_INT64, {4})}, {Ref("a0"), Ints({0})}),
            "error: mean(): could not infer output dtype. Input dtype must be either a floating point or complex "
            "dtype. Got: i64");
}

TEST(ReductionTest, Scans) {
  EXPECT_EQ(InferString("aten.cumsum.default", {T(v1::DTYPE_INT32, {2, 3})}, {Ref("a0"), I(1)}),
            "i64[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.cumsum.default", {F32({2, 3}, {1, 2})}, {Ref("a0"), I(0)}), "f32[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten.native_group_norm.default", {F32({2, 4, 3, 3})},
                        {Ref("a0"), None(), None(), I(2), I(4), I(9), I(2), F(1e-5)}),
            "(f32[2, 4, 3, 3] strides [36, 9, 3, 1] cuda, f32[2, 2] strides [2, 1] cuda, f32[2, 2] strides [2, 1] cuda)");
}

TEST(ReductionTest, Others) {
  EXPECT_EQ(InferString("aten.mean.dim", {F32({2, 3, 4, 4})}, {Ref("a0"), Ints({-1, -2}), B(true)}),
            "f32[2, 3, 1, 1] strides [3, 1, 1, 1] cuda");
  EXPECT_EQ(InferString("aten.amax.default", {T(v1::DTYPE_BFLOAT16, {2, 3})}, {Ref("a0")}), "bf16[] strides [] cuda");
  EXPECT_EQ(InferString("aten.var_mean.correction", {F32({2, 3})}, {Ref("a0"), Ints({1})},
                        {{"correction", I(0)}, {"keepdim", B(true)}}),
            "(f32[2, 1] strides [1, 1] cuda, f32[2, 1] strides [1, 1] cuda)");
  EXPECT_EQ(InferString("aten.var.correction", {T(v1::DTYPE_COMPLEX64, {2, 3})}, {Ref("a0")}), "f32[] strides [] cuda");
  EXPECT_EQ(InferString("aten.argmax.default", {F32({2, 3})}, {Ref("a0")}), "i64[] strides [] cuda");
  EXPECT_EQ(InferString("aten.argmax.default", {F32({2, 3})}, {Ref("a0"), I(1), B(true)}),
            "i64[2, 1] strides [1, 1] cuda");
  EXPECT_EQ(InferString("aten.max.dim", {T(v1::DTYPE_FLOAT16, {2, 3})}, {Ref("a0"), I(0)}),
            "(f16[3] strides [1] cuda, i64[3] strides [1] cuda)");
  EXPECT_EQ(InferString("aten.any.dim", {T(v1::DTYPE_UINT8, {2, 3})}, {Ref("a0"), I(0)}), "u8[3] strides [1] cuda");
  EXPECT_EQ(InferString("aten.all.default", {F32({2, 3})}, {Ref("a0")}), "b8[] strides [] cuda");
  EXPECT_EQ(InferString("aten.prod.dim_int", {T(v1::DTYPE_INT32, {2, 3})}, {Ref("a0"), I(1)}), "i64[2] strides [1] cuda");
  EXPECT_EQ(InferString("aten._softmax.default", {T(v1::DTYPE_FLOAT16, {2, 3})}, {Ref("a0"), I(-1), B(true)}),
            "f32[2, 3] strides [3, 1] cuda");
  EXPECT_EQ(InferString("aten._softmax.default", {F32({2, 3})}, {Ref("a0"), I(-1), B(true)}),
            "error: conversion is supported for Half/BFloat16 type only");
}

}  // namespace
}  // namespace kiln::graph
