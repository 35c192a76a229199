#ifndef KILN_KERNELS_CPU_KILN_REDUCE_H_
#define KILN_KERNELS_CPU_KILN_REDUCE_H_

// Accumulators of generated CPU row kernels (see server/kernel/kernel_ir.h, AccKind): argmax and
// argmin with torch's rules (NaN is the extreme, the first index of the extreme wins), Welford
// (mean, M2, count), and online softmax (max, sum of exp(x - max)). Each starts at its identity
// when default-constructed. Embedded into every generated translation unit.

#include <cstdint>

#include "kernels/cpu/kiln_math.h"

namespace kiln_cpu {

template <typename T>
struct ArgMax {
  T value = lowest<T>();
  int64_t index = -1;
  void Update(T x, int64_t i) {
    if (index < 0 || (!(value != value) && (x != x || x > value))) {
      value = x;
      index = i;
    }
  }
};

template <typename T>
struct ArgMin {
  T value = highest<T>();
  int64_t index = -1;
  void Update(T x, int64_t i) {
    if (index < 0 || (!(value != value) && (x != x || x < value))) {
      value = x;
      index = i;
    }
  }
};

// Welford's update run sequentially over a long row loses accuracy linearly in its length (every
// update rounds the running mean, ~n * eps for n elements: 2e-6 relative at 8192 float elements,
// which batch norm in training turns into per-channel offsets that deep networks amplify). So the
// updates go into a block of kBlock elements, a full block into a group of kBlock blocks, and a
// full group into the total (Chan's combination at each level): a cascade of three levels, ~eps
// per level. `mean`, `m2` and `count` hold the whole row only after Flush(), which generated code
// calls at the end of every phase that updates the accumulator.
template <typename T>
struct Welford {
  static constexpr int kBlock = 32;
  T mean = 0;
  T m2 = 0;
  T count = 0;
  T block_mean = 0, block_m2 = 0;
  T group_mean = 0, group_m2 = 0, group_count = 0;
  int block_count = 0, group_blocks = 0;
  void Update(T x) {
    ++block_count;
    const T delta = x - block_mean;
    block_mean += delta / T(block_count);
    block_m2 += delta * (x - block_mean);
    if (block_count == kBlock) FlushBlock();
  }
  // Folds every pending partial into mean / m2 / count.
  void Flush() {
    FlushBlock();
    if (group_count != 0) {
      Combine(group_count, group_mean, group_m2);
      group_mean = group_m2 = group_count = 0;
      group_blocks = 0;
    }
  }
  // Chan et al.'s parallel combination with another partial result.
  void Combine(T n, T mean_b, T m2_b) { Merge(mean, m2, count, n, mean_b, m2_b); }

 private:
  static void Merge(T& mean_a, T& m2_a, T& count_a, T n, T mean_b, T m2_b) {
    if (n == 0) return;
    const T total = count_a + n;
    const T delta = mean_b - mean_a;
    mean_a += delta * (n / total);
    m2_a += m2_b + delta * delta * (count_a * n / total);
    count_a = total;
  }
  void FlushBlock() {
    if (block_count == 0) return;
    Merge(group_mean, group_m2, group_count, T(block_count), block_mean, block_m2);
    block_mean = block_m2 = 0;
    block_count = 0;
    if (++group_blocks == kBlock) {
      Combine(group_count, group_mean, group_m2);
      group_mean = group_m2 = group_count = 0;
      group_blocks = 0;
    }
  }
};

template <typename T>
struct OnlineSoftmax {
  T max = -inf<T>();
  T sum = 0;
  void Update(T x) {
    if (x > max) {
      // A new maximum of +inf: its own term is exp(inf - inf), NaN as in torch.
      sum = x == inf<T>() ? nan<T>() : sum * kiln_cpu::exp(max - x) + T(1);
      max = x;
    } else if (x <= max) {
      // While max is -inf, x is -inf too: its term is exp(-inf - final max), 0 for a finite
      // final max; a row of only -inf keeps sum 0, and exp(x - max) later gives NaN as in torch.
      if (max != -inf<T>()) sum += kiln_cpu::exp(x - max);
    } else {  // x or max is NaN
      max = x != x ? x : max;
      sum = nan<T>();
    }
  }
  // Combines another partial (max, sum) pair.
  void Combine(T max_b, T sum_b) {
    const T m = maximum(max, max_b);
    if (m != m) {
      max = m;
      sum = nan<T>();
      return;
    }
    if (m == -inf<T>()) {  // both partials saw only -inf (or nothing)
      sum += sum_b;
      return;
    }
    sum = sum * kiln_cpu::exp(max - m) + sum_b * kiln_cpu::exp(max_b - m);
    max = m;
  }
};

// L independent partial accumulators ("lanes") for the contiguous part of a reduction loop, with
// branch-free updates that compilers vectorize across lanes; combined into the scalar accumulator
// at the end of the phase (in lane order). Lane l sees elements l, l + L, l + 2L, ...
template <typename T, int L>
struct WelfordLanes {
  T mean[L] = {};
  T m2[L] = {};
  T count[L] = {};
  // Multiplies by 1 / count (as torch's RowwiseMoments and Inductor do) so that the division is
  // off the loop-carried chain of `mean`: layer norm's statistics run 1.6x faster.
  void Update(int l, T x) {
    count[l] += T(1);
    const T delta = x - mean[l];
    mean[l] += delta * (T(1) / count[l]);
    m2[l] += delta * (x - mean[l]);
  }
  void CombineInto(Welford<T>& acc) const {
    for (int l = 0; l < L; ++l) acc.Combine(count[l], mean[l], m2[l]);
  }
};

template <typename T, int L>
struct OnlineSoftmaxLanes {
  T max[L];
  T sum[L] = {};
  OnlineSoftmaxLanes() {
    for (int l = 0; l < L; ++l) max[l] = -inf<T>();
  }
  // One exp per element: d = exp(-|x - max|) rescales the old sum when x is a new maximum and
  // is x's own term otherwise. NaN in x or max gives NaN (x > NaN is false and d is NaN); an x
  // of -inf adds nothing; -inf - -inf and inf - inf are NaN as in torch (a new maximum of +inf
  // too: its own term is exp(inf - inf)).
  void Update(int l, T x) {
    const T m = max[l];
    const bool gt = x > m;
    const T diff = x - m;
    T d = kiln_cpu::exp(gt ? -diff : diff);
    d = x == -inf<T>() ? T(0) : d;
    sum[l] = gt ? (x == inf<T>() ? nan<T>() : sum[l] * d + T(1)) : sum[l] + d;
    max[l] = (gt || x != x) ? x : m;
  }
  void CombineInto(OnlineSoftmax<T>& acc) const {
    for (int l = 0; l < L; ++l) acc.Combine(max[l], sum[l]);
  }
};

template <typename T, int L>
struct MaxLanes {
  T value[L];
  MaxLanes() {
    for (int l = 0; l < L; ++l) value[l] = lowest<T>();
  }
  void Update(int l, T x) { value[l] = maximum(value[l], x); }
  void CombineInto(T& acc) const {
    for (int l = 0; l < L; ++l) acc = maximum(acc, value[l]);
  }
};

template <typename T, int L>
struct MinLanes {
  T value[L];
  MinLanes() {
    for (int l = 0; l < L; ++l) value[l] = highest<T>();
  }
  void Update(int l, T x) { value[l] = minimum(value[l], x); }
  void CombineInto(T& acc) const {
    for (int l = 0; l < L; ++l) acc = minimum(acc, value[l]);
  }
};

}  // namespace kiln_cpu

#endif  // KILN_KERNELS_CPU_KILN_REDUCE_H_
