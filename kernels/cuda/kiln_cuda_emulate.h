#ifndef KILN_KERNELS_CUDA_KILN_CUDA_EMULATE_H_
#define KILN_KERNELS_CUDA_KILN_CUDA_EMULATE_H_

// Test-only: runs generated CUDA kernels on the host, so that the emitter's thread mappings,
// vector lanes, register caches and warp/block reductions are checked on machines without a GPU
// (//server/codegen:cuda_emulation_test). Placed before the CUDA prelude in a host C++17
// translation unit: every CUDA thread of a block is a std::thread; __syncthreads is a barrier of
// the block's threads and __shfl_xor_sync exchanges through memory between two barriers of the
// warp's 32 threads; blocks run one after another (so a __shared__ array can be a static).
// Never embedded into generated code.

#define KILN_CUDA_EMULATE 1

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __launch_bounds__(n)
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

struct Block {
  explicit Block(int threads) : block(threads), slots(threads) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.emplace_back(new Barrier(32));
  }
  Barrier block;
  std::vector<std::unique_ptr<Barrier>> warps;
  std::vector<unsigned> slots;
};

inline thread_local Block* tl_block = nullptr;

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

// Runs fn<<<grid, block>>>(buffers..., scalars...) with the emitter's parameter convention.
template <typename... P, size_t... I>
void LaunchImpl(void (*fn)(P...), void* const* buffers, const int64_t* scalars, int grid, int block,
                std::index_sequence<I...>) {
  constexpr size_t num_buffers = (size_t{0} + ... + (std::is_pointer<P>::value ? 1 : 0));
  gridDim.x = static_cast<unsigned>(grid);
  blockDim.x = static_cast<unsigned>(block);
  for (int b = 0; b < grid; ++b) {
    Block blk(block);
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (int t = 0; t < block; ++t) {
      threads.emplace_back([&, b, t] {
        threadIdx.x = static_cast<unsigned>(t);
        blockIdx.x = static_cast<unsigned>(b);
        tl_block = &blk;
        fn(Arg<P>(buffers, scalars, I, num_buffers)...);
      });
    }
    for (std::thread& th : threads) th.join();
  }
}

template <typename... P>
void Launch(void (*fn)(P...), void* const* buffers, const int64_t* scalars, int grid, int block) {
  LaunchImpl(fn, buffers, scalars, grid, block, std::index_sequence_for<P...>());
}

}  // namespace kiln_emu

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_EMULATE_H_
