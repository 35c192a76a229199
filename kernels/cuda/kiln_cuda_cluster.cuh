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
//   cluster_word(p, r): the 32-bit word at the address of `p` (this block's shared memory) in the
//                       shared memory of the cluster's block of rank r (distributed shared memory:
//                       mapa + ld.shared::cluster).
//   cluster_allreduce<kWarps, kCluster>(s, op, smem, pub, parity): every thread of every block of
//     the cluster must call it, the same number of times; block_allreduce, then thread 0 of each
//     block publishes the block's state in `pub` (2 slots of 8 words, alternating with *parity:
//     a slot is rewritten two calls later, after a barrier that every reader of the previous
//     value has passed), cluster_sync, and every thread folds the published states in rank order,
//     so every thread of the cluster returns bit-identical results (Welford's merge is not
//     commutative). A block must not exit while another may still read its slots: the kernel
//     ends with cluster_sync().
// Inline PTX only (no CUDA headers). kiln_cuda_emulate.h stands in for the PTX on the host, where
// the blocks of a cluster run concurrently.

#include "kernels/cuda/kiln_cuda_reduce.cuh"

namespace kiln_cuda {

#if defined(KILN_CUDA_EMULATE)

template <int N> KILN_DEV unsigned char* cluster_smem() { return kiln_emu::BlockSmem(N); }
KILN_DEV void cluster_sync() { kiln_emu::ClusterSync(); }
KILN_DEV uint32_t cluster_word(const uint32_t* p, unsigned rank) { return kiln_emu::ClusterWord(p, rank); }

#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

template <int N> KILN_DEV unsigned char* cluster_smem() {
  alignas(16) __shared__ unsigned char smem[N];
  return smem;
}
KILN_DEV void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
KILN_DEV uint32_t cluster_word(const uint32_t* p, unsigned rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint32_t remote, v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
  return v;
}

#endif

#if defined(KILN_CUDA_EMULATE) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)

template <int kWarps, int kCluster, typename S, typename Op>
KILN_DEV S cluster_allreduce(S s, Op op, void* smem, uint32_t* pub, unsigned* parity) {
  constexpr int kWords = (sizeof(S) + 3) / 4;
  static_assert(kWords <= 8, "a cluster slot holds 8 words");
  union U { S s; uint32_t w[kWords]; KILN_DEV U() {} } u;
  u.s = block_allreduce<kWarps>(s, op, smem);
  uint32_t* slot = pub + 8 * *parity;
  *parity ^= 1u;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) slot[i] = u.w[i];
  }
  cluster_sync();
#pragma unroll
  for (int i = 0; i < kWords; ++i) u.w[i] = cluster_word(slot + i, 0);
  S r = u.s;
#pragma unroll
  for (int c = 1; c < kCluster; ++c) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) u.w[i] = cluster_word(slot + i, c);
    r = op(r, u.s);
  }
  return r;
}

#endif

}  // namespace kiln_cuda

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_CLUSTER_CUH_
