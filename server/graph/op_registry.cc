#include "server/graph/op_registry.h"

#include <algorithm>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::graph {

namespace {

struct Registry {
  std::map<std::string, std::unique_ptr<OpDef>, std::less<>> ops;
  std::vector<std::string> errors;
};

const Registry& GetRegistry() {
  static const Registry* registry = [] {
    auto* r = new Registry();
    std::vector<OpSpec> specs;
    RegisterPointwiseOps(&specs);
    RegisterReductionOps(&specs);
    RegisterViewOps(&specs);
    RegisterMiscOps(&specs);
    RegisterNnOps(&specs);
    RegisterPoolOps(&specs);
    for (const OpSpec& spec : specs) {
      auto schema = ParseSchema(spec.schema);
      if (!schema.ok()) {
        r->errors.push_back(std::string(schema.status().message()));
        continue;
      }
      auto def = std::make_unique<OpDef>();
      def->target = spec.target != nullptr
                        ? spec.target
                        : absl::StrCat(spec.ns, ".", schema->name, ".",
                                       schema->overload.empty() ? "default" : schema->overload);
      def->schema = *std::move(schema);
      def->op_class = spec.op_class;
      def->infer = spec.infer;
      if (r->ops.count(def->target)) {
        r->errors.push_back(absl::StrCat("duplicate op ", def->target));
        continue;
      }
      std::string target = def->target;
      r->ops.emplace(target, std::move(def));
    }
    return r;
  }();
  return *registry;
}

const Type& UnknownType() {
  static const auto* t = new Type();
  return *t;
}

const Arg& NoneArg() {
  static const auto* a = new Arg();
  return *a;
}

absl::Status ArgError(int i, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": ", what));
}

}  // namespace

const char* OpClassName(OpClass c) {
  switch (c) {
    case OpClass::kPointwise: return "pointwise";
    case OpClass::kReduction: return "reduction";
    case OpClass::kView: return "view";
    case OpClass::kExtern: return "extern";
    case OpClass::kOther: return "other";
  }
  return "?";
}

const OpDef* FindOp(absl::string_view target) {
  const Registry& r = GetRegistry();
  auto it = r.ops.find(target);
  return it == r.ops.end() ? nullptr : it->second.get();
}

std::vector<const OpDef*> AllOps() {
  std::vector<const OpDef*> out;
  for (const auto& [name, def] : GetRegistry().ops) out.push_back(def.get());
  return out;
}

std::vector<std::string> RegistryErrors() { return GetRegistry().errors; }

const Arg& InferContext::arg(int i) const {
  if (i < 0 || i >= num_args()) return NoneArg();
  return node_.args[i];
}

const Type& InferContext::ValueType(const Arg& a) const {
  if (a.kind != Arg::Kind::kValue || a.value < 0 ||
      a.value >= static_cast<int32_t>(graph_.nodes.size())) {
    return UnknownType();
  }
  return graph_.nodes[a.value].type;
}

const TensorType* InferContext::tensor(int i) const {
  const Type& t = ValueType(arg(i));
  return t.kind == Type::Kind::kTensor ? &t.tensor : nullptr;
}

absl::StatusOr<const TensorType*> InferContext::RequireTensor(int i) const {
  const TensorType* t = tensor(i);
  if (t == nullptr) return ArgError(i, "expected a tensor");
  return t;
}

absl::StatusOr<std::vector<const TensorType*>> InferContext::TensorList(int i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::Kind::kList) return ArgError(i, "expected a list of tensors");
  std::vector<const TensorType*> out;
  for (const Arg& item : a.list) {
    if (item.kind == Arg::Kind::kNone) {
      out.push_back(nullptr);
      continue;
    }
    const Type& t = ValueType(item);
    if (t.kind != Type::Kind::kTensor) return ArgError(i, "expected a list of tensors");
    out.push_back(&t.tensor);
  }
  return out;
}

absl::StatusOr<std::optional<Operand>> InferContext::GetOperand(int i) const {
  const Arg& a = arg(i);
  Operand op;
  switch (a.kind) {
    case Arg::Kind::kNone:
      return std::optional<Operand>();
    case Arg::Kind::kInt:
    case Arg::Kind::kSym:
      op.scalar_dtype = ::kiln::v1::DTYPE_INT64;
      return std::optional<Operand>(op);
    case Arg::Kind::kFloat:
      op.scalar_dtype = ::kiln::v1::DTYPE_FLOAT64;
      return std::optional<Operand>(op);
    case Arg::Kind::kBool:
      op.scalar_dtype = ::kiln::v1::DTYPE_BOOL;
      return std::optional<Operand>(op);
    case Arg::Kind::kValue: {
      const Type& t = ValueType(a);
      if (t.kind == Type::Kind::kTensor) {
        op.tensor = &t.tensor;
      } else if (t.kind == Type::Kind::kSymInt) {
        op.scalar_dtype = ::kiln::v1::DTYPE_INT64;
      } else if (t.kind == Type::Kind::kScalar) {
        op.scalar_dtype = IsFloatingDType(t.scalar_dtype)  ? ::kiln::v1::DTYPE_FLOAT64
                          : t.scalar_dtype == ::kiln::v1::DTYPE_BOOL ? ::kiln::v1::DTYPE_BOOL
                          : IsComplexDType(t.scalar_dtype) ? ::kiln::v1::DTYPE_COMPLEX128
                                                           : ::kiln::v1::DTYPE_INT64;
      } else {
        return ArgError(i, "expected a tensor or a number");
      }
      return std::optional<Operand>(op);
    }
    default:
      return ArgError(i, "expected a tensor or a number");
  }
}

absl::StatusOr<SymExpr> InferContext::SymOf(const Arg& a) const {
  switch (a.kind) {
    case Arg::Kind::kInt: return SymExpr::Const(a.i);
    case Arg::Kind::kSym: return a.sym;
    case Arg::Kind::kBool: return SymExpr::Const(a.b ? 1 : 0);
    case Arg::Kind::kValue: {
      const Type& t = ValueType(a);
      if (t.kind == Type::Kind::kSymInt) return t.sym;
      break;
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("expected an integer, got ", ArgToString(a)));
}

absl::StatusOr<SymExpr> InferContext::Sym(int i) const {
  auto r = SymOf(arg(i));
  if (!r.ok()) return ArgError(i, r.status().message());
  return r;
}

absl::StatusOr<std::vector<SymExpr>> InferContext::SymList(int i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::Kind::kList) return ArgError(i, "expected a list of integers");
  std::vector<SymExpr> out;
  for (const Arg& item : a.list) {
    auto e = SymOf(item);
    if (!e.ok()) return ArgError(i, e.status().message());
    out.push_back(*e);
  }
  return out;
}

absl::StatusOr<int64_t> InferContext::Int(int i) const {
  auto e = Sym(i);
  if (!e.ok()) return e.status();
  if (!e->is_const()) return ArgError(i, "expected a constant integer");
  return e->value();
}

absl::StatusOr<std::vector<int64_t>> InferContext::IntList(int i) const {
  auto l = SymList(i);
  if (!l.ok()) return l.status();
  std::vector<int64_t> out;
  for (const SymExpr& e : *l) {
    if (!e.is_const()) return ArgError(i, "expected constant integers");
    out.push_back(e.value());
  }
  return out;
}

std::optional<DType> InferContext::OptDType(int i) const {
  const Arg& a = arg(i);
  if (a.kind == Arg::Kind::kDType) return a.dtype;
  return std::nullopt;
}

bool InferContext::Bool(int i) const { return arg(i).kind == Arg::Kind::kBool && arg(i).b; }
double InferContext::Float(int i) const {
  const Arg& a = arg(i);
  return a.kind == Arg::Kind::kFloat ? a.f : a.kind == Arg::Kind::kInt ? static_cast<double>(a.i) : 0;
}
std::string InferContext::Str(int i) const { return arg(i).kind == Arg::Kind::kString ? arg(i).s : ""; }

int64_t InferContext::Hint(const SymExpr& e, int64_t fallback) const {
  if (e.is_const()) return e.value();
  auto v = e.Evaluate(hints_);
  return v.ok() ? *v : fallback;
}

bool InferContext::LikelyEqual(const SymExpr& a, const SymExpr& b) const {
  if (a == b) return true;
  auto va = a.Evaluate(hints_);
  auto vb = b.Evaluate(hints_);
  return va.ok() && vb.ok() && *va == *vb;
}

}  // namespace kiln::graph
