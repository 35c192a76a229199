#ifndef KILN_KERNELS_CUDA_KILN_CUDA_EMULATE_H_
#define KILN_KERNELS_CUDA_KILN_CUDA_EMULATE_H_

// Test-only: runs generated CUDA kernels on the host, so that the emitter's thread mappings,
// vector lanes, register caches and warp/block reductions are checked on machines without a GPU
// (//server/codegen:cuda_emulation_test). Placed before the CUDA prelude in a host C++17
// translation unit: every CUDA thread of a block is a std::thread; __syncthreads is a barrier of
// the block's threads and __shfl_xor_sync exchanges through memory between two barriers of the
// warp's 32 threads; blocks run one after another (so a __shared__ array can be a static), except
// the blocks of one cluster (kiln_cuda_cluster.cuh), which run concurrently: their shared memory
// is cluster_smem (one arena per block, not a static), cluster_sync is a barrier of the cluster's
// threads and cluster_words reads another block's arena at the same offset. Dynamic shared memory
// (dynamic_smem) is an arena of the launch's shared_bytes per block, filled with garbage.
// Never embedded into generated code.

#define KILN_CUDA_EMULATE 1

#include <condition_variable>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static

struct kiln_emu_dim3 {
  unsigned x = 0, y = 1, z = 1;
};

namespace kiln_emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const long gen = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int count_ = 0;
  long generation_ = 0;
};

constexpr int kSmemBytes = 64 * 1024;  // a block's cluster_smem arena

struct Block {
  explicit Block(int threads, int dynamic_bytes = 0)
      : block(threads), slots(threads), smem(kSmemBytes / 16), dynamic((dynamic_bytes + 15) / 16 + 1) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.emplace_back(new Barrier(32));
    // Garbage, as on a GPU: a kernel must not read slots it did not write.
    for (size_t i = 0; i < dynamic.size(); ++i) std::memset(dynamic[i].b, static_cast<int>(0x5A + i), 16);
  }
  Barrier block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<unsigned> slots;
  struct alignas(16) Chunk { unsigned char b[16]; };
  std::vector<Chunk> smem;
  std::vector<Chunk> dynamic;  // dynamic shared memory
  unsigned char* arena() { return smem.front().b; }
};

struct Cluster {
  explicit Cluster(int threads) : barrier(threads) {}
  Barrier barrier;
  std::vector<Block*> blocks;  // by rank
};

inline thread_local Block* tl_block = nullptr;
inline thread_local Cluster* tl_cluster = nullptr;

inline unsigned char* BlockSmem(int bytes) {
  if (bytes > kSmemBytes) std::abort();
  return tl_block->arena();
}
inline unsigned char* DynamicSmem() { return tl_block->dynamic.front().b; }
inline void ClusterSync() { tl_cluster->barrier.Wait(); }
inline uint32_t ClusterWord(const uint32_t* p, unsigned rank) {
  const size_t offset = reinterpret_cast<const unsigned char*>(p) - tl_block->arena();
  if (rank >= tl_cluster->blocks.size() || offset + 4 > static_cast<size_t>(kSmemBytes)) std::abort();
  uint32_t v;
  std::memcpy(&v, tl_cluster->blocks[rank]->arena() + offset, 4);
  return v;
}

// mbarriers of bulk copies (kiln_cuda_vec.cuh): the 64-bit word holds the phase (bit 63),
// whether its one arrival came (bit 32) and the bytes still due (bits 0-31), changed under one
// lock; a copy is a memcpy by the issuing thread, and a waiter polls the phase.
inline std::mutex& MbarMutex() {
  static std::mutex mu;
  return mu;
}
inline void MbarCompleteLocked(uint64_t* bar) {
  if ((*bar & (uint64_t{1} << 32)) != 0 && (*bar & 0xffffffffu) == 0) {
    *bar = (*bar & (uint64_t{1} << 63)) ^ (uint64_t{1} << 63);  // next phase, nothing arrived
  }
}
inline void MbarInit(uint64_t* bar) {
  std::lock_guard<std::mutex> lock(MbarMutex());
  *bar = 0;
}
inline void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  std::lock_guard<std::mutex> lock(MbarMutex());
  if ((*bar & (uint64_t{1} << 32)) != 0) std::abort();  // one arrival per phase
  *bar += (uint64_t{1} << 32) + bytes;
  MbarCompleteLocked(bar);
}
inline void BulkCopy(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(smem) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(gmem) % 16 != 0) {
    std::abort();  // the hardware's rule
  }
  std::memcpy(smem, gmem, bytes);
  std::lock_guard<std::mutex> lock(MbarMutex());
  if ((*bar & 0xffffffffu) < bytes) std::abort();  // more bytes than announced
  *bar -= bytes;
  MbarCompleteLocked(bar);
}
inline void MbarWait(uint64_t* bar, unsigned parity) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(MbarMutex());
      if ((*bar >> 63) != parity) return;
    }
    std::this_thread::yield();
  }
}

}  // namespace kiln_emu

inline thread_local kiln_emu_dim3 threadIdx, blockIdx;
inline kiln_emu_dim3 blockDim, gridDim;

inline void __syncthreads() { kiln_emu::tl_block->block.Wait(); }

inline unsigned __shfl_xor_sync(unsigned /*mask*/, unsigned v, int offset) {
  kiln_emu::Block& b = *kiln_emu::tl_block;
  const unsigned t = threadIdx.x;
  kiln_emu::Barrier& warp = *b.warps[t / 32];
  b.slots[t] = v;
  warp.Wait();
  const unsigned r = b.slots[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned>(offset))];
  warp.Wait();
  return r;
}

namespace kiln_emu {

template <typename P>
P Arg(void* const* buffers, const int64_t* scalars, size_t i, size_t num_buffers) {
  if constexpr (std::is_pointer<P>::value) {
    return static_cast<P>(buffers[i]);
  } else {
    return static_cast<P>(scalars[i - num_buffers]);
  }
}

// Runs fn<<<grid, block, shared_bytes>>>(buffers..., scalars...) with the emitter's parameter
// convention, in clusters of `cluster` blocks (grid a multiple of it; 1: no clusters).
template <typename... P, size_t... I>
void LaunchImpl(void (*fn)(P...), void* const* buffers, const int64_t* scalars, int grid, int block,
                int cluster, int shared_bytes, std::index_sequence<I...>) {
  constexpr size_t num_buffers = (size_t{0} + ... + (std::is_pointer<P>::value ? 1 : 0));
  if (cluster < 1 || grid % cluster != 0) std::abort();
  gridDim.x = static_cast<unsigned>(grid);
  blockDim.x = static_cast<unsigned>(block);
  for (int b0 = 0; b0 < grid; b0 += cluster) {
    Cluster cl(cluster * block);
    std::vector<std::unique_ptr<Block>> blocks;
    for (int r = 0; r < cluster; ++r) {
      blocks.emplace_back(new Block(block, shared_bytes));
      cl.blocks.push_back(blocks.back().get());
    }
    std::vector<std::thread> threads;
    threads.reserve(cluster * block);
    for (int r = 0; r < cluster; ++r) {
      for (int t = 0; t < block; ++t) {
        threads.emplace_back([&, r, t] {
          threadIdx.x = static_cast<unsigned>(t);
          blockIdx.x = static_cast<unsigned>(b0 + r);
          tl_block = blocks[r].get();
          tl_cluster = &cl;
          fn(Arg<P>(buffers, scalars, I, num_buffers)...);
        });
      }
    }
    for (std::thread& th : threads) th.join();
  }
}

template <typename... P>
void Launch(void (*fn)(P...), void* const* buffers, const int64_t* scalars, int grid, int block,
            int cluster = 1, int shared_bytes = 0) {
  LaunchImpl(fn, buffers, scalars, grid, block, cluster, shared_bytes, std::index_sequence_for<P...>());
}

}  // namespace kiln_emu

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_EMULATE_H_
