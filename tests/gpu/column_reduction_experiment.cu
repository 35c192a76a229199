// A device experiment (session 21, 2026-11-23): why did the batch-norm partials of ResNet-50
// training take 4x the time to read their input? With channels-last activations, a training batch
// norm's statistics start with a column reduction (kColumn): the mean and M2 of every (n, c) over
// H x W, here bf16 [32, 256, 56, 56] (strides n 802816, h 14336, w 256, c 1; 8192 points of 3136
// elements, 51 MB). kiln's kernel for it took 58 us; reading 51 MB takes 16 us.
//
// The variants keep kiln's thread layout (a block of 32 points x 32 lanes, each lane folding every
// 32nd element of its point, then a fold of the lanes in shared memory) and change one thing each:
//   div        Welford's mean step as kiln had it, delta / count (an IEEE division);
//   rcp_rn     delta * __frcp_rn(count) (an IEEE reciprocal);
//   fdividef   __fdividef(delta, count) (rcp.approx and a multiply, 2 ulp);
//   flat       the element index as r * 256 instead of (r / 56) * 14336 + (r % 56) * 256;
//   sums       per-lane sums of x - x0 and (x - x0)^2 (x0: the lane's first element), converted
//              to (mean, M2, count) before the fold; with 1 or 2 points a lane (bf16x2 loads).
// The results are compared with the `div` variant's (relative difference of mean and M2).
//
// Not built by Bazel; on a GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/col tests/gpu/column_reduction_experiment.cu && /tmp/col
// What it found (docs/benchmarks-gpu-sessions.md, "Session 21 runs"): the division was most of the
// time (div 52 us, fdividef 28 us); the index arithmetic and the accumulator's form matter less
// (flat 26.5, sums 24). kiln's Welford::Update now divides with kiln_cuda::div_approx (__fdividef).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

constexpr int N = 32, C = 256, HW = 3136, W = 56;
constexpr int kStrideN = C * HW, kStrideH = W * C, kStrideW = C;

__device__ __forceinline__ float bf16(uint16_t b) { return __uint_as_float(uint32_t{b} << 16); }

// Welford's per-element update with the mean step's division as `Divide` does it.
template <class Divide> struct Welford {
  float mean = 0, m2 = 0, count = 0;
  __device__ __forceinline__ void Update(float x) {
    count += 1.f;
    const float d = x - mean;
    mean += Divide()(d, count);
    m2 += d * (x - mean);
  }
};
struct Div {  // as kiln had it
  __device__ __forceinline__ float operator()(float a, float b) const { return a / b; }
};
struct RcpRn {
  __device__ __forceinline__ float operator()(float a, float b) const { return a * __frcp_rn(b); }
};
struct FDivide {
  __device__ __forceinline__ float operator()(float a, float b) const { return __fdividef(a, b); }
};

// The lanes' (mean, M2, count) of one point folded in lane order (Chan et al.), by lane 0.
__device__ void FoldAndStore(float (*sm)[1024], int point_slot, int u, float* mean_out, float* m2_out) {
  float mean = 0, m2 = 0, n = 0;
  for (int g = 0; g < 32; ++g) {
    const int t = g * 32 + point_slot;
    const float bn = sm[2][t];
    if (bn == 0) continue;
    const float total = n + bn, d = sm[0][t] - mean;
    mean += d * (bn / total);
    m2 += sm[1][t] + d * d * (n * bn / total);
    n = total;
  }
  mean_out[u] = mean;
  m2_out[u] = m2;
}

template <class Divide, bool kFlat>
__global__ void __launch_bounds__(1024) Columns(const uint16_t* __restrict__ x, float* __restrict__ mean,
                                  float* __restrict__ m2) {
  __shared__ float sm[3][1024];
  const int lane = threadIdx.x / 32;
  for (int p = blockIdx.x * 32; p < N * C; p += gridDim.x * 32) {
    const int u = p + threadIdx.x % 32;
    const int c = u % C, n = u / C;
    Welford<Divide> acc;
#pragma unroll 8
    for (int r = lane; r < HW; r += 32) {
      int at;
      if (kFlat) {
        at = n * kStrideN + c + r * kStrideW;
      } else {
        const int h = r / W;
        at = n * kStrideN + c + h * kStrideH + (r - h * W) * kStrideW;
      }
      acc.Update(bf16(x[at]));
    }
    sm[0][threadIdx.x] = acc.mean;
    sm[1][threadIdx.x] = acc.m2;
    sm[2][threadIdx.x] = acc.count;
    __syncthreads();
    if (lane == 0) FoldAndStore(sm, threadIdx.x, u, mean, m2);
    __syncthreads();
  }
}

template <int V>
__global__ void __launch_bounds__(1024) ShiftedSums(const uint16_t* __restrict__ x, float* __restrict__ mean,
                                                    float* __restrict__ m2) {
  __shared__ float sm[V][3][1024];
  const int lane = threadIdx.x / 32;
  for (int p = blockIdx.x * 32 * V; p < N * C; p += gridDim.x * 32 * V) {
    const int u = p + (threadIdx.x % 32) * V;
    const uint16_t* base = x + (u / C) * kStrideN + u % C;
    auto load = [&](int r, float* v) {
      if constexpr (V == 2) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(base + r * kStrideW);
        v[0] = bf16(w & 0xffff);
        v[1] = bf16(w >> 16);
      } else {
        v[0] = bf16(base[r * kStrideW]);
      }
    };
    float shift[V], s1[V], s2[V];
    load(lane, shift);
    for (int j = 0; j < V; ++j) s1[j] = s2[j] = 0;
    int count = 0;
#pragma unroll 8
    for (int r = lane; r < HW; r += 32) {
      float v[V];
      load(r, v);
      for (int j = 0; j < V; ++j) {
        const float d = v[j] - shift[j];
        s1[j] += d;
        s2[j] = fmaf(d, d, s2[j]);
      }
      ++count;
    }
    for (int j = 0; j < V; ++j) {
      const float n = count, m = s1[j] / n;
      sm[j][0][threadIdx.x] = shift[j] + m;
      sm[j][1][threadIdx.x] = fmaxf(s2[j] - s1[j] * m, 0.f);
      sm[j][2][threadIdx.x] = n;
    }
    __syncthreads();
    if (lane < V) FoldAndStore(sm[lane], threadIdx.x % 32, u + lane, mean, m2);
    __syncthreads();
  }
}

template <class F>
float MedianUs(F launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> us;
  for (int i = 0; i < 25; ++i) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(ms * 1000);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main() {
  const size_t n = size_t{N} * C * HW;
  std::vector<uint16_t> host(n);
  uint32_t s = 1;
  for (size_t i = 0; i < n; ++i) {  // uniform in [2, 4): a mean far from 0, as activations after a shift
    s = s * 1664525u + 1013904223u;
    const float v = 3.0f + ((s >> 8) & 0xffff) / 65536.f * 2.f - 1.f;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    host[i] = static_cast<uint16_t>(bits >> 16);
  }
  uint16_t *x, *copy;
  float *ref_mean, *ref_m2, *mean, *m2;
  cudaMalloc(&x, n * 2);
  cudaMalloc(&copy, n * 2);
  for (float** p : {&ref_mean, &ref_m2, &mean, &m2}) cudaMalloc(p, N * C * 4);
  cudaMemcpy(x, host.data(), n * 2, cudaMemcpyHostToDevice);
  const int grid = N * C / 32;
  auto check = [&](const char* name, float us) {
    std::vector<float> a(N * C), b(N * C), ra(N * C), rb(N * C);
    cudaMemcpy(a.data(), mean, N * C * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), m2, N * C * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(ra.data(), ref_mean, N * C * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(rb.data(), ref_m2, N * C * 4, cudaMemcpyDeviceToHost);
    double dm = 0, dv = 0;
    for (int i = 0; i < N * C; ++i) {
      dm = std::max(dm, std::fabs(double{a[i]} - ra[i]) / std::fabs(ra[i]));
      dv = std::max(dv, std::fabs(double{b[i]} - rb[i]) / std::fabs(rb[i]));
    }
    std::printf("%-26s %7.1f us  %5.2f TB/s read   vs div: mean %.1e, M2 %.1e\n", name, us, n * 2 / us / 1e6, dm, dv);
  };
  const float base = MedianUs([&] { Columns<Div, false><<<grid, 1024>>>(x, ref_mean, ref_m2); });
  cudaMemcpy(mean, ref_mean, N * C * 4, cudaMemcpyDeviceToDevice);
  cudaMemcpy(m2, ref_m2, N * C * 4, cudaMemcpyDeviceToDevice);
  check("div (kiln before)", base);
  check("rcp_rn", MedianUs([&] { Columns<RcpRn, false><<<grid, 1024>>>(x, mean, m2); }));
  check("fdividef (kiln now)", MedianUs([&] { Columns<FDivide, false><<<grid, 1024>>>(x, mean, m2); }));
  check("div, flat", MedianUs([&] { Columns<Div, true><<<grid, 1024>>>(x, mean, m2); }));
  check("fdividef, flat", MedianUs([&] { Columns<FDivide, true><<<grid, 1024>>>(x, mean, m2); }));
  check("sums, flat", MedianUs([&] { ShiftedSums<1><<<grid, 1024>>>(x, mean, m2); }));
  check("sums, flat, bf16x2", MedianUs([&] { ShiftedSums<2><<<grid / 2, 1024>>>(x, mean, m2); }));
  const float memcpy_us = MedianUs([&] { cudaMemcpyAsync(copy, x, n * 2, cudaMemcpyDeviceToDevice); });
  std::printf("%-26s %7.1f us  (read + write; half of it: %.1f us)\n", "cudaMemcpyAsync, 51 MB", memcpy_us,
              memcpy_us / 2);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
