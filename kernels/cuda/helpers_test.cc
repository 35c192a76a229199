// The CUDA helper headers compiled for the host (KILN_DEV = inline): conversions are bit-identical
// to kernels/cpu, merges agree with sequential folds, and the embedded prelude holds every header.
// The device build of the same headers is checked by //server/codegen:cuda_nvrtc_test.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/kiln_reduce.h"
#include "kernels/cuda/embedded_headers.h"
#include "kernels/cuda/kiln_cuda_reduce.cuh"
#include "kernels/cuda/kiln_cuda_vec.cuh"

namespace {

TEST(CudaHelpers, HalfConversionsMatchTheCpuHelpersBitForBit) {
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) {
    float f;
    const uint32_t w = static_cast<uint32_t>(u);
    std::memcpy(&f, &w, 4);
    ASSERT_EQ(kiln_cuda::f32_to_bf16(f), kiln_cpu::f32_to_bf16(f)) << std::hex << w;
    ASSERT_EQ(kiln_cuda::f32_to_f16(f), kiln_cpu::f32_to_f16(f)) << std::hex << w;
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float a = kiln_cuda::f16_to_f32(static_cast<uint16_t>(h));
    const float b = kiln_cpu::f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << h;
    const float c = kiln_cuda::bf16_to_f32(static_cast<uint16_t>(h));
    const float d = kiln_cpu::bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::memcmp(&c, &d, 4), 0) << h;
  }
  EXPECT_EQ(kiln_cuda::f32_to_bf16(1.00390625f), 0x3f80);  // tie to even
  EXPECT_EQ(kiln_cuda::f32_to_f16(65520.0f), 0x7c00);      // rounds to inf
}

TEST(CudaHelpers, MathFollowsTorch) {
  EXPECT_TRUE(std::isnan(kiln_cuda::maximum(1.0f, kiln_cuda::nan<float>())));
  EXPECT_TRUE(std::isnan(kiln_cuda::minimum(kiln_cuda::nan<float>(), 1.0f)));
  EXPECT_EQ(kiln_cuda::div_floor<int32_t>(-7, 2), -4);
  EXPECT_EQ(kiln_cuda::remainder<int32_t>(-7, 2), 1);
  EXPECT_EQ(kiln_cuda::div_trunc<int32_t>(5, 0), 0);
  EXPECT_EQ(kiln_cuda::div_trunc<int64_t>(kiln_cuda::int_traits<int64_t>::lowest(), -1),
            kiln_cuda::int_traits<int64_t>::lowest());
  EXPECT_EQ(kiln_cuda::div_floor<float>(-7.0f, 2.0f), -4.0f);
  EXPECT_EQ(kiln_cuda::remainder<float>(-7.0f, 2.0f), 1.0f);
  EXPECT_EQ(kiln_cuda::nearbyint(2.5f), 2.0f);
  EXPECT_EQ(kiln_cuda::float_to_int<int8_t>(300.0f), static_cast<int8_t>(44));
  EXPECT_EQ(kiln_cuda::float_to_int<int64_t>(kiln_cuda::nan<double>()),
            kiln_cuda::int_traits<int64_t>::lowest());
  EXPECT_EQ(kiln_cuda::pow<int32_t>(3, 4), 81);
  EXPECT_EQ(kiln_cuda::shift_right<int32_t>(-8, 40), -1);
  EXPECT_EQ(kiln_cuda::lowest<float>(), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(kiln_cuda::highest<int8_t>(), 127);
}

TEST(CudaHelpers, WelfordMergeOfInterleavedPartsMatchesSequential) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(3.0f, 2.0f);
  std::vector<float> x(1000);
  for (float& v : x) v = dist(rng);
  kiln_cpu::Welford<float> seq;
  for (float v : x) seq.Update(v);
  seq.Flush();
  for (int parts : {1, 3, 32, 256}) {
    kiln_cuda::Welford<float> total;
    for (int p = 0; p < parts; ++p) {
      kiln_cuda::Welford<float> part;
      for (size_t i = p; i < x.size(); i += parts) part.Update(x[i]);
      total.Merge(part);
    }
    EXPECT_NEAR(total.mean, seq.mean, 1e-4) << parts;
    EXPECT_NEAR(total.m2 / total.count, seq.m2 / seq.count, 1e-3) << parts;
    EXPECT_EQ(total.count, 1000.0f);
  }
}

TEST(CudaHelpers, OnlineSoftmaxMergeMatchesSequentialAndPropagatesNan) {
  std::vector<float> x = {1, 5, -2, 7, 7, 0.5f, -kiln_cuda::inf<float>(), 3};
  kiln_cpu::OnlineSoftmax<float> seq;
  for (float v : x) seq.Update(v);
  for (int parts : {1, 2, 3, 8, 32}) {
    kiln_cuda::OnlineSoftmax<float> total;
    for (int p = 0; p < parts; ++p) {
      kiln_cuda::OnlineSoftmax<float> part;
      for (size_t i = p; i < x.size(); i += parts) part.Update(x[i]);
      total.Merge(part);
    }
    EXPECT_EQ(total.max, seq.max) << parts;
    EXPECT_NEAR(total.sum, seq.sum, 1e-5) << parts;
  }
  kiln_cuda::OnlineSoftmax<float> a, b;
  a.Update(1.0f);
  b.Update(kiln_cuda::nan<float>());
  a.Merge(b);
  EXPECT_TRUE(std::isnan(a.max) && std::isnan(a.sum));
  // One +inf: its term is exp(inf - inf) = NaN in torch, also when it is a new maximum.
  kiln_cuda::OnlineSoftmax<float> c;
  for (float v : {1.0f, kiln_cuda::inf<float>(), 2.0f}) c.Update(v);
  EXPECT_EQ(c.max, kiln_cuda::inf<float>());
  EXPECT_TRUE(std::isnan(c.sum));
}

TEST(CudaHelpers, ArgMaxMergeKeepsTorchsTieAndNanRules) {
  const std::vector<float> x = {1, 9, 3, 9, 2, 9};
  for (int parts : {1, 2, 4, 32}) {
    kiln_cuda::ArgMax<float> total;
    kiln_cuda::ArgMin<float> total_min;
    for (int p = 0; p < parts; ++p) {
      kiln_cuda::ArgMax<float> part;
      kiln_cuda::ArgMin<float> part_min;
      for (size_t i = p; i < x.size(); i += parts) {
        part.Update(x[i], static_cast<int64_t>(i));
        part_min.Update(x[i], static_cast<int64_t>(i));
      }
      total.Merge(part);
      total_min.Merge(part_min);
    }
    EXPECT_EQ(total.index, 1) << parts;
    EXPECT_EQ(total_min.index, 0) << parts;
  }
  kiln_cuda::ArgMax<float> a, b, c;
  a.Update(5.0f, 0);
  b.Update(kiln_cuda::nan<float>(), 7);
  c.Update(kiln_cuda::nan<float>(), 3);
  a.Merge(b);
  a.Merge(c);
  EXPECT_EQ(a.index, 3);
}

TEST(CudaHelpers, VecIsAlignedToItsSize) {
  EXPECT_EQ(alignof(kiln_cuda::Vec<float, 4>), 16u);
  EXPECT_EQ(alignof(kiln_cuda::Vec<uint16_t, 8>), 16u);
  EXPECT_EQ(sizeof(kiln_cuda::Vec<uint16_t, 2>), 4u);
  alignas(16) float data[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(kiln_cuda::aligned(data, 16));
  EXPECT_FALSE(kiln_cuda::aligned(data + 1, 16));
  const kiln_cuda::Vec<float, 4> v = kiln_cuda::load_vec<4>(data + 4);
  EXPECT_EQ(v.v[3], 7.0f);
}

TEST(CudaHelpers, MaxNanHalfIsTheLargestLaneOrNan) {
  kiln_cuda::Vec<uint16_t, 8> v;
  const float values[8] = {-3.0f, 0.5f, -0.0f, 7.25f, -100.0f, 2.0f, 7.0f, 1.0f};
  for (int i = 0; i < 8; ++i) v.v[i] = kiln_cuda::f32_to_bf16(values[i]);
  EXPECT_EQ((kiln_cuda::max_nan_half<true, 8>(v)), 7.25f);
  EXPECT_EQ((kiln_cuda::bf16_lane<0, 8>(v)), -3.0f);
  EXPECT_EQ((kiln_cuda::bf16_lane<3, 8>(v)), 7.25f);
  EXPECT_EQ((kiln_cuda::bf16_lane<7, 8>(v)), 1.0f);
  v.v[5] = kiln_cuda::f32_to_bf16(std::nanf(""));
  EXPECT_TRUE(std::isnan(kiln_cuda::max_nan_half<true, 8>(v)));
  kiln_cuda::Vec<uint16_t, 4> h;
  for (int i = 0; i < 4; ++i) h.v[i] = kiln_cuda::f32_to_f16(-values[i]);
  EXPECT_EQ((kiln_cuda::max_nan_half<false, 4>(h)), 3.0f);
}

// Every offset of every width: the elements of a then b from `off`, bit for bit.
template <typename T, int N> void ExpectWindows() {
  kiln_cuda::Vec<T, N> a, b;
  for (int i = 0; i < N; ++i) {
    a.v[i] = static_cast<T>(0x1234 + 3 * i);
    b.v[i] = static_cast<T>(0x5678 + 5 * i);
  }
  for (int off = 0; off < N; ++off) {
    const kiln_cuda::Vec<T, N> w = kiln_cuda::window(a, b, off);
    for (int i = 0; i < N; ++i) {
      const T want = off + i < N ? a.v[off + i] : b.v[off + i - N];
      EXPECT_EQ(w.v[i], want) << sizeof(T) << "-byte x " << N << ", off " << off << ", lane " << i;
    }
  }
}

TEST(CudaHelpers, WindowIsTheVectorAtAnyOffsetOfTwo) {
  ExpectWindows<uint16_t, 8>();
  ExpectWindows<uint16_t, 4>();
  ExpectWindows<uint16_t, 2>();
  ExpectWindows<float, 4>();
  ExpectWindows<double, 2>();
  ExpectWindows<uint8_t, 8>();
  ExpectWindows<int64_t, 1>();
}

TEST(CudaHelpers, PreludeHoldsEveryHeaderWithoutIncludes) {
  const std::string prelude = kiln::kernels::CudaPrelude();
  for (const char* h : {"kiln_cuda_half.cuh", "kiln_cuda_math.cuh", "kiln_cuda_reduce.cuh",
                        "kiln_cuda_vec.cuh"}) {
    EXPECT_NE(prelude.find(h), std::string::npos) << h;
  }
  EXPECT_EQ(prelude.find("#include \""), std::string::npos);
  EXPECT_NE(prelude.find("warp_allreduce"), std::string::npos);
}

}  // namespace
