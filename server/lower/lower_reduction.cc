// Reductions and row-fused composites -> RowOps (see lower.h and op_graph.h).

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"
#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {
namespace {

using graph::Arg;
using graph::Node;
using graph::Type;
using k::AccField;
using k::AccKind;
using k::ExprOr;
using k::ScalarType;

absl::StatusOr<std::vector<int>> Dims(const Arg& a, int rank) {
  std::vector<int64_t> raw;
  if (a.kind == Arg::Kind::kNone) {
    // all dims
  } else if (a.kind == Arg::Kind::kInt) {
    raw.push_back(a.i);
  } else if (a.kind == Arg::Kind::kList) {
    for (const Arg& x : a.list) {
      if (x.kind != Arg::Kind::kInt) return absl::UnimplementedError("non-constant reduction dim");
      raw.push_back(x.i);
    }
  } else {
    return absl::UnimplementedError("reduction dims");
  }
  std::set<int> dims;
  if (raw.empty()) {
    for (int d = 0; d < rank; ++d) dims.insert(d);
  }
  for (int64_t d : raw) {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return absl::UnimplementedError("reduction dim out of range");
    dims.insert(static_cast<int>(d));
  }
  return std::vector<int>(dims.begin(), dims.end());
}

// The one output of a row whose accumulator 0 (of type `acc`) sums or multiplies: that value (a
// mean: over `count`), cast to `out`; then split when long (lower_split.cc).
absl::Status FinishSum(Lowerer& l, RowBuilder& b, ScalarType acc, ScalarType out, bool mean, int64_t count) {
  KILN_RETURN_IF_ERROR(b.Output(-1, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) -> ExprOr {
    ExprOr v = a(0, AccField::kValue);
    if (mean) v = k::Div(v, LiteralF(acc, static_cast<double>(count)));
    return k::Cast(out, v);
  }));
  KILN_RETURN_IF_ERROR(SplitFewOutputReduction(l, b));
  return b.Finish();
}

// mse_loss(self, target, reduction): (self - target)^2 in the compute type over the operands'
// broadcast shape, pointwise (reduction 0, or 0-d operands) or summed over every dim (2; 1 divides
// by the count, as mean does).
absl::Status LowerMseLoss(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  if (n.args.size() < 2) return absl::UnimplementedError("mse_loss arguments");
  KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[0]));
  KILN_ASSIGN_OR_RETURN(const int32_t y, l.KernelValueOf(n.args[1]));
  // Copies: Add() grows the value table.
  const std::vector<int64_t> x_sizes = l.g().values[x].sizes, y_sizes = l.g().values[y].sizes;
  std::vector<int64_t> sizes(std::max(x_sizes.size(), y_sizes.size()), 1);
  for (const std::vector<int64_t>* in : {&x_sizes, &y_sizes}) {  // torch's broadcasting
    const size_t skip = sizes.size() - in->size();
    for (size_t i = 0; i < in->size(); ++i) {
      int64_t& s = sizes[skip + i];
      if ((*in)[i] != s && (*in)[i] != 1 && s != 1) return absl::UnimplementedError("mse_loss operands do not broadcast");
      if ((*in)[i] != 1) s = (*in)[i];
    }
  }
  int64_t count = 1;
  for (int64_t s : sizes) count *= s;
  if (count == 0) return absl::UnimplementedError("mse_loss of an empty tensor");
  int64_t reduction = 1;
  if (n.args.size() > 2 && n.args[2].kind != Arg::Kind::kNone) {
    if (n.args[2].kind != Arg::Kind::kInt) return absl::UnimplementedError("mse_loss reduction");
    reduction = n.args[2].i;
  }
  if (reduction < 0 || reduction > 2) return absl::UnimplementedError("mse_loss reduction");
  if (n.type.kind != Type::Kind::kTensor) return absl::UnimplementedError("mse_loss result");
  const auto out_st = ToScalarType(n.type.tensor.dtype);
  if (!out_st) return absl::UnimplementedError("mse_loss result dtype");
  const ScalarType out = *out_st, ct = ComputeType(out);
  if (!k::IsFloatType(ct)) return absl::UnimplementedError("integer mse_loss");
  const ElemFn a = LoadAs(x, ct), b = LoadAs(y, ct);
  const ElemFn squared = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
    const ExprOr d = k::Sub(a(ctx, BroadcastIndex(x_sizes, idx)), b(ctx, BroadcastIndex(y_sizes, idx)));
    return k::Mul(d, d);
  };
  if (reduction == 0 || sizes.empty()) {  // (the mean or sum of one element: itself)
    KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, n.type.tensor, ValueKind::kPointwise));
    if (v.sizes != sizes) return absl::UnimplementedError("mse_loss result shape");
    v.op = "mse_loss";
    v.inputs = {x, y};
    v.elem = [squared, out](LoadContext& ctx, const std::vector<Affine>& idx) {
      return k::Cast(out, squared(ctx, idx));
    };
    l.SetResult(node_index, l.Add(std::move(v)));
    return absl::OkStatus();
  }
  RowBuilder rb{l, node_index, n, RowOp{}, {}};
  rb.row.name = "mse_loss";
  rb.row.domain = sizes;
  rb.row.inputs = {x, y};
  for (int d = 0; d < static_cast<int>(sizes.size()); ++d) rb.row.reduce_dims.push_back(d);
  rb.row.accs.push_back({AccKind::kSum, ct, squared});
  return FinishSum(l, rb, ct, out, reduction == 1, count);
}

}  // namespace

absl::Status LowerRowNode(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  const std::string& name = n.op->schema.name;
  const std::string& ov = n.op->schema.overload;
  if (name == "mse_loss") return LowerMseLoss(l, node_index);
  if (n.args.empty()) return absl::UnimplementedError("no input");
  KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[0]));
  const LValue& in = l.g().values[x];
  const int rank = static_cast<int>(in.sizes.size());
  if (rank == 0) {  // sum/mean/prod/amax/amin/max/min of a scalar: the value itself, cast
    if (name != "sum" && name != "mean" && name != "prod" && name != "amax" && name != "amin" &&
        !((name == "max" || name == "min") && ov.empty())) {
      return absl::UnimplementedError("reduction of a 0-d tensor");
    }
    if (n.type.kind != Type::Kind::kTensor) return absl::UnimplementedError("0-d reduction result");
    KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, n.type.tensor, ValueKind::kPointwise));
    if (!v.sizes.empty() || (name == "mean" && !k::IsFloatType(v.dtype))) {
      return absl::UnimplementedError("0-d reduction result");
    }
    v.op = name;
    v.inputs = {x};
    v.cheap = true;
    const ScalarType out = v.dtype;
    v.elem = [x, out](LoadContext& ctx, const std::vector<Affine>& idx) { return k::Cast(out, ctx.Load(x, idx)); };
    l.SetResult(node_index, l.Add(std::move(v)));
    return absl::OkStatus();
  }
  for (int64_t s : in.sizes) {
    if (s == 0) return absl::UnimplementedError("reduction of an empty tensor");
  }
  RowBuilder b{l, node_index, n, RowOp{}, {}};
  b.row.name = name;
  b.row.domain = in.sizes;
  b.row.inputs = {x};
  const ScalarType in_ct = ComputeType(in.dtype);
  auto out_type = [&](int item) -> absl::StatusOr<ScalarType> {
    if (item >= 0 && item >= static_cast<int>(n.type.items.size())) return absl::UnimplementedError("result item");
    const Type& t = item < 0 ? n.type : n.type.items[item];
    if (t.kind != Type::Kind::kTensor) return absl::UnimplementedError("non-tensor result");
    auto st = ToScalarType(t.tensor.dtype);
    if (!st) return absl::UnimplementedError("reduction result dtype");
    return *st;
  };
  const bool all_default = ov.empty() && name != "argmax" && name != "argmin" && name != "amax" && name != "amin" &&
                           name != "_softmax" && name != "_log_softmax" && name != "native_layer_norm";
  auto dims_at = [&](int i) -> absl::StatusOr<std::vector<int>> {
    if (all_default) return Dims(Arg::None(), rank);
    return Dims(i < static_cast<int>(n.args.size()) ? n.args[i] : Arg::None(), rank);
  };

  if (name == "sum" || name == "mean" || name == "prod") {
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, dims_at(1));
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(-1));
    const ScalarType acc = ComputeType(out);
    if (name == "mean" && !k::IsFloatType(acc)) return absl::UnimplementedError("integer mean");
    int64_t count = 1;
    for (int d : b.row.reduce_dims) count *= in.sizes[d];
    b.row.accs.push_back({name == "prod" ? AccKind::kProd : AccKind::kSum, acc, LoadAs(x, acc)});
    return FinishSum(l, b, acc, out, name == "mean", count);
  }
  if (name == "amax" || name == "amin" || ((name == "max" || name == "min") && ov.empty())) {
    if (in.dtype == ScalarType::kBool) return absl::UnimplementedError("max of bool");
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, dims_at(1));
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(-1));
    const bool mx = name == "amax" || name == "max";
    b.row.accs.push_back({mx ? AccKind::kMax : AccKind::kMin, in_ct, LoadAs(x, in_ct)});
    KILN_RETURN_IF_ERROR(b.Output(-1, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
      return k::Cast(out, a(0, AccField::kValue));
    }));
    KILN_RETURN_IF_ERROR(SplitFewOutputReduction(l, b));
    return b.Finish();
  }
  if (name == "argmax" || name == "argmin" || name == "max" || name == "min") {  // max.dim / min.dim too
    if (in.dtype == ScalarType::kBool) return absl::UnimplementedError("argmax of bool");
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, Dims(n.args.size() > 1 ? n.args[1] : Arg::None(), rank));
    const bool mx = name == "argmax" || name == "max";
    b.row.accs.push_back({mx ? AccKind::kArgMax : AccKind::kArgMin, in_ct, LoadAs(x, in_ct)});
    if (name == "argmax" || name == "argmin") {
      KILN_RETURN_IF_ERROR(b.Output(-1, false, [](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return a(0, AccField::kIndex);
      }));
    } else {
      KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(0));
      KILN_RETURN_IF_ERROR(b.Output(0, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return k::Cast(out, a(0, AccField::kValue));
      }));
      KILN_RETURN_IF_ERROR(b.Output(1, false, [](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return a(0, AccField::kIndex);
      }));
    }
    return b.Finish();
  }
  if (name == "any" || name == "all") {
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, dims_at(1));
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(-1));
    const ScalarType i32 = ScalarType::kInt32;
    ElemFn as_bool = [x, i32](LoadContext& ctx, const std::vector<Affine>& idx) -> ExprOr {
      ExprOr v = ctx.Load(x, idx);
      if (v.ok() && k::IsHalfType((*v)->type)) v = k::Cast(ScalarType::kFloat32, v);
      return k::Cast(i32, k::Cast(ScalarType::kBool, v));
    };
    b.row.accs.push_back({name == "any" ? AccKind::kMax : AccKind::kMin, i32, as_bool});
    KILN_RETURN_IF_ERROR(b.Output(-1, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
      return k::Cast(out, k::Cast(ScalarType::kBool, a(0, AccField::kValue)));
    }));
    return b.Finish();
  }
  if (name == "var" || name == "std" || name == "var_mean") {
    if (!k::IsFloatType(in.dtype)) return absl::UnimplementedError("var of integers");
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, dims_at(1));
    double correction = 1;
    if (n.args.size() > 2) {
      const Arg& c = n.args[2];
      if (c.kind == Arg::Kind::kInt) correction = static_cast<double>(c.i);
      if (c.kind == Arg::Kind::kFloat) correction = c.f;
    }
    b.row.accs.push_back({AccKind::kWelford, in_ct, LoadAs(x, in_ct)});
    const bool sd = name == "std";
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(name == "var_mean" ? 0 : -1));
    auto var = [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) -> ExprOr {
      ExprOr v = k::Div(a(0, AccField::kM2), k::Sub(a(0, AccField::kCount), LiteralF(in_ct, correction)));
      if (sd) v = k::Unary(k::UnaryOp::kSqrt, v);
      return k::Cast(out, v);
    };
    KILN_RETURN_IF_ERROR(b.Output(name == "var_mean" ? 0 : -1, false, var));
    if (name == "var_mean") {
      KILN_RETURN_IF_ERROR(b.Output(1, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
        return k::Cast(out, a(0, AccField::kMean));
      }));
    }
    return b.Finish();
  }
  if (name == "_softmax" || name == "_log_softmax") {
    if (!k::IsFloatType(in.dtype)) return absl::UnimplementedError("softmax of integers");
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, Dims(n.args[1], rank));
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(-1));
    const bool log = name == "_log_softmax";
    KILN_ASSIGN_OR_RETURN(const bool split, SplitFewRowSoftmax(l, b, x, in_ct, out, log));
    if (split) return absl::OkStatus();
    b.row.composite = true;
    // A 16-bit result: the exps may be approximate (CudaKernelEmitter::PlanApproxExp).
    b.row.accs.push_back({AccKind::kOnlineSoftmax, in_ct, LoadAs(x, in_ct), k::IsHalfType(out)});
    KILN_RETURN_IF_ERROR(b.Output(-1, true, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
      const ExprOr xv = LoadAs(x, in_ct)(ctx, idx);
      const ExprOr shifted = k::Sub(xv, a(0, AccField::kMax));
      if (log) return k::Cast(out, k::Sub(shifted, k::Log(a(0, AccField::kSum))));
      return k::Cast(out, k::Div(k::Exp(shifted), a(0, AccField::kSum)));
    }));
    return b.Finish();
  }
  if (name == "native_layer_norm") {
    if (!k::IsFloatType(in.dtype)) return absl::UnimplementedError("layer norm of integers");
    if (n.args.size() < 5 || n.args[1].kind != Arg::Kind::kList) return absl::UnimplementedError("normalized_shape");
    const int nd = static_cast<int>(n.args[1].list.size());
    if (nd < 1 || nd > rank) return absl::UnimplementedError("normalized_shape rank");
    for (int d = rank - nd; d < rank; ++d) b.row.reduce_dims.push_back(d);
    int32_t w = -1, bias = -1;
    if (n.args[2].kind == Arg::Kind::kValue) {
      KILN_ASSIGN_OR_RETURN(w, l.KernelValueOf(n.args[2]));
    }
    if (n.args[3].kind == Arg::Kind::kValue) {
      KILN_ASSIGN_OR_RETURN(bias, l.KernelValueOf(n.args[3]));
    }
    for (int32_t p : {w, bias}) {
      if (p < 0) continue;
      b.row.inputs.push_back(p);
      const auto& ps = l.g().values[p].sizes;
      if (static_cast<int>(ps.size()) != nd ||
          !std::equal(ps.begin(), ps.end(), in.sizes.end() - nd)) {
        return absl::UnimplementedError("layer norm weight shape");
      }
    }
    const double eps = n.args[4].kind == Arg::Kind::kFloat ? n.args[4].f : static_cast<double>(n.args[4].i);
    b.row.composite = true;
    b.row.accs.push_back({AccKind::kWelford, in_ct, LoadAs(x, in_ct)});
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(0));
    KILN_ASSIGN_OR_RETURN(const ScalarType stat, out_type(1));
    auto rstd = [=](const AccReader& a) -> ExprOr {
      return k::Unary(k::UnaryOp::kRsqrt,
                      k::Add(k::Div(a(0, AccField::kM2), a(0, AccField::kCount)), LiteralF(in_ct, eps)));
    };
    KILN_RETURN_IF_ERROR(b.Output(0, true, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
      ExprOr y = k::Mul(k::Sub(LoadAs(x, in_ct)(ctx, idx), a(0, AccField::kMean)), rstd(a));
      const std::vector<Affine> pidx(idx.end() - nd, idx.end());
      if (w >= 0) y = k::Mul(y, LoadAs(w, in_ct)(ctx, pidx));
      if (bias >= 0) y = k::Add(y, LoadAs(bias, in_ct)(ctx, pidx));
      return k::Cast(out, y);
    }));
    KILN_RETURN_IF_ERROR(b.Output(1, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
      return k::Cast(stat, a(0, AccField::kMean));
    }));
    KILN_RETURN_IF_ERROR(b.Output(2, false, [=](LoadContext&, const AccReader& a, const std::vector<Affine>&) {
      return k::Cast(stat, rstd(a));
    }));
    return b.Finish();
  }
  if (name == "_softmax_backward_data" || name == "_log_softmax_backward_data") {
    if (!k::IsFloatType(in.dtype) || n.args.size() < 3) return absl::UnimplementedError("softmax backward");
    KILN_ASSIGN_OR_RETURN(const int32_t y, l.KernelValueOf(n.args[1]));
    if (l.g().values[y].sizes != in.sizes) return absl::UnimplementedError("softmax backward shapes");
    KILN_ASSIGN_OR_RETURN(b.row.reduce_dims, Dims(n.args[2], rank));
    KILN_ASSIGN_OR_RETURN(const ScalarType out, out_type(-1));
    b.row.inputs.push_back(y);
    b.row.composite = true;
    const bool log = name == "_log_softmax_backward_data";
    const ElemFn gv = LoadAs(x, in_ct), yv = LoadAs(y, in_ct);
    if (log) {
      b.row.accs.push_back({AccKind::kSum, in_ct, gv});  // grad - exp(out) * sum(grad)
    } else {
      b.row.accs.push_back({AccKind::kSum, in_ct, [=](LoadContext& ctx, const std::vector<Affine>& idx) {
                              return k::Mul(gv(ctx, idx), yv(ctx, idx));
                            }});  // out * (grad - sum(grad * out))
    }
    KILN_RETURN_IF_ERROR(b.Output(-1, true, [=](LoadContext& ctx, const AccReader& a, const std::vector<Affine>& idx) {
      const ExprOr s = a(0, AccField::kValue);
      if (log) return k::Cast(out, k::Sub(gv(ctx, idx), k::Mul(k::Exp(yv(ctx, idx)), s)));
      return k::Cast(out, k::Mul(yv(ctx, idx), k::Sub(gv(ctx, idx), s)));
    }));
    return b.Finish();
  }
  if (name == "native_layer_norm_backward") return LowerLayerNormBackward(l, node_index);
  if (name == "max_pool2d_with_indices") return LowerMaxPool2d(l, node_index);
  if (name == "_native_batch_norm_legit_functional" || name == "_native_batch_norm_legit_no_training" ||
      name == "native_batch_norm_backward") {
    return LowerBatchNorm(l, node_index);
  }
  return absl::UnimplementedError(absl::StrCat("reduction ", n.target, " is not lowered"));
}

}  // namespace kiln::lower::internal
