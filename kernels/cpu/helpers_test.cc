#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/embedded_headers.h"
#include "kernels/cpu/kiln_half.h"
#include "kernels/cpu/kiln_math.h"
#include "kernels/cpu/kiln_reduce.h"

namespace kiln_cpu {
namespace {

TEST(HalfTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), h) << h;
  }
}

TEST(HalfTest, F16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(round_f16(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(round_f16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(round_f16(65520.0f), INFINITY);
  EXPECT_EQ(round_f16(65519.0f), 65504.0f);
  EXPECT_EQ(round_f16(0x1p-25f), 0.0f);               // tie to even (0)
  EXPECT_EQ(round_f16(0x1.8p-25f), 0x1p-24f);
  EXPECT_EQ(round_f16(3 * 0x1p-25f), 2 * 0x1p-24f);    // 1.5 ulp -> 2 (even)
  EXPECT_EQ(round_bf16(3.4e38f), INFINITY);
}

TEST(MathTest, IntegerDivisionFollowsPython) {
  EXPECT_EQ(div_floor<int64_t>(-7, 2), -4);
  EXPECT_EQ(div_floor<int64_t>(7, -2), -4);
  EXPECT_EQ(div_trunc<int64_t>(-7, 2), -3);
  EXPECT_EQ(remainder<int64_t>(-7, 2), 1);
  EXPECT_EQ(remainder<int64_t>(7, -2), -1);
  EXPECT_EQ(fmod<int64_t>(-7, 2), -1);
  EXPECT_EQ(div_floor<int32_t>(5, 0), 0);
  EXPECT_EQ(div_trunc<int32_t>(INT32_MIN, -1), INT32_MIN);
  EXPECT_EQ(remainder<int8_t>(-128, -1), 0);
}

TEST(MathTest, FloatDivisionFollowsTorch) {
  EXPECT_EQ(div_floor<float>(-7.0f, 2.0f), -4.0f);
  EXPECT_EQ(remainder<float>(-7.0f, 2.0f), 1.0f);
  EXPECT_EQ(remainder<double>(5.5, -2.0), -0.5);
  EXPECT_TRUE(std::isinf(div_floor<float>(1.0f, 0.0f)));
  EXPECT_TRUE(std::signbit(div_floor<double>(-0.0, 3.0)));
}

TEST(MathTest, MaxMinPropagateNan) {
  EXPECT_TRUE(std::isnan(maximum<float>(NAN, 1.0f)));
  EXPECT_TRUE(std::isnan(maximum<float>(1.0f, NAN)));
  EXPECT_TRUE(std::isnan(minimum<double>(NAN, 1.0)));
  EXPECT_TRUE(std::isnan(relu<float>(NAN)));
  EXPECT_EQ(relu<float>(-2.0f), 0.0f);
  EXPECT_EQ(sign<float>(NAN), 0.0f);
}

TEST(MathTest, VectorizableExpIsAccurate) {
  // 200k points over [-110, 89]: within 1 ulp of the exact result in the normal range (an
  // exhaustive sweep over every float in [-87, 88.7] measured 0.992 ulp at worst).
  double worst = 0;
  const int kPoints = 200000;
  for (int i = 0; i <= kPoints; ++i) {
    const float x = -110.0f + 199.0f * static_cast<float>(i) / kPoints;
    const double want = std::exp(static_cast<double>(x));
    const float got = kiln_cpu::exp(x);
    const float wantf = static_cast<float>(want);
    if (wantf < 1.1754944e-38f || std::isinf(wantf)) {  // subnormal, zero or overflow
      ASSERT_TRUE(got == wantf || std::fabs(got - wantf) <= 3e-45) << x << " " << got;
      continue;
    }
    const double ulp = std::nextafter(wantf, INFINITY) - wantf;
    worst = std::max(worst, std::fabs(got - want) / ulp);
    ASSERT_LE(std::fabs(got - want) / ulp, 1.0) << x;
  }
  EXPECT_LT(worst, 1.0);
  EXPECT_EQ(kiln_cpu::exp(-INFINITY), 0.0f);
  EXPECT_EQ(kiln_cpu::exp(INFINITY), INFINITY);
  EXPECT_EQ(kiln_cpu::exp(89.0f), INFINITY);
  EXPECT_TRUE(std::isnan(kiln_cpu::exp(NAN)));
  EXPECT_EQ(kiln_cpu::exp(0.0f), 1.0f);
  EXPECT_EQ(kiln_cpu::exp(-120.0f), 0.0f);
}

TEST(MathTest, VectorizableErfIsAccurate) {
  // 400k points over [-5, 5] and small magnitudes: within 1.5 ulp of the exact result (an
  // exhaustive sweep over every float measured 1.016 ulp at worst).
  const int kPoints = 400000;
  for (int i = 0; i <= kPoints; ++i) {
    for (const float x : {-5.0f + 10.0f * static_cast<float>(i) / kPoints,
                          std::ldexp(1.0f + static_cast<float>(i) / kPoints, -(i % 130))}) {
      const double want = std::erf(static_cast<double>(x));
      const float wantf = static_cast<float>(want);
      const double ulp = std::nextafter(std::fabs(wantf), INFINITY) - std::fabs(wantf);
      ASSERT_LE(std::fabs(kiln_cpu::erf(x) - want) / ulp, 1.5) << x;
    }
  }
  EXPECT_EQ(kiln_cpu::erf(INFINITY), 1.0f);
  EXPECT_EQ(kiln_cpu::erf(-INFINITY), -1.0f);
  EXPECT_EQ(kiln_cpu::erf(6.0f), 1.0f);
  EXPECT_TRUE(std::signbit(kiln_cpu::erf(-0.0f)));
  EXPECT_TRUE(std::isnan(kiln_cpu::erf(NAN)));
}

TEST(MathTest, CastsAndPow) {
  EXPECT_EQ(float_to_int<int64_t>(NAN), INT64_MIN);
  EXPECT_EQ(float_to_int<int32_t>(-2.7f), -2);
  EXPECT_EQ(float_to_int<uint8_t>(-1.0f), 255);
  EXPECT_EQ(float_to_int<uint8_t>(300.0f), 44);
  EXPECT_EQ(float_to_int<int32_t>(NAN), INT32_MIN);
  EXPECT_EQ(float_to_int<int32_t>(3e9f), INT32_MIN);
  EXPECT_EQ(float_to_int<int8_t>(NAN), 0);
  EXPECT_EQ(float_to_int<int64_t>(-1e19), INT64_MIN);
  EXPECT_EQ(float_to_int<int64_t>(-2.9), -2);
  EXPECT_EQ(pow<int64_t>(3, 4), 81);
  EXPECT_EQ(pow<int64_t>(2, -1), 0);
  EXPECT_EQ(pow<int64_t>(-1, -3), -1);
  EXPECT_EQ(shift_left<int32_t>(1, 40), 0);
  EXPECT_EQ(shift_right<int32_t>(-8, 40), -1);
}

TEST(ReduceTest, ArgMaxTakesFirstExtremeAndNan) {
  ArgMax<float> a;
  const float ws[] = {1.0f, 3.0f, 3.0f, 2.0f};
  for (int i = 0; i < 4; ++i) a.Update(ws[i], i);
  EXPECT_EQ(a.index, 1);
  ArgMax<float> b;
  const float xs[] = {1.0f, 3.0f, NAN, 5.0f, NAN};
  for (int i = 0; i < 5; ++i) b.Update(xs[i], i);
  EXPECT_EQ(b.index, 2);
  ArgMin<int32_t> c;
  const int32_t ys[] = {4, -1, 7, -1};
  for (int i = 0; i < 4; ++i) c.Update(ys[i], i);
  EXPECT_EQ(c.index, 1);
}

TEST(ReduceTest, WelfordAndOnlineSoftmax) {
  Welford<double> w;
  for (double x : {1.0, 2.0, 3.0, 4.0}) w.Update(x);
  w.Flush();
  EXPECT_DOUBLE_EQ(w.mean, 2.5);
  EXPECT_DOUBLE_EQ(w.m2, 5.0);
  EXPECT_DOUBLE_EQ(w.count, 4.0);
  OnlineSoftmax<double> s;
  for (double x : {-HUGE_VAL, 1.0, 2.0}) s.Update(x);
  EXPECT_DOUBLE_EQ(s.max, 2.0);
  EXPECT_NEAR(s.sum, std::exp(-1.0) + 1.0, 1e-15);
  OnlineSoftmax<float> n;
  for (float x : {1.0f, NAN, 2.0f}) n.Update(x);
  EXPECT_TRUE(std::isnan(n.sum));
  // One +inf: torch's sum holds exp(inf - inf) = NaN (softmax is NaN over the row).
  OnlineSoftmax<float> i;
  for (float x : {1.0f, INFINITY, 2.0f}) i.Update(x);
  EXPECT_EQ(i.max, INFINITY);
  EXPECT_TRUE(std::isnan(i.sum));
  OnlineSoftmaxLanes<float, 2> il;
  for (float x : {1.0f, INFINITY, 2.0f}) il.Update(0, x);
  il.Update(1, 3.0f);
  OnlineSoftmax<float> ic;
  il.CombineInto(ic);
  EXPECT_TRUE(std::isnan(ic.sum));
}

// Batch-norm statistics of a long row in float (ResNet's N*H*W per channel): a plain sequential
// Welford update rounds the running mean once per element (error ~n * eps, ~2e-6 of the std at
// n = 8192, mean 3 std 1); the blocked cascade keeps it at a few ulps, as two-pass / pairwise does.
TEST(ReduceTest, FloatWelfordStaysAccurateOverLongRows) {
  for (int n : {512, 8192, 100000}) {
    uint64_t state = 42;
    auto uniform = [&state]() {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<double>(state >> 11) / 9007199254740992.0;
    };
    double worst_mean = 0, worst_var = 0;
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> xs(n);
      for (float& x : xs) {  // mean 3, std ~1 (a sum of uniforms)
        double u = 0;
        for (int k = 0; k < 12; ++k) u += uniform();
        x = static_cast<float>(3.0 + (u - 6.0));
      }
      double mean = 0;
      for (float x : xs) mean += x;
      mean /= n;
      double var = 0;
      for (float x : xs) var += (x - mean) * (x - mean);
      var /= n;
      Welford<float> w;
      for (float x : xs) w.Update(x);
      w.Flush();
      ASSERT_EQ(w.count, static_cast<float>(n));
      worst_mean = std::max(worst_mean, std::abs(w.mean - mean) / std::sqrt(var));
      worst_var = std::max(worst_var, std::abs(w.m2 / w.count - var) / var);
    }
    // The sequential update: mean 1.1e-6 / 3.4e-6 / 3.2e-5, variance 6.3e-7 / 1.8e-6 / 2.8e-5
    // (n = 512 / 8192 / 100000); the cascade: at most 6.3e-7 and 3.1e-7 (the mean's own ulp is 2.4e-7).
    EXPECT_LT(worst_mean, 8e-7) << "n = " << n;
    EXPECT_LT(worst_var, 4e-7) << "n = " << n;
  }
}

TEST(ReduceTest, LanesCombineToTheSequentialResult) {
  std::vector<double> xs;
  for (int i = 0; i < 1000; ++i) xs.push_back(1e3 + std::sin(i * 0.37) * 5);
  Welford<double> seq;
  for (double x : xs) seq.Update(x);
  seq.Flush();
  WelfordLanes<double, 16> lanes;
  Welford<double> combined;
  for (size_t i = 0; i < 992; ++i) lanes.Update(static_cast<int>(i % 16), xs[i]);
  for (size_t i = 992; i < xs.size(); ++i) combined.Update(xs[i]);
  lanes.CombineInto(combined);
  combined.Flush();
  EXPECT_DOUBLE_EQ(combined.count, seq.count);
  EXPECT_NEAR(combined.mean, seq.mean, 1e-12 * seq.mean);
  EXPECT_NEAR(combined.m2, seq.m2, 1e-9 * seq.m2);

  OnlineSoftmax<float> s1, s2;
  OnlineSoftmaxLanes<float, 4> sl;
  const float ys[] = {-INFINITY, 1.0f, -INFINITY, 3.0f, 2.0f, -INFINITY, 0.5f, -1.0f, 7.0f};
  for (int i = 0; i < 9; ++i) s1.Update(ys[i]);
  for (int i = 0; i < 8; ++i) sl.Update(i % 4, ys[i]);
  s2.Update(ys[8]);
  sl.CombineInto(s2);
  EXPECT_EQ(s2.max, s1.max);
  EXPECT_NEAR(s2.sum, s1.sum, 1e-6f * s1.sum);
  // Lanes that saw only -inf, and NaN.
  OnlineSoftmaxLanes<float, 2> masked;
  masked.Update(0, -INFINITY);
  OnlineSoftmax<float> m;
  masked.CombineInto(m);
  EXPECT_EQ(m.sum, 0.0f);
  masked.Update(1, NAN);
  OnlineSoftmax<float> m2;
  masked.CombineInto(m2);
  EXPECT_TRUE(std::isnan(m2.sum));
  MaxLanes<float, 4> mx;
  mx.Update(2, NAN);
  mx.Update(1, 5.0f);
  float acc = lowest<float>();
  mx.CombineInto(acc);
  EXPECT_TRUE(std::isnan(acc));
}

TEST(EmbeddedTest, PreludeHoldsEveryHeaderWithoutLocalIncludes) {
  const std::string prelude = kiln::kernels::CpuPrelude();
  EXPECT_NE(prelude.find("// ---- kernels/cpu/kiln_half.h"), std::string::npos);
  EXPECT_NE(prelude.find("struct OnlineSoftmax"), std::string::npos);
  EXPECT_EQ(prelude.find("#include \""), std::string::npos);
  EXPECT_LT(prelude.find("KILN_KERNELS_CPU_KILN_HALF_H_"), prelude.find("struct Welford"));
  EXPECT_LT(prelude.find("KILN_KERNELS_CPU_KILN_BASE_H_"), prelude.find("KILN_KERNELS_CPU_KILN_HALF_H_"));
}

TEST(EmbeddedTest, PreludeIncludesNoHeavyStandardHeaders) {
  // Parsing <cmath>, <algorithm>, <limits> cost ~2/3 of a small graph's compile (kiln_base.h).
  const std::string prelude = kiln::kernels::CpuPrelude();
  for (size_t at = prelude.find("#include <"); at != std::string::npos;
       at = prelude.find("#include <", at + 1)) {
    EXPECT_EQ(prelude.compare(at, 18, "#include <cstdint>"), 0) << prelude.substr(at, 40);
  }
}

}  // namespace
}  // namespace kiln_cpu
