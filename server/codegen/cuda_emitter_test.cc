#include "server/codegen/cuda_emitter.h"

#include <cstdint>
#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/codegen/cuda_golden.h"
#include "server/codegen/cuda_test_kernels.h"
#include "server/kernel/test_kernels.h"

namespace kiln::codegen {
namespace {

using namespace ::kiln::kernel;  // NOLINT: tests build IR
namespace kt = ::kiln::kernel::testing;
namespace ct = ::kiln::codegen::testing;
using ct::Count;
using ct::EmitOne;

TEST(CudaEmitterGolden, PointwiseBroadcastAddIsVectorizedWithAScalarTail) {
  EXPECT_EQ(EmitOne(kt::BroadcastAddTransposed(64, 1024), /*vectorize=*/true, nullptr, /*tile=*/false), R"cu(// kiln_kernel_0: pointwise, 2 outer dims, 0 reduction dims, 0 phases, vector width 4, 0 cached values per thread
extern "C" __global__ void __launch_bounds__(256) kiln_kernel_0(const float* __restrict__ b0, const float* __restrict__ b1, float* __restrict__ b2) {
  using idx_t = int32_t;
  const bool kiln_vec = kiln_cuda::aligned(b1, 16) && kiln_cuda::aligned(b2, 16);
  const idx_t kiln_chunks = 256;
  const idx_t kiln_units = 64 * kiln_chunks;
  for (idx_t kiln_u = static_cast<idx_t>(blockIdx.x) * static_cast<idx_t>(blockDim.x) + static_cast<idx_t>(threadIdx.x); kiln_u < kiln_units; kiln_u += static_cast<idx_t>(gridDim.x) * static_cast<idx_t>(blockDim.x)) {
    const idx_t kiln_c = kiln_u % kiln_chunks;
    const idx_t o0 = kiln_u / kiln_chunks;
    const idx_t kiln_base = kiln_c * 4;
    if (kiln_vec && kiln_base + 4 <= 1024) {
      {
        const idx_t o1 = kiln_base;
        const kiln_cuda::Vec<float, 4> kiln_lv0 = kiln_cuda::load_vec<4>(b1 + (o1));
        kiln_cuda::Vec<float, 4> kiln_sv0;
        {
          const idx_t o1 = kiln_base + 0;
          const float v0 = b0[o0 + o1 * 64];
          const float v1 = kiln_lv0.v[0];
          const float v2 = v0 + v1;
          kiln_sv0.v[0] = v2;
        }
        {
          const idx_t o1 = kiln_base + 1;
          const float v3 = b0[o0 + o1 * 64];
          const float v4 = kiln_lv0.v[1];
          const float v5 = v3 + v4;
          kiln_sv0.v[1] = v5;
        }
        {
          const idx_t o1 = kiln_base + 2;
          const float v6 = b0[o0 + o1 * 64];
          const float v7 = kiln_lv0.v[2];
          const float v8 = v6 + v7;
          kiln_sv0.v[2] = v8;
        }
        {
          const idx_t o1 = kiln_base + 3;
          const float v9 = b0[o0 + o1 * 64];
          const float v10 = kiln_lv0.v[3];
          const float v11 = v9 + v10;
          kiln_sv0.v[3] = v11;
        }
        kiln_cuda::store_vec<4>(b2 + (o0 * 1024 + o1), kiln_sv0);
      }
    }
    else {
      const idx_t kiln_end = kiln_base + 4 < 1024 ? kiln_base + 4 : 1024;
      for (idx_t o1 = kiln_base; o1 < kiln_end; ++o1) {
        const float v12 = b0[o0 + o1 * 64];
        const float v13 = b1[o1];
        const float v14 = v12 + v13;
        b2[o0 * 1024 + o1] = v14;
      }
    }
  }
}
)cu");
}

// The transposed load goes through a padded shared tile (read coalesced along o0), the
// broadcast load and the store are coalesced along o1; tail tiles are bounds-checked.
TEST(CudaEmitterGolden, TransposedLoadsAreStagedThroughASharedTile) {
  CudaLaunch launch;
  EXPECT_EQ(EmitOne(kt::BroadcastAddTransposed(48, 1024), /*vectorize=*/true, &launch), R"cu(// kiln_kernel_0: tiled, 2 outer dims, 0 reduction dims, 0 phases, vector width 1, 0 cached values per thread
extern "C" __global__ void __launch_bounds__(256) kiln_kernel_0(const float* __restrict__ b0, const float* __restrict__ b1, float* __restrict__ b2) {
  using idx_t = int32_t;
  __shared__ float kiln_t0[64][33];
  const int kiln_lane = threadIdx.x & 31;
  const int kiln_row = threadIdx.x >> 5;
  const idx_t kiln_units = 32;
  for (idx_t kiln_u = blockIdx.x; kiln_u < kiln_units; kiln_u += gridDim.x) {
    const idx_t kiln_x0 = kiln_u % 16 * 64;
    const idx_t kiln_y0 = kiln_u / 16 % 2 * 32;
#pragma unroll
    for (int kiln_j = 0; kiln_j < 8; ++kiln_j) {
      const int kiln_i = kiln_row + kiln_j * 8;
      const idx_t o0 = kiln_y0 + kiln_lane;
      const idx_t o1 = kiln_x0 + kiln_i;
      if (o0 < 48) {
        kiln_t0[kiln_i][kiln_lane] = b0[o0 + o1 * 48];
      }
    }
    __syncthreads();
#pragma unroll
    for (int kiln_j = 0; kiln_j < 8; ++kiln_j) {
      const int kiln_i = kiln_row + kiln_j % 4 * 8;
      const int kiln_xl = kiln_lane + kiln_j / 4 * 32;
      const idx_t o0 = kiln_y0 + kiln_i;
      const idx_t o1 = kiln_x0 + kiln_xl;
      if (o0 < 48) {
        const float v0 = kiln_t0[kiln_xl][kiln_i];
        const float v1 = b1[o1];
        const float v2 = v0 + v1;
        b2[o0 * 1024 + o1] = v2;
      }
    }
    __syncthreads();  // the tiles are refilled next step
  }
}
)cu");
  EXPECT_EQ(launch.layout, CudaLayout::kTiled);
  EXPECT_EQ(launch.block, 256);
  EXPECT_EQ(*CudaGridSize(launch, {}), 2 * 16);  // 32 x 64 tiles
}

TEST(CudaEmitterGolden, RowSoftmaxReadsTheRowOnceIntoRegisters) {
  EXPECT_EQ(EmitOne(kt::RowSoftmax(1024, false), /*vectorize=*/false), R"cu(// kiln_kernel_0: warp_per_row, 1 outer dims, 1 reduction dims, 2 phases, vector width 1, 32 cached values per thread
template <typename idx_t>
KILN_DEV void kiln_kernel_0_body(const float* __restrict__ b0, float* __restrict__ b1, int64_t n0) {
  const int kiln_lane = threadIdx.x & 31;
  for (idx_t kiln_u = static_cast<idx_t>(blockIdx.x) * 8 + (threadIdx.x >> 5); kiln_u < n0; kiln_u += static_cast<idx_t>(gridDim.x) * 8) {
    const idx_t o0 = kiln_u;
    kiln_cuda::OnlineSoftmax<float> acc0;
    float kiln_c0[32];
    // phase 0
#pragma unroll
    for (int kiln_e = 0; kiln_e < 32; ++kiln_e) {
      const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 32 + kiln_lane;
      const idx_t kiln_r = kiln_rb;
      const idx_t r0 = kiln_r;
      kiln_c0[kiln_e] = b0[o0 * 1024 + r0];
      const float v0 = kiln_c0[kiln_e];
      acc0.max = kiln_cuda::max_nan(acc0.max, v0);
    }
    acc0.max = kiln_cuda::warp_allreduce(acc0.max, kiln_cuda::MaxOp());
    {
#pragma unroll
      for (int kiln_e = 0; kiln_e < 32; ++kiln_e) {
        kiln_c0[kiln_e] = kiln_cuda::exp(kiln_c0[kiln_e] - acc0.max);
        acc0.sum += kiln_c0[kiln_e];
      }
    }
    acc0.sum = kiln_cuda::warp_allreduce(acc0.sum, kiln_cuda::SumOp());
    if (acc0.max == -kiln_cuda::inf<float>()) acc0.sum = float(0);
    // phase 1
#pragma unroll
    for (int kiln_e = 0; kiln_e < 32; ++kiln_e) {
      const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 32 + kiln_lane;
      const idx_t kiln_r = kiln_rb;
      const idx_t r0 = kiln_r;
      const float v1 = kiln_c0[kiln_e] * (float(1) / acc0.sum);
      b1[o0 * 1024 + r0] = v1;
    }
  }
}
extern "C" __global__ void __launch_bounds__(256) kiln_kernel_0(const float* __restrict__ b0, float* __restrict__ b1, int64_t n0) {
  if (1024.0 * static_cast<double>(n0) <= 2143289343.0) {
    kiln_kernel_0_body<int32_t>(b0, b1, n0);
  }
  else {
    kiln_kernel_0_body<int64_t>(b0, b1, n0);
  }
}
)cu");
}

TEST(CudaEmitterGolden, LayerNormUsesWelfordAndAWarpPerRow) {
  EXPECT_EQ(EmitOne(kt::LayerNorm(768, 1e-5f), /*vectorize=*/false), R"cu(// kiln_kernel_0: warp_per_row, 1 outer dims, 1 reduction dims, 2 phases, vector width 1, 24 cached values per thread
template <typename idx_t>
KILN_DEV void kiln_kernel_0_body(const float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, float* __restrict__ b3, float* __restrict__ b4, float* __restrict__ b5, int64_t n0) {
  const int kiln_lane = threadIdx.x & 31;
  for (idx_t kiln_u = static_cast<idx_t>(blockIdx.x) * 8 + (threadIdx.x >> 5); kiln_u < n0; kiln_u += static_cast<idx_t>(gridDim.x) * 8) {
    const idx_t o0 = kiln_u;
    kiln_cuda::Welford<float> acc0;
    float kiln_c0[24];
    // phase 0
#pragma unroll
    for (int kiln_e = 0; kiln_e < 24; ++kiln_e) {
      const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 32 + kiln_lane;
      const idx_t kiln_r = kiln_rb;
      const idx_t r0 = kiln_r;
      kiln_c0[kiln_e] = b0[o0 * 768 + r0];
      const float v0 = kiln_c0[kiln_e];
      acc0.mean += v0;
    }
    acc0.mean = kiln_cuda::warp_allreduce(acc0.mean, kiln_cuda::SumOp());
    acc0.mean = acc0.mean / static_cast<float>(768);
    {
#pragma unroll
      for (int kiln_e = 0; kiln_e < 24; ++kiln_e) {
        const float kiln_d0 = kiln_c0[kiln_e] - acc0.mean;
        acc0.m2 += kiln_d0 * kiln_d0;
      }
    }
    acc0.m2 = kiln_cuda::warp_allreduce(acc0.m2, kiln_cuda::SumOp());
    acc0.count = static_cast<float>(768);
    // phase 1
#pragma unroll
    for (int kiln_e = 0; kiln_e < 24; ++kiln_e) {
      const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 32 + kiln_lane;
      const idx_t kiln_r = kiln_rb;
      const idx_t r0 = kiln_r;
      const float v1 = kiln_c0[kiln_e];
      const float v2 = v1 - acc0.mean;
      const float v3 = acc0.m2 * (float(1) / acc0.count);
      const float v4 = v3 + 0x1.4f8b58p-17f;
      const float v5 = kiln_cuda::rsqrt(v4);
      const float v6 = v2 * v5;
      const float v7 = b1[r0];
      const float v8 = v6 * v7;
      const float v9 = b2[r0];
      const float v10 = v8 + v9;
      b3[o0 * 768 + r0] = v10;
    }
    if (kiln_lane == 0) {
      b4[o0] = acc0.mean;
      const float v11 = acc0.m2 * (float(1) / acc0.count);
      const float v12 = v11 + 0x1.4f8b58p-17f;
      const float v13 = kiln_cuda::rsqrt(v12);
      b5[o0] = v13;
    }
  }
}
extern "C" __global__ void __launch_bounds__(256) kiln_kernel_0(const float* __restrict__ b0, const float* __restrict__ b1, const float* __restrict__ b2, float* __restrict__ b3, float* __restrict__ b4, float* __restrict__ b5, int64_t n0) {
  if (768.0 * static_cast<double>(n0) <= 2143289343.0 && 1.0 * static_cast<double>(n0) <= 2143289343.0) {
    kiln_kernel_0_body<int32_t>(b0, b1, b2, b3, b4, b5, n0);
  }
  else {
    kiln_kernel_0_body<int64_t>(b0, b1, b2, b3, b4, b5, n0);
  }
}
)cu");
}

// The canonical column reduction: each thread sums 4 columns with 16-byte loads (misaligned
// pointers: the same columns, scalar loads; only the loop is emitted twice), the accumulators
// meet in shared memory, and the sums go out in one 16-byte store (a misaligned output: four).
TEST(CudaEmitterGolden, ColumnSumMovesVectorsAndMeetsInSharedMemory) {
  EXPECT_EQ(EmitOne(kt::ColumnSum(4096, 512), /*vectorize=*/true), R"cu(// kiln_kernel_0: column, 1 outer dims, 1 reduction dims, 1 phases, vector width 4, 0 cached values per thread
extern "C" __global__ void __launch_bounds__(1024) kiln_kernel_0(const float* __restrict__ b0, float* __restrict__ b1) {
  using idx_t = int32_t;
  alignas(16) __shared__ unsigned char kiln_smem[16384];
  const bool kiln_vec = kiln_cuda::aligned(b0, 16);
  const bool kiln_vec_out = kiln_cuda::aligned(b1, 16);
  const int kiln_lane = threadIdx.x / 2;
  for (idx_t kiln_p = static_cast<idx_t>(blockIdx.x) * 8; kiln_p < 512; kiln_p += static_cast<idx_t>(gridDim.x) * 8) {
    const idx_t kiln_u = kiln_p + threadIdx.x % 2 * 4;
    const bool kiln_active = kiln_u < 512;
    const idx_t o0 = kiln_u;
    const idx_t kiln_ob = o0;
    float kiln_acc0[4] = {0, 0, 0, 0};
    // phase 0
    if (kiln_vec) {
      if (kiln_active) {
#pragma unroll 4
        for (idx_t kiln_r = kiln_lane; kiln_r < 4096; kiln_r += 512) {
          const idx_t r0 = kiln_r;
          {
            const idx_t o0 = kiln_ob;
            const kiln_cuda::Vec<float, 4> kiln_lv0 = kiln_cuda::load_vec<4>(b0 + (o0 + r0 * 512));
            {
              const idx_t o0 = kiln_ob + 0;
              float& acc0 = kiln_acc0[0];
              const float v0 = kiln_lv0.v[0];
              acc0 += v0;
            }
            {
              const idx_t o0 = kiln_ob + 1;
              float& acc0 = kiln_acc0[1];
              const float v1 = kiln_lv0.v[1];
              acc0 += v1;
            }
            {
              const idx_t o0 = kiln_ob + 2;
              float& acc0 = kiln_acc0[2];
              const float v2 = kiln_lv0.v[2];
              acc0 += v2;
            }
            {
              const idx_t o0 = kiln_ob + 3;
              float& acc0 = kiln_acc0[3];
              const float v3 = kiln_lv0.v[3];
              acc0 += v3;
            }
          }
        }
      }
    }
    else {
      if (kiln_active) {
#pragma unroll 4
        for (idx_t kiln_r = kiln_lane; kiln_r < 4096; kiln_r += 512) {
          const idx_t r0 = kiln_r;
          {
            const idx_t o0 = kiln_ob;
            {
              const idx_t o0 = kiln_ob + 0;
              float& acc0 = kiln_acc0[0];
              const float v4 = b0[o0 + r0 * 512];
              acc0 += v4;
            }
            {
              const idx_t o0 = kiln_ob + 1;
              float& acc0 = kiln_acc0[1];
              const float v5 = b0[o0 + r0 * 512];
              acc0 += v5;
            }
            {
              const idx_t o0 = kiln_ob + 2;
              float& acc0 = kiln_acc0[2];
              const float v6 = b0[o0 + r0 * 512];
              acc0 += v6;
            }
            {
              const idx_t o0 = kiln_ob + 3;
              float& acc0 = kiln_acc0[3];
              const float v7 = b0[o0 + r0 * 512];
              acc0 += v7;
            }
          }
        }
      }
    }
    kiln_cuda::column_allreduce_vec<2, 512>(kiln_acc0, kiln_cuda::SumOp(), kiln_smem);
    if (kiln_active && kiln_lane == 0) {
      kiln_cuda::Vec<float, 4> kiln_sv0;
      {
        const idx_t o0 = kiln_ob + 0;
        float& acc0 = kiln_acc0[0];
        kiln_sv0.v[0] = acc0;
      }
      {
        const idx_t o0 = kiln_ob + 1;
        float& acc0 = kiln_acc0[1];
        kiln_sv0.v[1] = acc0;
      }
      {
        const idx_t o0 = kiln_ob + 2;
        float& acc0 = kiln_acc0[2];
        kiln_sv0.v[2] = acc0;
      }
      {
        const idx_t o0 = kiln_ob + 3;
        float& acc0 = kiln_acc0[3];
        kiln_sv0.v[3] = acc0;
      }
      if (kiln_vec_out) {
        const idx_t o0 = kiln_ob;
        kiln_cuda::store_vec<4>(b1 + (o0), kiln_sv0);
      }
      else {
        {
          const idx_t o0 = kiln_ob + 0;
          b1[o0] = kiln_sv0.v[0];
        }
        {
          const idx_t o0 = kiln_ob + 1;
          b1[o0] = kiln_sv0.v[1];
        }
        {
          const idx_t o0 = kiln_ob + 2;
          b1[o0] = kiln_sv0.v[2];
        }
        {
          const idx_t o0 = kiln_ob + 3;
          b1[o0] = kiln_sv0.v[3];
        }
      }
    }
  }
}
)cu");
}

// Points per block of a scalar column reduction (no vectors): 32 while there are blocks enough
// for the SMs (132 here), else halved down to 32 bytes of the loads per row (f32: 8 points) with
// more threads per point; the threads of a point fold as a tree (column_allreduce) whatever their
// number.
TEST(CudaEmitter, ColumnReductionsNarrowTheirBlocksWhenPointsAreFew) {
  for (const auto& [cols, points, block] : std::vector<std::tuple<int64_t, int, int>>{
           {65536, 32, 256}, {8192, 32, 1024}, {4096, 16, 1024}, {512, 8, 1024}, {64, 8, 1024}}) {
    CudaLaunch launch;
    const std::string src = EmitOne(kt::ColumnSum(4096, cols), /*vectorize=*/false, &launch);
    EXPECT_EQ(launch.layout, CudaLayout::kColumn) << cols;
    EXPECT_EQ(launch.block, block) << cols;
    EXPECT_EQ(launch.work_per_block, points) << cols;
    EXPECT_EQ(Count(src, absl::StrCat("kiln_u = kiln_p + threadIdx.x % ", points, ";")), 1) << src;
    EXPECT_EQ(Count(src, absl::StrCat("column_allreduce<", points, ", ", block / points, ">(")), 1) << src;
  }
}

// Vector columns: a thread serves V consecutive points (V = 4 where the column count allows it,
// else 2; odd counts stay scalar), a row of a block's points is 128 bytes (f32: 8 threads of 4
// points), narrowed to 32 bytes when points are few; the V accumulators of every thread fold in
// one tree (column_allreduce_vec), and misaligned pointers take the same points with scalar loads.
// The loop over a thread's rows is unrolled up to 8 times, never more than it has rows.
TEST(CudaEmitter, ColumnReductionsMoveVectorsAlongTheirPoints) {
  for (const auto& [cols, width, threads, block] : std::vector<std::tuple<int64_t, int, int, int>>{
           {8192, 4, 8, 1024}, {512, 4, 2, 1024}, {70, 2, 4, 1024}, {63, 1, 8, 1024}}) {
    CudaLaunch launch;
    const std::string src = EmitOne(kt::ColumnSum(4096, cols), /*vectorize=*/true, &launch);
    EXPECT_EQ(launch.layout, CudaLayout::kColumn) << cols;
    EXPECT_EQ(launch.vector_width, width) << cols;
    EXPECT_EQ(launch.block, block) << cols;
    EXPECT_EQ(launch.work_per_block, threads * width) << cols;
    if (width == 1) {
      EXPECT_EQ(Count(src, "column_allreduce_vec"), 0) << src;
      continue;
    }
    EXPECT_EQ(Count(src, absl::StrCat("kiln_u = kiln_p + threadIdx.x % ", threads, " * ", width, ";")), 1) << src;
    // Misaligned pointers: the same points in a second loop, scalar loads; one all-reduce.
    EXPECT_EQ(Count(src, absl::StrCat("kiln_cuda::load_vec<", width, ">(b0 + (o0 + r0 * ", cols, "))")), 1)
        << src;
    EXPECT_EQ(Count(src, "= b0["), width) << src;
    EXPECT_EQ(Count(src, absl::StrCat("column_allreduce_vec<", threads, ", ", block / threads,
                                      ">(kiln_acc0, kiln_cuda::SumOp(), kiln_smem);")),
              1) << src;
  }
  // Short columns: at least 16 rows per thread, but whole warps (2 threads across x 16 rows).
  CudaLaunch launch;
  const std::string short_src = EmitOne(kt::ColumnSum(64, 64), /*vectorize=*/true, &launch);
  EXPECT_EQ(launch.vector_width, 4);
  EXPECT_EQ(launch.block, 32);
  EXPECT_EQ(Count(short_src, "#pragma unroll 4\n"), 2) << "4 rows per thread, both loops: " << short_src;
  // Few rows over many points (a batch norm's first pass: 8192 (n, c) points of 196 rows): at
  // least 16 rows per thread would leave 64-thread blocks and most of the GPU idle; 4 suffice.
  EmitOne(kt::ColumnSum(196, 8192), /*vectorize=*/true, &launch);
  EXPECT_EQ(launch.vector_width, 4);
  EXPECT_EQ(launch.work_per_block, 32);
  EXPECT_EQ(launch.block, 256);
}

// At most 16 rows over many points (grouped-query attention's backward: the 3 query heads of a
// key head, 1M points): one thread per point sums all its rows (the loop unrolled as many times),
// the block's threads all along the points (256 while that gives two blocks per SM, down to 32),
// and no all-reduce. Too few points for one block per SM at 32: lanes along the rows, as before.
TEST(CudaEmitter, ShortColumnsTakeOneThreadPerPoint) {
  for (const auto& [rows, cols, vectorize, width, block] : std::vector<std::tuple<int64_t, int64_t, bool, int, int>>{
           {3, 1 << 20, true, 4, 256}, {16, 1 << 20, true, 4, 256}, {3, 1 << 20, false, 1, 256},
           {8, 20000, true, 4, 32}, {5, 17001, true, 1, 64}}) {
    SCOPED_TRACE(absl::StrCat(rows, " x ", cols));
    CudaLaunch launch;
    const std::string src = EmitOne(kt::ColumnSum(rows, cols), vectorize, &launch);
    EXPECT_EQ(launch.layout, CudaLayout::kColumn);
    EXPECT_EQ(launch.vector_width, width);
    EXPECT_EQ(launch.block, block);
    EXPECT_EQ(launch.work_per_block, block * width);
    EXPECT_EQ(Count(src, "const int kiln_lane = threadIdx.x / " + std::to_string(block) + ";"), 1) << src;
    EXPECT_EQ(Count(src, "column_allreduce"), 0) << src;
    EXPECT_EQ(Count(src, absl::StrCat("#pragma unroll ", std::min<int64_t>(rows, 8), "\n")),
              width > 1 ? 2 : 1) << src;
  }
  CudaLaunch launch;
  EmitOne(kt::ColumnSum(3, 4096), /*vectorize=*/true, &launch);  // 32 blocks of 32 x 4 points: too few
  EXPECT_EQ(launch.vector_width, 4);
  EXPECT_GT(launch.block, launch.work_per_block / 4);
}

// Layer norm's weight gradient sums over (batch, rows) per column: a column reduction, though its
// per-row mean and rstd lie along the reduction (they are the same for all of a block's points,
// read once per row by every thread of the warp, not strided like the column's loads).
TEST(CudaEmitter, ColumnReductionsReadPerRowValuesAlongTheRow) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::LayerNormWeightGrad(8, 512, 768), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kColumn) << src;
  EXPECT_EQ(Count(src, "kiln_u = kiln_p + threadIdx.x % "), 1) << src;
}

// The vectorized softmax: phase 0 loads each row once with 16-byte loads into registers, phase 1
// reads the registers and stores with 16-byte stores; a scalar path for misaligned pointers.
TEST(CudaEmitter, VectorizedSoftmaxLoadsOnceAndStoresVectors) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::RowSoftmax(1024, false), true, &launch);
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec<4>(b0"), 1) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::store_vec<4>(b1"), 1) << src;
  EXPECT_EQ(Count(src, "= b0["), 1) << src;  // the scalar path's one load
  // Two-pass online softmax over the registers: a max, then a sum, in both paths.
  EXPECT_EQ(Count(src, "acc0.max = kiln_cuda::warp_allreduce(acc0.max, kiln_cuda::MaxOp());"), 2);
  EXPECT_EQ(Count(src, "acc0.sum = kiln_cuda::warp_allreduce(acc0.sum, kiln_cuda::SumOp());"), 2);
  EXPECT_EQ(Count(src, ".Update("), 0) << src;
  // Pass B keeps exp(x - max) in the cache; phase 1 reads it instead of a second exp.
  EXPECT_EQ(Count(src, "kiln_c0[kiln_e * 4 + 3] = kiln_cuda::exp(kiln_c0[kiln_e * 4 + 3] - acc0.max);"), 1) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::exp("), 5) << src;  // 4 vector lanes + the scalar path
  // x * (1 / sum): the reciprocal is a common subexpression of the row, not a division per element.
  EXPECT_EQ(Count(src, " / acc0.sum"), Count(src, " * (float(1) / acc0.sum)")) << src;
  EXPECT_TRUE(absl::StrContains(src, "const bool kiln_vec = kiln_cuda::aligned(b0, 16) && kiln_cuda::aligned(b1, 16);"));
  EXPECT_EQ(launch.layout, CudaLayout::kWarpPerRow);
  EXPECT_EQ(launch.block, 256);
  EXPECT_EQ(launch.vector_width, 4);
  EXPECT_EQ(launch.cached_values, 32);
  absl::StatusOr<int64_t> grid = CudaGridSize(launch, {65536});
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(*grid, 132 * 8 * 4);  // four waves of 256-thread blocks on 132 SMs (by threads)
  EXPECT_EQ(*CudaGridSize(launch, {20}), 3);
  EXPECT_EQ(*CudaGridSize(launch, {0}), 1);
  EXPECT_FALSE(CudaGridSize(launch, {}).ok());
}

TEST(CudaEmitter, LongRowsGetABlockEachAndTooLongRowsAreNotCached) {
  CudaLaunch launch;
  std::string src = EmitOne(kt::RowSoftmax(8192, true), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
  EXPECT_EQ(launch.block, 256);  // the smallest block that caches <= 32 values per thread
  EXPECT_EQ(launch.cached_values, 32);
  EXPECT_TRUE(absl::StrContains(src, "block_allreduce<8>(acc0.max, kiln_cuda::MaxOp(), kiln_smem)"));
  EXPECT_TRUE(absl::StrContains(src, "block_allreduce<8>(acc0.sum, kiln_cuda::SumOp(), kiln_smem)"));
  EXPECT_TRUE(absl::StrContains(src, "alignas(16) __shared__ unsigned char kiln_smem[256];"));
  EmitOne(kt::RowSoftmax(32768, false), true, &launch);
  EXPECT_EQ(launch.block, 1024);
  EXPECT_EQ(launch.cached_values, 32);
  EmitOne(kt::RowSoftmax(2048, false), true, &launch);
  EXPECT_EQ(launch.block, 128);
  EXPECT_EQ(launch.cached_values, 16);
  src = EmitOne(kt::RowSoftmax(1 << 20, false), true, &launch);
  EXPECT_EQ(launch.block, 1024);
  EXPECT_EQ(launch.cached_values, 0);
  // Not cached: the online rule, one merge all-reduce.
  EXPECT_TRUE(absl::StrContains(src, "block_allreduce<32>(acc0, kiln_cuda::MergeOp(), kiln_smem)"));
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec<4>(b0"), 2) << "re-read in phase 1 when it cannot be cached";
}

TEST(CudaEmitter, Bf16UsesEightWideVectorsAndBitConversions) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::Bf16Chain(1 << 20), true, &launch);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_EQ(*CudaGridSize(launch, {}), 132 * 8 * 4 < (1 << 20) / (256 * 8) ? 132 * 8 * 4 : (1 << 20) / (256 * 8));
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::Vec<uint16_t, 8>"));
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::bf16_lane<7, 8>(kiln_lv0)")) << "lanes widen from the words";
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::f32_to_bf16("));
  EXPECT_TRUE(absl::StrContains(src, "using idx_t = int32_t;"));
}

// Loads masked by a test that holds for a whole vector or for none of it (a window's bounds, a
// cat's part: not the vector's dim) bound the vector's width as unmasked loads do (int64: 2
// lanes), and in vectors of 4 lanes or more they move as vectors too, read when the test holds
// and zero otherwise; the lanes test the mask again.
TEST(CudaEmitter, MaskedLoadsUniformAlongTheVectorSetItsWidthAndMoveAsVectors) {
  CudaLaunch launch;
  std::string src = EmitOne(ct::MaskedWindowGather(6, 64), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kPointwise);
  EXPECT_EQ(launch.vector_width, 2) << src;  // 8 bf16 lanes would read the int64s strided
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec_if<"), 0) << src;  // 2 lanes: scalar loads
  EXPECT_EQ(Count(src, "kiln_cuda::store_vec<2>(b2"), 1) << src;
  src = EmitOne(ct::CatRowsBf16(5, 7, 64), true, &launch);
  EXPECT_EQ(launch.vector_width, 8) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::Vec<uint16_t, 8> kiln_lv"), 2) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec_if<8>("), 2) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec<8>("), 0) << src;
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::aligned(b0, 16)")) << src;
  // The scalar path (misaligned pointers, tails) keeps its masked scalar loads.
  EXPECT_EQ(Count(src, " ? kiln_cuda::bf16_to_f32(b0["), 1) << src;
  // An access also loaded under a mask that reads the vector's dim stays scalar.
  src = EmitOne(ct::OneAccessTwoMasks(8, 64), true, &launch);
  EXPECT_EQ(launch.vector_width, 4) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec_if<"), 0) << src;
}

// bf16 rows as torch graphs give them (cast<f32>(load) folded, cast<bf16> stored): the widened
// load is the row cache's value, so the two-pass max/sum and the exp reuse work as in f32 (no
// second register array, one exp per element), and the store narrows once (no round_bf16).
TEST(CudaEmitter, OddRowsMoveInVectorsShiftedToEachRowsAlignment) {
  CudaLaunch launch;
  // 3001 bf16 columns: a row starts 3001 * row elements in, so its vectors of 8 start
  // (misalign(b0) + row * 3001 % 8) % 8 elements before it; the output row is as far from a
  // boundary (checked at run time), so both move as vectors; the row's first and last chunks go
  // element by element.
  std::string src = EmitOne(kt::RowSoftmaxBf16(3001), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::misalign(b1, 8) == kiln_cuda::misalign(b0, 8)")) << src;
  EXPECT_TRUE(absl::StrContains(src, "const idx_t kiln_sh = static_cast<idx_t>((kiln_cuda::misalign(b0, 8) + (o0 * 3001) % 8) % 8);")) << src;
  EXPECT_TRUE(absl::StrContains(src, "if (kiln_rb >= 0 && kiln_rb + 8 <= 3001)")) << src;
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::load_vec<8>(b0 + (")) << src;
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::store_vec<8>(b1 + (")) << src;
  EXPECT_TRUE(absl::StrContains(src, "if (kiln_r >= 0 && kiln_r < 3001)")) << src;
  // Layer norm: x and out shift with the row, the weight and bias (aligned, one row for all)
  // stay scalar loads inside the vector lanes.
  src = EmitOne(kt::LayerNormBf16(3001, 1e-5f), true, &launch);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_FALSE(absl::StrContains(src, "load_vec<8>(b1")) << src;
  EXPECT_FALSE(absl::StrContains(src, "misalign(b1")) << src;
  // Lengths that are a multiple of the width keep the plain vectors (no shift).
  src = EmitOne(kt::RowSoftmaxBf16(4096), true, &launch);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_FALSE(absl::StrContains(src, "kiln_sh")) << src;
  // Without vectors: scalar.
  src = EmitOne(kt::RowSoftmaxBf16(3001), false, &launch);
  EXPECT_EQ(launch.vector_width, 1);
}

// A softmax of an expression (attention's scores scaled and masked, kt::MaskedScaledSoftmax):
// the value's own registers (kiln_a0) take exp(v - max) in pass B, so the output phase, and the
// chained backward's two phases, read them: one exp per element, none recomputed.
TEST(CudaEmitter, SoftmaxOfAPrologueKeepsItsExpsInItsOwnRegisters) {
  CudaLaunch launch;
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    const std::string src = EmitOne(kt::MaskedScaledSoftmax(512, backward), true, &launch);
    EXPECT_EQ(launch.layout, CudaLayout::kWarpPerRow);
    EXPECT_EQ(launch.vector_width, 8);
    EXPECT_EQ(Count(src, "kiln_a0[kiln_e * 8 + 7] = kiln_cuda::exp_approx(kiln_a0[kiln_e * 8 + 7] - acc0.max);"), 1)
        << src;
    EXPECT_EQ(Count(src, "kiln_cuda::exp_approx("), 9) << src;  // 8 vector lanes + the scalar path
    EXPECT_EQ(Count(src, "kiln_cuda::exp("), 0) << src;
    EXPECT_EQ(Count(src, "kiln_m"), 0) << src;
    // Each element's scale and mask are computed once (phase 0), not again in later phases.
    EXPECT_EQ(Count(src, " * 0x1p-3f;"), 9) << src;
    // Scores and mask are read in later phases only inside those exps: not cached. The
    // backward's gradient (phases 1 and 2) is (in the vector and the scalar path).
    EXPECT_EQ(Count(src, "float kiln_c"), backward ? 2 : 0) << src;
    EXPECT_EQ(Count(src, "bool kiln_c"), 0) << src;
    EXPECT_EQ(launch.cached_values, backward ? 32 : 16) << src;
  }
  // 1024 columns: with the dead caches the row's registers (32 + 32 + 32 values) would not fit
  // the 64 a warp-per-row thread may cache, and the softmax would fall back to the online rule
  // with two exps per element.
  const std::string src = EmitOne(kt::MaskedScaledSoftmax(1024, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kWarpPerRow);
  EXPECT_EQ(Count(src, "kiln_a0[kiln_e * 8 + 7] = kiln_cuda::exp_approx(kiln_a0[kiln_e * 8 + 7] - acc0.max);"), 1)
      << src;
  EXPECT_EQ(Count(src, "kiln_cuda::exp_approx("), 9) << src;
}

TEST(CudaEmitter, Bf16SoftmaxCachesTheWidenedRowOnceWithOneExpPerElement) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::RowSoftmaxBf16(1024), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kWarpPerRow);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_EQ(launch.cached_values, 32) << src;
  EXPECT_FALSE(absl::StrContains(src, "kiln_a0")) << src;
  // bf16 results: the exps are exp_approx (PlanApproxExp), kept for phase 1.
  EXPECT_EQ(Count(src, "kiln_c0[kiln_e * 8 + 7] = kiln_cuda::exp_approx(kiln_c0[kiln_e * 8 + 7] - acc0.max);"), 1) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::exp_approx("), 9) << src;  // 8 vector lanes + the scalar path
  EXPECT_EQ(Count(src, "kiln_cuda::exp("), 0) << src;
  // f32 results keep accurate exps (kiln_cuda::exp, expf), shared rows or registers.
  for (int64_t cols : {1024, 50257}) {
    const std::string f32 = EmitOne(kt::RowSoftmax(cols, false), true, &launch);
    EXPECT_EQ(Count(f32, "exp_approx"), 0) << f32;
    EXPECT_GT(Count(f32, "kiln_cuda::exp("), 0) << f32;
  }
  // An accumulator the lowering marked approx_exp (its results reach the graph rounded to 16 bits:
  // a split softmax's partials) takes exp_approx although this kernel stores f32.
  for (int64_t cols : {1024, 50257}) {
    absl::StatusOr<Kernel> marked = kt::RowSoftmax(cols, false);
    ASSERT_TRUE(marked.ok());
    marked->accumulators[0].approx_exp = true;
    const std::string f32 = EmitOne(marked, true, &launch);
    EXPECT_GT(Count(f32, "exp_approx"), 0) << f32;
    // (50257 columns: the scalar path for rows whose buffers lie differently reads the row twice,
    // uncached, with the online rule and accurate exps.)
    if (cols == 1024) EXPECT_EQ(Count(f32, "kiln_cuda::exp("), 0) << f32;
  }
  EXPECT_EQ(Count(src, "round_bf16"), 0) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::f32_to_bf16("), 9) << src;
  // Welford over a widened load: two passes over the cache, no array of its own.
  const std::string ln = EmitOne(kt::LayerNormBf16(1024, 1e-5f), true, &launch);
  EXPECT_EQ(launch.cached_values, 32) << ln;
  EXPECT_FALSE(absl::StrContains(ln, "kiln_a0")) << ln;
  EXPECT_EQ(Count(ln, ".Update("), 0) << ln;
}

// The same kernel before and after the fusion of rms norm's epilogue: one row kernel, x cached.
TEST(CudaEmitter, RmsNormReadsTheRowOnce) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::RmsNorm(1024, 1e-6f, true), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kWarpPerRow);
  EXPECT_EQ(launch.cached_values, 32) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::load_vec<8>(b0"), 1) << src;
}

// torch gives `a.t() + b` a column-major output: the loops are permuted so that threads run along
// the stores, and the now-transposed b goes through the shared tile.
TEST(CudaEmitter, ColumnMajorOutputsPermuteTheLoopsAndTileTheOtherInput) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::TransposeAddColumnMajor(64, 96), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kTiled) << src;
  EXPECT_TRUE(absl::StrContains(src, "b2[o0 * 64 + o1] = ")) << src;  // lanes along o1: coalesced
  EXPECT_TRUE(absl::StrContains(src, "kiln_t0[kiln_i][kiln_lane] = b1[o0 + o1 * 96];")) << src;
  EXPECT_TRUE(absl::StrContains(src, "= b0[o0 * 64 + o1];")) << src;
  // Without tiles: vectors along the stores.
  EmitOne(kt::TransposeAddColumnMajor(64, 96), true, &launch, /*tile=*/false);
  EXPECT_EQ(launch.layout, CudaLayout::kPointwise);
  EXPECT_EQ(launch.vector_width, 4);
}

// A cat whose middle operand is transposed (a GPT attention backward's q, k, v gradients): the
// strided operand is staged through the tile under its mask, so masked-off columns read nothing,
// and the compute step reads the tile where it would read that load.
TEST(CudaEmitter, MaskedStridedLoadsAreStagedUnderTheirMask) {
  CudaLaunch launch;
  const std::string src = EmitOne(ct::CatTransposedBf16(64, 96), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kTiled) << src;
  EXPECT_EQ(Count(src, "__shared__"), 1) << src;  // only k is staged: q and v run along the stores
  EXPECT_TRUE(absl::StrContains(src, " ? kiln_cuda::bf16_to_f32(b1[")) << src;
  EXPECT_TRUE(absl::StrContains(src, " ? kiln_t0[kiln_xl][kiln_i] : float(0)")) << src;
}

TEST(CudaEmitter, SixtyFourBitIndicesForHugeSizesAndAThirtyTwoBitInstanceForScalars) {
  // Sizes over scalars: the body is instantiated for both index types, 32-bit when the scalars
  // make every size (plus the slack) fit.
  const std::string softmax = EmitOne(kt::RowSoftmax(1024, false));
  EXPECT_FALSE(absl::StrContains(softmax, "using idx_t")) << softmax;
  EXPECT_TRUE(absl::StrContains(softmax, "if (1024.0 * static_cast<double>(n0) <= 2143289343.0) {\n"
                                         "    kiln_kernel_0_body<int32_t>(b0, b1, n0);"))
      << softmax;
  EXPECT_TRUE(absl::StrContains(softmax, "kiln_kernel_0_body<int64_t>(b0, b1, n0);"));
  // Block per row: the static shared memory is the kernel's, passed to the body.
  const std::string log_softmax = EmitOne(kt::RowSoftmax(8192, true));
  EXPECT_TRUE(absl::StrContains(log_softmax, "kiln_kernel_0_body<int32_t>(b0, b1, n0, kiln_smem);"))
      << log_softmax;
  EXPECT_TRUE(absl::StrContains(EmitOne(kt::Bf16Chain(int64_t{3} << 30)), "using idx_t = int64_t;"));
}

TEST(CudaEmitter, ArchPicksTheSmCountOnlyAndTheSourceIsTheSame) {
  absl::StatusOr<Kernel> k = kt::RowSoftmax(1024, false);
  ASSERT_TRUE(k.ok());
  CudaEmitOptions a100;
  a100.arch = "sm_80";
  absl::StatusOr<CudaSource> s80 = EmitCudaSource({*k}, a100);
  absl::StatusOr<CudaSource> s90 = EmitCudaSource({*k});
  ASSERT_TRUE(s80.ok() && s90.ok());
  EXPECT_EQ(s80->source, s90->source);
  EXPECT_EQ(s80->launches[0].max_grid, 108 * 8 * 4);
  EXPECT_EQ(s90->launches[0].max_grid, 132 * 8 * 4);
}

TEST(CudaEmitter, NothingFromTheGraphReachesTheSource) {
  KernelBuilder kb("*/ evil(); /* \"name\" \\n");
  const Buffer a = kb.AddBuffer(ScalarType::kFloat32, Access::kRead, Size::Const(4));
  const Buffer out = kb.AddBuffer(ScalarType::kFloat32, Access::kWrite, Size::Const(4));
  const Var i = kb.AddOuter(Size::Const(4));
  const Index idx = MakeIndex(Size(), {{i, Size::Const(1)}});
  kb.Add(Store(out, idx, Add(Load(a, idx), ConstFloat(ScalarType::kFloat32, 0.1f))));
  absl::StatusOr<Kernel> k = kb.Finish();
  const std::string src = EmitOne(k);
  EXPECT_FALSE(absl::StrContains(src, "evil"));
  EXPECT_TRUE(absl::StrContains(src, "0x1.99999ap-4f")) << src;  // exact hex literal
}

TEST(CudaEmitter, TheWholeSourceHasThePreludeAndEverySymbol) {
  absl::StatusOr<Kernel> a = kt::Bf16Chain(100), b = kt::LayerNorm(64, 1e-5f);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<CudaSource> src = EmitCudaSource({*a, *b});
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->symbols, (std::vector<std::string>{"kiln_kernel_0", "kiln_kernel_1"}));
  EXPECT_EQ(src->launches.size(), 2u);
  EXPECT_TRUE(absl::StrContains(src->source, "namespace kiln_cuda"));
  EXPECT_FALSE(absl::StrContains(src->source, "#include \""));
  EXPECT_FALSE(absl::StrContains(src->source, "#include <cuda"));
}

TEST(CudaEmitter, KernelsTakeTheSymbolPrefix) {
  absl::StatusOr<Kernel> a = kt::Bf16Chain(100), b = kt::LayerNorm(64, 1e-5f);
  ASSERT_TRUE(a.ok() && b.ok());
  CudaEmitOptions options;
  options.symbol_prefix = "kiln_0123abcd_";
  absl::StatusOr<CudaSource> src = EmitCudaSource({*a, *b}, options);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->symbols, (std::vector<std::string>{"kiln_0123abcd_0", "kiln_0123abcd_1"}));
  EXPECT_TRUE(absl::StrContains(src->kernel_sources[1], " kiln_0123abcd_1(")) << src->kernel_sources[1];
  EXPECT_FALSE(absl::StrContains(src->source, "kiln_kernel_"));
  for (const char* bad : {"", "kiln-x_", "9kiln_", "kiln_\"; evil();"}) {
    options.symbol_prefix = bad;
    EXPECT_EQ(EmitCudaSource({*a}, options).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CudaEmitter, AKernelThatDoesNotVerifyIsAnError) {
  Kernel k;
  k.num_scalars = 0;
  k.outer = {Size::Param(3)};
  absl::StatusOr<CudaSource> src = EmitCudaSource({k});
  ASSERT_FALSE(src.ok());
  EXPECT_TRUE(absl::StrContains(src.status().message(), "kernel 0")) << src.status();
  CudaEmitOptions bad;
  bad.pointwise_block = 100;
  EXPECT_EQ(EmitCudaSource({}, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::codegen
