// max_pool2d_with_indices -> two element functions over the output (see lower_internal.h): the
// window's maximum and, when the graph uses it, its flat index in the input plane. The input is
// read masked (padding) and so is stored by its producer; the window is unrolled (at most
// kMaxWindow elements). Torch's semantics (aten/src/ATen/native/cuda/DilatedMaxPool2d.cu and the
// CPU kernel alike): the window is scanned row-major; an element replaces the running maximum when
// it is greater or NaN; the index starts at the first element inside the input.
//
// max_pool2d_with_indices_backward -> a gather over the windows that contain each input element
// (the scatter torch's kernels do, turned around): input row h lies in window row oh of kernel row
// i when oh * stride - pad + i * dilation = h. With h = stride * hq + rh (rh < stride) that
// window row is hq + q_i for the one residue rh = r_i that kernel row i can reach, q_i and r_i
// constants: so the gradient is computed over [N, C, H / stride, stride, W / stride, stride]
// (affine reads of grad_output and indices at (hq + q_i, wq + q_j), masked by the residue and the
// window's bounds), stored, and the op's result is the 4-D view of it with the strides the graph
// states. The windows are visited in torch's order (window rows, then columns, ascending) and
// summed in f32 from 0, as torch's kernels sum, so the result is the same bits.

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {
namespace {

using graph::Arg;
using graph::Node;
using graph::Type;
using k::BinaryOp;
using k::ExprOr;
using k::ScalarType;

constexpr int64_t kMaxWindow = 64;  // unrolled window elements; larger windows stay torch's

absl::StatusOr<std::vector<int64_t>> Pair(const Node& n, size_t i, std::vector<int64_t> fallback) {
  if (i >= n.args.size()) return fallback;
  const Arg& a = n.args[i];
  if (a.kind != Arg::Kind::kList) return absl::UnimplementedError("max_pool2d: a non-constant int[2] argument");
  std::vector<int64_t> v;
  for (const Arg& x : a.list) {
    if (x.kind != Arg::Kind::kInt) return absl::UnimplementedError("max_pool2d: a symbolic int[2] argument");
    v.push_back(x.i);
  }
  if (v.empty()) return fallback;
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2) return absl::UnimplementedError("max_pool2d: an int[2] argument of another length");
  return v;
}

ExprOr I64(int64_t v) { return k::ConstInt(ScalarType::kInt64, v); }

// The pooling window: kernel_size, stride (default: the kernel), padding and dilation, from the
// node's arguments first..first+3, each per spatial dim.
struct Window {
  std::vector<int64_t> kernel, stride, pad, dil;
};

absl::StatusOr<Window> ParseWindow(const Node& n, size_t first, const char* op) {
  Window w;
  KILN_ASSIGN_OR_RETURN(w.kernel, Pair(n, first, {}));
  if (w.kernel.empty()) return absl::UnimplementedError(absl::StrCat(op, " without a kernel size"));
  KILN_ASSIGN_OR_RETURN(w.stride, Pair(n, first + 1, w.kernel));
  KILN_ASSIGN_OR_RETURN(w.pad, Pair(n, first + 2, {0, 0}));
  KILN_ASSIGN_OR_RETURN(w.dil, Pair(n, first + 3, {1, 1}));
  for (int d = 0; d < 2; ++d) {
    if (w.kernel[d] <= 0 || w.stride[d] <= 0 || w.dil[d] <= 0 || w.pad[d] < 0) {
      return absl::UnimplementedError(absl::StrCat(op, ": bad window"));  // the verifier rejects these first
    }
  }
  if (w.kernel[0] * w.kernel[1] > kMaxWindow) {
    return absl::UnimplementedError(absl::StrCat(op, " window of ", w.kernel[0] * w.kernel[1],
                                                 " elements (kiln unrolls at most ", kMaxWindow, ")"));
  }
  return w;
}

}  // namespace

absl::Status LowerMaxPool2d(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  if (n.type.kind != Type::Kind::kList || n.type.items.size() != 2 || n.type.items[0].kind != Type::Kind::kTensor ||
      n.type.items[1].kind != Type::Kind::kTensor) {
    return absl::UnimplementedError("max_pool2d_with_indices result");
  }
  KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[0]));
  const std::vector<int64_t> in = l.g().values[x].sizes;
  if (in.size() != 4) return absl::UnimplementedError("max_pool2d of a 3-D input");
  if (!k::IsFloatType(l.g().values[x].dtype)) return absl::UnimplementedError("max_pool2d of an integer input");
  KILN_ASSIGN_OR_RETURN(const Window win, ParseWindow(n, 1, "max_pool2d"));
  const std::vector<int64_t> kernel = win.kernel, stride = win.stride, pad = win.pad, dil = win.dil;
  KILN_ASSIGN_OR_RETURN(LValue out, l.NewValue(node_index, n.type.items[0].tensor, ValueKind::kPointwise));
  KILN_ASSIGN_OR_RETURN(LValue index, l.NewValue(node_index, n.type.items[1].tensor, ValueKind::kPointwise));
  if (out.sizes.size() != 4 || out.sizes[0] != in[0] || out.sizes[1] != in[1] || index.sizes != out.sizes ||
      index.dtype != ScalarType::kInt64) {
    return absl::UnimplementedError("max_pool2d result shapes");
  }
  const ScalarType ot = out.dtype, ct = ComputeType(out.dtype);
  const int64_t height = in[2], width = in[3];
  // The running (maximum, index) after scanning the window of output point idx.
  auto scan = [=](LoadContext& ctx, const std::vector<Affine>& idx, bool want_index) -> std::pair<ExprOr, ExprOr> {
    ExprOr best = LiteralF(ct, -std::numeric_limits<double>::infinity());
    ExprOr best_at = I64(-1);
    for (int64_t i = 0; i < kernel[0]; ++i) {
      for (int64_t j = 0; j < kernel[1]; ++j) {
        const Affine h = AffAdd(AffScale(idx[2], stride[0]), AffConst(i * dil[0] - pad[0]));
        const Affine w = AffAdd(AffScale(idx[3], stride[1]), AffConst(j * dil[1] - pad[1]));
        const ExprOr inside = k::Binary(BinaryOp::kLogicalAnd, InRange(h, 0, height), InRange(w, 0, width));
        ExprOr v = ctx.LoadMasked(x, {idx[0], idx[1], h, w}, inside);
        if (v.ok() && k::IsHalfType((*v)->type)) v = k::Cast(ScalarType::kFloat32, v);
        v = k::Cast(ct, v);
        ExprOr take = k::Binary(BinaryOp::kLogicalOr, k::Binary(BinaryOp::kGt, v, best), k::Unary(k::UnaryOp::kIsNan, v));
        if (want_index) take = k::Binary(BinaryOp::kLogicalOr, take, k::Binary(BinaryOp::kLt, best_at, I64(0)));
        take = k::Binary(BinaryOp::kLogicalAnd, inside, take);
        if (want_index) best_at = k::Select(take, k::Add(k::Mul(AffineExpr(h), I64(width)), AffineExpr(w)), best_at);
        best = k::Select(take, v, best);
      }
    }
    return {best, best_at};
  };
  out.op = "max_pool2d";
  out.inputs = {x};
  out.masked_inputs = {x};
  out.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    return k::Cast(ot, scan(ctx, idx, false).first);
  };
  index.op = "max_pool2d_indices";
  index.inputs = {x};
  index.masked_inputs = {x};
  index.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr { return scan(ctx, idx, true).second; };
  const int32_t out_id = l.Add(std::move(out));
  const int32_t index_id = l.Add(std::move(index));
  l.SetItems(node_index, {out_id, index_id});
  return absl::OkStatus();
}

absl::Status LowerMaxPool2dBackward(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  if (n.type.kind != Type::Kind::kTensor || n.args.size() < 8) {
    return absl::UnimplementedError("max_pool2d_with_indices_backward arguments");
  }
  KILN_ASSIGN_OR_RETURN(const int32_t go, l.KernelValueOf(n.args[0]));
  KILN_ASSIGN_OR_RETURN(const int32_t indices, l.KernelValueOf(n.args[7]));
  const std::vector<int64_t> out_sizes = l.g().values[go].sizes;  // the pooled [N, C, OH, OW]
  if (out_sizes.size() != 4) return absl::UnimplementedError("max_pool2d backward of a 3-D input");
  if (!k::IsFloatType(l.g().values[go].dtype)) return absl::UnimplementedError("max_pool2d backward of an integer gradient");
  if (l.g().values[indices].sizes != out_sizes || l.g().values[indices].dtype != ScalarType::kInt64) {
    return absl::UnimplementedError("max_pool2d backward: indices of another shape than grad_output, or not int64");
  }
  KILN_ASSIGN_OR_RETURN(const Window win, ParseWindow(n, 2, "max_pool2d backward"));
  const std::vector<int64_t> kernel = win.kernel, stride = win.stride, pad = win.pad, dil = win.dil;
  KILN_ASSIGN_OR_RETURN(LValue view, l.NewValue(node_index, n.type.tensor, ValueKind::kView));
  if (view.sizes.size() != 4 || view.sizes[0] != out_sizes[0] || view.sizes[1] != out_sizes[1] ||
      view.storage_offset != 0 || view.dtype != l.g().values[go].dtype) {
    return absl::UnimplementedError("max_pool2d backward result shape");
  }
  const int64_t height = view.sizes[2], width = view.sizes[3];
  if (height % stride[0] != 0 || width % stride[1] != 0) {
    return absl::UnimplementedError(absl::StrCat("max_pool2d backward: input ", height, " x ", width,
                                                 " is not a multiple of the stride ", stride[0], " x ", stride[1]));
  }
  for (int64_t s : view.strides) {
    if (s <= 0) return absl::UnimplementedError("max_pool2d backward result with a zero or negative stride");
  }
  // The gradient over [N, C, H / sh, sh, W / sw, sw], laid out so that the view has the graph's strides.
  LValue split = view;
  split.kind = ValueKind::kPointwise;
  split.op = "max_pool2d_backward";
  split.sizes = {view.sizes[0], view.sizes[1], height / stride[0], stride[0], width / stride[1], stride[1]};
  split.strides = {view.strides[0], view.strides[1], view.strides[2] * stride[0], view.strides[2],
                   view.strides[3] * stride[1], view.strides[3]};
  split.meta.clear_sizes();
  split.meta.clear_strides();
  for (int64_t x : split.sizes) split.meta.add_sizes()->set_constant(x);
  for (int64_t x : split.strides) split.meta.add_strides()->set_constant(x);
  split.inputs = {go, indices};
  split.masked_inputs = {go, indices};
  // Per kernel offset along one axis: the residue r it reaches and the window offset q (see above).
  auto reach = [](int64_t i, int64_t s, int64_t p, int64_t d) {
    const int64_t r = ((i * d - p) % s + s) % s;
    return std::pair<int64_t, int64_t>{r, (r + p - i * d) / s};
  };
  const ScalarType ot = view.dtype, ct = ComputeType(view.dtype);
  const int64_t oh_size = out_sizes[2], ow_size = out_sizes[3];
  split.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    const Affine h = AffAdd(AffScale(idx[2], stride[0]), idx[3]);
    const Affine w = AffAdd(AffScale(idx[4], stride[1]), idx[5]);
    const ExprOr at = k::Add(k::Mul(AffineExpr(h), I64(width)), AffineExpr(w));
    ExprOr sum = LiteralF(ct, 0.0);
    for (int64_t i = kernel[0] - 1; i >= 0; --i) {  // window rows ascending
      const auto [ri, qi] = reach(i, stride[0], pad[0], dil[0]);
      const Affine oh = AffAdd(idx[2], AffConst(qi));
      for (int64_t j = kernel[1] - 1; j >= 0; --j) {  // window columns ascending
        const auto [rj, qj] = reach(j, stride[1], pad[1], dil[1]);
        const Affine ow = AffAdd(idx[4], AffConst(qj));
        ExprOr in = k::Binary(BinaryOp::kLogicalAnd, InRange(oh, 0, oh_size), InRange(ow, 0, ow_size));
        in = k::Binary(BinaryOp::kLogicalAnd, in, k::Binary(BinaryOp::kEq, AffineExpr(idx[3]), I64(ri)));
        in = k::Binary(BinaryOp::kLogicalAnd, in, k::Binary(BinaryOp::kEq, AffineExpr(idx[5]), I64(rj)));
        const std::vector<Affine> where = {idx[0], idx[1], oh, ow};
        const ExprOr hit = k::Binary(BinaryOp::kLogicalAnd, in,
                                     k::Binary(BinaryOp::kEq, ctx.LoadMasked(indices, where, in), at));
        ExprOr g = ctx.LoadMasked(go, where, in);
        if (g.ok() && k::IsHalfType((*g)->type)) g = k::Cast(ScalarType::kFloat32, g);
        sum = k::Add(sum, k::Select(hit, k::Cast(ct, g), LiteralF(ct, 0.0)));
      }
    }
    return k::Cast(ot, sum);
  };
  const int32_t split_id = l.Add(std::move(split));
  view.op = "max_pool2d_backward_view";
  view.base = split_id;
  view.inputs = {split_id};
  l.SetResult(node_index, l.Add(std::move(view)));
  return absl::OkStatus();
}

}  // namespace kiln::lower::internal
