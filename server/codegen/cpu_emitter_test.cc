#include "server/codegen/cpu_emitter.h"

#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/kernel/printer.h"
#include "server/kernel/test_kernels.h"
#include "server/kernel/verifier.h"

namespace kiln::codegen {
namespace {

using namespace ::kiln::kernel;  // NOLINT: tests build IR
namespace kt = ::kiln::kernel::testing;

// The kernel's function alone (no prelude). Golden expectations below are meant to be read:
// update them intentionally when the emitter changes.
std::string EmitOne(const absl::StatusOr<Kernel>& k) {
  EXPECT_TRUE(k.ok()) << k.status();
  if (!k.ok()) return "";
  EXPECT_TRUE(VerifyKernel(*k).ok());
  CpuEmitOptions options;
  options.include_prelude = false;
  absl::StatusOr<CpuSource> src = EmitCpuSource({*k}, options);
  EXPECT_TRUE(src.ok()) << src.status();
  if (!src.ok()) return "";
  // KILN_PRINT_GOLDEN=1 prints what was emitted, to update expectations intentionally.
  if (std::getenv("KILN_PRINT_GOLDEN") != nullptr) {
    std::cerr << "==== golden\n" << src->kernel_sources[0] << "==== end\n";
  }
  return src->kernel_sources[0];
}

TEST(CpuEmitterGolden, BroadcastAddWithTransposedInput) {
  EXPECT_EQ(EmitOne(kt::BroadcastAddTransposed(64, 1024)), R"cc(// kiln_kernel_0: pointwise, 2 outer dims, 0 reduction dims, 0 phases
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* kiln_buffers, const int64_t* kiln_scalars) {
  (void)kiln_scalars;
  using idx_t = int64_t;
  const float* b0 = static_cast<const float*>(kiln_buffers[0]);
  const float* b1 = static_cast<const float*>(kiln_buffers[1]);
  float* b2 = static_cast<float*>(kiln_buffers[2]);
#pragma omp parallel for schedule(static)
  for (idx_t kiln_u = 0; kiln_u < 64; ++kiln_u) {
    const idx_t o0 = kiln_u;
    for (idx_t o1 = 0; o1 < 1024; ++o1) {
      const float v0 = b0[o0 + o1 * 64];
      const float v1 = b1[o1];
      const float v2 = v0 + v1;
      b2[o0 * 1024 + o1] = v2;
    }
  }
}
)cc");
}

TEST(CpuEmitterGolden, RowSoftmaxIsOneKernelWithTwoPhases) {
  EXPECT_EQ(EmitOne(kt::RowSoftmax(1000, false)), R"cc(// kiln_kernel_0: rows, 1 outer dims, 1 reduction dims, 2 phases
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* kiln_buffers, const int64_t* kiln_scalars) {
  using idx_t = int64_t;
  const float* b0 = static_cast<const float*>(kiln_buffers[0]);
  float* b1 = static_cast<float*>(kiln_buffers[1]);
  const int64_t n0 = kiln_scalars[0];
  const int64_t z0 = 1000 * n0;
#pragma omp parallel for schedule(static) if (z0 >= 32768)
  for (idx_t kiln_u = 0; kiln_u < n0; ++kiln_u) {
    const idx_t o0 = kiln_u;
    kiln_cpu::OnlineSoftmax<float> acc0;
    float kiln_row0[1000];
    // phase 0: softmax statistics in two passes, exp(x - max) kept in kiln_row0 for the phases below
    {
      float kiln_max = kiln_cpu::lowest<float>();
      int kiln_nan = 0;
#pragma omp simd reduction(max:kiln_max) reduction(|:kiln_nan)
      for (idx_t r0 = 0; r0 < 1000; ++r0) {
        const float v0 = b0[o0 * 1000 + r0];
        kiln_max = v0 > kiln_max ? v0 : kiln_max;
        kiln_nan |= v0 != v0;
      }
      if (kiln_nan) kiln_max = kiln_cpu::nan<float>();
      float kiln_sum = 0;
#pragma omp simd reduction(+:kiln_sum)
      for (idx_t r0 = 0; r0 < 1000; ++r0) {
        const float v1 = b0[o0 * 1000 + r0];
        const float kiln_x = kiln_cpu::exp(v1 - kiln_max);
        kiln_row0[r0] = kiln_x;
        kiln_sum += kiln_x;
      }
      acc0.max = kiln_max;
      acc0.sum = kiln_sum;
    }
    // phase 1
    for (idx_t r0 = 0; r0 < 1000; ++r0) {
      const float v2 = kiln_row0[r0] * (float(1) / acc0.sum);
      b1[o0 * 1000 + r0] = v2;
    }
  }
}
)cc");
}

// Softmax keeps its row in a per-thread buffer (one exp per element) while the row fits
// 64 KiB; longer rows, and log_softmax (whose output reads x, not exp(x - max)), keep the
// online rule.
TEST(CpuEmitter, SoftmaxTwoPassOnlyForShortRowsWithExpReuse) {
  const std::string short_row = EmitOne(kt::RowSoftmax(16384, false));
  EXPECT_NE(short_row.find("float kiln_row0[16384];"), std::string::npos) << short_row;
  EXPECT_EQ(short_row.find("OnlineSoftmaxLanes"), std::string::npos) << short_row;
  const std::string long_row = EmitOne(kt::RowSoftmax(16385, false));
  EXPECT_EQ(long_row.find("kiln_row0"), std::string::npos) << long_row;
  EXPECT_NE(long_row.find("OnlineSoftmaxLanes"), std::string::npos) << long_row;
  const std::string log_row = EmitOne(kt::RowSoftmax(1000, true));
  EXPECT_EQ(log_row.find("kiln_row0"), std::string::npos) << log_row;
  EXPECT_NE(log_row.find("OnlineSoftmaxLanes"), std::string::npos) << log_row;
}

// A softmax of an expression (scores scaled and masked) keeps exp(v - max) in its row buffer too:
// the output phase reads it, and the chained backward's two phases as well.
TEST(CpuEmitter, SoftmaxOfAPrologueKeepsItsExpsInTheRowBuffer) {
  for (bool backward : {false, true}) {
    const std::string src = EmitOne(kt::MaskedScaledSoftmax(512, backward));
    EXPECT_NE(src.find("float kiln_row0[512];"), std::string::npos) << src;
    EXPECT_EQ(src.find("OnlineSoftmaxLanes"), std::string::npos) << src;
    size_t exps = 0;
    for (size_t at = src.find("kiln_cpu::exp("); at != std::string::npos; at = src.find("kiln_cpu::exp(", at + 1)) ++exps;
    EXPECT_EQ(exps, 1u) << src;
  }
}

TEST(CpuEmitterGolden, LayerNormUsesWelford) {
  EXPECT_EQ(EmitOne(kt::LayerNorm(768, 1e-5f)), R"cc(// kiln_kernel_0: rows, 1 outer dims, 1 reduction dims, 2 phases
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* kiln_buffers, const int64_t* kiln_scalars) {
  using idx_t = int64_t;
  const float* b0 = static_cast<const float*>(kiln_buffers[0]);
  const float* b1 = static_cast<const float*>(kiln_buffers[1]);
  const float* b2 = static_cast<const float*>(kiln_buffers[2]);
  float* b3 = static_cast<float*>(kiln_buffers[3]);
  float* b4 = static_cast<float*>(kiln_buffers[4]);
  float* b5 = static_cast<float*>(kiln_buffers[5]);
  const int64_t n0 = kiln_scalars[0];
  const int64_t z0 = 768 * n0;
#pragma omp parallel for schedule(static) if (z0 >= 32768)
  for (idx_t kiln_u = 0; kiln_u < n0; ++kiln_u) {
    const idx_t o0 = kiln_u;
    kiln_cpu::Welford<float> acc0;
    // phase 0 (16 lanes)
    {
      kiln_cpu::WelfordLanes<float, 16> acc0_l;
      const idx_t kiln_full = 768 - 768 % 16;
      for (idx_t kiln_base = 0; kiln_base < kiln_full; kiln_base += 16) {
        for (int kiln_lane = 0; kiln_lane < 16; ++kiln_lane) {
          const idx_t r0 = kiln_base + kiln_lane;
          const float v0 = b0[o0 * 768 + r0];
          acc0_l.Update(kiln_lane, v0);
        }
      }
      for (idx_t r0 = kiln_full; r0 < 768; ++r0) {
        const float v1 = b0[o0 * 768 + r0];
        acc0.Update(v1);
      }
      acc0_l.CombineInto(acc0);
    }
    acc0.Flush();
    // phase 1
    const float v2 = acc0.m2 * (float(1) / acc0.count);
    const float v3 = v2 + 0x1.4f8b58p-17f;
    const float v4 = float(1) / kiln_cpu::sqrt(v3);
    for (idx_t r0 = 0; r0 < 768; ++r0) {
      const float v5 = b0[o0 * 768 + r0];
      const float v6 = v5 - acc0.mean;
      const float v7 = v6 * v4;
      const float v8 = b1[r0];
      const float v9 = v7 * v8;
      const float v10 = b2[r0];
      const float v11 = v9 + v10;
      b3[o0 * 768 + r0] = v11;
    }
    b4[o0] = acc0.mean;
    b5[o0] = v4;
  }
}
)cc");
}

TEST(CpuEmitterGolden, ColumnReductionRunsRowsOutsideAndColumnsInside) {
  EXPECT_EQ(EmitOne(kt::ColumnSum(100, 37)), R"cc(// kiln_kernel_0: columns, 1 outer dims, 1 reduction dims, 1 phases
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* kiln_buffers, const int64_t* kiln_scalars) {
  (void)kiln_scalars;
  using idx_t = int64_t;
  const float* b0 = static_cast<const float*>(kiln_buffers[0]);
  float* b1 = static_cast<float*>(kiln_buffers[1]);
  const idx_t kiln_blocks = 3;
  for (idx_t kiln_u = 0; kiln_u < kiln_blocks; ++kiln_u) {
    const idx_t kiln_block = kiln_u % kiln_blocks;
    const idx_t kiln_begin = kiln_block * 16;
    const idx_t kiln_end = kiln_cpu::imin<idx_t>(kiln_begin + 16, 37);
    float acc0_c[16];
    for (int kiln_j = 0; kiln_j < 16; ++kiln_j) acc0_c[kiln_j] = 0;
    // phase 0 (columns)
    for (idx_t r0 = 0; r0 < 100; ++r0) {
      for (idx_t o0 = kiln_begin; o0 < kiln_end; ++o0) {
        const idx_t kiln_j = o0 - kiln_begin;
        const float v0 = b0[o0 + r0 * 37];
        acc0_c[kiln_j] += v0;
      }
    }
    for (idx_t o0 = kiln_begin; o0 < kiln_end; ++o0) {
      const idx_t kiln_j = o0 - kiln_begin;
      const float acc0 = acc0_c[kiln_j];
      b1[o0] = acc0;
    }
  }
}
)cc");
}

TEST(CpuEmitterGolden, Bf16ChainRoundsOnceAtTheStore) {
  EXPECT_EQ(EmitOne(kt::Bf16Chain(100000)), R"cc(// kiln_kernel_0: pointwise, 1 outer dims, 0 reduction dims, 0 phases
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* kiln_buffers, const int64_t* kiln_scalars) {
  (void)kiln_scalars;
  using idx_t = int64_t;
  const uint16_t* b0 = static_cast<const uint16_t*>(kiln_buffers[0]);
  const uint16_t* b1 = static_cast<const uint16_t*>(kiln_buffers[1]);
  uint16_t* b2 = static_cast<uint16_t*>(kiln_buffers[2]);
  const idx_t kiln_blocks = 25;
#pragma omp parallel for schedule(static)
  for (idx_t kiln_u = 0; kiln_u < kiln_blocks; ++kiln_u) {
    const idx_t kiln_block = kiln_u % kiln_blocks;
    const idx_t kiln_begin = kiln_block * 4096;
    const idx_t kiln_end = kiln_cpu::imin<idx_t>(kiln_begin + 4096, 100000);
    for (idx_t o0 = kiln_begin; o0 < kiln_end; ++o0) {
      const float v0 = kiln_cpu::bf16_to_f32(b0[o0]);
      const float v1 = kiln_cpu::bf16_to_f32(b1[o0]);
      const float v2 = v0 * v1;
      const float v3 = kiln_cpu::silu(v2);
      const float v4 = v3 + 0x1p+0f;
      const float v5 = kiln_cpu::round_bf16(v4);
      b2[o0] = kiln_cpu::f32_to_bf16(v5);
    }
  }
}
)cc");
}

TEST(CpuEmitter, OneRowDeclaresTheOuterIndicesOfItsUnitDims) {
  // rows == 1 and a short inner dim: no unit loop, but the stores still index with o0.
  const std::string src = EmitOne(kt::BroadcastAddTransposed(1, 8));
  EXPECT_TRUE(absl::StrContains(src, "const idx_t o0 = 0;")) << src;
  EXPECT_FALSE(absl::StrContains(src, "kiln_u")) << src;
}

TEST(CpuEmitter, NoStringFromTheGraphReachesTheSource) {
  absl::StatusOr<Kernel> a = kt::RowSoftmax(64, false);
  ASSERT_TRUE(a.ok());
  Kernel evil = *a;
  evil.debug_name = "*/ #include \"/etc/passwd\"\n#define x y // \\";
  Kernel plain = *a;
  plain.debug_name = "x";
  absl::StatusOr<CpuSource> s1 = EmitCpuSource({evil});
  absl::StatusOr<CpuSource> s2 = EmitCpuSource({plain});
  ASSERT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s1->source, s2->source);
  EXPECT_FALSE(absl::StrContains(s1->source, "passwd"));
  // The printer shows the name, escaped, on one line.
  EXPECT_TRUE(absl::StrContains(PrintKernel(evil), "kernel \"*/ #include \\\"/etc/passwd\\\"\\n"));
}

TEST(CpuEmitter, TranslationUnitHasPreludeOnceAndOneSymbolPerKernel) {
  absl::StatusOr<Kernel> a = kt::ColumnSum(4, 4);
  absl::StatusOr<Kernel> b = kt::Bf16Chain(10);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<CpuSource> src = EmitCpuSource({*a, *b});
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(src->symbols, (std::vector<std::string>{"kiln_kernel_0", "kiln_kernel_1"}));
  EXPECT_TRUE(absl::StrContains(src->source, "void kiln_kernel_1("));
  const size_t first = src->source.find("struct OnlineSoftmax {");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(src->source.find("struct OnlineSoftmax {", first + 1), std::string::npos);
  EXPECT_FALSE(absl::StrContains(src->source, "#include \"kernels"));
}

TEST(CpuEmitter, ConstantsAreExact) {
  KernelBuilder kb("constants");
  const Buffer out = kb.AddBuffer(ScalarType::kFloat64, Access::kWrite, Size::Const(1));
  const Buffer outf = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, Size::Const(1));
  const Buffer outi = kb.AddBuffer(ScalarType::kInt64, Access::kWrite, Size::Const(1));
  const Index at0 = MakeIndex(Size(), {});
  kb.Add(Store(out, at0, Add(Add(ConstFloat(ScalarType::kFloat64, 0.1),
                                 ConstFloat(ScalarType::kFloat64, -0.0)),
                             Add(ConstFloat(ScalarType::kFloat64, NAN),
                                 ConstFloat(ScalarType::kFloat64, -INFINITY)))));
  kb.Add(Store(outf, at0, ConstFloat(ScalarType::kFloat32, 3.0)));
  kb.Add(Store(outi, at0, Add(ConstInt(ScalarType::kInt64, std::numeric_limits<int64_t>::min()),
                              ConstInt(ScalarType::kInt64, -5))));
  const std::string src = EmitOne(kb.Finish());
  EXPECT_TRUE(absl::StrContains(src, "0x1.999999999999ap-4 + (-0x0p+0)")) << src;
  EXPECT_TRUE(absl::StrContains(src, "kiln_cpu::nan<double>() + (-kiln_cpu::inf<double>())")) << src;
  EXPECT_TRUE(absl::StrContains(src, "b1[0] = 0x1.8p+1f;")) << src;
  EXPECT_TRUE(absl::StrContains(src, "kiln_cpu::lowest<int64_t>() + int64_t{-5}")) << src;
}

TEST(CpuEmitter, DynamicSizesAreHoistedAndIndicesAre64Bit) {
  KernelBuilder kb("dynamic transpose");
  const Size n0 = kb.AddScalar(), n1 = kb.AddScalar();
  const Buffer in = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, n0 * n1);
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, n0 * n1);
  const Var i = kb.AddOuter(n0), j = kb.AddOuter(n1);
  kb.Add(Store(out, ContiguousIndex({i, j}, {n0, n1}),
               Load(in, MakeIndex(Size(), {{i, Size::Const(1)}, {j, n0}}))));
  EXPECT_EQ(EmitOne(kb.Finish()), R"cc(// kiln_kernel_0: pointwise, 2 outer dims, 0 reduction dims, 0 phases
extern "C" __attribute__((visibility("default"))) void kiln_kernel_0(void* const* kiln_buffers, const int64_t* kiln_scalars) {
  using idx_t = int64_t;
  const float* b0 = static_cast<const float*>(kiln_buffers[0]);
  float* b1 = static_cast<float*>(kiln_buffers[1]);
  const int64_t n0 = kiln_scalars[0];
  const int64_t n1 = kiln_scalars[1];
  const int64_t z0 = n0 * n1;
  const idx_t kiln_blocks = ((n1 + 4095) / 4096);
#pragma omp parallel for schedule(static) if (z0 >= 32768)
  for (idx_t kiln_u = 0; kiln_u < n0 * kiln_blocks; ++kiln_u) {
    const idx_t kiln_block = kiln_u % kiln_blocks;
    const idx_t o0 = kiln_u / kiln_blocks;
    const idx_t kiln_begin = kiln_block * 4096;
    const idx_t kiln_end = kiln_cpu::imin<idx_t>(kiln_begin + 4096, n1);
    for (idx_t o1 = kiln_begin; o1 < kiln_end; ++o1) {
      const float v0 = b0[o0 + o1 * n0];
      b1[o0 * n1 + o1] = v0;
    }
  }
}
)cc");
}

TEST(CpuEmitter, RefusesAKernelThatDoesNotVerify) {
  absl::StatusOr<Kernel> k = kt::ColumnSum(4, 4);
  ASSERT_TRUE(k.ok());
  Kernel bad = *k;
  bad.body.clear();
  bad.phases[0].stmts.clear();  // a0 is never updated
  absl::StatusOr<CpuSource> src = EmitCpuSource({bad});
  EXPECT_EQ(src.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(src.status().message(), "kernel 0")) << src.status();
}

}  // namespace
}  // namespace kiln::codegen
