#ifndef KILN_SERVER_LOWER_GEMM_STEP_H_
#define KILN_SERVER_LOWER_GEMM_STEP_H_

// MatchGemm: an extern aten.mm / bmm / addmm / baddbmm step, or an aten.convolution with a 1x1
// kernel -> a GEMM the runtime can hand to cuBLASLt (a LibraryStep "cublasLt.matmul"), or
// NOT_FOUND with the reason it cannot.
//
// Convolutions: stride 1, no padding, dilation 1, one group, not transposed, f16 or bf16 (f32
// stays a convolution: torch gives cuDNN TF32 under its own flag), an input whose N, H and W dims
// collapse into rows of unit-stride channels (channels-last, as conv_layout.h makes them on CUDA;
// any layout when H = W = 1) and a result laid out the same way, an optional contiguous bias:
// D[N*H*W, K] = X[N*H*W, C] @ W[K, C]^T (+ bias over rows). Besides the speed of cuBLASLt's GEMMs,
// this spares a new process cuDNN's one-time work for each such convolution shape.
//
// Takes the OpGraph and one of its extern steps. Succeeds only when every operand is f32, f16 or
// bf16 (all the same), no size is 0, each operand matrix has a unit stride in one of its last two
// dims and a leading dimension >= max(1, the other size), bmm batch strides are constant and
// non-zero, the result has a unit column stride, and addmm/baddbmm's `self` is either a bias
// broadcast over rows (1-D [n], or [1, n] / expanded rows, unit stride, beta = 1), a matrix laid
// out exactly like the result, or ignored (beta = 0). Strides of size-1 dims are normalized (they
// address nothing). Everything else stays an AtenStep (the caller logs the reason).
//
// ===== The LibraryStep encoding (kiln.v1.LibraryStep, function "cublasLt.matmul") =====
// Row-major, batched: for b < batch, i < m, j < n:
//   D[b,i,j] = alpha * sum_p A[b,i,p] * B[b,p,j]  (+ C[j] when c_kind = 1, + beta * C[b,i,j] when 2)
// with X[b,r,c] at element offset b*X_batch_stride + r*X_row_stride + c*X_col_stride from the data
// pointer of args[...] (tensor.data_ptr(): its storage offset included); D's and C's column
// stride is 1. Accumulation in f32 for every dtype; the result is rounded to the dtype once.
//   args         [D, A, B, C, W]: plan values; C = -1 when c_kind = 0; W = -1 or a u8 workspace
//                value of `workspace_bytes` bytes (cuBLASLt's scratch, live only during the step)
//   int_params   kGemmParamCount entries, indexed by GemmParam below
//   float_params [alpha, beta]  (beta is 1 for a bias, 0 without C)
// A and B each satisfy (col_stride == 1 && row_stride >= max(1, cols)) or (row_stride == 1 &&
// col_stride >= max(1, rows)) (cols/rows: k/m for A, n/k for B); batch strides are 0 when
// batch == 1, else > 0; D's row stride is >= n; a C matrix has D's strides.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/compiler.pb.h"
#include "server/lower/op_graph.h"

namespace kiln::lower {

inline constexpr char kGemmFunction[] = "cublasLt.matmul";
// Scratch for cuBLASLt per GEMM step (what torch gives cuBLASLt on Hopper). Lives in the plan
// workspace only while the step runs, so GEMMs share it with each other and with dead values.
inline constexpr int64_t kGemmWorkspaceBytes = int64_t{32} << 20;

enum GemmParam : int {
  kGemmBatch = 0,
  kGemmM,
  kGemmN,
  kGemmK,
  kGemmDType,  // kiln.v1.DType of A, B, C and D
  kGemmABatchStride,
  kGemmARowStride,
  kGemmAColStride,
  kGemmBBatchStride,
  kGemmBRowStride,
  kGemmBColStride,
  kGemmDBatchStride,
  kGemmDRowStride,
  kGemmCKind,  // GemmCKind
  kGemmCBatchStride,
  kGemmCRowStride,
  kGemmFlags,  // bit 0: TF32 allowed for f32 (kiln emits 0; the client may set it from torch)
  kGemmWorkspaceBytesParam,
  kGemmParamCount,
};

enum GemmCKind : int64_t { kGemmNoC = 0, kGemmBias = 1, kGemmMatrix = 2 };
inline constexpr int64_t kGemmAllowTf32 = 1;

struct GemmCall {
  int32_t d = -1, a = -1, b = -1, c = -1;  // OpGraph value ids (c = -1 without C)
  int64_t params[kGemmParamCount] = {};
  double alpha = 1.0, beta = 0.0;
};

// NOT_FOUND (with the reason) when the step is not a GEMM cuBLASLt can run as planned.
absl::StatusOr<GemmCall> MatchGemm(const OpGraph& g, const ExternStep& step);

// Checks a LibraryStep's shape (function, param and arg counts, the layout rules above) so that
// readers of a plan (the test executor, the verifier) can rely on it.
absl::Status CheckGemmStep(const ::kiln::v1::LibraryStep& step);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_GEMM_STEP_H_
