#include "server/lower/kernelize.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/base/status_macros.h"

namespace kiln::lower {
namespace {

bool IsStorageKind(ValueKind k) {
  return k == ValueKind::kInput || k == ValueKind::kConstant || k == ValueKind::kStepOutput;
}

int64_t Span(const LValue& v) {
  int64_t n = 1;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] == 0) return 0;
    n += (v.sizes[d] - 1) * v.strides[d];
  }
  return n;
}

class KernelCtx : public LoadContext {
 public:
  KernelCtx(const OpGraph& g, const Schedule& s, int32_t gi, k::KernelBuilder& kb)
      : g_(g), s_(s), gi_(gi), kb_(kb) {}

  k::ExprOr Load(int32_t v, const std::vector<Affine>& idx) override {
    const std::string key = absl::StrCat(v, ":", IndexKey(idx));
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    k::ExprOr e = Compute(v, idx);
    if (e.ok()) memo_.emplace(key, *e);
    return e;
  }

  k::ExprOr LoadMasked(int32_t v, const std::vector<Affine>& idx, const k::ExprOr& mask) override {
    const LValue& x = g_.values[v];
    const int32_t root = ViewRoot(g_, v);
    const bool stored = IsStorageKind(g_.values[root].kind) || (s_.stored[root] && !Member(root));
    if (!stored) return absl::InternalError(absl::StrCat("masked read of v", v, " which is not stored"));
    const k::Buffer b = BufferFor(v, k::Access::kRead);
    return k::LoadMasked(b, ToKernelIndex(idx, x.strides), mask);
  }

  k::Buffer BufferFor(int32_t v, k::Access access) {
    auto it = buffers_.find(v);
    if (it != buffers_.end()) return it->second;
    const LValue& x = g_.values[v];
    const k::Buffer b = kb_.AddBuffer(x.dtype, access, k::Size::Const(Span(x)));
    buffers_.emplace(v, b);
    args.push_back(v);
    return b;
  }

  std::map<int32_t, std::vector<k::Accumulator>> accs;  // row op -> its accumulators
  std::vector<int32_t> args;

 private:
  bool Member(int32_t v) const { return s_.group_of[v] == gi_; }

  k::ExprOr LoadBuffer(int32_t v, const std::vector<Affine>& idx) {
    const k::Buffer b = BufferFor(v, k::Access::kRead);
    return k::Load(b, ToKernelIndex(idx, g_.values[v].strides));
  }

  k::ExprOr Compute(int32_t v, const std::vector<Affine>& idx) {
    const LValue& x = g_.values[v];
    if (Member(v)) {
      if (x.kind == ValueKind::kPointwise) return x.elem(*this, idx);
      if (x.kind == ValueKind::kRowOutput) {
        const RowOp& row = g_.row_ops[x.row_op];
        auto ait = accs.find(x.row_op);
        if (ait == accs.end()) return absl::InternalError("row op of a member has no accumulators");
        const std::vector<k::Accumulator>& a = ait->second;
        const AccReader reader = [&a](int i, k::AccField f) { return k::AccRead(a[i], f); };
        for (const RowOutput& o : row.outputs) {
          if (o.value == v) return o.fn(*this, reader, idx);
        }
      }
      return absl::InternalError(absl::StrCat("member v", v, " cannot be computed"));
    }
    if (x.kind == ValueKind::kView) {
      const int32_t root = ViewRoot(g_, v);
      if (IsStorageKind(g_.values[root].kind) || (s_.stored[root] && !Member(root))) return LoadBuffer(v, idx);
      auto mapped = MapViewIndex(g_, v, idx);
      if (!mapped.ok()) return absl::InternalError(absl::StrCat("view v", v, " of an unstored value is not affine"));
      return Load(root, *mapped);
    }
    if (s_.stored[v]) return LoadBuffer(v, idx);
    if (x.kind == ValueKind::kPointwise) return x.elem(*this, idx);
    return absl::InternalError(absl::StrCat("v", v, " (", x.op, ") is read but neither stored nor computed here"));
  }

  const OpGraph& g_;
  const Schedule& s_;
  const int32_t gi_;
  k::KernelBuilder& kb_;
  std::map<std::string, k::Expr> memo_;
  std::map<int32_t, k::Buffer> buffers_;
};

std::vector<Affine> Vars(const std::vector<k::Var>& vars) {
  std::vector<Affine> r;
  for (const k::Var& v : vars) r.push_back(AffVar(v));
  return r;
}

absl::StatusOr<GraphKernel> Build(const OpGraph& g, const Schedule& s, int32_t gi) {
  const Group& gr = s.groups[gi];
  std::string name;
  for (int32_t m : gr.members) {
    if (!name.empty()) name += "+";
    name += g.values[m].op;
  }
  k::KernelBuilder kb(absl::StrCat("group ", gi, ": ", name));
  KernelCtx ctx(g, s, gi, kb);
  std::vector<k::Stmt> phase0, phase1, phase2, body;
  auto store = [&](std::vector<k::Stmt>* out, int32_t m, const std::vector<Affine>& idx) -> absl::Status {
    const LValue& x = g.values[m];
    KILN_ASSIGN_OR_RETURN(k::Expr value, ctx.Load(m, idx));
    const k::Buffer b = ctx.BufferFor(m, k::Access::kWrite);
    KILN_ASSIGN_OR_RETURN(k::Stmt st, k::Store(b, ToKernelIndex(idx, x.strides), value));
    out->push_back(std::move(st));
    return absl::OkStatus();
  };
  if (gr.kind == Group::Kind::kPointwise) {
    std::vector<k::Var> vars;
    for (int64_t e : gr.shape) vars.push_back(kb.AddOuter(k::Size::Const(e)));
    const std::vector<Affine> idx = Vars(vars);
    for (int32_t m : gr.stores) KILN_RETURN_IF_ERROR(store(&body, m, idx));
  } else {
    const size_t rank = gr.shape.size();
    std::vector<bool> reduced(rank, false);
    for (int d : gr.reduce_dims) reduced[d] = true;
    std::vector<Affine> dom(rank);
    std::vector<std::pair<int64_t, Affine>> outer_nonunit;
    for (size_t d = 0; d < rank; ++d) {
      if (!reduced[d]) {
        dom[d] = AffVar(kb.AddOuter(k::Size::Const(gr.shape[d])));
        if (gr.shape[d] != 1) outer_nonunit.push_back({gr.shape[d], dom[d]});
      }
    }
    for (size_t d = 0; d < rank; ++d) {
      if (reduced[d]) dom[d] = AffVar(kb.AddReduce(k::Size::Const(gr.shape[d])));
    }
    for (int32_t r : gr.row_ops) {
      for (const RowAcc& a : g.row_ops[r].accs) {
        ctx.accs[r].push_back(kb.AddAccumulator(a.kind, a.dtype, a.approx_exp));
      }
    }
    for (size_t j = 0; j < gr.row_ops.size(); ++j) {  // a chained row op folds in phase 1
      const int32_t r = gr.row_ops[j];
      const auto& accs = g.row_ops[r].accs;
      for (size_t i = 0; i < accs.size(); ++i) {
        KILN_ASSIGN_OR_RETURN(k::Stmt st, k::Accumulate(ctx.accs[r][i], accs[i].value(ctx, dom)));
        (gr.row_stage[j] > 0 ? phase1 : phase0).push_back(std::move(st));
      }
    }
    for (int32_t m : gr.stores) {
      size_t pos = 0;
      while (gr.members[pos] != m) ++pos;
      if (gr.stage[pos] > 0) {
        KILN_RETURN_IF_ERROR(store(gr.stage[pos] > 1 ? &phase2 : &phase1, m, dom));
        continue;
      }
      // The member's non-1 dims are the outer space's non-1 dims, in order.
      const LValue& x = g.values[m];
      std::vector<Affine> idx;
      size_t next = 0;
      for (size_t d = 0; d < x.sizes.size(); ++d) {
        if (x.sizes[d] == 1) {
          idx.push_back(AffConst(0));
          continue;
        }
        while (next < outer_nonunit.size() && outer_nonunit[next].first == 1) ++next;
        if (next >= outer_nonunit.size() || outer_nonunit[next].first != x.sizes[d]) {
          return absl::InternalError(absl::StrCat("epilogue v", m, " does not match the row op's outer space"));
        }
        idx.push_back(outer_nonunit[next++].second);
      }
      KILN_RETURN_IF_ERROR(store(&body, m, idx));
    }
  }
  if (!phase0.empty()) {
    kb.BeginPhase();
    for (auto& st : phase0) kb.Add(std::move(st));
  }
  if (!phase1.empty()) {
    kb.BeginPhase();
    for (auto& st : phase1) kb.Add(std::move(st));
  }
  if (!phase2.empty()) {
    kb.BeginPhase();
    for (auto& st : phase2) kb.Add(std::move(st));
  }
  kb.BeginBody();
  for (auto& st : body) kb.Add(std::move(st));
  auto kernel = kb.Finish();
  if (!kernel.ok()) {
    return absl::Status(kernel.status().code() == absl::StatusCode::kUnimplemented ? kernel.status().code()
                                                                                    : absl::StatusCode::kInternal,
                        absl::StrCat("kernel for group ", gi, " (", name, "): ", kernel.status().message()));
  }
  GraphKernel gk;
  gk.group = gi;
  gk.kernel = std::move(*kernel);
  gk.args = std::move(ctx.args);
  return gk;
}

}  // namespace

absl::StatusOr<KernelSet> BuildKernels(const OpGraph& g, const Schedule& s) {
  KernelSet ks;
  ks.kernel_of_group.assign(s.groups.size(), -1);
  for (const ScheduleItem& it : s.items) {
    if (it.is_step || s.groups[it.index].stores.empty()) continue;
    const auto& shape = s.groups[it.index].shape;
    if (std::find(shape.begin(), shape.end(), int64_t{0}) != shape.end()) continue;  // nothing to compute
    KILN_ASSIGN_OR_RETURN(GraphKernel gk, Build(g, s, it.index));
    ks.kernel_of_group[it.index] = static_cast<int32_t>(ks.kernels.size());
    ks.kernels.push_back(std::move(gk));
  }
  return ks;
}

}  // namespace kiln::lower
