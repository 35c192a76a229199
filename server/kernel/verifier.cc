#include "server/kernel/verifier.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/kernel/printer.h"
#include "server/base/status_macros.h"

namespace kiln::kernel {
namespace {

class Verifier {
 public:
  explicit Verifier(const Kernel& k) : k_(k) {}

  absl::Status Run() {
    for (size_t i = 0; i < k_.buffers.size(); ++i) {
      const Buffer& b = k_.buffers[i];
      if (b.index != static_cast<int32_t>(i)) return Error("buffer table", "index mismatch");
      KILN_RETURN_IF_ERROR(CheckSize(b.num_elements, absl::StrCat("b", i, " size")));
    }
    for (size_t i = 0; i < k_.outer.size(); ++i) {
      KILN_RETURN_IF_ERROR(CheckExtent(k_.outer[i], absl::StrCat("o", i)));
    }
    for (size_t i = 0; i < k_.reduce.size(); ++i) {
      KILN_RETURN_IF_ERROR(CheckExtent(k_.reduce[i], absl::StrCat("r", i)));
    }
    if (k_.phases.empty() && !k_.reduce.empty()) {
      return Error("kernel", "a reduction space without phases");
    }
    update_phase_.assign(k_.accumulators.size(), -1);
    for (size_t i = 0; i < k_.accumulators.size(); ++i) {
      const Accumulator& a = k_.accumulators[i];
      if (a.id != static_cast<int32_t>(i)) return Error("accumulator table", "id mismatch");
      KILN_RETURN_IF_ERROR(CheckAccType(a));
    }
    // Which phase updates each accumulator.
    for (size_t p = 0; p < k_.phases.size(); ++p) {
      for (const Stmt& s : k_.phases[p].stmts) {
        if (s.kind != StmtKind::kAccumulate) continue;
        if (s.acc.id < 0 || s.acc.id >= static_cast<int32_t>(k_.accumulators.size())) {
          return Error(absl::StrCat("phase ", p), "unknown accumulator");
        }
        int& up = update_phase_[s.acc.id];
        if (up != -1 && up != static_cast<int>(p)) {
          return Error(absl::StrCat("phase ", p),
                       absl::StrCat("a", s.acc.id, " is updated in two phases"));
        }
        up = static_cast<int>(p);
      }
    }
    for (size_t i = 0; i < update_phase_.size(); ++i) {
      if (update_phase_[i] == -1) return Error("kernel", absl::StrCat("a", i, " is never updated"));
    }
    for (size_t p = 0; p < k_.phases.size(); ++p) {
      for (size_t s = 0; s < k_.phases[p].stmts.size(); ++s) {
        KILN_RETURN_IF_ERROR(CheckStmt(k_.phases[p].stmts[s], static_cast<int>(p),
                                       absl::StrCat("phase ", p, " statement ", s)));
      }
    }
    for (size_t s = 0; s < k_.body.size(); ++s) {
      KILN_RETURN_IF_ERROR(CheckStmt(k_.body[s], -1, absl::StrCat("body statement ", s)));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const std::string& where, const std::string& what) const {
    return absl::InternalError(absl::StrCat("kernel verifier (", k_.buffers.size(),
                                            " buffers): ", where, ": ", what));
  }

  absl::Status CheckSize(const Size& s, const std::string& what) const {
    if (s.overflowed()) return Error(what, "size overflowed int64");
    if (s.MaxParam() >= k_.num_scalars) {
      return Error(what, absl::StrCat("uses n", s.MaxParam(), " of ", k_.num_scalars, " scalars"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckExtent(const Size& s, const std::string& what) const {
    KILN_RETURN_IF_ERROR(CheckSize(s, what));
    if (s.AsConst() && *s.AsConst() < 0) return Error(what, "negative extent");
    return absl::OkStatus();
  }

  absl::Status CheckAccType(const Accumulator& a) const {
    const ScalarType t = a.dtype;
    bool ok = false;
    switch (a.kind) {
      case AccKind::kSum: case AccKind::kProd: case AccKind::kMax: case AccKind::kMin:
      case AccKind::kArgMax: case AccKind::kArgMin:
        ok = !IsHalfType(t) && t != ScalarType::kBool;
        break;
      case AccKind::kWelford: case AccKind::kOnlineSoftmax:
        ok = t == ScalarType::kFloat32 || t == ScalarType::kFloat64;
        break;
    }
    if (!ok) {
      return Error(absl::StrCat("a", a.id),
                   absl::StrCat(AccKindName(a.kind), " of ", ScalarTypeName(t)));
    }
    return absl::OkStatus();
  }

  absl::Status CheckBuffer(const Buffer& b, const std::string& where) const {
    if (b.index < 0 || b.index >= static_cast<int32_t>(k_.buffers.size())) {
      return Error(where, absl::StrCat("unknown buffer b", b.index));
    }
    const Buffer& d = k_.buffers[b.index];
    if (d.dtype != b.dtype || d.access != b.access) {
      return Error(where, absl::StrCat("b", b.index, " does not match the buffer table"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckVar(const Var& v, int phase, const std::string& where) const {
    const size_t n = v.kind == VarKind::kOuter ? k_.outer.size() : k_.reduce.size();
    if (v.index < 0 || v.index >= static_cast<int32_t>(n)) {
      return Error(where, absl::StrCat("unknown loop variable ", VarName(v)));
    }
    if (v.kind == VarKind::kReduce && phase < 0) {
      return Error(where, absl::StrCat(VarName(v), " used outside a phase"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckIndex(const Index& index, const Buffer& b, int phase, bool check_range,
                          const std::string& where) const {
    KILN_RETURN_IF_ERROR(CheckSize(index.offset, where));
    if (check_range && index.offset.AsConst() && *index.offset.AsConst() < 0) {
      return Error(where, "negative index offset");
    }
    std::set<Var> seen;
    absl::optional<int64_t> max_index = index.offset.AsConst();
    bool empty_space = false;
    for (const IndexTerm& t : index.terms) {
      KILN_RETURN_IF_ERROR(CheckVar(t.var, phase, where));
      KILN_RETURN_IF_ERROR(CheckSize(t.stride, where));
      if (!seen.insert(t.var).second) return Error(where, "a variable appears twice in an index");
      const Size& extent = t.var.kind == VarKind::kOuter ? k_.outer[t.var.index]
                                                          : k_.reduce[t.var.index];
      const absl::optional<int64_t> e = extent.AsConst();
      const absl::optional<int64_t> st = t.stride.AsConst();
      if (st && *st < 0) return Error(where, "negative stride");
      if (e && *e == 0) empty_space = true;
      if (!max_index || !e || !st) {
        max_index = absl::nullopt;
        continue;
      }
      int64_t span;
      if (*e > 0 && (__builtin_mul_overflow(*st, *e - 1, &span) ||
                     __builtin_add_overflow(*max_index, span, &*max_index))) {
        return Error(where, "index overflows int64");
      }
    }
    const absl::optional<int64_t> limit = k_.buffers[b.index].num_elements.AsConst();
    if (check_range && max_index && limit && !empty_space &&
        (*max_index < 0 || *max_index >= *limit)) {
      return Error(where, absl::StrCat("index reaches ", *max_index, " in b", b.index, " of ",
                                       *limit, " elements"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckExpr(const Expr& e, int phase, const std::string& where) {
    if (e == nullptr) return Error(where, "null expression");
    if (!visited_.insert(e.get()).second) return absl::OkStatus();
    for (const Expr& a : e->args) KILN_RETURN_IF_ERROR(CheckExpr(a, phase, where));
    ExprOr remade = e;
    switch (e->kind) {
      case ExprKind::kConst:
        remade = IsFloatType(e->type) ? ConstFloat(e->type, e->float_value)
                                      : ConstInt(e->type, e->int_value);
        break;
      case ExprKind::kLoad:
        KILN_RETURN_IF_ERROR(CheckBuffer(e->buffer, where));
        if (e->buffer.access == Access::kWrite) return Error(where, "load from a write buffer");
        if (e->args.size() > 1) return Error(where, "load arity");
        if (e->args.size() == 1 && e->args[0]->type != ScalarType::kBool) {
          return Error(where, "load mask must be b8");
        }
        KILN_RETURN_IF_ERROR(
            CheckIndex(e->index, e->buffer, phase, /*check_range=*/e->args.empty(), where));
        if (e->type != e->buffer.dtype) return Error(where, "load type differs from its buffer");
        break;
      case ExprKind::kScalar:
        if (e->scalar < 0 || e->scalar >= k_.num_scalars) return Error(where, "unknown scalar");
        if (e->type != ScalarType::kInt64) return Error(where, "scalar must be i64");
        break;
      case ExprKind::kLoopVar:
        KILN_RETURN_IF_ERROR(CheckVar(e->var, phase, where));
        if (e->type != ScalarType::kInt64) return Error(where, "loop variable must be i64");
        break;
      case ExprKind::kUnary:
        if (e->args.size() != 1) return Error(where, "unary arity");
        remade = Unary(e->unary_op, e->args[0]);
        break;
      case ExprKind::kBinary:
        if (e->args.size() != 2) return Error(where, "binary arity");
        remade = Binary(e->binary_op, e->args[0], e->args[1]);
        break;
      case ExprKind::kSelect:
        if (e->args.size() != 3) return Error(where, "select arity");
        remade = Select(e->args[0], e->args[1], e->args[2]);
        break;
      case ExprKind::kCast:
        if (e->args.size() != 1) return Error(where, "cast arity");
        break;
      case ExprKind::kAccRead: {
        const int32_t id = e->acc.id;
        if (id < 0 || id >= static_cast<int32_t>(k_.accumulators.size())) {
          return Error(where, "read of an unknown accumulator");
        }
        const Accumulator& d = k_.accumulators[id];
        if (d.kind != e->acc.kind || d.dtype != e->acc.dtype) {
          return Error(where, absl::StrCat("a", id, " does not match the accumulator table"));
        }
        if (phase >= 0 && update_phase_[id] >= phase) {
          return Error(where, absl::StrCat("a", id, " is read before its phase completes"));
        }
        remade = AccRead(e->acc, e->field);
        break;
      }
    }
    if (!remade.ok()) return Error(where, std::string(remade.status().message()));
    if ((*remade)->type != e->type) {
      return Error(where, absl::StrCat("node ", PrintExpr(e), " has type ", ScalarTypeName(e->type),
                                       ", expected ", ScalarTypeName((*remade)->type)));
    }
    return absl::OkStatus();
  }

  absl::Status CheckStmt(const Stmt& s, int phase, const std::string& where) {
    visited_.clear();
    KILN_RETURN_IF_ERROR(CheckExpr(s.value, phase, where));
    switch (s.kind) {
      case StmtKind::kStore:
        KILN_RETURN_IF_ERROR(CheckBuffer(s.buffer, where));
        if (s.buffer.access == Access::kRead) return Error(where, "store to a read-only buffer");
        if (s.value->type != s.buffer.dtype) return Error(where, "store type differs from buffer");
        KILN_RETURN_IF_ERROR(CheckIndex(s.index, s.buffer, phase, /*check_range=*/true, where));
        break;
      case StmtKind::kAccumulate:
        if (phase < 0) return Error(where, "accumulate outside a phase");
        if (s.acc.id < 0 || s.acc.id >= static_cast<int32_t>(k_.accumulators.size()) ||
            k_.accumulators[s.acc.id].kind != s.acc.kind ||
            k_.accumulators[s.acc.id].dtype != s.acc.dtype) {
          return Error(where, "accumulator does not match the table");
        }
        if (s.value->type != s.acc.dtype) return Error(where, "accumulated type differs");
        break;
    }
    return absl::OkStatus();
  }

  const Kernel& k_;
  std::vector<int> update_phase_;
  std::set<const ExprNode*> visited_;
};

}  // namespace

absl::Status VerifyKernel(const Kernel& kernel) { return Verifier(kernel).Run(); }

}  // namespace kiln::kernel
