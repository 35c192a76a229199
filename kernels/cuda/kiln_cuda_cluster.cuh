#ifndef KILN_KERNELS_CUDA_KILN_CUDA_CLUSTER_CUH_
#define KILN_KERNELS_CUDA_KILN_CUDA_CLUSTER_CUH_

// Thread-block clusters (sm_90+) for row kernels whose row is spread over the blocks of one
// cluster (server/codegen/cuda_long_rows.h, layout kClusterRow). The blocks of a cluster are
// consecutive in blockIdx.x (rank = blockIdx.x % cluster size, the kernel has
// __cluster_dims__(size, 1, 1)); they are co-scheduled, so they may wait for each other.
//   cluster_smem<N>():  the block's static shared memory, N bytes, 16-aligned.
//   cluster_sync():     barrier.cluster arrive (release) + wait (acquire): every thread of every
//                       block of the cluster; shared-memory writes before it are visible to the
//                       whole cluster after it.
//   cluster_words<n>(w, p, r): the n 32-bit words at the address of `p` (this block's shared
//                       memory, 8-byte aligned) in the shared memory of the cluster's block of
//                       rank r (distributed shared memory: mapa + ld.shared::cluster).
//   cluster_fold<kCluster>(s, op, pub, parity): `s` the same in every thread of a block (a block
//     all-reduce's result); every thread of every block of the cluster must call it, the same
//     number of times (cluster_allreduce counts as one call): thread 0 of each block publishes
//     the block's state in `pub` (2 slots of 8 words, alternating with *parity: a slot is
//     rewritten two calls later, after a barrier that every reader of the previous value has
//     passed), cluster_sync, and every thread folds the published states in rank order, so every
//     thread of the cluster returns bit-identical results (Welford's merge is not commutative).
//     A block must not exit while another may still read its slots: the kernel ends with
//     cluster_sync().
//   cluster_allreduce<kWarps, kCluster>(s, op, smem, pub, parity): block_allreduce, then
//     cluster_fold.
// Inline PTX only (no CUDA headers). kiln_cuda_emulate.h stands in for the PTX on the host, where
// the blocks of a cluster run concurrently.

#include "kernels/cuda/kiln_cuda_reduce.cuh"

namespace kiln_cuda {

#if defined(KILN_CUDA_EMULATE)

template <int N> KILN_DEV unsigned char* cluster_smem() { return kiln_emu::BlockSmem(N); }
KILN_DEV void cluster_sync() { kiln_emu::ClusterSync(); }
template <int kWords> KILN_DEV void cluster_words(uint32_t* w, const uint32_t* p, unsigned rank) {
  for (int i = 0; i < kWords; ++i) w[i] = kiln_emu::ClusterWord(p + i, rank);
}

#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

template <int N> KILN_DEV unsigned char* cluster_smem() {
  alignas(16) __shared__ unsigned char smem[N];
  return smem;
}
KILN_DEV void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// No "memory" clobber on the loads: they stay after the cluster barrier (volatile asm keeps its
// order) but several may be in flight at once; with the clobber each waited for the last
// (softmax f32 64 x 262144 in 16-block clusters: 67 us against 55 us).
template <int kWords> KILN_DEV void cluster_words(uint32_t* w, const uint32_t* p, unsigned rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t a;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(local), "r"(rank));
#pragma unroll
  for (int i = 0; i + 1 < kWords; i += 2) {
    asm volatile("ld.shared::cluster.v2.u32 {%0, %1}, [%2];" : "=r"(w[i]), "=r"(w[i + 1]) : "r"(a + 4 * i));
  }
  if (kWords % 2 != 0) {
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(w[kWords - 1]) : "r"(a + 4 * (kWords - 1)));
  }
}

#endif

#if defined(KILN_CUDA_EMULATE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)

template <int kCluster, typename S, typename Op>
KILN_DEV S cluster_fold(S s, Op op, uint32_t* pub, unsigned* parity) {
  constexpr int kWords = (sizeof(S) + 3) / 4;
  static_assert(kWords <= 8, "a cluster slot holds 8 words");
  union U { S s; uint32_t w[kWords]; KILN_DEV U() {} } u;
  u.s = s;
  uint32_t* slot = pub + 8 * *parity;
  *parity ^= 1u;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) slot[i] = u.w[i];
  }
  cluster_sync();
  // The blocks' states in rank order, a few ranks' loads in flight at a time.
  constexpr int kGroup = kWords <= 2 ? 4 : kWords <= 4 ? 2 : 1;
  S r = u.s;
#pragma unroll
  for (int g = 0; g < kCluster; g += kGroup) {
    U p[kGroup];
#pragma unroll
    for (int c = 0; c < kGroup; ++c) {
      if (g + c < kCluster) cluster_words<kWords>(p[c].w, slot, static_cast<unsigned>(g + c));
    }
#pragma unroll
    for (int c = 0; c < kGroup; ++c) {
      if (g + c < kCluster) r = g + c == 0 ? p[c].s : op(r, p[c].s);
    }
  }
  return r;
}

template <int kWarps, int kCluster, typename S, typename Op>
KILN_DEV S cluster_allreduce(S s, Op op, void* smem, uint32_t* pub, unsigned* parity) {
  return cluster_fold<kCluster>(block_allreduce<kWarps>(s, op, smem), op, pub, parity);
}

#endif

}  // namespace kiln_cuda

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_CLUSTER_CUH_
