#include "server/codegen/exp_reuse.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "server/kernel/printer.h"

namespace kiln::codegen {

using kernel::ExprKind;
using kernel::ExprNode;

std::string AccessKey(const kernel::Buffer& b, const kernel::Index& index) {
  return absl::StrCat("b", b.index, "@", kernel::PrintIndex(index));
}

const ExprNode* HeldLoad(const ExprNode* e) {
  if (e->kind == ExprKind::kCast && e->type == kernel::ScalarType::kFloat32 &&
      kernel::IsHalfType(e->args[0]->type)) {
    e = e->args[0].get();
  }
  return e->kind == ExprKind::kLoad && e->args.empty() ? e : nullptr;
}

namespace {

// exp(load `key` - acc<id>.max)?
bool IsExpShift(const ExprNode* e, int id, const std::string& key) {
  if (e->kind != ExprKind::kUnary || e->unary_op != kernel::UnaryOp::kExp) return false;
  const ExprNode* d = e->args[0].get();
  if (d->kind != ExprKind::kBinary || d->binary_op != kernel::BinaryOp::kSub) return false;
  const ExprNode* x = HeldLoad(d->args[0].get());
  const ExprNode* m = d->args[1].get();
  return x != nullptr && AccessKey(x->buffer, x->index) == key && m->kind == ExprKind::kAccRead &&
         m->acc.id == id && m->field == kernel::AccField::kMax;
}

bool Collect(const ExprNode* e, int id, const std::string& key, std::set<const ExprNode*>* seen,
             std::vector<const ExprNode*>* out) {
  if (!seen->insert(e).second) return true;
  if (IsExpShift(e, id, key)) {
    out->push_back(e);
    return true;
  }
  if (e->kind == ExprKind::kLoad && AccessKey(e->buffer, e->index) == key) return false;
  for (const kernel::Expr& a : e->args) {
    if (!Collect(a.get(), id, key, seen, out)) return false;
  }
  return true;
}

}  // namespace

absl::optional<std::vector<const ExprNode*>> ExpShiftNodes(const kernel::Kernel& k, size_t from, int id,
                                                           const std::string& key) {
  std::set<const ExprNode*> seen;
  std::vector<const ExprNode*> nodes;
  for (size_t p = from; p < k.phases.size(); ++p) {
    for (const kernel::Stmt& s : k.phases[p].stmts) {
      if (!Collect(s.value.get(), id, key, &seen, &nodes)) return absl::nullopt;
    }
  }
  for (const kernel::Stmt& s : k.body) {
    if (!Collect(s.value.get(), id, key, &seen, &nodes)) return absl::nullopt;
  }
  return nodes;
}

std::map<int, int> FoldCounts(const kernel::Kernel& k) {
  std::map<int, int> folds;
  for (const kernel::Phase& p : k.phases) {
    for (const kernel::Stmt& s : p.stmts) folds[s.acc.id] += s.kind == kernel::StmtKind::kAccumulate;
  }
  return folds;
}

bool SameExpr(const ExprNode* a, const ExprNode* b) {
  if (a == b) return true;
  if (a->kind != b->kind || a->type != b->type || a->args.size() != b->args.size()) return false;
  switch (a->kind) {
    case ExprKind::kConst:
      if (a->int_value != b->int_value || !(a->float_value == b->float_value)) return false;
      break;
    case ExprKind::kLoad:
      if (AccessKey(a->buffer, a->index) != AccessKey(b->buffer, b->index)) return false;
      break;
    case ExprKind::kScalar:
      if (a->scalar != b->scalar) return false;
      break;
    case ExprKind::kLoopVar:
      if (!(a->var == b->var)) return false;
      break;
    case ExprKind::kUnary:
      if (a->unary_op != b->unary_op) return false;
      break;
    case ExprKind::kBinary:
      if (a->binary_op != b->binary_op) return false;
      break;
    case ExprKind::kAccRead:
      if (a->acc.id != b->acc.id || a->field != b->field) return false;
      break;
    case ExprKind::kSelect:
    case ExprKind::kCast:
      break;
  }
  for (size_t i = 0; i < a->args.size(); ++i) {
    if (!SameExpr(a->args[i].get(), b->args[i].get())) return false;
  }
  return true;
}

namespace {

void CollectShifts(const ExprNode* e, int id, const ExprNode* value, std::set<const ExprNode*>* seen,
                   std::vector<const ExprNode*>* out) {
  if (!seen->insert(e).second) return;
  if (e->kind == ExprKind::kUnary && e->unary_op == kernel::UnaryOp::kExp) {
    const ExprNode* d = e->args[0].get();
    if (d->kind == ExprKind::kBinary && d->binary_op == kernel::BinaryOp::kSub) {
      const ExprNode* m = d->args[1].get();
      if (m->kind == ExprKind::kAccRead && m->acc.id == id && m->field == kernel::AccField::kMax &&
          SameExpr(d->args[0].get(), value)) {
        out->push_back(e);
        return;
      }
    }
  }
  for (const kernel::Expr& a : e->args) CollectShifts(a.get(), id, value, seen, out);
}

}  // namespace

std::vector<const ExprNode*> ExpShiftNodesOf(const kernel::Kernel& k, size_t from, int id,
                                             const ExprNode* value) {
  std::set<const ExprNode*> seen;
  std::vector<const ExprNode*> nodes;
  for (size_t p = from; p < k.phases.size(); ++p) {
    for (const kernel::Stmt& s : k.phases[p].stmts) CollectShifts(s.value.get(), id, value, &seen, &nodes);
  }
  for (const kernel::Stmt& s : k.body) CollectShifts(s.value.get(), id, value, &seen, &nodes);
  return nodes;
}

}  // namespace kiln::codegen
