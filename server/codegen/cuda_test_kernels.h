#ifndef KILN_SERVER_CODEGEN_CUDA_TEST_KERNELS_H_
#define KILN_SERVER_CODEGEN_CUDA_TEST_KERNELS_H_

// Kernels that exercise every operation, type, accumulator and thread layout of the CUDA emitter
// (besides the canonical ones of server/kernel/test_kernels.h). Test-only.

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::testing {

// Pointwise over n elements of `t`: every unary and binary op valid for `t` on loads of b0 and
// b1, each stored to a buffer of its own; casts to every type; a masked load; a select; inf,
// -0.0 and NaN constants for float types.
absl::StatusOr<kernel::Kernel> EveryOp(kernel::ScalarType t, int64_t n);

// Rows of x[rows, r0, r1] (rows = n0 when `dynamic`, else 37): every accumulator kind valid for
// `t` in phase 0, a sum of x - max in phase 1, results stored per row.
absl::StatusOr<kernel::Kernel> EveryAccumulator(kernel::ScalarType t, bool dynamic, int64_t r0,
                                                int64_t r1);

// out[0] = sum of x[n] (no outer dims).
absl::StatusOr<kernel::Kernel> FullSum(int64_t n);

// softmax(x[:, 1:], -1) for x of `t` (f32 or bf16; bf16 widened to f32 and the result narrowed)
// of shape n0 x (cols + 1): the input row is a column-sliced view (element offset 1, row stride
// cols + 1), the output contiguous (row stride cols). Odd `cols`: the rows' vector plan shifts
// to the input's alignment, and the output lies differently.
absl::StatusOr<kernel::Kernel> SlicedRowSoftmax(kernel::ScalarType t, int64_t cols);

// A training batch norm's partials over a channels-last image x[n, hw, c] (bf16, n dynamic), per
// (n, c): Welford over x, sum(go), sum(go * (x - mean[c]) * invstd[c]) and max(x), each stored as
// an f32 [n, c] value (buffers x, go, mean, invstd, then the five outputs). Outer (n, c), c
// contiguous: a column reduction whose loads move along c as vectors where `channels` allows.
absl::StatusOr<kernel::Kernel> ChannelsLastPartials(int64_t hw, int64_t channels);

// out[b, h, j] = sum over d in {0, 1} of (h >= d && at[b, h - d, j] >= 0) ? g[b, h - d, j] : 0
// over [n0, rows, cols], with int64 `at` and bf16 `g` and `out`: max_pool2d's backward in one
// dim. Both loads are masked by a test of h alone; the int64 loads bound the vector to 2 lanes, in
// which masked loads stay scalar.
absl::StatusOr<kernel::Kernel> MaskedWindowGather(int64_t rows, int64_t cols);

// torch.cat([a, c], 1) * 2 of bf16 a[n0, rows_a, cols] and c[n0, rows_c, cols]: two loads masked
// by a test of the row alone, which move as 8-lane vectors along the columns.
absl::StatusOr<kernel::Kernel> CatRowsBf16(int64_t rows_a, int64_t rows_c, int64_t cols);

// torch.cat([q, k.transpose(1, 2), v], -1) of bf16 q, v [n0, rows, cols] and k [n0, cols, rows]
// (a GPT attention backward's query/key/value gradients into its fused projection's): three
// loads masked by a test of the column alone, the middle one strided along the columns and
// contiguous along the rows, which a tiled kernel stages through shared memory under its mask.
absl::StatusOr<kernel::Kernel> CatTransposedBf16(int64_t rows, int64_t cols);

// out[t, j] = (t < rows / 2 ? a[t, j] : 0) + (j < 3 ? a[t, j] : 0) over f32 [rows, cols]: one
// access loaded under two masks, of which only the first holds for whole vectors along j (so the
// access stays a scalar load).
absl::StatusOr<kernel::Kernel> OneAccessTwoMasks(int64_t rows, int64_t cols);

// x[n0, n1, n2] (f16, read-write) *= y[n1, n2] (f32), in place, every size dynamic.
absl::StatusOr<kernel::Kernel> DynamicInPlace();

}  // namespace kiln::codegen::testing

#endif  // KILN_SERVER_CODEGEN_CUDA_TEST_KERNELS_H_
