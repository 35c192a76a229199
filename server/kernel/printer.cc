#include "server/kernel/printer.h"

#include <cstdio>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::kernel {
namespace {

std::string Factor(const Size& s) {
  return s.terms().size() > 1 ? absl::StrCat("(", s.ToString(), ")") : s.ToString();
}

}  // namespace

std::string PrintIndex(const Index& index) {
  std::vector<std::string> parts;
  for (const IndexTerm& t : index.terms) {
    parts.push_back(t.stride.is_const(1) ? VarName(t.var)
                                         : absl::StrCat(Factor(t.stride), "*", VarName(t.var)));
  }
  const absl::optional<int64_t> off = index.offset.AsConst();
  if (off && *off < 0 && !parts.empty()) return absl::StrCat(absl::StrJoin(parts, " + "), " - ", -*off);
  if (!index.offset.is_const(0) || parts.empty()) parts.push_back(index.offset.ToString());
  return absl::StrJoin(parts, " + ");
}

std::string PrintExpr(const Expr& e) {
  if (e == nullptr) return "<null>";
  switch (e->kind) {
    case ExprKind::kConst: {
      if (!IsFloatType(e->type)) return absl::StrCat(e->int_value, ":", ScalarTypeName(e->type));
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", e->float_value);
      return absl::StrCat(buf, ":", ScalarTypeName(e->type));
    }
    case ExprKind::kLoad:
      return absl::StrCat("load(b", e->buffer.index, ", ", PrintIndex(e->index),
                          e->args.empty() ? "" : absl::StrCat(", mask=", PrintExpr(e->args[0])),
                          ")");
    case ExprKind::kScalar:
      return absl::StrCat("n", e->scalar);
    case ExprKind::kLoopVar:
      return VarName(e->var);
    case ExprKind::kUnary:
      return absl::StrCat(UnaryOpName(e->unary_op), "(", PrintExpr(e->args[0]), ")");
    case ExprKind::kBinary:
      return absl::StrCat(BinaryOpName(e->binary_op), "(", PrintExpr(e->args[0]), ", ",
                          PrintExpr(e->args[1]), ")");
    case ExprKind::kSelect:
      return absl::StrCat("select(", PrintExpr(e->args[0]), ", ", PrintExpr(e->args[1]), ", ",
                          PrintExpr(e->args[2]), ")");
    case ExprKind::kCast:
      return absl::StrCat("cast<", ScalarTypeName(e->type), ">(", PrintExpr(e->args[0]), ")");
    case ExprKind::kAccRead:
      return absl::StrCat("a", e->acc.id, ".", AccFieldName(e->field));
  }
  return "<?>";
}

std::string PrintStmt(const Stmt& s) {
  if (s.kind == StmtKind::kStore) {
    return absl::StrCat("b", s.buffer.index, "[", PrintIndex(s.index), "] = ", PrintExpr(s.value));
  }
  return absl::StrCat("a", s.acc.id, " <- ", PrintExpr(s.value));
}

std::string PrintKernel(const Kernel& k) {
  std::string out = absl::StrCat("kernel \"", absl::CEscape(k.debug_name), "\"\n");
  absl::StrAppend(&out, "  scalars: ", k.num_scalars, "\n");
  std::vector<std::string> parts;
  for (const Buffer& b : k.buffers) {
    parts.push_back(absl::StrCat("b", b.index, ": ", ScalarTypeName(b.dtype), " ",
                                 AccessName(b.access), " [", b.num_elements.ToString(), "]"));
  }
  absl::StrAppend(&out, "  buffers: ", absl::StrJoin(parts, ", "), "\n");
  parts.clear();
  for (size_t i = 0; i < k.outer.size(); ++i) {
    parts.push_back(absl::StrCat("o", i, " < ", k.outer[i].ToString()));
  }
  absl::StrAppend(&out, "  outer: ", parts.empty() ? "(none)" : absl::StrJoin(parts, ", "), "\n");
  if (!k.reduce.empty()) {
    parts.clear();
    for (size_t i = 0; i < k.reduce.size(); ++i) {
      parts.push_back(absl::StrCat("r", i, " < ", k.reduce[i].ToString()));
    }
    absl::StrAppend(&out, "  reduce: ", absl::StrJoin(parts, ", "), "\n");
  }
  if (!k.accumulators.empty()) {
    parts.clear();
    for (const Accumulator& a : k.accumulators) {
      parts.push_back(
          absl::StrCat("a", a.id, ": ", AccKindName(a.kind), " ", ScalarTypeName(a.dtype),
                       a.approx_exp ? " approx_exp" : ""));
    }
    absl::StrAppend(&out, "  accumulators: ", absl::StrJoin(parts, ", "), "\n");
  }
  for (size_t p = 0; p < k.phases.size(); ++p) {
    absl::StrAppend(&out, "  phase ", p, ":\n");
    for (const Stmt& s : k.phases[p].stmts) absl::StrAppend(&out, "    ", PrintStmt(s), "\n");
  }
  absl::StrAppend(&out, "  body:\n");
  for (const Stmt& s : k.body) absl::StrAppend(&out, "    ", PrintStmt(s), "\n");
  return out;
}

}  // namespace kiln::kernel
