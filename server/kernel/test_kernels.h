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

// out = bf16(silu(f32(a) * f32(b)) + 1) for bf16 a, b, out of n elements (a pointwise chain with
// one rounding at the store). Buffers: b0 = a, b1 = b, b2 = out.
absl::StatusOr<Kernel> Bf16Chain(int64_t n);

}  // namespace kiln::kernel::testing

#endif  // KILN_SERVER_KERNEL_TEST_KERNELS_H_
