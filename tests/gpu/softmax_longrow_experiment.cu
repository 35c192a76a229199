// A device experiment (session 19, 2026-11-22): how close can a softmax over few long rows
// (f32 64 x 262144, the bench's softmax_f32_256k) come to a copy of the same bytes? kiln's
// cluster kernel (kClusterRow, 16 blocks of 512 threads per row) runs in waves: every block
// loads its part of a row, the cluster reduces, every block stores, and only then does the next
// wave's cluster start, so the loads of one wave never overlap the stores of the one before.
//
// The design tried here is a persistent pipeline: one block per SM (or a few), launched
// cooperatively so that all are resident. A row is cut into pieces of S floats; block b takes
// pieces b, b + G, b + 2G, ... (G blocks). Each piece is copied into shared memory by the bulk
// copy engine (cp.async.bulk on an mbarrier, K buffers deep). A block computes its piece's
// (max, sum of exps), publishes it to global memory and counts it in the row's counter; it
// stores a piece only once the row's counter says every piece is in. The statistics run D >= 1
// pieces ahead of the stores, so a row spread over two rounds never waits on a block that waits
// on it: a block publishes piece t + D before it waits for the row of piece t.
//
// Every variant is checked against a float64 reference over every row. Not built by Bazel; on a
// GPU machine:
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/lr tests/gpu/softmax_longrow_experiment.cu
//   /tmp/lr
// Environment: ONLY=<variant index>, FROM=<first variant index>, REPS=<timed runs>. What it found
// is in docs/benchmarks-gpu-sessions.md ("Session 19 runs"): the warp-specialized version 3 reaches
// 44.5 us (71% of the 1 GiB copy's rate, 83.5% of a cudaMemcpyAsync of the same bytes) with
// ex2.approx exps; with accurate expf, version 4 (exps written back) 50.1 us, against 57.9 us for
// kiln's cluster kernel; not built into kiln.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "experiment_common.cuh"


constexpr int kRows = 64;
constexpr int kCols = 262144;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

template <bool FAST>
__device__ __forceinline__ float expo(float x) { return FAST ? ex2(x * kLog2e) : expf(x); }

// (m, s) pairs: s is a sum of exp(x - m). An all -inf part has m = -inf and s = 0.
template <bool FAST>
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) return;
  s = (m == -INFINITY ? 0.f : s * expo<FAST>(m - M)) + (m2 == -INFINITY ? 0.f : s2 * expo<FAST>(m2 - M));
  m = M;
}

// Folds the (max, sum) pairs of a warp's lanes: every lane ends with the warp's pair.
template <bool FAST>
__device__ __forceinline__ void warp_combine(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    combine<FAST>(m, s, m2, s2);
  }
}

// Brings a piece of S floats at `src` into shared memory at `dst` through the bulk copy engine,
// in copies of 16 KiB completing on `bar`.
template <int S>
__device__ __forceinline__ void issue_piece(float* dst, const float* src, uint64_t* bar) {
  mbar_expect(bar, S * 4);
  constexpr uint32_t kPiece = 16384;
  for (uint32_t off = 0; off < S * 4; off += kPiece) {
    bulk_load(dst + off / 4, src + off / 4, min(kPiece, uint32_t(S * 4) - off), bar);
  }
}

// Thread `tid` of T: its V = S / T floats of a piece in shared memory (float4 loads, strided by T)
// into v; returns their maximum.
template <int T, int S>
__device__ __forceinline__ float load_piece(const float* piece, int tid, float (&v)[S / T]) {
  constexpr int V = S / T;
  const float4* p = reinterpret_cast<const float4*>(piece);
#pragma unroll
  for (int q = 0; q < V / 4; ++q) {
    const float4 f = p[tid + q * T];
    v[4 * q] = f.x; v[4 * q + 1] = f.y; v[4 * q + 2] = f.z; v[4 * q + 3] = f.w;
  }
  float m = v[0];
#pragma unroll
  for (int j = 1; j < V; ++j) m = fmaxf(m, v[j]);
  return m;
}

// The (max, sum of exps) of a piece of S floats in shared memory, computed by the T threads that
// call it (this one is `tid` of them) through `red` (T / 32 slots) and `sync` (a barrier over those
// threads). Every lane of warp 0 gets the piece's pair; the others get the (-inf, 0) pair.
template <int T, int S, bool FAST, typename Sync>
__device__ __forceinline__ float2 piece_stats(const float* piece, int tid, float2* red, Sync sync) {
  constexpr int V = S / T;
  const int lane = tid & 31, warp = tid >> 5;
  float v[V];
  float m = load_piece<T, S>(piece, tid, v);
  float s = 0.f;
  if (m != -INFINITY) {
#pragma unroll
    for (int j = 0; j < V; ++j) s += expo<FAST>(v[j] - m);
  }
  warp_combine<FAST>(m, s);
  if (lane == 0) red[warp] = make_float2(m, s);
  sync();
  float2 r = make_float2(-INFINITY, 0.f);
  if (warp == 0) {
    if (lane < T / 32) r = red[lane];
    warp_combine<FAST>(r.x, r.y);
  }
  return r;
}

template <int T, int S, int K, int D, bool FAST, bool STCS>
__global__ void __launch_bounds__(T, 1) longrow_softmax(const float* __restrict__ x, float* __restrict__ y,
                                                        float2* __restrict__ partial, unsigned* __restrict__ count,
                                                        int rows, int cols, unsigned target) {
  static_assert(S % (4 * T) == 0, "a piece is whole float4s per thread");
  constexpr int V = S / T;
  extern __shared__ __align__(128) unsigned char smem[];
  float* const buf = reinterpret_cast<float*>(smem);
  __shared__ uint64_t bars[K];
  __shared__ float2 red[T / 32];
  __shared__ float2 row_stat;
  const int P = cols / S;
  const int total = rows * P;
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = b < total ? (total - 1 - b) / G + 1 : 0;

  auto issue = [&](int t) { issue_piece<S>(buf + (t % K) * S, x + (size_t(b) + size_t(t) * G) * S, &bars[t % K]); };
  auto stats = [&](int t) {
    while (!mbar_try(&bars[t % K], (t / K) & 1)) {}
    const float2 r = piece_stats<T, S, FAST>(buf + (t % K) * S, tid, red, [] { __syncthreads(); });
    if (warp == 0) {
      if (lane == 0) {
        const size_t i = size_t(b) + size_t(t) * G;
        partial[i] = r;
        red_release_add(&count[i / P], 1);
      }
    }
  };
  auto wait_row = [&](int row) {
    if (warp == 0) {
      while (ld_acquire(&count[row]) < target) {}
      float m = -INFINITY, s = 0.f;
      for (int j = lane; j < P; j += 32) {
        const float2 q = __ldcg(&partial[size_t(row) * P + j]);
        combine<FAST>(m, s, q.x, q.y);
      }
      warp_combine<FAST>(m, s);
      if (lane == 0) row_stat = make_float2(m, 1.f / s);
    }
    __syncthreads();
  };
  auto store = [&](int t) {
    const size_t i = size_t(b) + size_t(t) * G;
    const float4* p = reinterpret_cast<const float4*>(buf + (t % K) * S);
    float4* out = reinterpret_cast<float4*>(y + i * S);
    const float M = row_stat.x, inv = row_stat.y;
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 f = p[tid + q * T];
      float4 o;
      o.x = expo<FAST>(f.x - M) * inv; o.y = expo<FAST>(f.y - M) * inv;
      o.z = expo<FAST>(f.z - M) * inv; o.w = expo<FAST>(f.w - M) * inv;
      if (STCS) __stcs(out + tid + q * T, o);
      else out[tid + q * T] = o;
    }
  };

  if (tid == 0) {
    for (int k = 0; k < K; ++k) mbar_init(&bars[k], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  static_assert(D >= 1 && D <= K - 1, "statistics run 1 to K - 1 pieces ahead of the stores");
  if (tid == 0) for (int t = 0; t < K - 1 && t < n; ++t) issue(t);
  for (int t = 0; t < D && t < n; ++t) stats(t);
  for (int t = 0; t < n; ++t) {
    if (tid == 0 && t + K - 1 < n) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(t + K - 1);  // into the buffer of piece t - 1, stored last iteration
    }
    if (t + D < n) stats(t + D);  // published before this block waits on anyone
    wait_row(int((size_t(b) + size_t(t) * G) / P));
    store(t);
    __syncthreads();  // every read of piece t's buffer done before it is filled again
  }
}

// Version 2: the row's statistics fetched off the critical path. Version 1 above pays, for every
// piece, an acquire load of the row's counter and then a load of its partials, two round trips
// that the whole block waits for. Here each partial is one 64-bit word, written with one relaxed
// store, and an unwritten slot holds kUnwritten; warp 0 loads the partials of the next piece's row
// before this piece's stores and checks them (reloading any slot still unwritten) after. The last
// block to finish sets every slot back to kUnwritten for the next launch on the stream. With the
// check one piece ahead, the statistics must run D >= 2 pieces ahead of the stores.
constexpr unsigned long long kUnwritten = ~0ull;
__device__ __forceinline__ unsigned long long ld_relaxed64(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed64(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long pack_ms(float m, float s) {
  const unsigned mb = m != m ? 0x7fc00000u : __float_as_uint(m);  // a NaN never looks unwritten
  return (static_cast<unsigned long long>(__float_as_uint(s)) << 32) | mb;
}

constexpr int kMaxPL = 4;  // partials per lane: rows of at most 128 pieces

// Warp 0 loads the P partials of a row (from `base`) into `pre`, without waiting for them.
__device__ __forceinline__ void prefetch_row(const unsigned long long* partial, size_t base, int P, int lane,
                                             unsigned long long (&pre)[kMaxPL]) {
#pragma unroll
  for (int k = 0; k < kMaxPL; ++k) {
    const int j = lane + 32 * k;
    pre[k] = j < P ? ld_relaxed64(&partial[base + j]) : 0ull;
  }
}

// Then the row's (max, 1 / sum) in every lane, reloading each partial still unwritten.
template <bool FAST>
__device__ __forceinline__ float2 resolve_row(const unsigned long long* partial, size_t base, int P, int lane,
                                              unsigned long long (&pre)[kMaxPL]) {
  float m = -INFINITY, s = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxPL; ++k) {
    const int j = lane + 32 * k;
    if (j < P) {
      while (pre[k] == kUnwritten) pre[k] = ld_relaxed64(&partial[base + j]);
      combine<FAST>(m, s, __uint_as_float(unsigned(pre[k])), __uint_as_float(unsigned(pre[k] >> 32)));
    }
  }
  warp_combine<FAST>(m, s);
  return make_float2(m, 1.f / s);
}

template <int T, int S, int K, int D, bool FAST>
__global__ void __launch_bounds__(T, 1) longrow_softmax2(const float* __restrict__ x, float* __restrict__ y,
                                                         unsigned long long* __restrict__ partial,
                                                         unsigned* __restrict__ done, int rows, int cols) {
  static_assert(S % (4 * T) == 0, "a piece is whole float4s per thread");
  static_assert(D >= 2 && D <= K - 1, "statistics run 2 to K - 1 pieces ahead of the stores");
  constexpr int V = S / T;
  extern __shared__ __align__(128) unsigned char smem[];
  float* const buf = reinterpret_cast<float*>(smem);
  __shared__ uint64_t bars[K];
  __shared__ float2 red[T / 32];
  __shared__ float2 row_stat[2];
  const int P = cols / S;
  const int total = rows * P;
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n = b < total ? (total - 1 - b) / G + 1 : 0;
  unsigned long long pre[kMaxPL];
  auto piece = [&](int t) { return size_t(b) + size_t(t) * G; };

  auto issue = [&](int t) { issue_piece<S>(buf + (t % K) * S, x + piece(t) * S, &bars[t % K]); };
  auto stats = [&](int t) {
    while (!mbar_try(&bars[t % K], (t / K) & 1)) {}
    const float2 r = piece_stats<T, S, FAST>(buf + (t % K) * S, tid, red, [] { __syncthreads(); });
    if (warp == 0) {
      if (lane == 0) st_relaxed64(&partial[piece(t)], pack_ms(r.x, r.y));
    }
  };
  auto prefetch = [&](int t) { prefetch_row(partial, piece(t) / P * P, P, lane, pre); };  // warp 0
  auto resolve = [&](int t, int slot) {  // warp 0
    const float2 r = resolve_row<FAST>(partial, piece(t) / P * P, P, lane, pre);
    if (lane == 0) row_stat[slot] = r;
  };
  auto store = [&](int t) {
    const float4* p = reinterpret_cast<const float4*>(buf + (t % K) * S);
    float4* out = reinterpret_cast<float4*>(y + piece(t) * S);
    const float M = row_stat[t & 1].x, inv = row_stat[t & 1].y;
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const float4 f = p[tid + q * T];
      float4 o;
      o.x = expo<FAST>(f.x - M) * inv; o.y = expo<FAST>(f.y - M) * inv;
      o.z = expo<FAST>(f.z - M) * inv; o.w = expo<FAST>(f.w - M) * inv;
      out[tid + q * T] = o;
    }
  };

  if (tid == 0) {
    for (int k = 0; k < K; ++k) mbar_init(&bars[k], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) for (int t = 0; t < K - 1 && t < n; ++t) issue(t);
  for (int t = 0; t < D && t < n; ++t) stats(t);
  if (warp == 0 && n > 0) { prefetch(0); resolve(0, 0); }
  __syncthreads();
  for (int t = 0; t < n; ++t) {
    if (tid == 0 && t + K - 1 < n) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(t + K - 1);  // into the buffer of piece t - 1, stored last iteration
    }
    if (t + D < n) stats(t + D);  // published before this block waits on anyone
    if (warp == 0 && t + 1 < n) prefetch(t + 1);
    store(t);
    if (warp == 0 && t + 1 < n) resolve(t + 1, (t + 1) & 1);
    __syncthreads();  // piece t's buffer free, the next row's statistics in row_stat
  }
  // The last block out sets the partials back to unwritten for the next launch.
  __shared__ bool last;
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(done, 1u) == unsigned(G - 1);
  }
  __syncthreads();
  if (last) {
    __threadfence();
    for (int i = tid; i < total; i += T) partial[i] = kUnwritten;
    if (tid == 0) *done = 0;
  }
}

// Version 3: warp-specialized. In versions 1 and 2 one group of threads does everything for a
// piece in turn (statistics, then stores), so the SM's arithmetic and its store traffic take turns.
// Here the first TA threads only compute statistics (piece after piece, as fast as the bulk loads
// land) and the next TB threads only store; the store group refills each buffer it frees with the
// piece K ahead. Waits only go backwards in piece order (statistics of piece u wait for the stores
// of piece u - K; stores of piece t wait for statistics up to piece t + 2 when a row spans two
// rounds), so with K >= 3 no cycle forms.
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// WB (version 4): the statistics warps take the piece's max first, then write exp(x - max) back
// into the buffer, so that the store warps only scale (one multiply an element, no exp); a second
// mbarrier a buffer (`ready`, one arrival per statistics thread) tells the stores it is written.
template <int TA, int TB, int S, int K, bool FAST, bool WB = false>
__global__ void __launch_bounds__(TA + TB, 1) longrow_softmax3(const float* __restrict__ x, float* __restrict__ y,
                                                                unsigned long long* __restrict__ partial,
                                                                unsigned* __restrict__ done, int rows, int cols) {
  static_assert(S % (4 * TA) == 0 && S % (4 * TB) == 0, "a piece is whole float4s per thread");
  static_assert(K >= 3, "see above");
  constexpr int VA = S / TA, VB = S / TB;
  extern __shared__ __align__(128) unsigned char smem[];
  float* const buf = reinterpret_cast<float*>(smem);
  __shared__ uint64_t bars[K];
  __shared__ float2 red[2][TA / 32];
  __shared__ float2 row_stat[2];
  __shared__ uint64_t ready[K];
  __shared__ float piece_max[K];
  const int P = cols / S;
  const int total = rows * P;
  const int G = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const int n = b < total ? (total - 1 - b) / G + 1 : 0;
  auto piece = [&](int t) { return size_t(b) + size_t(t) * G; };
  auto issue = [&](int t) { issue_piece<S>(buf + (t % K) * S, x + piece(t) * S, &bars[t % K]); };
  if (tid == 0) {
    for (int k = 0; k < K; ++k) mbar_init(&bars[k], 1);
    for (int k = 0; k < K; ++k) mbar_init(&ready[k], TA);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    for (int t = 0; t < K && t < n; ++t) issue(t);
  }
  __syncthreads();

  if (WB && tid < TA) {  // statistics, exps written back
    const int warp = tid >> 5;
    for (int t = 0; t < n; ++t) {
      while (!mbar_try(&bars[t % K], (t / K) & 1)) {}
      float4* p = reinterpret_cast<float4*>(buf + (t % K) * S);
      float v[VA];
      float m = load_piece<TA, S>(buf + (t % K) * S, tid, v);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) red[t & 1][warp].x = m;
      named_sync(1, TA);
      float M = red[t & 1][0].x;
#pragma unroll
      for (int w = 1; w < TA / 32; ++w) M = fmaxf(M, red[t & 1][w].x);
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < VA; ++j) {
        v[j] = M == -INFINITY ? 0.f : expo<FAST>(v[j] - M);
        s += v[j];
      }
#pragma unroll
      for (int q = 0; q < VA / 4; ++q) p[tid + q * TA] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
      if (tid == 0) piece_max[t % K] = M;
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&ready[t % K])) : "memory");
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) red[t & 1][warp].y = s;
      named_sync(1, TA);
      if (warp == 0) {
        float r = lane < TA / 32 ? red[t & 1][lane].y : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
        if (lane == 0) st_relaxed64(&partial[piece(t)], pack_ms(M, r));
      }
    }
  } else if (tid < TA) {  // statistics
    const int warp = tid >> 5;
    for (int t = 0; t < n; ++t) {
      while (!mbar_try(&bars[t % K], (t / K) & 1)) {}
      const float2 r = piece_stats<TA, S, FAST>(buf + (t % K) * S, tid, red[t & 1], [] { named_sync(1, TA); });
      if (warp == 0 && lane == 0) st_relaxed64(&partial[piece(t)], pack_ms(r.x, r.y));
    }
  } else {  // stores
    const int bt = tid - TA;
    const bool lead = bt < 32;
    unsigned long long pre[kMaxPL];
    auto prefetch = [&](int t) { prefetch_row(partial, piece(t) / P * P, P, lane, pre); };
    auto resolve = [&](int t) {
      const float2 r = resolve_row<FAST>(partial, piece(t) / P * P, P, lane, pre);
      if (lane == 0) row_stat[t & 1] = r;
    };
    if (lead && n > 0) { prefetch(0); resolve(0); }
    named_sync(2, TB);
    for (int t = 0; t < n; ++t) {
      if (WB) {
        while (!mbar_try(&ready[t % K], (t / K) & 1)) {}  // the exps written back
      } else {
        while (!mbar_try(&bars[t % K], (t / K) & 1)) {}  // makes the bulk copy's bytes visible here
      }
      if (lead && t + 1 < n) prefetch(t + 1);
      const float4* p = reinterpret_cast<const float4*>(buf + (t % K) * S);
      float4* out = reinterpret_cast<float4*>(y + piece(t) * S);
      const float M = row_stat[t & 1].x, inv = row_stat[t & 1].y;
      if (WB) {
        const float pm = piece_max[t % K];
        const float scale = pm == -INFINITY ? 0.f : expo<FAST>(pm - M) * inv;
#pragma unroll
        for (int q = 0; q < VB / 4; ++q) {
          const float4 f = p[bt + q * TB];
          out[bt + q * TB] = make_float4(f.x * scale, f.y * scale, f.z * scale, f.w * scale);
        }
      } else {
#pragma unroll
        for (int q = 0; q < VB / 4; ++q) {
          const float4 f = p[bt + q * TB];
          float4 o;
          o.x = expo<FAST>(f.x - M) * inv; o.y = expo<FAST>(f.y - M) * inv;
          o.z = expo<FAST>(f.z - M) * inv; o.w = expo<FAST>(f.w - M) * inv;
          out[bt + q * TB] = o;
        }
      }
      if (lead && t + 1 < n) resolve(t + 1);
      named_sync(2, TB);  // buffer t read by every store thread; the next row's statistics in row_stat
      if (bt == 0 && t + K < n) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        issue(t + K);
      }
    }
  }
  __syncthreads();
  __shared__ bool last;
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(done, 1u) == unsigned(G - 1);
  }
  __syncthreads();
  if (last) {
    __threadfence();
    for (int i = tid; i < total; i += TA + TB) partial[i] = kUnwritten;
    if (tid == 0) *done = 0;
  }
}

__global__ void copy4(const float4* __restrict__ a, float4* __restrict__ b, size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) b[i] = a[i];
}

int main() {
  const size_t n = size_t(kRows) * kCols, bytes = n * 4;
  std::vector<float> h(n);
  uint64_t st = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; ++i) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u1 = ((st >> 11) + 1) * (1.0 / 9007199254740993.0);
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const double u2 = (st >> 11) * (1.0 / 9007199254740992.0);
    h[i] = float(3.0 * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  std::vector<double> ref(n);
  for (int r = 0; r < kRows; ++r) {
    const float* xr = h.data() + size_t(r) * kCols;
    double m = -1e300; for (int j = 0; j < kCols; ++j) m = std::max(m, double(xr[j]));
    double s = 0; for (int j = 0; j < kCols; ++j) s += std::exp(double(xr[j]) - m);
    for (int j = 0; j < kCols; ++j) ref[size_t(r) * kCols + j] = std::exp(double(xr[j]) - m) / s;
  }
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *in, *out; float2* partial; unsigned* count; char *big_a, *big_b;
  CK(cudaMalloc(&in, bytes)); CK(cudaMalloc(&out, bytes));
  CK(cudaMalloc(&partial, 1 << 20)); CK(cudaMalloc(&count, kRows * sizeof(unsigned)));
  const size_t big = size_t(1) << 30;
  CK(cudaMalloc(&big_a, big)); CK(cudaMalloc(&big_b, big));
  CK(cudaMemset(big_a, 1, big));
  CK(cudaMemcpy(in, h.data(), bytes, cudaMemcpyHostToDevice));
  const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 50;
  const float copy_big = median_us([&] { CK(cudaMemcpyAsync(big_b, big_a, big, cudaMemcpyDeviceToDevice)); }, 20);
  const float copy_same = median_us([&] { CK(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice)); }, reps);
  const float copy_kernel = median_us([&] { copy4<<<sms * 4, 512>>>(reinterpret_cast<const float4*>(in), reinterpret_cast<float4*>(out), n / 4); }, reps);
  const double ceiling = 2.0 * big / (copy_big * 1e-6) / 1e12;
  printf("copy 1 GiB: %.1f us (%.2f TB/s); copy of the softmax's %zu bytes: cudaMemcpyAsync %.1f us (%.2f TB/s), float4 kernel %.1f us (%.2f TB/s)\n",
         copy_big, ceiling, bytes, copy_same, 2.0 * bytes / (copy_same * 1e-6) / 1e12, copy_kernel, 2.0 * bytes / (copy_kernel * 1e-6) / 1e12);

  std::vector<float> o(n);
  auto check = [&](const char* name, float us) {
    CK(cudaMemcpy(o.data(), out, bytes, cudaMemcpyDeviceToHost));
    double worst = 0; size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = std::fabs(double(o[i]) - ref[i]);
      if (!(d <= 4e-6 * ref[i] + 1e-12)) { if (bad < 3) printf("  %s at %zu: got %g ref %g\n", name, i, o[i], ref[i]); ++bad; }
      if (ref[i] > 1e-30) worst = std::max(worst, d / ref[i]);
    }
    const double tbs = 2.0 * bytes / (us * 1e-6) / 1e12;
    printf("%-52s %7.1f us  %5.2f TB/s  %5.1f%% of copy (1 GiB)  %5.1f%% of same-size copy  worst rel %.2e  bad %zu\n", name, us, tbs,
           100 * tbs / ceiling, 100 * copy_same / us, worst, bad);
  };
  const char* only = getenv("ONLY");
  const int from = getenv("FROM") ? atoi(getenv("FROM")) : 0;
  int vidx = 0;
  unsigned epoch = 0;

#define VARIANT(T, S, K, D, FAST, STCS, OCC)                                                                             \
  if ((!only || std::string(only) == std::to_string(vidx)) && vidx >= from) {                                                           \
    auto k = longrow_softmax<T, S, K, D, FAST, STCS>;                                                                    \
    const int smem = K * S * 4;                                                                                       \
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                                  \
    int per_sm = 0;                                                                                                   \
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, T, smem));                                          \
    per_sm = std::min(per_sm, OCC);                                                                                   \
    int grid = sms * per_sm;                                                                                          \
    int rows = kRows, cols = kCols; unsigned target = 0;                                                              \
    void* args[] = {&in, &out, &partial, &count, &rows, &cols, &target};                                              \
    CK(cudaMemset(count, 0, kRows * sizeof(unsigned)));                                                               \
    CK(cudaMemset(out, 0xff, bytes));                                                                                 \
    epoch = 0;                                                                                                        \
    auto launch = [&] {                                                                                               \
      target = unsigned(kCols / S) * ++epoch;                                                                         \
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), grid, T, args, smem, 0));                            \
    };                                                                                                                \
    launch();                                                                                                         \
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());                                                              \
    const float us = median_us(launch, reps);                                                                         \
    char name[128]; snprintf(name, sizeof name, "[%d] T=%d S=%d K=%d D=%d fast=%d stcs=%d grid=%d (%d/SM)", vidx, T, S, K, D, FAST, STCS, grid, per_sm); \
    check(name, us);                                                                                                  \
  }                                                                                                                   \
  ++vidx;
  VARIANT(1024, 16384, 3, 1, true, false, 1)
  VARIANT(512, 8192, 6, 1, true, false, 1)
  VARIANT(512, 8192, 6, 2, true, false, 1)
  VARIANT(512, 8192, 6, 3, true, false, 1)
  VARIANT(512, 8192, 6, 4, true, false, 1)
  VARIANT(512, 8192, 7, 3, true, false, 1)
  VARIANT(1024, 8192, 6, 2, true, false, 1)
  VARIANT(1024, 8192, 6, 3, true, false, 1)
  VARIANT(512, 4096, 12, 4, true, false, 1)
  VARIANT(512, 4096, 12, 7, true, false, 1)
  VARIANT(256, 4096, 6, 3, true, false, 2)
  VARIANT(512, 8192, 6, 3, false, false, 1)
  VARIANT(512, 8192, 6, 3, true, true, 1)
#define VARIANT2(T, S, K, D, FAST, OCC)                                                                               \
  if ((!only || std::string(only) == std::to_string(vidx)) && vidx >= from) {                                                           \
    auto k = longrow_softmax2<T, S, K, D, FAST>;                                                                      \
    const int smem = K * S * 4;                                                                                       \
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                                  \
    int per_sm = 0;                                                                                                   \
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, T, smem));                                          \
    per_sm = std::min(per_sm, OCC);                                                                                   \
    int grid = sms * per_sm;                                                                                          \
    int rows = kRows, cols = kCols;                                                                                   \
    void* args[] = {&in, &out, &partial, &count, &rows, &cols};                                                       \
    CK(cudaMemset(count, 0, kRows * sizeof(unsigned)));                                                               \
    CK(cudaMemset(partial, 0xff, 1 << 20));                                                                           \
    CK(cudaMemset(out, 0xff, bytes));                                                                                 \
    auto launch = [&] { CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), grid, T, args, smem, 0)); };      \
    launch();                                                                                                         \
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());                                                              \
    const float us = median_us(launch, reps);                                                                         \
    char name[128]; snprintf(name, sizeof name, "[%d] v2 T=%d S=%d K=%d D=%d fast=%d grid=%d (%d/SM)", vidx, T, S, K, D, FAST, grid, per_sm); \
    check(name, us);                                                                                                  \
  }                                                                                                                   \
  ++vidx;
  VARIANT2(512, 8192, 6, 2, true, 1)
  VARIANT2(512, 8192, 6, 3, true, 1)
  VARIANT2(512, 8192, 7, 4, true, 1)
  VARIANT2(1024, 8192, 6, 2, true, 1)
  VARIANT2(1024, 16384, 3, 2, true, 1)
  VARIANT2(512, 4096, 12, 2, true, 1)
  VARIANT2(512, 4096, 12, 5, true, 1)
  VARIANT2(256, 4096, 6, 2, true, 2)
  VARIANT2(512, 8192, 6, 2, false, 1)
#define VARIANT3(TA, TB, S, K, FAST, ...)                                                                                  \
  if ((!only || std::string(only) == std::to_string(vidx)) && vidx >= from) {                                                           \
    auto k = longrow_softmax3<TA, TB, S, K, FAST, ##__VA_ARGS__>;                                                                    \
    const int smem = K * S * 4;                                                                                       \
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                                  \
    int grid = sms;                                                                                                   \
    int rows = kRows, cols = kCols;                                                                                   \
    void* args[] = {&in, &out, &partial, &count, &rows, &cols};                                                       \
    CK(cudaMemset(count, 0, kRows * sizeof(unsigned)));                                                               \
    CK(cudaMemset(partial, 0xff, 1 << 20));                                                                           \
    CK(cudaMemset(out, 0xff, bytes));                                                                                 \
    auto launch = [&] { CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(k), grid, TA + TB, args, smem, 0)); }; \
    launch();                                                                                                         \
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());                                                              \
    const float us = median_us(launch, reps);                                                                         \
    char name[128]; snprintf(name, sizeof name, "[%d] v3 TA=%d TB=%d S=%d K=%d fast=%d%s grid=%d", vidx, TA, TB, S, K, FAST, #__VA_ARGS__[0] ? " wb" : "", grid); \
    check(name, us);                                                                                                  \
  }                                                                                                                   \
  ++vidx;
  VARIANT3(256, 512, 8192, 6, true)
  VARIANT3(512, 512, 8192, 6, true)
  VARIANT3(256, 256, 8192, 6, true)
  VARIANT3(128, 256, 4096, 12, true)
  VARIANT3(256, 256, 4096, 12, true)
  VARIANT3(256, 512, 16384, 3, true)
  VARIANT3(256, 512, 8192, 6, false)
  VARIANT3(512, 512, 8192, 6, false)
  VARIANT3(256, 256, 8192, 6, true, true)
  VARIANT3(256, 256, 8192, 6, false, true)
  VARIANT3(256, 512, 8192, 6, false, true)
  VARIANT3(512, 256, 8192, 6, false, true)
  VARIANT3(256, 256, 8192, 6, false)
  return 0;
}
