#ifndef KILN_KERNELS_CUDA_KILN_CUDA_REDUCE_CUH_
#define KILN_KERNELS_CUDA_KILN_CUDA_REDUCE_CUH_

// Accumulators and group reductions of generated CUDA row kernels (see server/kernel/kernel_ir.h,
// AccKind, and server/codegen/cuda_emitter.h for the thread layouts). Each thread folds its share
// of a row into a thread-local accumulator (same Update rules as kernels/cpu/kiln_reduce.h); a
// phase ends with an all-reduce over the threads of the row, after which every thread holds the
// same combined accumulator (results are broadcast for later phases):
//   * warp_allreduce: the row's threads are one warp (butterfly of shuffles; each pair combines
//     (lower lane, higher lane) in that order, so every lane computes bit-identical results even
//     for the non-commutative Welford merge);
//   * block_allreduce: the row's threads are the whole block (warp all-reduce, then each thread
//     folds the per-warp results from shared memory in warp order);
//   * column_allreduce<kRx, kLanes>: thread t of a block serves point t % kRx with lane t / kRx
//     (column reductions: coalesced across points); partials meet in shared memory;
//     column_allreduce_vec: the same for V accumulators per thread (vector columns: thread t
//     serves points V * (t % kRx) + j), one tree for all of them.
// dynamic_smem(): the block's dynamic shared memory (extern __shared__), for row caches.
// Merges: sum/prod/max/min through SumOp/ProdOp/MaxOp/MinOp (NaN-propagating), argmax/argmin with
// torch's rule (NaN is the extreme, the smallest index wins ties), Welford by Chan et al.,
// online softmax by rescaling to the larger max. fp32 state for half/bf16 inputs (the IR's
// accumulators are f32/f64 there already).

#include "kernels/cuda/kiln_cuda_math.cuh"

namespace kiln_cuda {

template <typename T> struct ArgMax {
  T value = lowest<T>();
  int64_t index = -1;
  KILN_DEV void Update(T x, int64_t i) {
    if (index < 0 || (!(value != value) && (x != x || x > value))) { value = x; index = i; }
  }
  // Any two partials (their index sets may interleave): NaN first, then larger, then smaller index.
  KILN_DEV void Merge(const ArgMax& b) {
    if (b.index < 0) return;
    if (index < 0) { *this = b; return; }
    const bool a_nan = value != value, b_nan = b.value != b.value;
    bool take;
    if (a_nan || b_nan) {
      take = b_nan && (!a_nan || b.index < index);
    } else {
      take = b.value > value || (b.value == value && b.index < index);
    }
    if (take) *this = b;
  }
};

template <typename T> struct ArgMin {
  T value = highest<T>();
  int64_t index = -1;
  KILN_DEV void Update(T x, int64_t i) {
    if (index < 0 || (!(value != value) && (x != x || x < value))) { value = x; index = i; }
  }
  KILN_DEV void Merge(const ArgMin& b) {
    if (b.index < 0) return;
    if (index < 0) { *this = b; return; }
    const bool a_nan = value != value, b_nan = b.value != b.value;
    bool take;
    if (a_nan || b_nan) {
      take = b_nan && (!a_nan || b.index < index);
    } else {
      take = b.value < value || (b.value == value && b.index < index);
    }
    if (take) *this = b;
  }
};

template <typename T> struct Welford {
  T mean = 0;
  T m2 = 0;
  T count = 0;
  KILN_DEV void Update(T x) {
    count += T(1);
    const T delta = x - mean;
    mean += div_approx(delta, count);  // kiln_cuda_math.cuh: the IEEE division is most of the cost
    m2 += delta * (x - mean);
  }
  KILN_DEV void Merge(const Welford& b) {
    if (b.count == 0) return;
    if (count == 0) { *this = b; return; }
    const T total = count + b.count;
    const T delta = b.mean - mean;
    // b's weight with an approximate division (2 ulp, as Triton's welford_combine): an IEEE
    // division is tens of instructions, and a column kernel merges V accumulators per level.
    const T w = div_approx(b.count, total);
    mean += delta * w;
    m2 += b.m2 + delta * delta * (count * w);
    count = total;
  }
};

template <typename T> struct OnlineSoftmax {
  T max = -inf<T>();
  T sum = 0;
  KILN_DEV void Update(T x) {
    if (x > max) {
      // A new maximum of +inf: its own term is exp(inf - inf), NaN as in torch.
      sum = x == inf<T>() ? nan<T>() : sum * kiln_cuda::exp(max - x) + T(1);
      max = x;
    } else if (x <= max) {
      if (max != -inf<T>()) sum += kiln_cuda::exp(x - max);
    } else {  // x or max is NaN
      max = x != x ? x : max;
      sum = nan<T>();
    }
  }
  KILN_DEV void Merge(const OnlineSoftmax& b) {
    const T m = maximum(max, b.max);
    if (m != m) { max = m; sum = nan<T>(); return; }
    if (m == -inf<T>()) { sum += b.sum; return; }
    sum = sum * kiln_cuda::exp(max - m) + b.sum * kiln_cuda::exp(b.max - m);
    max = m;
  }
};

struct SumOp { template <typename T> KILN_DEV T operator()(T a, T b) const { return static_cast<T>(a + b); } };
struct ProdOp { template <typename T> KILN_DEV T operator()(T a, T b) const { return static_cast<T>(a * b); } };
struct MaxOp { template <typename T> KILN_DEV T operator()(T a, T b) const { return maximum(a, b); } };
struct MinOp { template <typename T> KILN_DEV T operator()(T a, T b) const { return minimum(a, b); } };
struct MergeOp {
  template <typename S> KILN_DEV S operator()(S a, const S& b) const { a.Merge(b); return a; }
};

#if defined(__CUDACC__) || defined(KILN_CUDA_EMULATE)

// Shuffles any trivially copyable state word by word.
template <typename S> KILN_DEV S shfl_xor(const S& s, int offset) {
  constexpr int kWords = (sizeof(S) + 3) / 4;
  union U { S s; uint32_t w[kWords]; KILN_DEV U() {} } in, out;
  in.s = s;
#pragma unroll
  for (int i = 0; i < kWords; ++i) out.w[i] = __shfl_xor_sync(0xffffffffu, in.w[i], offset);
  return out.s;
}

// All 32 lanes must call it; every lane returns the same combination of the 32 partials.
template <typename S, typename Op> KILN_DEV S warp_allreduce(S s, Op op) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 16; offset >= 1; offset >>= 1) {
    const S other = shfl_xor(s, offset);
    s = (lane & offset) ? op(other, s) : op(s, other);
  }
  return s;
}

// Every thread of the block must call it (a barrier inside); `smem` holds blockDim.x / 32 states.
// kWarps > 0: the block has exactly that many warps (the fold is unrolled); 0: blockDim.x / 32.
template <int kWarps = 0, typename S, typename Op> KILN_DEV S block_allreduce(S s, Op op, void* smem) {
  S* slots = static_cast<S*>(smem);
  s = warp_allreduce(s, op);
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = s;
  __syncthreads();
  S r = slots[0];
  const int warps = kWarps > 0 ? kWarps : static_cast<int>(blockDim.x >> 5);
#pragma unroll
  for (int w = 1; w < warps; ++w) r = op(r, slots[w]);
  __syncthreads();  // the slots may be reused right after
  return r;
}

// Every thread of the block must call it; `smem` holds kRx * kLanes states. The block is kRx *
// kLanes threads (the emitter's launch): thread t serves point t % kRx as lane t / kRx.
// A power-of-two number of lanes folds as a tree (lane l takes lane l + half, half = kLanes / 2,
// kLanes / 4, ... 1), else in lane order by every thread. Either way every thread of a point gets
// the same result. Both counts are template arguments so that only one of the two ways is
// compiled and the divisions are by constants: small column kernels run for microseconds, and
// their code's first fetch from memory is a large part of that.
template <int kRx, int kLanes, typename S, typename Op> KILN_DEV S column_allreduce(S s, Op op, void* smem) {
  S* slots = static_cast<S*>(smem);
  const int t = static_cast<int>(threadIdx.x);
  slots[t] = s;
  __syncthreads();
  const int point = t % kRx;
  if constexpr ((kLanes & (kLanes - 1)) == 0) {
    const int lane = t / kRx;
#pragma unroll 1
    for (int half = kLanes / 2; half > 0; half /= 2) {
      if (lane < half) slots[t] = op(slots[t], slots[t + half * kRx]);
      __syncthreads();
    }
    const S r = slots[point];
    __syncthreads();
    return r;
  } else {
    S r = slots[point];
#pragma unroll 1
    for (int l = 1; l < kLanes; ++l) r = op(r, slots[l * kRx + point]);
    __syncthreads();
    return r;
  }
}

// column_allreduce over the V accumulators `s` of each thread (points V * (t % kRx) + j), in
// place: `smem` holds V * kRx * kLanes states, lane-major (slot j * n + t: consecutive threads,
// consecutive slots). The same folds in the same order as V column_allreduce calls, with the
// barriers of one; the folds of a level are not unrolled (code size, as above).
template <int kRx, int kLanes, int V, typename S, typename Op>
KILN_DEV void column_allreduce_vec(S (&s)[V], Op op, void* smem) {
  S* slots = static_cast<S*>(smem);
  constexpr int n = kRx * kLanes;
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int j = 0; j < V; ++j) slots[j * n + t] = s[j];
  __syncthreads();
  const int point = t % kRx;
  if constexpr ((kLanes & (kLanes - 1)) == 0) {
    const int lane = t / kRx;
    // Once the lanes still folding (2 * half of them) lie in warp 0, their partners
    // (t + half * kRx = t ^ half * kRx) come by shuffle: no shared memory, no barrier.
    constexpr bool kShuffle = (kRx & (kRx - 1)) == 0 && 2 * kRx <= 32;
#pragma unroll 1
    for (int half = kLanes / 2; half > 0; half /= 2) {
      if (kShuffle && 2 * half * kRx <= 32) {
        S other[V];
#pragma unroll
        for (int j = 0; j < V; ++j) other[j] = shfl_xor(s[j], half * kRx);  // every thread: whole warps
        if (lane < half) {
#pragma unroll
          for (int j = 0; j < V; ++j) s[j] = op(s[j], other[j]);
        }
        continue;
      }
      if (lane < half) {
        // The V partner states first, then the merges, then the stores: a store between two
        // loads could alias them as far as the compiler knows, which made the V merges of a
        // level one chain (a ResNet batch norm merge: 2.4 us of its 5 in the Welford all-reduce).
        // A thread's own states stay in s (its slots hold the same values).
        S other[V];
#pragma unroll
        for (int j = 0; j < V; ++j) other[j] = slots[j * n + t + half * kRx];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          s[j] = op(s[j], other[j]);
          slots[j * n + t] = s[j];
        }
      }
      __syncthreads();
    }
    if constexpr (kShuffle) {
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < V; ++j) slots[j * n + t] = s[j];
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < V; ++j) s[j] = slots[j * n + point];
    __syncthreads();
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      S r = slots[j * n + point];
#pragma unroll 1
      for (int l = 1; l < kLanes; ++l) r = op(r, slots[j * n + l * kRx + point]);
      s[j] = r;
    }
    __syncthreads();
  }
}

// The block's dynamic shared memory (the launch's shared_bytes; kSharedRow's row cache), 16-aligned.
#if defined(KILN_CUDA_EMULATE)
KILN_DEV unsigned char* dynamic_smem() { return kiln_emu::DynamicSmem(); }
#else
KILN_DEV unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char kiln_dynamic_smem[];
  return kiln_dynamic_smem;
}
#endif

#endif  // __CUDACC__ || KILN_CUDA_EMULATE

}  // namespace kiln_cuda

#endif  // KILN_KERNELS_CUDA_KILN_CUDA_REDUCE_CUH_
