// CudaEmitter's rows too long for a block (cuda_emitter.h, cuda_long_rows.h): spread over a
// cluster (kClusterRow), cached in shared memory (kSharedRow), and the store phases of sliced rows
// realigned to the output (cuda_emit_realigned_stores.cc). Golden sources and launch choices.

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/codegen/cuda_emitter.h"
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

// A 65536-column f32 softmax does not fit one block's registers: on sm_90 the row is spread over
// a cluster of 4 blocks of 512 threads (32 values each, read once), the all-reduces meet in
// distributed shared memory, and the grid is a multiple of the cluster. sm_80 keeps one block.
TEST(CudaEmitterGolden, RowsTooLongForABlockSpreadOverACluster) {
  CudaLaunch launch;
  const std::string src = EmitOne(kt::RowSoftmax(65536, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kClusterRow);
  EXPECT_EQ(launch.cluster, 4);
  EXPECT_EQ(launch.block, 512);
  EXPECT_EQ(launch.cached_values, 32);
  EXPECT_EQ(src, R"(// kiln_kernel_0: cluster_row, 1 outer dims, 1 reduction dims, 2 phases, vector width 4, 32 cached values per thread
template <typename idx_t>
KILN_DEV void kiln_kernel_0_body(const float* __restrict__ b0, float* __restrict__ b1, int64_t n0, unsigned char* kiln_smem) {
  const bool kiln_vec = kiln_cuda::aligned(b0, 16) && kiln_cuda::aligned(b1, 16);
  const int kiln_lane = static_cast<int>(blockIdx.x % 4u) * 512 + static_cast<int>(threadIdx.x);
  uint32_t* const kiln_pub = reinterpret_cast<uint32_t*>(kiln_smem + 256);
  unsigned kiln_parity = 0;
  for (idx_t kiln_u = blockIdx.x / 4u; kiln_u < n0; kiln_u += gridDim.x / 4u) {
    const idx_t o0 = kiln_u;
    if (kiln_vec) {
      kiln_cuda::OnlineSoftmax<float> acc0;
      float kiln_c0[32];
      // phase 0
#pragma unroll
      for (int kiln_e = 0; kiln_e < 8; ++kiln_e) {
        const idx_t kiln_rb = (static_cast<idx_t>(kiln_e) * 2048 + kiln_lane) * 4;
        {
          const idx_t r0 = kiln_rb;
          const kiln_cuda::Vec<float, 4> kiln_lv0 = kiln_cuda::load_vec<4>(b0 + (o0 * 65536 + r0));
          {
            const idx_t kiln_r = kiln_rb + 0;
            const idx_t r0 = kiln_r;
            kiln_c0[kiln_e * 4 + 0] = kiln_lv0.v[0];
            const float v0 = kiln_c0[kiln_e * 4 + 0];
            acc0.max = kiln_cuda::max_nan(acc0.max, v0);
          }
          {
            const idx_t kiln_r = kiln_rb + 1;
            const idx_t r0 = kiln_r;
            kiln_c0[kiln_e * 4 + 1] = kiln_lv0.v[1];
            const float v1 = kiln_c0[kiln_e * 4 + 1];
            acc0.max = kiln_cuda::max_nan(acc0.max, v1);
          }
          {
            const idx_t kiln_r = kiln_rb + 2;
            const idx_t r0 = kiln_r;
            kiln_c0[kiln_e * 4 + 2] = kiln_lv0.v[2];
            const float v2 = kiln_c0[kiln_e * 4 + 2];
            acc0.max = kiln_cuda::max_nan(acc0.max, v2);
          }
          {
            const idx_t kiln_r = kiln_rb + 3;
            const idx_t r0 = kiln_r;
            kiln_c0[kiln_e * 4 + 3] = kiln_lv0.v[3];
            const float v3 = kiln_c0[kiln_e * 4 + 3];
            acc0.max = kiln_cuda::max_nan(acc0.max, v3);
          }
        }
      }
      acc0.max = kiln_cuda::block_allreduce<16>(acc0.max, kiln_cuda::MaxOp(), kiln_smem);
      {
        const float kiln_m = acc0.max == -kiln_cuda::inf<float>() ? float(0) : acc0.max;
#pragma unroll
        for (int kiln_e = 0; kiln_e < 8; ++kiln_e) {
          kiln_c0[kiln_e * 4 + 0] = kiln_cuda::exp(kiln_c0[kiln_e * 4 + 0] - kiln_m);
          acc0.sum += kiln_c0[kiln_e * 4 + 0];
          kiln_c0[kiln_e * 4 + 1] = kiln_cuda::exp(kiln_c0[kiln_e * 4 + 1] - kiln_m);
          acc0.sum += kiln_c0[kiln_e * 4 + 1];
          kiln_c0[kiln_e * 4 + 2] = kiln_cuda::exp(kiln_c0[kiln_e * 4 + 2] - kiln_m);
          acc0.sum += kiln_c0[kiln_e * 4 + 2];
          kiln_c0[kiln_e * 4 + 3] = kiln_cuda::exp(kiln_c0[kiln_e * 4 + 3] - kiln_m);
          acc0.sum += kiln_c0[kiln_e * 4 + 3];
        }
      }
      acc0.sum = kiln_cuda::block_allreduce<16>(acc0.sum, kiln_cuda::SumOp(), kiln_smem);
      const float kiln_bm0 = acc0.max;
      acc0 = kiln_cuda::cluster_fold<4>(acc0, kiln_cuda::MergeOp(), kiln_pub, &kiln_parity);
      const float kiln_rs0 = kiln_bm0 == -kiln_cuda::inf<float>() && acc0.max > -kiln_cuda::inf<float>() ? float(0) : kiln_cuda::exp(kiln_bm0 - acc0.max);
      // phase 1
#pragma unroll
      for (int kiln_e = 0; kiln_e < 8; ++kiln_e) {
        const idx_t kiln_rb = (static_cast<idx_t>(kiln_e) * 2048 + kiln_lane) * 4;
        {
          const idx_t r0 = kiln_rb;
          kiln_cuda::Vec<float, 4> kiln_sv0;
          {
            const idx_t kiln_r = kiln_rb + 0;
            const idx_t r0 = kiln_r;
            const float v4 = (kiln_c0[kiln_e * 4 + 0] * kiln_rs0) * (float(1) / acc0.sum);
            kiln_sv0.v[0] = v4;
          }
          {
            const idx_t kiln_r = kiln_rb + 1;
            const idx_t r0 = kiln_r;
            const float v5 = (kiln_c0[kiln_e * 4 + 1] * kiln_rs0) * (float(1) / acc0.sum);
            kiln_sv0.v[1] = v5;
          }
          {
            const idx_t kiln_r = kiln_rb + 2;
            const idx_t r0 = kiln_r;
            const float v6 = (kiln_c0[kiln_e * 4 + 2] * kiln_rs0) * (float(1) / acc0.sum);
            kiln_sv0.v[2] = v6;
          }
          {
            const idx_t kiln_r = kiln_rb + 3;
            const idx_t r0 = kiln_r;
            const float v7 = (kiln_c0[kiln_e * 4 + 3] * kiln_rs0) * (float(1) / acc0.sum);
            kiln_sv0.v[3] = v7;
          }
          kiln_cuda::store_vec<4>(b1 + (o0 * 65536 + r0), kiln_sv0);
        }
      }
    }
    else {
      kiln_cuda::OnlineSoftmax<float> acc0;
      float kiln_c0[32];
      // phase 0
#pragma unroll
      for (int kiln_e = 0; kiln_e < 32; ++kiln_e) {
        const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 2048 + kiln_lane;
        const idx_t kiln_r = kiln_rb;
        const idx_t r0 = kiln_r;
        kiln_c0[kiln_e] = b0[o0 * 65536 + r0];
        const float v8 = kiln_c0[kiln_e];
        acc0.max = kiln_cuda::max_nan(acc0.max, v8);
      }
      acc0.max = kiln_cuda::block_allreduce<16>(acc0.max, kiln_cuda::MaxOp(), kiln_smem);
      {
        const float kiln_m = acc0.max == -kiln_cuda::inf<float>() ? float(0) : acc0.max;
#pragma unroll
        for (int kiln_e = 0; kiln_e < 32; ++kiln_e) {
          kiln_c0[kiln_e] = kiln_cuda::exp(kiln_c0[kiln_e] - kiln_m);
          acc0.sum += kiln_c0[kiln_e];
        }
      }
      acc0.sum = kiln_cuda::block_allreduce<16>(acc0.sum, kiln_cuda::SumOp(), kiln_smem);
      const float kiln_bm0 = acc0.max;
      acc0 = kiln_cuda::cluster_fold<4>(acc0, kiln_cuda::MergeOp(), kiln_pub, &kiln_parity);
      const float kiln_rs0 = kiln_bm0 == -kiln_cuda::inf<float>() && acc0.max > -kiln_cuda::inf<float>() ? float(0) : kiln_cuda::exp(kiln_bm0 - acc0.max);
      // phase 1
#pragma unroll
      for (int kiln_e = 0; kiln_e < 32; ++kiln_e) {
        const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 2048 + kiln_lane;
        const idx_t kiln_r = kiln_rb;
        const idx_t r0 = kiln_r;
        const float v9 = (kiln_c0[kiln_e] * kiln_rs0) * (float(1) / acc0.sum);
        b1[o0 * 65536 + r0] = v9;
      }
    }
  }
  kiln_cuda::cluster_sync();  // no block leaves while others may read its slots
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(512, 2) kiln_kernel_0(const float* __restrict__ b0, float* __restrict__ b1, int64_t n0) {
  unsigned char* const kiln_smem = kiln_cuda::cluster_smem<320>();
  if (65536.0 * static_cast<double>(n0) <= 2143289343.0) {
    kiln_kernel_0_body<int32_t>(b0, b1, n0, kiln_smem);
  }
  else {
    kiln_kernel_0_body<int64_t>(b0, b1, n0, kiln_smem);
  }
}
)");
  EXPECT_EQ(CudaGridSize(launch, {5}).value(), 20);
  EXPECT_EQ(CudaGridSize(launch, {0}).value(), 4);
  EXPECT_EQ(CudaGridSize(launch, {1 << 20}).value() % 4, 0);
}

TEST(CudaEmitterGolden, LongRowsWithRowsEnoughAreCachedInSharedMemory) {
  // The vocabulary softmax (bf16, 50257 columns, rows unknown): one block of 512 per row, the row
  // as bf16 bit patterns in dynamic shared memory, slot-major (element (slot, thread) at
  // [slot * 512 + threadIdx.x]), widened at each read; two per SM. Scalar (vectorize = false)
  // to keep the golden short; the vector path is checked below.
  CudaLaunch launch;
  std::string src = EmitOne(kt::RowSoftmaxBf16(50257), /*vectorize=*/false, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.block, 512);
  EXPECT_EQ(launch.shared_bytes, 99 * 512 * 2);
  EXPECT_EQ(launch.cached_values, 0);
  EXPECT_EQ(launch.max_grid, 264);
  EXPECT_EQ(src, R"(// kiln_kernel_0: shared_row, 1 outer dims, 1 reduction dims, 2 phases, vector width 1, 0 cached values per thread, 101376 bytes of shared row cache per block
template <typename idx_t>
KILN_DEV void kiln_kernel_0_body(const uint16_t* __restrict__ b0, uint16_t* __restrict__ b1, int64_t n0, unsigned char* kiln_smem) {
  const int kiln_lane = threadIdx.x;
  unsigned char* const kiln_dsmem = kiln_cuda::dynamic_smem();
  for (idx_t kiln_u = blockIdx.x; kiln_u < n0; kiln_u += gridDim.x) {
    const idx_t o0 = kiln_u;
    kiln_cuda::OnlineSoftmax<float> acc0;
    uint16_t* const kiln_c0 = reinterpret_cast<uint16_t*>(kiln_dsmem + 0);
    // phase 0
#pragma unroll 4
    for (int kiln_e = 0; kiln_e < 99; ++kiln_e) {
      const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 512 + kiln_lane;
      if (kiln_rb < 50257) {
        const idx_t kiln_r = kiln_rb;
        const idx_t r0 = kiln_r;
        const uint16_t v0 = b0[o0 * 50257 + r0];
        kiln_c0[kiln_e * 512 + kiln_lane] = v0;
        const float v1 = kiln_cuda::bf16_to_f32(v0);
        acc0.max = kiln_cuda::max_nan(acc0.max, v1);
      }
    }
    acc0.max = kiln_cuda::block_allreduce<16>(acc0.max, kiln_cuda::MaxOp(), kiln_smem);
    {
      const float kiln_m = acc0.max == -kiln_cuda::inf<float>() ? float(0) : acc0.max;
#pragma unroll 4
      for (int kiln_e = 0; kiln_e < 99; ++kiln_e) {
        if ((static_cast<idx_t>(kiln_e) * 512 + kiln_lane) < 50257) {
          acc0.sum += kiln_cuda::exp_approx(kiln_cuda::bf16_to_f32(kiln_c0[kiln_e * 512 + kiln_lane]) - kiln_m);
        }
      }
    }
    acc0.sum = kiln_cuda::block_allreduce<16>(acc0.sum, kiln_cuda::SumOp(), kiln_smem);
    // phase 1
#pragma unroll 4
    for (int kiln_e = 0; kiln_e < 99; ++kiln_e) {
      const idx_t kiln_rb = static_cast<idx_t>(kiln_e) * 512 + kiln_lane;
      if (kiln_rb < 50257) {
        const idx_t kiln_r = kiln_rb;
        const idx_t r0 = kiln_r;
        const float v2 = kiln_cuda::bf16_to_f32(kiln_c0[kiln_e * 512 + kiln_lane]);
        const float v3 = v2 - acc0.max;
        const float v4 = kiln_cuda::exp_approx(v3);
        const float v5 = v4 * (float(1) / acc0.sum);
        b1[o0 * 50257 + r0] = kiln_cuda::f32_to_bf16(v5);
      }
    }
  }
}
extern "C" __global__ void __launch_bounds__(512, 2) kiln_kernel_0(const uint16_t* __restrict__ b0, uint16_t* __restrict__ b1, int64_t n0) {
  alignas(16) __shared__ unsigned char kiln_smem[256];
  if (50257.0 * static_cast<double>(n0) <= 2143289343.0) {
    kiln_kernel_0_body<int32_t>(b0, b1, n0, kiln_smem);
  }
  else {
    kiln_kernel_0_body<int64_t>(b0, b1, n0, kiln_smem);
  }
}
)");
  // Vectors of 8 shifted to each row's alignment: 13 chunks of 8 slots per thread (104 KiB), one
  // cache a block (kShared; by default sm_90 takes two, below).
  src = EmitOne(kt::RowSoftmaxBf16(50257), /*vectorize=*/true, &launch, true, CudaLongRows::kShared);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_EQ(launch.shared_bytes, 13 * 8 * 512 * 2);
  EXPECT_EQ(launch.max_grid, 264);
  EXPECT_TRUE(absl::StrContains(src, "__launch_bounds__(512, 2)")) << src;
  // The vector path's slots are chunks (Vec<uint16_t, 8>, chunk-major), filled before phase 0 by
  // one cp.async per chunk within the row and element by element at its edges; every phase reads
  // them from shared memory (a chunk's vector once), none from global memory.
  EXPECT_TRUE(absl::StrContains(src, "kiln_cuda::Vec<uint16_t, 8>* const kiln_c0 = "
                                     "reinterpret_cast<kiln_cuda::Vec<uint16_t, 8>*>(kiln_dsmem + 0);"))
      << src;
  EXPECT_EQ(Count(src, "kiln_cuda::cp_async<16>(&kiln_c0[kiln_e * 512 + kiln_lane], b0 + (o0 * 50257 + r0));"), 1);
  EXPECT_EQ(Count(src, "kiln_c0[kiln_e * 512 + kiln_lane].v[7] = b0[o0 * 50257 + r0];"), 1) << "edge lanes fill";
  EXPECT_EQ(Count(src, "kiln_cuda::cp_async_wait_all();"), 1);
  EXPECT_LT(src.find("kiln_cuda::cp_async_wait_all();"), src.find("acc0.max = kiln_cuda::max_nan"));
  // Phase 0 within the row: one packed max per chunk's vector; edge lanes one by one.
  EXPECT_EQ(Count(src, "acc0.max = kiln_cuda::max_nan(acc0.max, kiln_cuda::max_nan_half<true, 8>(kiln_lv0));"), 1)
      << src;
  EXPECT_EQ(Count(src, "acc0.max = kiln_cuda::max_nan(acc0.max, v"), 8) << src;
  EXPECT_EQ(Count(src, "const kiln_cuda::Vec<uint16_t, 8> kiln_lv0 = kiln_c0[kiln_e * 512 + kiln_lane];"), 2)
      << "phases 0 and 1 read a chunk's vector once";
  EXPECT_EQ(Count(src, "const kiln_cuda::Vec<uint16_t, 8> kiln_x = kiln_c0[kiln_e * 512 + kiln_lane];"), 1)
      << "pass B too";
  EXPECT_EQ(Count(src, "kiln_cuda::bf16_to_f32(kiln_c0[kiln_e * 512 + kiln_lane].v[7])"), 2)
      << "edge lanes of phases 0 and 1 read and widen";
  EXPECT_EQ(Count(src, "load_vec<8>(b0"), 0) << "no global vector loads of the cached row";
  EXPECT_FALSE(absl::StrContains(src, "] = kiln_cuda::exp")) << "no exps into 16-bit slots";
  // Pass B folds a chunk within the row without a check per lane; the row's first and last
  // chunks check each lane (as phase 0 and 1 do).
  EXPECT_EQ(Count(src, "const idx_t kiln_rb = (static_cast<idx_t>(kiln_e) * 512 + kiln_lane) * 8 - kiln_sh;"), 4)
      << "fill, phase 0, pass B, phase 1";
  EXPECT_EQ(Count(src, "if (kiln_rb >= 0 && kiln_rb + 8 <= 50257)"), 4) << "fill, phase 0, pass B, phase 1";
  EXPECT_EQ(Count(src, "acc0.sum += kiln_cuda::exp_approx(kiln_cuda::bf16_lane<7, 8>(kiln_x) - kiln_m);"), 2)
      << "vector and edge lanes";
  // By default (sm_90: bulk copies, and two caches fit a block): one block per SM with two
  // caches and their mbarriers. Thread 0 fills a block's first row, stores the row's edge chunks
  // from registers, a barrier, then it starts the next row's fill into the other cache (the
  // edges into registers), and every thread waits for this row's cache: no cp.async, and the
  // phases read the cache as above.
  src = EmitOne(kt::RowSoftmaxBf16(50257), /*vectorize=*/true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.shared_bytes, 2 * 13 * 8 * 512 * 2 + 16);
  EXPECT_EQ(launch.max_grid, 132);
  EXPECT_TRUE(absl::StrContains(src, "__launch_bounds__(512, 1)")) << src;
  EXPECT_EQ(Count(src, "cp_async"), 0) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::mbar_init(kiln_bars"), 2);
  EXPECT_EQ(Count(src, "kiln_cuda::bulk_copy(&kiln_c0[kiln_f0], b0 + (o0 * 50257 + r0), "
                       "static_cast<uint32_t>((kiln_f1 - kiln_f0) * 16), kiln_bars + "), 2)
      << "a block's first row, and the next row";
  EXPECT_EQ(Count(src, "kiln_c0_tail.v[7] = b0[o0 * 50257 + r0];"), 2);
  EXPECT_EQ(Count(src, "kiln_c0_head.v[0] = b0[o0 * 50257 + r0];"), 2);
  const size_t edges = src.find("if (kiln_sh > 0) kiln_c0[0] = kiln_c0_head;");
  const size_t barrier = src.find("__syncthreads();  // the edges are in");
  const size_t next = src.find("kiln_cuda::fence_proxy_async();");
  const size_t wait = src.find("kiln_cuda::mbar_wait(kiln_bars + kiln_buf, (kiln_parity >> kiln_buf) & 1u);");
  ASSERT_NE(edges, std::string::npos) << src;
  EXPECT_LT(edges, barrier);
  EXPECT_LT(barrier, next);
  EXPECT_LT(next, wait);
  EXPECT_LT(wait, src.find("acc0.max = kiln_cuda::max_nan"));
  EXPECT_TRUE(absl::StrContains(src, "reinterpret_cast<kiln_cuda::Vec<uint16_t, 8>*>(kiln_dsmem + 0 + (kiln_buf ^ 1) * 106496);"))
      << "the next row's fill goes to the other cache";
  // A layer norm's Welford reads the cached bf16 row in its pass B too; its phase 1 loads the
  // weight and bias along the row, so one cache and two blocks per SM (their warps hide those
  // loads' latency).
  src = EmitOne(kt::LayerNormBf16(50257, 1e-5f), /*vectorize=*/true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.shared_bytes, 13 * 8 * 512 * 2);
  EXPECT_EQ(launch.max_grid, 264);
  EXPECT_TRUE(absl::StrContains(src, ".mean;")) << src;
  // f32 rows too long for registers take one block per SM (by default too); f32 65536 columns
  // (256 KiB) fit no block and stay a cluster.
  EmitOne(kt::RowSoftmax(40000, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.max_grid, 132);
  EmitOne(kt::RowSoftmax(65536, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kClusterRow);
}

// softmax(x[:, 1:], -1): the input row starts 1 element in, with a stride of cols + 1, the
// output is contiguous. The loads anchor the rows' shifted vectors, so the output (another
// residue modulo 8) is not in their plan; the store phase walks the output's own chunks (its
// shift kiln_so), reads each chunk's elements from the cache as the window of the two cache
// chunks that hold them, and stores 16-byte vectors; scalar lanes at the row's ends only.
TEST(CudaEmitter, SlicedSoftmaxStoresVectorsAlignedToTheOutput) {
  CudaLaunch launch;
  const std::string src = EmitOne(ct::SlicedRowSoftmax(ScalarType::kBFloat16, 50257), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_EQ(launch.max_grid, 132) << "two caches, bulk copies";
  EXPECT_TRUE(absl::StrContains(src, "const idx_t kiln_sh = static_cast<idx_t>((kiln_cuda::misalign(b0, 8) + (o0 * 50258 + 1) % 8) % 8);")) << src;
  EXPECT_TRUE(absl::StrContains(src, "const idx_t kiln_so = static_cast<idx_t>((kiln_cuda::misalign(b1, 8) + (o0 * 50257) % 8) % 8);")) << src;
  EXPECT_EQ(Count(src, "kiln_cuda::store_vec<8>(b1 + (o0 * 50257 + r0), kiln_sv0);"), 1) << src;
  EXPECT_EQ(Count(src, "const kiln_cuda::Vec<uint16_t, 8> kiln_lv0 = kiln_cuda::window(kiln_c0[kiln_w0], kiln_c0[kiln_w1], kiln_wo);"), 1) << src;
  EXPECT_EQ(Count(src, "kiln_sv0.v[7] = kiln_cuda::f32_to_bf16("), 1) << src;
  EXPECT_EQ(Count(src, "b1[o0 * 50257 + r0] = "), 8 + 1)
      << "the row's end lanes; the uncached scalar path for buffers that lie differently" << src;
  EXPECT_EQ(Count(src, "kiln_cuda::bulk_copy(&kiln_c0[kiln_f0], b0 + (o0 * 50258 + r0 + 1)"), 2) << src;
  EXPECT_EQ(Count(src, "__syncthreads();  // every window is read"), 1) << src;
  EXPECT_EQ(Count(src, "__syncthreads();  // the cache is whole"), 0) << "phase 0's all-reduces ordered the fill" << src;
  // f32: vectors of 4; the exps pass B kept in the cache are read through the windows.
  const std::string f32 =
      EmitOne(ct::SlicedRowSoftmax(ScalarType::kFloat32, 20001), true, &launch, true, CudaLongRows::kShared);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.vector_width, 4);
  EXPECT_EQ(Count(f32, "kiln_cuda::store_vec<4>(b1 + (o0 * 20001 + r0), kiln_sv0);"), 1) << f32;
  EXPECT_EQ(Count(f32, "const kiln_cuda::Vec<float, 4> kiln_lv0 = kiln_cuda::window(kiln_c0[kiln_w0], kiln_c0[kiln_w1], kiln_wo);"), 1) << f32;
  EXPECT_EQ(Count(f32, " = kiln_lv0.v[3] * (float(1) / acc0.sum);"), 2) << "vector and edge lanes, no second exp" << f32;
  // Contiguous rows (the store in the loads' plan) and rows in registers keep their source: the
  // vocabulary softmax's, byte for byte (its size and 64-bit FNV-1a hash; KILN_PRINT_GOLDEN=1
  // prints it: update these only for a change meant to alter that kernel).
  const std::string contiguous = EmitOne(kt::RowSoftmaxBf16(50257), true, &launch);
  uint64_t fnv = 14695981039346656037ull;
  for (unsigned char c : contiguous) fnv = (fnv ^ c) * 1099511628211ull;
  EXPECT_EQ(contiguous.size(), 25571u);
  EXPECT_EQ(fnv, 8296261775918343802ull);
  EXPECT_EQ(Count(contiguous, "kiln_cuda::window("), 0);
  EXPECT_EQ(Count(EmitOne(ct::SlicedRowSoftmax(ScalarType::kBFloat16, 3001), true, &launch), "kiln_cuda::window("), 0);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow) << "fewer than one vector a thread of a 512-thread block";
  // Rows that one block's registers would hold (32001 bf16 columns) take the row cache for their
  // stray stores (ClusterRowFacts::stray_stores); the same length with the store in the loads'
  // plan stays in registers.
  const std::string mid = EmitOne(ct::SlicedRowSoftmax(ScalarType::kBFloat16, 32001), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(Count(mid, "kiln_cuda::store_vec<8>(b1 + (o0 * 32001 + r0), kiln_sv0);"), 1) << mid;
  EmitOne(kt::RowSoftmaxBf16(12001), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
  // bf16 rows that registers hold only in 1024-thread blocks take the row cache (two of them).
  EmitOne(kt::RowSoftmaxBf16(32000), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.shared_bytes, 2 * 512 * 8 * 8 * 2 + 16);
  EmitOne(kt::RowSoftmaxBf16(16384), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
  // f32: 32000 columns take the row cache; 32768, whole chunks of a 1024-thread block, registers.
  EmitOne(kt::RowSoftmax(32000, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EmitOne(kt::RowSoftmax(32768, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
}

TEST(CudaEmitter, ClustersOnlyOnSm90AndForFewLongRowsOrRowsTooLongForABlock) {
  CudaLaunch launch;
  // sm_80 has no clusters: one block per row, not cached.
  absl::StatusOr<Kernel> k = kt::RowSoftmax(65536, false);
  ASSERT_TRUE(k.ok());
  CudaEmitOptions a100;
  a100.arch = "sm_80";
  absl::StatusOr<CudaSource> s80 = EmitCudaSource({*k}, a100);
  ASSERT_TRUE(s80.ok());
  EXPECT_EQ(s80->launches[0].layout, CudaLayout::kBlockPerRow);
  EXPECT_EQ(s80->launches[0].cluster, 1);
  EXPECT_FALSE(absl::StrContains(s80->source.substr(s80->prelude.size()), "cluster"));
  // 262144 columns: 16 blocks of 512 threads (a non-portable cluster size: the runtime allows it
  // per kernel), two blocks an SM; 8 x 1024 within the portable limit.
  std::string src = EmitOne(kt::RowSoftmax(262144, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kClusterRow);
  EXPECT_EQ(launch.cluster, 16);
  EXPECT_EQ(launch.block, 512);
  EXPECT_TRUE(absl::StrContains(src, "__cluster_dims__(16, 1, 1) __launch_bounds__(512, 2)"));
  CudaEmitOptions portable;
  portable.include_prelude = false;
  portable.max_small_cluster = 0;
  absl::StatusOr<Kernel> long_rows = kt::RowSoftmax(262144, false);
  ASSERT_TRUE(long_rows.ok());
  absl::StatusOr<CudaSource> s8 = EmitCudaSource({*long_rows}, portable);
  ASSERT_TRUE(s8.ok());
  EXPECT_EQ(s8->launches[0].cluster, 8);
  EXPECT_EQ(s8->launches[0].block, 1024);
  // The vocabulary softmax: odd length, bf16 (vectors of 8 shifted to each row's alignment), an
  // unknown number of rows: by default one block per row caching it in shared memory
  // (cuda_long_rows.h; golden below).
  src = EmitOne(kt::RowSoftmaxBf16(50257), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kSharedRow);
  EXPECT_EQ(launch.cluster, 1);
  // Forced to one uncached block of 1024 per row, read twice, with two blocks per SM at most
  // (264 rows in flight fit kL2RowBytes).
  src = EmitOne(kt::RowSoftmaxBf16(50257), true, &launch, true, CudaLongRows::kBlockPerRow);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
  EXPECT_EQ(launch.block, 1024);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_EQ(launch.cached_values, 0);
  EXPECT_EQ(launch.max_grid, 264);
  EXPECT_EQ(Count(src, "#pragma unroll 4\n"), 4) << "two phases, vector and scalar paths" << src;
  // Forced into a cluster: 5 x 512 threads x 3 chunks of 8 values (3/4 of the usual 32: no
  // spills at 64 registers).
  src = EmitOne(kt::RowSoftmaxBf16(50257), true, &launch, true, CudaLongRows::kCluster);
  EXPECT_EQ(launch.layout, CudaLayout::kClusterRow);
  EXPECT_EQ(launch.cluster, 5);
  EXPECT_EQ(launch.vector_width, 8);
  EXPECT_EQ(launch.cached_values, 24);
  EXPECT_EQ(Count(src, "cluster_fold<5>("), 1) << "the vector path's block max and sum, folded once";
  EXPECT_EQ(Count(src, "cluster_allreduce<16, 5>("), 1) << "the uncached scalar path's online softmax";
  // Per kernel: the second of two copies forced to one block per row.
  CudaEmitOptions clusters;
  clusters.include_prelude = false;
  clusters.long_rows = CudaLongRows::kCluster;
  clusters.kernel_long_rows = {CudaLongRows::kCluster, CudaLongRows::kBlockPerRow};
  absl::StatusOr<Kernel> vocab = kt::RowSoftmaxBf16(50257);
  ASSERT_TRUE(vocab.ok());
  absl::StatusOr<CudaSource> forced = EmitCudaSource({*vocab, *vocab}, clusters);
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->launches[0].layout, CudaLayout::kClusterRow);
  EXPECT_EQ(forced->launches[1].layout, CudaLayout::kBlockPerRow);
  // Layer norm over 65536 columns (Welford in two passes over the cached row).
  src = EmitOne(kt::LayerNorm(65536, 1e-5f), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kClusterRow);
  EXPECT_EQ(launch.cached_values, 32);
  // 64 sums of 262144 columns: a split reduction over clusters of 5 blocks; 1 row: 8 blocks.
  src = EmitOne(kt::RowSum(64, 262144, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kClusterRow);
  EXPECT_EQ(launch.cluster, 5);
  EXPECT_EQ(CudaGridSize(launch, {}).value(), 320);
  EXPECT_TRUE(absl::StrContains(src, "if (kiln_lane == 0)")) << "one thread of the cluster stores";
  EmitOne(kt::RowSum(1, 1 << 20, true), true, &launch);
  EXPECT_EQ(launch.cluster, 8);
  // Rows enough, or short enough for one block: no cluster.
  EmitOne(kt::RowSum(4096, 262144, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
  EmitOne(kt::RowSoftmax(32768, false), true, &launch);
  EXPECT_EQ(launch.layout, CudaLayout::kBlockPerRow);
}

}  // namespace
}  // namespace kiln::codegen
