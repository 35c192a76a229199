#include "server/lower/gemm_step.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/status_macros.h"

namespace kiln::lower {
namespace {

namespace v1 = ::kiln::v1;
using graph::Arg;

struct Matrix {
  int64_t batch_stride = 0, row_stride = 0, col_stride = 0;
};

// A (rows x cols) matrix with strides (rs, cs) in one of cuBLAS's two layouts, strides of size-1
// dims normalized; false when it has neither.
bool NormalizeMatrix(int64_t rows, int64_t cols, int64_t rs, int64_t cs, Matrix* out) {
  if (cols == 1 || cs == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(1, cols) : rs;
    if (ld >= std::max<int64_t>(1, cols)) {
      out->row_stride = ld;
      out->col_stride = 1;
      return true;
    }
  }
  if (rows == 1 || rs == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(1, rows) : cs;
    if (ld >= std::max<int64_t>(1, rows)) {
      out->row_stride = 1;
      out->col_stride = ld;
      return true;
    }
  }
  return false;
}

std::string Layout(const LValue& v) {
  return absl::StrCat("sizes [", absl::StrJoin(v.sizes, ", "), "] strides [", absl::StrJoin(v.strides, ", "), "]");
}

absl::Status NotFound(const std::string& node, const std::string& why) {
  return absl::NotFoundError(absl::StrCat("node ", node, " stays an aten step: ", why));
}

// The operand matrix of value `v` (rank 2, or 3 when batched) with `rows` x `cols`.
absl::StatusOr<Matrix> Operand(const LValue& v, bool batched, int64_t batch, const char* name,
                               const std::string& node) {
  const size_t r = batched ? 1 : 0;
  Matrix m;
  if (!NormalizeMatrix(v.sizes[r], v.sizes[r + 1], v.strides[r], v.strides[r + 1], &m)) {
    return NotFound(node, absl::StrCat(name, " (", Layout(v), ") has no unit stride with a valid leading dimension"));
  }
  if (batched && batch > 1) {
    if (v.strides[0] <= 0) return NotFound(node, absl::StrCat(name, " (", Layout(v), ") has a batch stride <= 0"));
    m.batch_stride = v.strides[0];
  }
  return m;
}

absl::StatusOr<double> ScalarArg(const graph::Node& node, size_t index) {
  if (index >= node.args.size()) return 1.0;  // the schema default
  const Arg& a = node.args[index];
  switch (a.kind) {
    case Arg::Kind::kInt: return static_cast<double>(a.i);
    case Arg::Kind::kFloat: return a.f;
    case Arg::Kind::kBool: return a.b ? 1.0 : 0.0;
    default: return NotFound(node.name, "beta or alpha is not a constant number");
  }
}

bool GemmDType(v1::DType d) {
  return d == v1::DTYPE_FLOAT32 || d == v1::DTYPE_FLOAT16 || d == v1::DTYPE_BFLOAT16;
}

// A GemmCall with D = the step's one output and A, B, C = the values of node arguments a_arg,
// b_arg and c_arg (c_arg < 0: no C), or NOT_FOUND when one of them is not a tensor value.
absl::StatusOr<GemmCall> BindOperands(const OpGraph& g, const ExternStep& step, const graph::Node& node,
                                      size_t a_arg, size_t b_arg, int c_arg) {
  auto value_of = [&](size_t i) -> int32_t {
    if (i >= node.args.size() || node.args[i].kind != Arg::Kind::kValue) return -1;
    const int32_t n = node.args[i].value;
    return n >= 0 && n < static_cast<int32_t>(g.node_value.size()) ? g.node_value[n] : -1;
  };
  GemmCall call;
  call.a = value_of(a_arg);
  call.b = value_of(b_arg);
  call.c = c_arg >= 0 ? value_of(static_cast<size_t>(c_arg)) : -1;
  call.d = step.outputs.size() == 1 ? step.outputs[0] : -1;
  if (call.a < 0 || call.b < 0 || call.d < 0 || (c_arg >= 0 && call.c < 0)) {
    return NotFound(node.name, "an operand is not a tensor value");
  }
  return call;
}

// Whether every item of list argument `index` is the int `want` (an absent argument: false).
bool AllInts(const graph::Node& node, size_t index, int64_t want) {
  if (index >= node.args.size() || node.args[index].kind != Arg::Kind::kList) return false;
  for (const Arg& a : node.args[index].list) {
    if (a.kind != Arg::Kind::kInt || a.i != want) return false;
  }
  return true;
}

// The stride of the rows made of a 4-D value's dims 0, 2 and 3 (N, H, W) collapsed into one, when
// they collapse (size-1 dims address nothing): W's stride, H's = W's * W, N's = H's * H.
bool CollapsedRowStride(const LValue& v, int64_t* out) {
  int64_t stride = 0, extent = 0;  // of the collapsed dims so far (inner first)
  for (int d : {3, 2, 0}) {
    if (v.sizes[d] == 1) continue;
    if (extent == 0) {
      stride = v.strides[d];
    } else if (v.strides[d] != stride * extent) {
      return false;
    }
    extent = extent == 0 ? v.sizes[d] : extent * v.sizes[d];
  }
  *out = extent == 0 ? std::max<int64_t>(1, v.sizes[1]) : stride;
  return true;
}

// aten.convolution of a 1x1 kernel (stride 1, no padding or dilation, one group, not transposed) in
// f16 or bf16 over a channels-last input into a channels-last result: the GEMM
// D[N*H*W, K] = X[N*H*W, C] @ W[K, C]^T (+ bias over rows), what cuDNN computes for it. f32 stays a
// convolution: torch gives cuDNN TF32 under its own flag (torch.backends.cudnn.allow_tf32), which
// the GEMM step's flag (matmul precision) does not follow.
absl::StatusOr<GemmCall> MatchConv1x1(const OpGraph& g, const ExternStep& step, const graph::Node& node) {
  if (node.args.size() != 9) return NotFound(node.name, "a convolution with other than 9 arguments");
  if (!AllInts(node, 3, 1) || !AllInts(node, 4, 0) || !AllInts(node, 5, 1) ||
      node.args[6].kind != Arg::Kind::kBool || node.args[6].b || node.args[8].kind != Arg::Kind::kInt ||
      node.args[8].i != 1) {
    return NotFound(node.name, "not a 1x1 convolution (stride 1, no padding, dilation 1, one group, not transposed)");
  }
  const bool with_bias = node.args[2].kind != Arg::Kind::kNone;
  KILN_ASSIGN_OR_RETURN(GemmCall call, BindOperands(g, step, node, 0, 1, with_bias ? 2 : -1));
  const LValue& x = g.values[call.a];
  const LValue& w = g.values[call.b];
  const LValue& d = g.values[call.d];
  if (x.sizes.size() != 4 || w.sizes.size() != 4 || d.sizes.size() != 4 || w.sizes[2] != 1 || w.sizes[3] != 1) {
    return NotFound(node.name, "not a 2-D convolution with a 1x1 kernel");
  }
  const v1::DType dtype = d.meta.dtype();
  if ((dtype != v1::DTYPE_FLOAT16 && dtype != v1::DTYPE_BFLOAT16) || x.meta.dtype() != dtype ||
      w.meta.dtype() != dtype || (with_bias && g.values[call.c].meta.dtype() != dtype)) {
    return NotFound(node.name, "a convolution GEMM takes f16 or bf16, the same for every operand");
  }
  const int64_t n = x.sizes[0], c = x.sizes[1], h = x.sizes[2], wd = x.sizes[3], k = w.sizes[0];
  if (w.sizes[1] != c || d.sizes[0] != n || d.sizes[1] != k || d.sizes[2] != h || d.sizes[3] != wd) {
    return NotFound(node.name, "operand sizes do not match the result");
  }
  const int64_t m = n * h * wd;
  if (m == 0 || c == 0 || k == 0) return NotFound(node.name, "an empty operand");
  if (m > std::numeric_limits<int32_t>::max()) return NotFound(node.name, "more rows than cuBLASLt takes");
  int64_t x_rows = 0, d_rows = 0;
  Matrix am, bm, dm;
  if (!CollapsedRowStride(x, &x_rows) || !NormalizeMatrix(m, c, x_rows, x.strides[1], &am) || am.col_stride != 1) {
    return NotFound(node.name, absl::StrCat("the input (", Layout(x), ") is not channels-last"));
  }
  if (!CollapsedRowStride(d, &d_rows) || !NormalizeMatrix(m, k, d_rows, d.strides[1], &dm) || dm.col_stride != 1) {
    return NotFound(node.name, absl::StrCat("the result (", Layout(d), ") is not channels-last"));
  }
  if (!NormalizeMatrix(c, k, w.strides[1], w.strides[0], &bm)) {
    return NotFound(node.name, absl::StrCat("the weight (", Layout(w), ") has no unit stride"));
  }
  int64_t c_kind = kGemmNoC;
  if (with_bias) {
    const LValue& bias = g.values[call.c];
    if (bias.sizes.size() != 1 || bias.sizes[0] != k || (k > 1 && bias.strides[0] != 1)) {
      return NotFound(node.name, absl::StrCat("the bias (", Layout(bias), ") is not a contiguous vector"));
    }
    c_kind = kGemmBias;
  }
  int64_t* p = call.params;
  p[kGemmBatch] = 1;
  p[kGemmM] = m;
  p[kGemmN] = k;
  p[kGemmK] = c;
  p[kGemmDType] = dtype;
  p[kGemmARowStride] = am.row_stride;
  p[kGemmAColStride] = am.col_stride;
  p[kGemmBRowStride] = bm.row_stride;
  p[kGemmBColStride] = bm.col_stride;
  p[kGemmDRowStride] = dm.row_stride;
  p[kGemmCKind] = c_kind;
  p[kGemmWorkspaceBytesParam] = kGemmWorkspaceBytes;
  call.alpha = 1.0;
  call.beta = with_bias ? 1.0 : 0.0;
  return call;
}

}  // namespace

absl::StatusOr<GemmCall> MatchGemm(const OpGraph& g, const ExternStep& step) {
  const graph::Node& node = g.graph->nodes[step.node];
  const std::string& t = step.target;
  if (t == "aten.convolution.default") {
    if (step.fallback) return NotFound(node.name, "a fallback step");
    return MatchConv1x1(g, step, node);
  }
  const bool batched = t == "aten.bmm.default" || t == "aten.baddbmm.default";
  const bool with_c = t == "aten.addmm.default" || t == "aten.baddbmm.default";
  if (!batched && !with_c && t != "aten.mm.default") return NotFound(node.name, "not a GEMM");
  if (step.fallback) return NotFound(node.name, "a fallback step");
  const size_t first = with_c ? 1 : 0;
  KILN_ASSIGN_OR_RETURN(GemmCall call, BindOperands(g, step, node, first, first + 1, with_c ? 0 : -1));
  const LValue& a = g.values[call.a];
  const LValue& b = g.values[call.b];
  const LValue& d = g.values[call.d];
  const size_t rank = batched ? 3 : 2;
  if (a.sizes.size() != rank || b.sizes.size() != rank || d.sizes.size() != rank) {
    return NotFound(node.name, "operands of an unexpected rank");
  }
  const v1::DType dtype = d.meta.dtype();
  if (!GemmDType(dtype) || a.meta.dtype() != dtype || b.meta.dtype() != dtype ||
      (with_c && g.values[call.c].meta.dtype() != dtype)) {
    return NotFound(node.name, absl::StrCat("dtype ", v1::DType_Name(dtype), " (cuBLASLt steps take f32, f16 or bf16, "
                                            "the same for every operand)"));
  }
  const size_t r = batched ? 1 : 0;
  const int64_t batch = batched ? d.sizes[0] : 1;
  const int64_t m = d.sizes[r], n = d.sizes[r + 1], k = a.sizes[r + 1];
  if (a.sizes[r] != m || b.sizes[r] != k || b.sizes[r + 1] != n || (batched && (a.sizes[0] != batch || b.sizes[0] != batch))) {
    return NotFound(node.name, "operand sizes do not match the result");
  }
  if (batch == 0 || m == 0 || n == 0 || k == 0) return NotFound(node.name, "an empty operand");
  if (batch > std::numeric_limits<int32_t>::max()) return NotFound(node.name, "more batches than cuBLASLt takes");
  double alpha = 1.0, beta = 1.0;
  if (with_c) {
    auto b_or = ScalarArg(node, 3);
    if (!b_or.ok()) return b_or.status();
    auto a_or = ScalarArg(node, 4);
    if (!a_or.ok()) return a_or.status();
    beta = *b_or;
    alpha = *a_or;
  }
  auto am = Operand(a, batched, batch, "mat1", node.name);
  if (!am.ok()) return am.status();
  auto bm = Operand(b, batched, batch, "mat2", node.name);
  if (!bm.ok()) return bm.status();
  Matrix dm;
  if (!NormalizeMatrix(m, n, d.strides[r], d.strides[r + 1], &dm) || dm.col_stride != 1) {
    return NotFound(node.name, absl::StrCat("the result (", Layout(d), ") is not row-major"));
  }
  if (batch > 1) {
    dm.batch_stride = d.strides[0];
    if (dm.batch_stride < (m - 1) * dm.row_stride + n) return NotFound(node.name, "the result's batches overlap");
  }
  int64_t c_kind = kGemmNoC;
  if (with_c && beta != 0.0) {
    // self broadcast to the result: effective strides, 0 along broadcast dims.
    const LValue& c = g.values[call.c];
    std::vector<int64_t> eff(rank, 0);
    if (c.sizes.size() > rank) return NotFound(node.name, "self has more dims than the result");
    const size_t lead = rank - c.sizes.size();
    for (size_t i = 0; i < c.sizes.size(); ++i) eff[lead + i] = c.sizes[i] == 1 ? 0 : c.strides[i];
    const int64_t c_bs = batched ? eff[0] : 0, c_rs = eff[r], c_cs = eff[r + 1];
    const bool rows_broadcast = (m == 1 || c_rs == 0) && (batch == 1 || c_bs == 0);
    if (rows_broadcast && (n == 1 || c_cs == 1) && beta == 1.0 && !batched) {
      c_kind = kGemmBias;
    } else if ((n == 1 || c_cs == 1) && (m == 1 || c_rs == dm.row_stride) && (batch == 1 || c_bs == dm.batch_stride) &&
               (m == 1 || c_rs != 0) && (batch == 1 || c_bs != 0)) {
      c_kind = kGemmMatrix;
    } else {
      return NotFound(node.name, absl::StrCat("self (", Layout(c), ", beta ", beta,
                                              ") is neither a bias broadcast over rows with beta 1 nor a matrix "
                                              "laid out like the result"));
    }
  }
  if (c_kind == kGemmNoC) {
    call.c = -1;
    beta = 0.0;
  }
  int64_t* p = call.params;
  p[kGemmBatch] = batch;
  p[kGemmM] = m;
  p[kGemmN] = n;
  p[kGemmK] = k;
  p[kGemmDType] = dtype;
  p[kGemmABatchStride] = am->batch_stride;
  p[kGemmARowStride] = am->row_stride;
  p[kGemmAColStride] = am->col_stride;
  p[kGemmBBatchStride] = bm->batch_stride;
  p[kGemmBRowStride] = bm->row_stride;
  p[kGemmBColStride] = bm->col_stride;
  p[kGemmDBatchStride] = dm.batch_stride;
  p[kGemmDRowStride] = dm.row_stride;
  p[kGemmCKind] = c_kind;
  p[kGemmCBatchStride] = c_kind == kGemmMatrix ? dm.batch_stride : 0;
  p[kGemmCRowStride] = c_kind == kGemmMatrix ? dm.row_stride : 0;
  p[kGemmFlags] = 0;
  p[kGemmWorkspaceBytesParam] = kGemmWorkspaceBytes;
  call.alpha = alpha;
  call.beta = beta;
  return call;
}

absl::Status CheckGemmStep(const v1::LibraryStep& step) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("library step ", step.function(), ": ", why));
  };
  if (step.function() != kGemmFunction) return bad("unknown function");
  if (step.int_params_size() != kGemmParamCount) return bad(absl::StrCat(step.int_params_size(), " int_params"));
  if (step.float_params_size() != 2) return bad(absl::StrCat(step.float_params_size(), " float_params"));
  if (step.args_size() != 5) return bad(absl::StrCat(step.args_size(), " args"));
  auto p = [&](int i) { return step.int_params(i); };
  const int64_t batch = p(kGemmBatch), m = p(kGemmM), n = p(kGemmN), k = p(kGemmK);
  if (batch < 1 || m < 1 || n < 1 || k < 1 || batch > std::numeric_limits<int32_t>::max()) return bad("bad sizes");
  if (!GemmDType(static_cast<v1::DType>(p(kGemmDType)))) return bad("bad dtype");
  auto layout_ok = [](int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
    return (cs == 1 && rs >= std::max<int64_t>(1, cols)) || (rs == 1 && cs >= std::max<int64_t>(1, rows));
  };
  if (!layout_ok(m, k, p(kGemmARowStride), p(kGemmAColStride))) return bad("bad layout of A");
  if (!layout_ok(k, n, p(kGemmBRowStride), p(kGemmBColStride))) return bad("bad layout of B");
  if (p(kGemmDRowStride) < n) return bad("bad layout of D");
  for (int s : {kGemmABatchStride, kGemmBBatchStride, kGemmDBatchStride}) {
    if (batch == 1 ? p(s) != 0 : p(s) <= 0) return bad("bad batch stride");
  }
  const int64_t c_kind = p(kGemmCKind);
  if (c_kind < kGemmNoC || c_kind > kGemmMatrix) return bad("bad c_kind");
  if ((c_kind == kGemmNoC) != (step.args(3) < 0)) return bad("C given without c_kind or the reverse");
  if (c_kind == kGemmBias && (batch != 1 || step.float_params(1) != 1.0)) return bad("a bias with batch > 1 or beta != 1");
  if (c_kind == kGemmMatrix && (p(kGemmCRowStride) != p(kGemmDRowStride) || p(kGemmCBatchStride) != p(kGemmDBatchStride))) {
    return bad("a C matrix not laid out like D");
  }
  if (p(kGemmWorkspaceBytesParam) < 0 || (p(kGemmWorkspaceBytesParam) > 0) != (step.args(4) >= 0)) {
    return bad("workspace bytes and workspace value disagree");
  }
  if (step.args(0) < 0 || step.args(1) < 0 || step.args(2) < 0) return bad("missing operand");
  return absl::OkStatus();
}

}  // namespace kiln::lower
