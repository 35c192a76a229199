#ifndef KILN_SERVER_KERNEL_TEST_KERNELS_H_
#define KILN_SERVER_KERNEL_TEST_KERNELS_H_

// Canonical kernels built by hand (what the lowering will produce for common fused groups), shared
// by the golden-source tests and the end-to-end tests. Test-only.

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::kernel::testing {

// out[i, j] = a[j, i] + b[j]: out f32[rows, cols]; a f32[cols, rows] read transposed; b f32[cols]
// broadcast over rows. Buffers: b0 = a, b1 = b, b2 = out.
absl::StatusOr<Kernel> BroadcastAddTransposed(int64_t rows, int64_t cols);

// Row softmax (or log_softmax) over the last dim of x f32[n0, cols] with a run-time row count n0:
// phase 0 folds the row into an online-softmax accumulator, phase 1 normalizes and stores.
// Buffers: b0 = x, b1 = out. Scalars: n0 = rows.
absl::StatusOr<Kernel> RowSoftmax(int64_t cols, bool log);

// Layer norm forward over the last dim with Welford: x f32[n0, cols], weight f32[cols],
// bias f32[cols] -> out f32[n0, cols], mean f32[n0], rstd f32[n0] (biased variance, as torch).
// Buffers: b0 = x, b1 = weight, b2 = bias, b3 = out, b4 = mean, b5 = rstd. Scalars: n0 = rows.
absl::StatusOr<Kernel> LayerNorm(int64_t cols, float eps);

// out[c] = sum over r of x[r, c]: a column (outer) reduction. x f32[rows, cols], out f32[cols].
absl::StatusOr<Kernel> ColumnSum(int64_t rows, int64_t cols);
// Layer norm's weight and bias gradients over a [batch, rows, cols] input: per column c,
// sum over (b, r) of bf16 g[b, r, c] * (x[b, r, c] - mean[b, r]) * rstd[b, r], and of g: two
// reduction dims, and loads along them (mean, rstd) that are the same for every column.
absl::StatusOr<Kernel> LayerNormWeightGrad(int64_t batch, int64_t rows, int64_t cols);
// A softmax recomputed and its backward in one kernel (fusion's chained row ops): bf16 scores x
// and grad g [n0, cols] -> bf16 y * (g - sum(g * y)), y = softmax(f32(x)): phase 0 folds the
// online softmax, phase 1 the sum of g * y, phase 2 stores.
absl::StatusOr<Kernel> SoftmaxThenBackward(int64_t cols);
// Attention's softmax as kiln fuses it in a bf16 model: a prologue on the scores, v =
// f32(bf16(where(keep, f32(bf16(f32(x) * 0.125)), -inf))), then softmax(v) stored as bf16 (forward),
// or, with `backward`, recomputed and chained with its backward as SoftmaxThenBackward. The
// accumulated value is an expression, not a load: its registers hold exp(v - max) for the later
// phases. Buffers: b0 = x bf16[n0, cols], b1 = keep bool[n0, cols], (backward: b2 = g bf16),
// then out bf16. Scalars: n0 = rows.
absl::StatusOr<Kernel> MaskedScaledSoftmax(int64_t cols, bool backward);

// out = bf16(silu(f32(a) * f32(b)) + 1) for bf16 a, b, out of n elements (a pointwise chain with
// one rounding at the store). Buffers: b0 = a, b1 = b, b2 = out.
absl::StatusOr<Kernel> Bf16Chain(int64_t n);

// The kernels kiln builds for real torch graphs at sizes the GPU benchmark measures (the IR of
// `compile_graph --dump`), so that they can be checked and timed in isolation:
// torch.softmax(x, -1) for bf16 x[n0, cols] (cast to f32 in, rounded to bf16 at the store).
// Buffers: b0 = x, b1 = out. Scalars: n0 = rows.
absl::StatusOr<Kernel> RowSoftmaxBf16(int64_t cols);

// x.sum(-1) for x[rows, cols] with a static row count (f32, or bf16 summed in f32 and rounded).
// Buffers: b0 = x, b1 = out[rows].
absl::StatusOr<Kernel> RowSum(int64_t rows, int64_t cols, bool bf16);

// F.layer_norm(x, (cols,), w, b, eps) for bf16 x[n0, cols], w, b (statistics in f32; only `out`).
// Buffers: b0 = x, b1 = w, b2 = b, b3 = out. Scalars: n0 = rows.
absl::StatusOr<Kernel> LayerNormBf16(int64_t cols, float eps);

// RMS norm fused into one row kernel (sum of squares in phase 0, the scaled row in phase 1):
// f32: x * rsqrt(mean(x^2) + eps) * w; bf16 (LLaMA): bf16(f32(bf16(f32(x) * rsqrt(mean(f32(x)^2)
// + eps))) * f32(w)). Buffers: b0 = x[n0, cols], b1 = w[cols], b2 = out. Scalars: n0 = rows.
absl::StatusOr<Kernel> RmsNorm(int64_t cols, float eps, bool bf16);

// torch's `a.t() + b` for a f32[cols, rows], b f32[rows, cols]: the output follows a.t()'s
// layout (column-major), so the store is contiguous along o0 and b is read transposed. As
// row-major buffers: out[cols, rows] = a + b.t(). Buffers: b0 = a, b1 = b, b2 = out.
absl::StatusOr<Kernel> TransposeAddColumnMajor(int64_t rows, int64_t cols);

}  // namespace kiln::kernel::testing

#endif  // KILN_SERVER_KERNEL_TEST_KERNELS_H_
