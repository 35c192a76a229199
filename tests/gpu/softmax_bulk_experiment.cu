// A device experiment (session 14, 2026-11-22), kept as the evidence behind kSharedRow's two
// caches with bulk fills (server/codegen/cuda_long_rows.h, kSharedBulkBytes): a hand-written
// softmax over bf16 rows of 50257 columns whose row is copied into shared memory by the bulk copy
// engine (cp.async.bulk completing on an mbarrier), with one or two row buffers per block, timed
// beside a kiln fixture kernel (optional: the cubin from emit_cuda_fixtures, its symbol, dynamic
// shared bytes, grid and block) and a device-to-device copy of the same bytes. Every variant is
// checked against a float64 reference on a spread of rows. Not built by Bazel; on a GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/sb tests/gpu/softmax_bulk_experiment.cu -lcuda
//   /tmp/sb [build/cuda_fixtures/kernels_sm_90.cubin kiln_kernel_14 106496 264 512]
// Environment: ONLY=<variant index or "kiln">, REPS=<timed runs> (for ncu). What it found is in
// docs/benchmarks-gpu-sessions.md ("Session 14 runs"): 16-byte stores must be written as one
// st.global.v4 (the compiler split a uint4 store through a uint16_t pointer into four 4-byte
// stores, and the partial sectors cost 2x), and with that two buffers reach 85.6-86.8% of copy.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "experiment_common.cuh"

#define DK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(e_, &s_); printf("CU %s at %s:%d\n", s_, __FILE__, __LINE__); exit(1);} } while (0)

constexpr int kCols = 50257;

__device__ __forceinline__ void bulk_load_hint(void* dst, const void* src, uint32_t bytes, uint64_t* b, uint64_t pol) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
               ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(b)), "l"(pol) : "memory");
}
__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t hmax2(uint32_t a, uint32_t b) {
  __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162*>(&a), y = *reinterpret_cast<__nv_bfloat162*>(&b);
  __nv_bfloat162 r = __hmax2_nan(x, y);
  return *reinterpret_cast<uint32_t*>(&r);
}

template <int T>
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int i = 1; i < T / 32; ++i) r = is_max ? fmaxf(r, red[i]) : r + red[i];
  __syncthreads();
  return r;
}

// Buffer bytes: the row's 16-byte chunks, from the chunk holding its first element.
constexpr int kChunks = (kCols * 2 + 14) / 16 + 1;  // enough for any start misalignment
constexpr int kBufBytes = kChunks * 16;

// One block per SM, persistent: row u of this block is blockIdx.x + u * gridDim.x.
// BUFS = 2: double-buffered (next row's bulk load in flight during this row's passes).
template <int T, int BUFS, bool HINT, bool ONE_WAITS, int MODE = 0, bool ONLINE = false>
__global__ void __launch_bounds__(T, 1) softmax_bulk(const uint16_t* __restrict__ in, uint16_t* __restrict__ out, int rows) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t bars[BUFS];
  __shared__ float red[T / 32];
  const char* const in_b = reinterpret_cast<const char*>(in);
  const uintptr_t in_end = reinterpret_cast<uintptr_t>(in_b) + static_cast<uintptr_t>(rows) * kCols * 2;
  const uintptr_t in_end_al = in_end & ~uintptr_t(15);
  uint64_t pol = 0;
  if (HINT) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));

  auto issue = [&](int row, int buf) {
    const uintptr_t s = reinterpret_cast<uintptr_t>(in_b) + static_cast<uintptr_t>(row) * kCols * 2;
    const uintptr_t a0 = s & ~uintptr_t(15);
    uintptr_t a1 = (s + kCols * 2 + 15) & ~uintptr_t(15);
    if (a1 > in_end_al) a1 = in_end_al;  // the last row's partial chunk: loaded by threads
    const uint32_t bytes = static_cast<uint32_t>(a1 - a0);
    unsigned char* dst = smem + buf * kBufBytes;
    mbar_expect(&bars[buf], bytes);
    // Several bulk copies so the engine can spread them.
    constexpr uint32_t kPiece = 16384;
    for (uint32_t off = 0; off < bytes; off += kPiece) {
      const uint32_t n = min(kPiece, bytes - off);
      if (HINT) bulk_load_hint(dst + off, reinterpret_cast<const void*>(a0 + off), n, &bars[buf], pol);
      else bulk_load(dst + off, reinterpret_cast<const void*>(a0 + off), n, &bars[buf]);
    }
  };

  if (threadIdx.x == 0) {
    for (int b = 0; b < BUFS; ++b) mbar_init(&bars[b], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  const int first = blockIdx.x;
  if (threadIdx.x == 0 && first < rows) issue(first, 0);

  int u = 0;
  for (int row = first; row < rows; row += gridDim.x, ++u) {
    const int buf = BUFS == 2 ? (u & 1) : 0;
    const uint32_t parity = BUFS == 2 ? ((u >> 1) & 1) : (u & 1);
    if (BUFS == 2 && threadIdx.x == 0 && row + gridDim.x < rows) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(row + gridDim.x, buf ^ 1);
    }
    const uintptr_t s = reinterpret_cast<uintptr_t>(in_b) + static_cast<uintptr_t>(row) * kCols * 2;
    const int mis = static_cast<int>(s & 15) / 2;  // elements before the row in chunk 0
    const int nch = (mis + kCols + 7) / 8;          // chunks holding the row
    unsigned char* const bp = smem + buf * kBufBytes;
    const uint4* const ch = reinterpret_cast<const uint4*>(bp);
    if (ONE_WAITS) {
      if (threadIdx.x == 0) { while (!mbar_try(&bars[buf], parity)) {} }
      __syncthreads();
    } else {
      while (!mbar_try(&bars[buf], parity)) {}
    }
    // The last row's partial chunk past the last 16-byte boundary of the tensor.
    const uintptr_t row_end = s + kCols * 2;
    if (row_end > in_end_al) {
      const int first_el = static_cast<int>((in_end_al - s) / 2);
      for (int j = first_el + threadIdx.x; j < kCols; j += T) {
        reinterpret_cast<uint16_t*>(bp)[mis + j] = in[static_cast<size_t>(row) * kCols + j];
      }
      __syncthreads();
    }
    if (MODE == 2) {
      if (threadIdx.x == 0) out[row] = reinterpret_cast<const uint16_t*>(bp)[mis];
      __syncthreads();
      continue;
    }
    float mb, sum;
    if constexpr (ONLINE) {
      float m = -INFINITY, sm = 0.f;
      for (int k = threadIdx.x; k < nch; k += T) {
        const uint4 v = ch[k];
        const int j0 = k * 8 - mis;
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        if (j0 >= 0 && j0 + 8 <= kCols) {
          const uint32_t c2 = hmax2(hmax2(v.x, v.y), hmax2(v.z, v.w));
          const float cm = fmaxf(lo(c2), hi(c2));
          if (cm > m) { sm *= ex2((m - cm) * kLog2e); m = cm; }
          const float b = m * kLog2e;
#pragma unroll
          for (int q = 0; q < 4; ++q) sm += ex2(fmaf(lo(w[q]), kLog2e, -b)) + ex2(fmaf(hi(w[q]), kLog2e, -b));
        } else {
#pragma unroll
          for (int l = 0; l < 8; ++l) {
            const int jj = j0 + l;
            if (jj >= 0 && jj < kCols) {
              const float x = (l & 1) ? hi(w[l >> 1]) : lo(w[l >> 1]);
              if (x > m) { sm *= ex2((m - x) * kLog2e); m = x; }
              sm += ex2((x - m) * kLog2e);
            }
          }
        }
      }
      const float M = block_reduce<T>(m, true, red);
      sm = m == -INFINITY ? 0.f : sm * ex2((m - M) * kLog2e);
      sum = block_reduce<T>(sm, false, red);
      mb = M * kLog2e;
    } else {
    // Pass 1: max.
    uint32_t m2 = 0xff80ff80u;  // -inf, -inf
    float mx = -INFINITY;
    for (int k = threadIdx.x; k < nch; k += T) {
      const uint4 v = ch[k];
      const int j0 = k * 8 - mis;
      if (j0 >= 0 && j0 + 8 <= kCols) {
        m2 = hmax2(m2, hmax2(hmax2(v.x, v.y), hmax2(v.z, v.w)));
      } else {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int l = 0; l < 8; ++l) {
          const int j = j0 + l;
          if (j >= 0 && j < kCols) mx = fmaxf(mx, (l & 1) ? hi(w[l >> 1]) : lo(w[l >> 1]));
        }
      }
    }
    mx = fmaxf(mx, fmaxf(lo(m2), hi(m2)));
    mx = block_reduce<T>(mx, true, red);
    mb = mx * kLog2e;
    // Pass 2: sum of exp(x - max).
    sum = 0.f;
    for (int k = threadIdx.x; k < nch; k += T) {
      const uint4 v = ch[k];
      const int j0 = k * 8 - mis;
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      if (j0 >= 0 && j0 + 8 <= kCols) {
#pragma unroll
        for (int q = 0; q < 4; ++q) sum += ex2(fmaf(lo(w[q]), kLog2e, -mb)) + ex2(fmaf(hi(w[q]), kLog2e, -mb));
      } else {
#pragma unroll
        for (int l = 0; l < 8; ++l) {
          const int j = j0 + l;
          if (j >= 0 && j < kCols) sum += ex2(fmaf((l & 1) ? hi(w[l >> 1]) : lo(w[l >> 1]), kLog2e, -mb));
        }
      }
    }
    sum = block_reduce<T>(sum, false, red);
    }
    const float inv = 1.f / sum;
    // Pass 3: stores (16-byte stores: out's rows start at the same misalignment as in's).
    uint16_t* const orow = out + static_cast<size_t>(row) * kCols;
    if (MODE == 1) {
      if (threadIdx.x == 0) out[row] = static_cast<uint16_t>(inv * 1000.f);
      __syncthreads();
      continue;
    }
    for (int k = threadIdx.x; k < nch; k += T) {
      const uint4 v = ch[k];
      const int j0 = k * 8 - mis;
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      if (j0 >= 0 && j0 + 8 <= kCols) {
        uint4 o;
        o.x = pack(ex2(fmaf(lo(w[0]), kLog2e, -mb)) * inv, ex2(fmaf(hi(w[0]), kLog2e, -mb)) * inv);
        o.y = pack(ex2(fmaf(lo(w[1]), kLog2e, -mb)) * inv, ex2(fmaf(hi(w[1]), kLog2e, -mb)) * inv);
        o.z = pack(ex2(fmaf(lo(w[2]), kLog2e, -mb)) * inv, ex2(fmaf(hi(w[2]), kLog2e, -mb)) * inv);
        o.w = pack(ex2(fmaf(lo(w[3]), kLog2e, -mb)) * inv, ex2(fmaf(hi(w[3]), kLog2e, -mb)) * inv);
        asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(orow + j0), "r"(o.x), "r"(o.y), "r"(o.z), "r"(o.w) : "memory");
      } else {
#pragma unroll
        for (int l = 0; l < 8; ++l) {
          const int j = j0 + l;
          if (j >= 0 && j < kCols) {
            const float x = (l & 1) ? hi(w[l >> 1]) : lo(w[l >> 1]);
            __nv_bfloat16 h = __float2bfloat16_rn(ex2(fmaf(x, kLog2e, -mb)) * inv);
            orow[j] = *reinterpret_cast<uint16_t*>(&h);
          }
        }
      }
    }
    __syncthreads();  // every read of this buffer done before it is filled again
    if (BUFS == 1 && threadIdx.x == 0 && row + gridDim.x < rows) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(row + gridDim.x, 0);
    }
  }
}

static float bf2f(uint16_t h) { uint32_t w = uint32_t(h) << 16; float f; memcpy(&f, &w, 4); return f; }
static uint16_t f2bf(float f) { uint32_t w; memcpy(&w, &f, 4); w += 0x7fff + ((w >> 16) & 1); return uint16_t(w >> 16); }

int main(int argc, char** argv) {
  const int rows = 4096;
  const char* cubin = argc > 1 ? argv[1] : nullptr;
  const char* sym = argc > 2 ? argv[2] : "kiln_kernel_14";
  const size_t n = size_t(rows) * kCols, bytes = n * 2;
  std::vector<uint16_t> h(n);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; ++i) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u1 = ((st >> 11) + 1) * (1.0 / 9007199254740993.0);
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u2 = (st >> 11) * (1.0 / 9007199254740992.0);
    h[i] = f2bf(float(3.0 * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2)));
  }
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint16_t *in, *out, *big_a, *big_b;
  CK(cudaMalloc(&in, bytes)); CK(cudaMalloc(&out, bytes));
  const size_t big = size_t(1) << 30;
  CK(cudaMalloc(&big_a, big)); CK(cudaMalloc(&big_b, big));
  CK(cudaMemset(big_a, 1, big));
  CK(cudaMemcpy(in, h.data(), bytes, cudaMemcpyHostToDevice));
  const float copy_big = median_us([&] { CK(cudaMemcpyAsync(big_b, big_a, big, cudaMemcpyDeviceToDevice)); }, 20);
  const float copy_same = median_us([&] { CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  const double ceiling = 2.0 * big / (copy_big * 1e-6) / 1e12;
  printf("copy 1 GiB: %.1f us (%.2f TB/s); copy of the softmax's %zu bytes: %.1f us (%.2f TB/s)\n", copy_big, ceiling,
         bytes, copy_same, 2.0 * bytes / (copy_same * 1e-6) / 1e12);

  std::vector<uint16_t> o(n);
  auto check = [&](const char* name, float us) {
    CK(cudaMemcpy(o.data(), out, bytes, cudaMemcpyDeviceToHost));
    double worst = 0; size_t bad = 0;
    for (int r = 0; r < rows; r += (r % 2 ? 37 : 1)) {  // rows of both parities, spread
      const uint16_t* x = h.data() + size_t(r) * kCols;
      const uint16_t* y = o.data() + size_t(r) * kCols;
      double m = -1e30; for (int j = 0; j < kCols; ++j) m = std::max(m, double(bf2f(x[j])));
      double s = 0; for (int j = 0; j < kCols; ++j) s += std::exp(double(bf2f(x[j])) - m);
      for (int j = 0; j < kCols; ++j) {
        const double ref = std::exp(double(bf2f(x[j])) - m) / s;
        const double got = bf2f(y[j]);
        if (!(std::fabs(got - ref) <= 1e-30 + ref * 1.0 / 128)) { if (bad < 3) printf("  %s row %d col %d got %g ref %g\n", name, r, j, got, ref); ++bad; }
        if (ref > 1e-30) worst = std::max(worst, std::fabs(got - ref) / ref);
      }
    }
    const double tbs = 2.0 * bytes / (us * 1e-6) / 1e12;
    printf("%-34s %8.1f us  %5.2f TB/s  %5.1f%% of copy (1 GiB)  %5.1f%% of same-size copy  worst rel %.2e  bad %zu\n", name, us, tbs,
           100 * tbs / ceiling, 100 * copy_same / us, worst, bad);
  };
  auto poison = [&] { CK(cudaMemset(out, 0xff, bytes)); };

  const char* only = getenv("ONLY");
  const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 30;
  int vidx = 0;
  if (cubin && (!only || std::string(only) == "kiln")) {
    CUmodule mod; CUfunction f;
    DK(cuModuleLoad(&mod, cubin));
    DK(cuModuleGetFunction(&f, mod, sym));
    const int smem = argc > 3 ? atoi(argv[3]) : 106496, grid = argc > 4 ? atoi(argv[4]) : 264, block = argc > 5 ? atoi(argv[5]) : 512;
    DK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
    int64_t n0 = rows;
    void* args[] = {&in, &out, &n0};
    poison();
    DK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, 0, args, nullptr));
    CK(cudaDeviceSynchronize());
    const float us = median_us([&] { DK(cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, 0, args, nullptr)); }, reps);
    check("kiln fixture (shared row)", us);
  }

#define VARIANT(T, BUFS, HINT, ONE, MODE, ONL)                                                                          \
  if (!only || std::string(only) == std::to_string(vidx++)) {                                          \
    auto k = softmax_bulk<T, BUFS, HINT, ONE, MODE, ONL>;                                                               \
    const int smem = BUFS * kBufBytes;                                                                  \
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                    \
    int per_sm = 0;                                                                                     \
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, T, smem));                            \
    const int grid = sms * per_sm;                                                                      \
    poison();                                                                                           \
    k<<<grid, T, smem>>>(in, out, rows);                                                                \
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());                                                \
    const float us = median_us([&] { k<<<grid, T, smem>>>(in, out, rows); }, reps);                      \
    char name[96]; snprintf(name, sizeof name, "bulk T=%d bufs=%d hint=%d one=%d mode=%d online=%d (%d/SM)", T, BUFS, HINT, ONE, MODE, ONL, per_sm); \
    check(name, us);                                                                                    \
  }
  VARIANT(1024, 2, false, true, 0, false)
  VARIANT(768, 2, false, true, 0, false)
  VARIANT(512, 2, false, true, 0, false)
  VARIANT(1024, 2, false, true, 0, true)
  VARIANT(768, 2, false, true, 0, true)
  VARIANT(512, 2, false, true, 0, true)
  return 0;
}
