// Position-dependent ops -> element functions: cat, stack, arange, constant_pad_nd,
// select_backward, slice_backward, tril, triu, nll_loss_backward (see lower.h). Operands that may
// be addressed out of range (cat, pads, slice_backward) are read masked and listed in
// LValue::masked_inputs.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"
#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {
namespace {

using graph::Arg;
using graph::Node;
using k::BinaryOp;
using k::ScalarType;

}  // namespace

k::ExprOr InRange(const Affine& i, int64_t lo, int64_t hi) {
  const k::ExprOr e = AffineExpr(i);
  return k::Binary(BinaryOp::kLogicalAnd, k::Binary(BinaryOp::kGe, e, k::ConstInt(ScalarType::kInt64, lo)),
                   k::Binary(BinaryOp::kLt, e, k::ConstInt(ScalarType::kInt64, hi)));
}

absl::StatusOr<bool> DefineIndexed(Lowerer& l, const Node& n, LValue& v) {
  const std::string& name = n.op->schema.name;
  const int rank = static_cast<int>(v.sizes.size());
  const ScalarType out = v.dtype;
  auto wrap = [&](int64_t d) -> absl::StatusOr<int> {
    if (d < 0) d += rank;
    if (d < 0 || d >= rank) return absl::UnimplementedError("dim out of range");
    return static_cast<int>(d);
  };
  auto zero = [out]() { return k::Cast(out, k::ConstInt(ScalarType::kInt64, 0)); };
  if (name == "cat") {
    if (n.args.size() < 2 || n.args[0].kind != Arg::Kind::kList || n.args[1].kind != Arg::Kind::kInt) {
      return absl::UnimplementedError("cat arguments");
    }
    KILN_ASSIGN_OR_RETURN(const int d, wrap(n.args[1].i));
    std::vector<int32_t> ins;
    std::vector<int64_t> starts;
    int64_t at = 0;
    for (const Arg& a : n.args[0].list) {
      KILN_ASSIGN_OR_RETURN(int32_t x, l.KernelValueOf(a));
      const LValue& xv = l.g().values[x];
      if (xv.numel() == 0) continue;
      if (static_cast<int>(xv.sizes.size()) != rank) return absl::UnimplementedError("cat of different ranks");
      ins.push_back(x);
      starts.push_back(at);
      at += xv.sizes[d];
    }
    if (ins.empty() || at != v.sizes[d]) return absl::UnimplementedError("cat shapes");
    v.inputs = ins;
    v.masked_inputs = ins;
    v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
      k::ExprOr r;
      for (int i = static_cast<int>(ins.size()) - 1; i >= 0; --i) {
        const int64_t end = i + 1 < static_cast<int>(ins.size()) ? starts[i + 1] : at;
        std::vector<Affine> local = idx;
        local[d] = AffAdd(idx[d], AffConst(-starts[i]));
        const k::ExprOr mask = InRange(idx[d], starts[i], end);
        const k::ExprOr x = k::Cast(out, ctx.LoadMasked(ins[i], local, mask));
        r = i + 1 == static_cast<int>(ins.size()) ? x : k::Select(mask, x, r);
      }
      return r;
    };
    return true;
  }
  if (name == "stack") {
    if (n.args.size() < 2 || n.args[0].kind != Arg::Kind::kList || n.args[1].kind != Arg::Kind::kInt) {
      return absl::UnimplementedError("stack arguments");
    }
    KILN_ASSIGN_OR_RETURN(const int d, wrap(n.args[1].i));
    std::vector<int32_t> ins;
    for (const Arg& a : n.args[0].list) {
      KILN_ASSIGN_OR_RETURN(int32_t x, l.KernelValueOf(a));
      std::vector<int64_t> expect = v.sizes;
      expect.erase(expect.begin() + d);
      if (l.g().values[x].sizes != expect) return absl::UnimplementedError("stack shapes");
      ins.push_back(x);
    }
    if (static_cast<int64_t>(ins.size()) != v.sizes[d]) return absl::UnimplementedError("stack count");
    v.inputs = ins;
    v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
      std::vector<Affine> local = idx;
      local.erase(local.begin() + d);
      k::ExprOr r = k::Cast(out, ctx.Load(ins.back(), local));
      for (int i = static_cast<int>(ins.size()) - 2; i >= 0; --i) {
        const k::ExprOr hit = k::Binary(BinaryOp::kEq, AffineExpr(idx[d]), k::ConstInt(ScalarType::kInt64, i));
        r = k::Select(hit, k::Cast(out, ctx.Load(ins[i], local)), r);
      }
      return r;
    };
    return true;
  }
  if (name == "arange") {  // start + i * step, computed in f64 (integers in i64), then cast
    const std::string& ov = n.op->schema.overload;
    Arg start = Arg::Int(0), step = Arg::Int(1);
    if (ov == "start" || ov == "start_step") start = n.args[0];
    if (ov == "start_step") step = n.args[2];
    for (const Arg& a : {start, step}) {
      if (a.kind != Arg::Kind::kInt && a.kind != Arg::Kind::kFloat) return absl::UnimplementedError("arange args");
    }
    if (rank != 1) return absl::UnimplementedError("arange rank");
    const ScalarType ct = k::IsFloatType(out) ? ScalarType::kFloat64 : ScalarType::kInt64;
    if (ct == ScalarType::kInt64 && (start.kind == Arg::Kind::kFloat || step.kind == Arg::Kind::kFloat)) {
      return absl::UnimplementedError("integer arange with float arguments");
    }
    v.elem = [=](LoadContext&, const std::vector<Affine>& idx) -> k::ExprOr {
      const k::ExprOr i = k::Cast(ct, AffineExpr(idx[0]));
      return k::Cast(out, k::Add(Literal(ct, start), k::Mul(i, Literal(ct, step))));
    };
    return true;
  }
  if (name == "constant_pad_nd") {
    KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[0]));
    if (n.args[1].kind != Arg::Kind::kList) return absl::UnimplementedError("pad list");
    std::vector<int64_t> left(rank, 0);
    const auto& pads = n.args[1].list;
    for (size_t i = 0; i + 1 < pads.size(); i += 2) {
      if (pads[i].kind != Arg::Kind::kInt) return absl::UnimplementedError("symbolic pad");
      left[rank - 1 - i / 2] = pads[i].i;
    }
    const std::vector<int64_t> in_sizes = l.g().values[x].sizes;
    if (static_cast<int>(in_sizes.size()) != rank) return absl::UnimplementedError("pad rank");
    const Arg value = n.args.size() > 2 ? n.args[2] : Arg::Int(0);
    v.inputs = {x};
    v.masked_inputs = {x};
    v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
      std::vector<Affine> local = idx;
      k::ExprOr mask = k::ConstBool(true);
      for (int d = 0; d < rank; ++d) {
        local[d] = AffAdd(idx[d], AffConst(-left[d]));
        if (left[d] > 0 || left[d] + in_sizes[d] < v.sizes[d]) {
          mask = k::Binary(BinaryOp::kLogicalAnd, mask, InRange(local[d], 0, in_sizes[d]));
        }
      }
      const ScalarType ct = ComputeType(out);
      return k::Select(mask, k::Cast(out, ctx.LoadMasked(x, local, mask)), k::Cast(out, Literal(ct, value)));
    };
    return true;
  }
  if (name == "select_backward" || name == "slice_backward") {
    KILN_ASSIGN_OR_RETURN(const int32_t grad, l.KernelValueOf(n.args[0]));
    if (n.args[2].kind != Arg::Kind::kInt || n.args[3].kind != Arg::Kind::kInt) return absl::UnimplementedError("dims");
    KILN_ASSIGN_OR_RETURN(const int d, wrap(n.args[2].i));
    const int64_t size = v.sizes[d];
    v.inputs = {grad};
    if (name == "select_backward") {
      int64_t index = n.args[3].i;
      if (index < 0) index += size;
      v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
        std::vector<Affine> gidx = idx;
        gidx.erase(gidx.begin() + d);
        const k::ExprOr hit = k::Binary(BinaryOp::kEq, AffineExpr(idx[d]), k::ConstInt(ScalarType::kInt64, index));
        return k::Select(hit, k::Cast(out, ctx.Load(grad, gidx)), zero());
      };
      return true;
    }
    if (n.args.size() < 6 || n.args[4].kind != Arg::Kind::kInt || n.args[5].kind != Arg::Kind::kInt ||
        n.args[5].i != 1) {
      return absl::UnimplementedError("slice_backward with a step");
    }
    auto norm = [size](int64_t x) { return std::min(std::max(x < 0 ? x + size : x, int64_t{0}), size); };
    const int64_t start = norm(n.args[3].i), end = std::max(start, norm(n.args[4].i));
    v.masked_inputs = {grad};
    v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
      std::vector<Affine> gidx = idx;
      gidx[d] = AffAdd(idx[d], AffConst(-start));
      const k::ExprOr mask = InRange(idx[d], start, end);
      return k::Select(mask, k::Cast(out, ctx.LoadMasked(grad, gidx, mask)), zero());
    };
    return true;
  }
  if (name == "nll_loss_backward") {
    // (grad_output, self, target, weight, reduction, ignore_index, total_weight): the one-hot
    // gradient, as ATen's kernels write it into zeros: at [i, t] (t = target[i] != ignore_index)
    // weight[t] * -(grad_output / total_weight) (mean), -grad_output (sum), -grad_output[i] (none).
    if (n.args.size() < 7 || n.args[4].kind != Arg::Kind::kInt || n.args[5].kind != Arg::Kind::kInt) {
      return absl::UnimplementedError("nll_loss_backward arguments");
    }
    if (rank != 1 && rank != 2) return absl::UnimplementedError("nll_loss_backward rank");
    const int64_t reduction = n.args[4].i, ignore = n.args[5].i;
    if (reduction < 0 || reduction > 2) return absl::UnimplementedError("nll_loss_backward reduction");
    const ScalarType ct = ComputeType(out);
    if (!k::IsFloatType(ct)) return absl::UnimplementedError("nll_loss_backward dtype");
    KILN_ASSIGN_OR_RETURN(const int32_t grad, l.KernelValueOf(n.args[0]));
    KILN_ASSIGN_OR_RETURN(const int32_t target, l.KernelValueOf(n.args[2]));
    KILN_ASSIGN_OR_RETURN(const int32_t total, l.KernelValueOf(n.args[6]));
    int32_t weight = -1;
    if (n.args[3].kind != Arg::Kind::kNone) {
      KILN_ASSIGN_OR_RETURN(weight, l.KernelValueOf(n.args[3]));
    }
    const std::vector<int64_t> rows = rank == 2 ? std::vector<int64_t>{v.sizes[0]} : std::vector<int64_t>{};
    const std::vector<int64_t> classes = {v.sizes[rank - 1]};
    const std::vector<int64_t> no_dims;
    const auto& vals = l.g().values;
    if (vals[target].sizes != rows || !k::IsIntType(vals[target].dtype)) {
      return absl::UnimplementedError("nll_loss_backward target");
    }
    if (vals[grad].sizes != (reduction == 0 ? rows : no_dims) || vals[total].sizes != no_dims) {
      return absl::UnimplementedError("nll_loss_backward grad_output");
    }
    if (weight >= 0 && vals[weight].sizes != classes) return absl::UnimplementedError("nll_loss_backward weight");
    v.inputs = {grad, target, total};
    if (weight >= 0) v.inputs.push_back(weight);
    const ElemFn as_ct_grad = LoadAs(grad, ct), as_ct_total = LoadAs(total, ct), as_ct_weight = LoadAs(weight, ct);
    v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
      const std::vector<Affine> row = rank == 2 ? std::vector<Affine>{idx[0]} : std::vector<Affine>{};
      const std::vector<Affine> none;
      const k::ExprOr t = k::Cast(ScalarType::kInt64, ctx.Load(target, row));
      const k::ExprOr hit = k::Binary(BinaryOp::kLogicalAnd,
                                      k::Binary(BinaryOp::kEq, t, AffineExpr(idx[rank - 1])),
                                      k::Binary(BinaryOp::kNe, t, k::ConstInt(ScalarType::kInt64, ignore)));
      k::ExprOr g = as_ct_grad(ctx, reduction == 0 ? row : none);
      if (reduction == 1) g = k::Div(g, as_ct_total(ctx, none));
      k::ExprOr value = k::Unary(k::UnaryOp::kNeg, g);
      if (weight >= 0) value = k::Mul(as_ct_weight(ctx, {idx[rank - 1]}), value);
      return k::Select(hit, k::Cast(out, value), zero());
    };
    return true;
  }
  if (name == "tril" || name == "triu") {
    KILN_ASSIGN_OR_RETURN(const int32_t x, l.KernelValueOf(n.args[0]));
    if (rank < 2 || l.g().values[x].sizes != v.sizes) return absl::UnimplementedError("tril shapes");
    const int64_t diag = n.args.size() > 1 && n.args[1].kind == Arg::Kind::kInt ? n.args[1].i : 0;
    const bool lower = name == "tril";
    v.inputs = {x};
    v.elem = [=](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
      // tril keeps j - i <= diag; triu keeps j - i >= diag.
      const k::ExprOr jmi = k::Sub(AffineExpr(idx[rank - 1]), AffineExpr(idx[rank - 2]));
      const k::ExprOr keep = k::Binary(lower ? BinaryOp::kLe : BinaryOp::kGe, jmi, k::ConstInt(ScalarType::kInt64, diag));
      return k::Select(keep, ctx.Load(x, idx), zero());
    };
    return true;
  }
  return false;
}

}  // namespace kiln::lower::internal
