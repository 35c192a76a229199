#ifndef KILN_KERNELS_CUDA_KILN_CUDA_VEC_CUH_
#define KILN_KERNELS_CUDA_KILN_CUDA_VEC_CUH_

// Vector loads and stores for generated CUDA kernels: Vec<T, N> is N elements aligned to their
// total size (2 to 16 bytes), so one load/store instruction moves it (ld.global.v4.f32 for
// Vec<float, 4>, ld.global.v4.u32 for Vec<uint16_t, 8>...); load_vec_if for a masked load whose
// mask holds for the whole vector or none of it. The emitter uses them only after a
// run-time alignment check (aligned()), with a scalar path for the rest. misalign(p, n): how many
// elements p lies past an n-element boundary (rows whose length is not a multiple of the width
// start their vectors that many elements early: the first and last chunk of a row go scalar).
// cp_async<N>(smem, gmem): an asynchronous copy of N = 4, 8 or 16 bytes (both addresses aligned
// to N) from global to shared memory (sm_80+: cp.async, .cg for 16 bytes, bypassing L1); the
// bytes are there once the same thread has called cp_async_wait_all() (commit_group +
// wait_group 0). Elsewhere (older archs, the host emulator) a plain copy and a no-op.
// Bulk copies (sm_90+, the copy engine; kSharedRow's two row caches): mbar_init(bar) readies an
// mbarrier of one arrival; mbar_expect_tx(bar, bytes) is that arrival, announcing the bytes the
// copies will bring; bulk_copy(smem, gmem, bytes, bar) moves `bytes` (a multiple of 16, both
// addresses 16-byte aligned) from global to shared memory, counting them against the barrier;
// mbar_wait(bar, parity) returns once the barrier's phase of that parity is complete (its k-th
// use: parity k % 2), after which the bytes are visible to the waiting thread.
// fence_proxy_async() orders this thread's earlier shared-memory accesses before later bulk
// copies (a cache's reads before its next fill). The host emulator runs them through kiln_emu
// (kiln_cuda_emulate.h); other archs trap (the emitter never calls them there).

#include "kernels/cuda/kiln_cuda_math.cuh"

// memcpy for reinterpreting bytes between registers (NVRTC declares memcpy for device code; the
// host emulation compiles with g++).
#if defined(__CUDACC__)
#define KILN_CUDA_MEMCPY(dst, src, n) memcpy(dst, src, n)
#else
#define KILN_CUDA_MEMCPY(dst, src, n) __builtin_memcpy(dst, src, n)
#endif

namespace kiln_cuda {

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <int N, typename T> KILN_DEV Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}
// load_vec_if<N>(m, p): load_vec<N>(p) where m holds, else zeros (p is not read); the vector
// moves as 32-bit words where its size allows (one predicated load into zeroed registers).
template <int N, typename T> KILN_DEV Vec<T, N> load_vec_if(bool m, const T* p) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  if constexpr (kBytes % 4 == 0) {
    Vec<unsigned int, kBytes / 4> w{};
    if (m) w = *reinterpret_cast<const Vec<unsigned int, kBytes / 4>*>(p);
    Vec<T, N> v;
    KILN_CUDA_MEMCPY(&v, &w, kBytes);
    return v;
  } else {
    Vec<T, N> v{};
    if (m) v = *reinterpret_cast<const Vec<T, N>*>(p);
    return v;
  }
}
template <int N, typename T> KILN_DEV void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}
template <typename T> KILN_DEV bool aligned(const T* p, int bytes) {
  return (reinterpret_cast<unsigned long long>(p) & static_cast<unsigned long long>(bytes - 1)) == 0;
}

template <typename T> KILN_DEV int misalign(const T* p, int n) {
  return static_cast<int>((reinterpret_cast<unsigned long long>(p) / sizeof(T)) %
                          static_cast<unsigned long long>(n));
}

template <int N> KILN_DEV void cp_async(void* smem, const void* gmem) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(N) : "memory");
  }
#else
  struct alignas(N) Bytes {
    unsigned char b[N];
  };
  *reinterpret_cast<Bytes*>(smem) = *reinterpret_cast<const Bytes*>(gmem);
#endif
}

// cp_async_commit(): closes the copies issued so far into a group without waiting for them (a
// later cp_async_wait_all() waits for every group).
KILN_DEV void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

KILN_DEV void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}

KILN_DEV void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#elif defined(KILN_CUDA_EMULATE)
  kiln_emu::MbarInit(bar);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

KILN_DEV void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes) : "memory");
#elif defined(KILN_CUDA_EMULATE)
  kiln_emu::MbarExpectTx(bar, bytes);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

KILN_DEV void bulk_copy(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  // Pieces of 16 KiB: the copy engine works on several at once.
  for (uint32_t off = 0; off < bytes; off += 16384) {
    const uint32_t n = bytes - off < 16384 ? bytes - off : 16384;
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(s + off), "l"(static_cast<const unsigned char*>(gmem) + off), "r"(n), "r"(b) : "memory");
  }
#elif defined(KILN_CUDA_EMULATE)
  kiln_emu::BulkCopy(smem, gmem, bytes, bar);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

KILN_DEV void mbar_wait(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  unsigned done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(b), "r"(parity) : "memory");
  }
#elif defined(KILN_CUDA_EMULATE)
  kiln_emu::MbarWait(bar, parity);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

KILN_DEV void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// window(a, b, off): the N elements of a then b (2 N in all) from element `off` (0 <= off < N): a
// vector at another alignment, from the two aligned vectors that hold it (kSharedRow's stores
// over their own alignment read the row cache, laid out by the loads' alignment, this way).
// log2(N) steps of selects on 32-bit words (16-bit elements: the odd offsets by a funnel shift of
// each pair of words), never an index by a run-time value: everything stays in registers (a and b
// by value: each read as one vector).
template <typename T, int N> KILN_DEV Vec<T, N> window(const Vec<T, N> a, const Vec<T, N> b, int off) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "window: a power-of-two width");
  Vec<T, N> r;
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
    constexpr int kWords = N / 2;  // Vec is aligned to its size: whole words
    uint32_t w[2 * kWords];  // pairs of lanes as words, copied (no cast pointer: strict aliasing)
    KILN_CUDA_MEMCPY(w, &a, sizeof(a));
    KILN_CUDA_MEMCPY(w + kWords, &b, sizeof(b));
    const int words = off >> 1;
#pragma unroll
    for (int step = kWords / 2; step >= 1; step /= 2) {
      const bool take = (words & step) != 0;
#pragma unroll
      for (int i = 0; i + step < 2 * kWords; ++i) w[i] = take ? w[i + step] : w[i];
    }
    const unsigned shift = static_cast<unsigned>(off & 1) * 16u;
    uint32_t out[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      out[i] = static_cast<uint32_t>(((static_cast<uint64_t>(w[i + 1]) << 32) | w[i]) >> shift);
    }
    KILN_CUDA_MEMCPY(&r, out, sizeof(r));
  } else {
    T e[2 * N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      e[i] = a.v[i];
      e[N + i] = b.v[i];
    }
#pragma unroll
    for (int step = N / 2; step >= 1; step /= 2) {
      const bool take = (off & step) != 0;
#pragma unroll
      for (int i = 0; i + step < 2 * N; ++i) e[i] = take ? e[i + step] : e[i];
    }
#pragma unroll
    for (int i = 0; i < N; ++i) r.v[i] = e[i];
  }
  return r;
}

// Lane J of a vector of bf16 bit patterns, widened: its 32-bit word shifted (even J) or masked
// (odd J), one instruction each (bf16_to_f32(v.v[J]) extracts the odd lanes first: two).
template <int J, int N> KILN_DEV float bf16_lane(const Vec<uint16_t, N>& v) {
  static_assert(N % 2 == 0 && J >= 0 && J < N, "bf16_lane: a lane of an even-width vector");
  const uint32_t w = reinterpret_cast<const uint32_t*>(&v)[J / 2];  // Vec is aligned to its size
  return bits_to_f32(J % 2 == 0 ? w << 16 : w & 0xffff0000u);
}

// max_nan over the lanes of a vector of bf16 (kBf16) or f16 bit patterns, widened to float: the
// two-pass softmax's row max over a cached 16-bit row. On sm_80+ pairwise max.NaN.bf16x2 /
// .f16x2 (exact: the maximum of 16-bit values is one of them; NaN if any lane is NaN), then the
// last pair widened: N / 2 + 2 instructions instead of 2 N. Elsewhere lane by lane.
template <bool kBf16, int N> KILN_DEV float max_nan_half(const Vec<uint16_t, N>& v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (N % 2 == 0) {
    const uint32_t* const w = reinterpret_cast<const uint32_t*>(&v);  // Vec is 16-byte aligned
    uint32_t m = w[0];
#pragma unroll
    for (int i = 1; i < N / 2; ++i) {
      if constexpr (kBf16) {
        asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(m), "r"(w[i]));
      } else {
        asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(m) : "r"(m), "r"(w[i]));
      }
    }
    const uint16_t lo = static_cast<uint16_t>(m & 0xffffu), hi = static_cast<uint16_t>(m >> 16);
    return kBf16 ? max_nan(bf16_to_f32(lo), bf16_to_f32(hi)) : max_nan(f16_to_f32(lo), f16_to_f32(hi));
  }
#endif
  float m = kBf16 ? bf16_to_f32(v.v[0]) : f16_to_f32(v.v[0]);
  for (int i = 1; i < N; ++i) m = max_nan(m, kBf16 ? bf16_to_f32(v.v[i]) : f16_to_f32(v.v[i]));
  return m;
}

}  // namespace kiln_cuda

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_VEC_CUH_
