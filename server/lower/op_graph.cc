#include "server/lower/op_graph.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::lower {

Affine AffConst(int64_t c) {
  Affine a;
  a.offset = c;
  return a;
}

Affine AffVar(k::Var v) {
  Affine a;
  a.terms.push_back({v, 1});
  return a;
}

Affine AffAdd(const Affine& a, const Affine& b) {
  Affine r;
  r.offset = a.offset + b.offset;
  r.terms = a.terms;
  for (const auto& t : b.terms) {
    auto it = std::find_if(r.terms.begin(), r.terms.end(), [&](const auto& x) { return x.first == t.first; });
    if (it == r.terms.end()) {
      r.terms.push_back(t);
    } else {
      it->second += t.second;
    }
  }
  r.terms.erase(std::remove_if(r.terms.begin(), r.terms.end(), [](const auto& x) { return x.second == 0; }),
                r.terms.end());
  std::sort(r.terms.begin(), r.terms.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return r;
}

Affine AffScale(const Affine& a, int64_t c) {
  if (c == 0) return AffConst(0);
  Affine r;
  r.offset = a.offset * c;
  for (const auto& t : a.terms) r.terms.push_back({t.first, t.second * c});
  return r;
}

bool AffEqual(const Affine& a, const Affine& b) {
  if (a.offset != b.offset || a.terms.size() != b.terms.size()) return false;
  for (size_t i = 0; i < a.terms.size(); ++i) {
    if (!(a.terms[i].first == b.terms[i].first) || a.terms[i].second != b.terms[i].second) return false;
  }
  return true;
}

k::ExprOr AffineExpr(const Affine& a) {
  k::ExprOr e = k::ConstInt(k::ScalarType::kInt64, a.offset);
  for (const auto& t : a.terms) {
    k::ExprOr v = k::LoopVar(t.first);
    if (t.second != 1) v = k::Mul(k::ConstInt(k::ScalarType::kInt64, t.second), v);
    e = a.offset == 0 && &t == &a.terms[0] ? v : k::Add(e, v);
  }
  return e;
}

k::Index ToKernelIndex(const std::vector<Affine>& index, const std::vector<int64_t>& strides) {
  Affine flat;
  for (size_t d = 0; d < index.size() && d < strides.size(); ++d) {
    flat = AffAdd(flat, AffScale(index[d], strides[d]));
  }
  std::vector<k::IndexTerm> terms;
  for (const auto& t : flat.terms) terms.push_back({t.first, k::Size::Const(t.second)});
  return k::MakeIndex(k::Size::Const(flat.offset), std::move(terms));
}

std::string IndexKey(const std::vector<Affine>& index) {
  std::string s;
  for (const Affine& a : index) {
    absl::StrAppend(&s, a.offset);
    for (const auto& t : a.terms) absl::StrAppend(&s, "+", t.second, "*", k::VarName(t.first));
    s += ";";
  }
  return s;
}

const char* ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kInput: return "input";
    case ValueKind::kConstant: return "constant";
    case ValueKind::kPointwise: return "pointwise";
    case ValueKind::kRowOutput: return "row";
    case ValueKind::kView: return "view";
    case ValueKind::kStepOutput: return "step";
  }
  return "?";
}

int64_t LValue::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int32_t ViewRoot(const OpGraph& g, int32_t value) {
  while (value >= 0 && g.values[value].kind == ValueKind::kView) value = g.values[value].base;
  return value;
}

absl::StatusOr<std::vector<Affine>> MapViewIndex(const OpGraph& g, int32_t view,
                                                 const std::vector<Affine>& index) {
  const LValue& v = g.values[view];
  const LValue& root = g.values[ViewRoot(g, view)];
  const int rr = static_cast<int>(root.sizes.size());
  std::vector<int> dims;  // root dims of size > 1, by decreasing stride
  for (int j = 0; j < rr; ++j) {
    if (root.sizes[j] > 1) dims.push_back(j);
  }
  std::stable_sort(dims.begin(), dims.end(), [&](int a, int b) { return root.strides[a] > root.strides[b]; });
  std::vector<Affine> out(rr, AffConst(0));
  std::vector<int64_t> hi(rr, 0);  // the largest value each root index reaches
  int64_t delta = v.storage_offset - root.storage_offset;
  if (delta < 0) return absl::NotFoundError("view before its root's offset");
  for (int j : dims) {
    if (root.strides[j] <= 0) return absl::NotFoundError("root with a zero stride");
    out[j].offset = delta / root.strides[j];
    hi[j] = out[j].offset;
    delta %= root.strides[j];
  }
  if (delta != 0) return absl::NotFoundError("view offset is not on an element of its root");
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] <= 1 || v.strides[d] == 0) continue;
    bool placed = false;
    for (int j : dims) {
      const int64_t sb = root.strides[j];
      if (v.strides[d] % sb != 0) continue;
      const int64_t m = v.strides[d] / sb;
      if (m * (v.sizes[d] - 1) >= root.sizes[j]) continue;
      out[j] = AffAdd(out[j], AffScale(index[d], m));
      hi[j] += m * (v.sizes[d] - 1);
      placed = true;
      break;
    }
    if (!placed) return absl::NotFoundError("view dim spans several dims of its root");
  }
  for (int j : dims) {
    if (hi[j] >= root.sizes[j]) return absl::NotFoundError("view runs past its root's dim");
  }
  return out;
}

bool ViewIsAffine(const OpGraph& g, int32_t view) {
  std::vector<Affine> idx;
  for (size_t d = 0; d < g.values[view].sizes.size(); ++d) idx.push_back(AffVar({k::VarKind::kOuter, static_cast<int32_t>(d)}));
  return MapViewIndex(g, view, idx).ok();
}

std::vector<int64_t> NonUnit(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> r;
  for (int64_t s : sizes) {
    if (s != 1) r.push_back(s);
  }
  return r;
}

bool IsSqueezeView(const OpGraph& g, int32_t view) {
  const LValue& v = g.values[view];
  const LValue& root = g.values[ViewRoot(g, view)];
  if (NonUnit(v.sizes) != NonUnit(root.sizes)) return false;
  std::vector<Affine> idx;
  std::vector<Affine> nonunit_vars;
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    idx.push_back(AffVar({k::VarKind::kOuter, static_cast<int32_t>(d)}));
    if (v.sizes[d] != 1) nonunit_vars.push_back(idx.back());
  }
  auto mapped = MapViewIndex(g, view, idx);
  if (!mapped.ok()) return false;
  size_t next = 0;
  for (size_t j = 0; j < root.sizes.size(); ++j) {
    if (root.sizes[j] == 1) continue;
    if (next >= nonunit_vars.size() || !AffEqual((*mapped)[j], nonunit_vars[next])) return false;
    ++next;
  }
  return next == nonunit_vars.size();
}

std::string PrintOpGraph(const OpGraph& g) {
  std::string s;
  for (const LValue& v : g.values) {
    absl::StrAppend(&s, "v", v.id, " = ", ValueKindName(v.kind), " ", v.op, "(",
                    absl::StrJoin(v.inputs, ", ", [](std::string* o, int32_t i) { absl::StrAppend(o, "v", i); }),
                    ") : ", k::ScalarTypeName(v.dtype), "[", absl::StrJoin(v.sizes, ", "), "] strides [",
                    absl::StrJoin(v.strides, ", "), "]");
    if (v.storage_offset != 0) absl::StrAppend(&s, " offset ", v.storage_offset);
    if (v.kind == ValueKind::kView) absl::StrAppend(&s, " of v", v.base);
    if (v.kind == ValueKind::kRowOutput) absl::StrAppend(&s, " of row", v.row_op);
    if (v.kind == ValueKind::kStepOutput) absl::StrAppend(&s, " of step", v.step);
    s += "\n";
  }
  for (size_t i = 0; i < g.row_ops.size(); ++i) {
    const RowOp& r = g.row_ops[i];
    absl::StrAppend(&s, "row", i, " = ", r.name, " domain [", absl::StrJoin(r.domain, ", "), "] reduce [",
                    absl::StrJoin(r.reduce_dims, ", "), "] accs ", r.accs.size(), "\n");
  }
  for (size_t i = 0; i < g.steps.size(); ++i) {
    const ExternStep& st = g.steps[i];
    absl::StrAppend(&s, "step", i, " = ", st.target, st.fallback ? " (fallback" : "",
                    st.fallback && !st.reason.empty() ? ": " + st.reason : "", st.fallback ? ")" : "", "\n");
  }
  absl::StrAppend(&s, "outputs: ", absl::StrJoin(g.outputs, ", "), "\n");
  return s;
}

}  // namespace kiln::lower
