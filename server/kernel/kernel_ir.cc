#include "server/kernel/kernel_ir.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/base/status_macros.h"
#include "server/kernel/verifier.h"

namespace kiln::kernel {

const char* ScalarTypeName(ScalarType t) {
  switch (t) {
    case ScalarType::kBool: return "b8";
    case ScalarType::kInt8: return "i8";
    case ScalarType::kUInt8: return "u8";
    case ScalarType::kInt32: return "i32";
    case ScalarType::kInt64: return "i64";
    case ScalarType::kFloat16: return "f16";
    case ScalarType::kBFloat16: return "bf16";
    case ScalarType::kFloat32: return "f32";
    case ScalarType::kFloat64: return "f64";
  }
  return "?";
}

int ScalarTypeBytes(ScalarType t) {
  switch (t) {
    case ScalarType::kBool: case ScalarType::kInt8: case ScalarType::kUInt8: return 1;
    case ScalarType::kFloat16: case ScalarType::kBFloat16: return 2;
    case ScalarType::kInt32: case ScalarType::kFloat32: return 4;
    case ScalarType::kInt64: case ScalarType::kFloat64: return 8;
  }
  return 0;
}

bool IsFloatType(ScalarType t) {
  return t == ScalarType::kFloat16 || t == ScalarType::kBFloat16 || t == ScalarType::kFloat32 ||
         t == ScalarType::kFloat64;
}
bool IsHalfType(ScalarType t) { return t == ScalarType::kFloat16 || t == ScalarType::kBFloat16; }
bool IsIntType(ScalarType t) {
  return t == ScalarType::kInt8 || t == ScalarType::kUInt8 || t == ScalarType::kInt32 ||
         t == ScalarType::kInt64;
}
bool IsSignedIntType(ScalarType t) { return IsIntType(t) && t != ScalarType::kUInt8; }

const char* UnaryOpName(UnaryOp op) {
  static const char* const kNames[] = {
      "neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal",
      "sin", "cos", "tanh", "sigmoid", "erf", "relu", "gelu", "gelu_tanh", "silu", "floor", "ceil",
      "round", "trunc", "sign", "isnan", "isinf", "logical_not", "bitwise_not"};
  return kNames[static_cast<int>(op)];
}

const char* BinaryOpName(BinaryOp op) {
  static const char* const kNames[] = {
      "add", "sub", "mul", "true_div", "trunc_div", "floor_div", "remainder", "fmod", "pow",
      "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
      "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right"};
  return kNames[static_cast<int>(op)];
}

const char* AccessName(Access a) {
  switch (a) {
    case Access::kRead: return "read";
    case Access::kWrite: return "write";
    case Access::kReadWrite: return "readwrite";
  }
  return "?";
}

const char* AccKindName(AccKind k) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "argmax", "argmin", "welford",
                                       "online_softmax"};
  return kNames[static_cast<int>(k)];
}

const char* AccFieldName(AccField f) {
  static const char* const kNames[] = {"value", "index", "mean", "m2", "count", "max", "sum"};
  return kNames[static_cast<int>(f)];
}

std::string VarName(const Var& v) {
  return absl::StrCat(v.kind == VarKind::kOuter ? "o" : "r", v.index);
}

Index MakeIndex(Size offset, std::vector<IndexTerm> terms) {
  std::map<Var, Size> merged;
  for (IndexTerm& t : terms) merged[t.var] = merged[t.var] + t.stride;
  Index index;
  index.offset = std::move(offset);
  for (auto& [var, stride] : merged) {
    if (stride.is_const(0) && !stride.overflowed()) continue;
    index.terms.push_back(IndexTerm{var, stride});
  }
  return index;
}

Index ContiguousIndex(const std::vector<Var>& vars, const std::vector<Size>& sizes) {
  std::vector<IndexTerm> terms;
  Size stride = Size::Const(1);
  for (int i = static_cast<int>(vars.size()) - 1; i >= 0; --i) {
    terms.push_back(IndexTerm{vars[i], stride});
    if (i < static_cast<int>(sizes.size())) stride = stride * sizes[i];
  }
  return MakeIndex(Size(), std::move(terms));
}

namespace {

std::shared_ptr<ExprNode> NewNode(ExprKind kind, ScalarType type) {
  auto n = std::make_shared<ExprNode>();
  n->kind = kind;
  n->type = type;
  return n;
}

absl::Status TypeError(absl::string_view what, absl::string_view op, ScalarType t) {
  return absl::InvalidArgumentError(
      absl::StrCat("kernel IR: ", what, " ", op, " does not accept ", ScalarTypeName(t)));
}

bool FitsInt(ScalarType t, int64_t v) {
  switch (t) {
    case ScalarType::kBool: return v == 0 || v == 1;
    case ScalarType::kInt8: return v >= -128 && v <= 127;
    case ScalarType::kUInt8: return v >= 0 && v <= 255;
    case ScalarType::kInt32:
      return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    case ScalarType::kInt64: return true;
    default: return false;
  }
}

// True when `v` is exactly representable in the half type (or NaN/inf).
bool ExactInHalf(ScalarType t, double v) {
  if (std::isnan(v) || std::isinf(v) || v == 0) return true;
  const int mantissa_bits = t == ScalarType::kBFloat16 ? 8 : 11;
  const int min_exp = t == ScalarType::kBFloat16 ? -126 : -14;  // smallest normal exponent
  const double max = t == ScalarType::kBFloat16 ? 3.3895313892515355e38 : 65504.0;
  if (std::fabs(v) > max) return false;
  int e;
  std::frexp(v, &e);  // v = m * 2^e, 0.5 <= |m| < 1
  const int exp = std::max(e - 1, min_exp);
  const double scaled = std::ldexp(v, mantissa_bits - 1 - exp);
  return scaled == std::trunc(scaled);
}

}  // namespace

ExprOr ConstInt(ScalarType type, int64_t value) {
  if (!IsIntType(type) && type != ScalarType::kBool) return TypeError("constant", "int", type);
  if (!FitsInt(type, value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel IR: constant ", value, " does not fit ", ScalarTypeName(type)));
  }
  auto n = NewNode(ExprKind::kConst, type);
  n->int_value = value;
  return Expr(n);
}

ExprOr ConstFloat(ScalarType type, double value) {
  if (!IsFloatType(type)) return TypeError("constant", "float", type);
  const bool exact = type == ScalarType::kFloat64 ||
                     (type == ScalarType::kFloat32
                          ? (std::isnan(value) || static_cast<double>(static_cast<float>(value)) == value)
                          : ExactInHalf(type, value));
  if (!exact) {
    return absl::InvalidArgumentError(absl::StrCat("kernel IR: constant ", value,
                                                   " is not exact in ", ScalarTypeName(type)));
  }
  auto n = NewNode(ExprKind::kConst, type);
  n->float_value = value;
  return Expr(n);
}

ExprOr ConstBool(bool value) { return ConstInt(ScalarType::kBool, value ? 1 : 0); }

ExprOr Load(const Buffer& buffer, Index index) {
  if (buffer.index < 0) return absl::InvalidArgumentError("kernel IR: load from an unset buffer");
  if (buffer.access == Access::kWrite) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel IR: load from write-only buffer b", buffer.index));
  }
  auto n = NewNode(ExprKind::kLoad, buffer.dtype);
  n->buffer = buffer;
  n->index = std::move(index);
  return Expr(n);
}

ExprOr LoadMasked(const Buffer& buffer, Index index, const ExprOr& mask) {
  if (!mask.ok()) return mask.status();
  if ((*mask)->type != ScalarType::kBool) return TypeError("masked load", "mask", (*mask)->type);
  ExprOr load = Load(buffer, std::move(index));
  if (!load.ok()) return load.status();
  auto n = std::make_shared<ExprNode>(**load);
  n->args = {*mask};
  return Expr(n);
}

ExprOr ScalarParam(int32_t index) {
  if (index < 0) return absl::InvalidArgumentError("kernel IR: negative scalar index");
  auto n = NewNode(ExprKind::kScalar, ScalarType::kInt64);
  n->scalar = index;
  return Expr(n);
}

ExprOr LoopVar(Var var) {
  if (var.index < 0) return absl::InvalidArgumentError("kernel IR: negative loop variable");
  auto n = NewNode(ExprKind::kLoopVar, ScalarType::kInt64);
  n->var = var;
  return Expr(n);
}

ExprOr Unary(UnaryOp op, const ExprOr& x) {
  if (!x.ok()) return x.status();
  const ScalarType t = (*x)->type;
  ScalarType result = t;
  bool ok = false;
  switch (op) {
    case UnaryOp::kExp: case UnaryOp::kExp2: case UnaryOp::kExpm1: case UnaryOp::kLog:
    case UnaryOp::kLog1p: case UnaryOp::kLog2: case UnaryOp::kSqrt: case UnaryOp::kRsqrt:
    case UnaryOp::kReciprocal: case UnaryOp::kSin: case UnaryOp::kCos: case UnaryOp::kTanh:
    case UnaryOp::kSigmoid: case UnaryOp::kErf: case UnaryOp::kGelu: case UnaryOp::kGeluTanh:
    case UnaryOp::kSilu:
      ok = t == ScalarType::kFloat32 || t == ScalarType::kFloat64;
      break;
    case UnaryOp::kNeg: case UnaryOp::kAbs: case UnaryOp::kRelu: case UnaryOp::kSign:
    case UnaryOp::kFloor: case UnaryOp::kCeil: case UnaryOp::kRound: case UnaryOp::kTrunc:
      ok = IsIntType(t) || t == ScalarType::kFloat32 || t == ScalarType::kFloat64;
      break;
    case UnaryOp::kIsNan: case UnaryOp::kIsInf:
      ok = !IsHalfType(t);
      result = ScalarType::kBool;
      break;
    case UnaryOp::kLogicalNot:
      ok = !IsHalfType(t);
      result = ScalarType::kBool;
      break;
    case UnaryOp::kBitwiseNot:
      ok = IsIntType(t) || t == ScalarType::kBool;
      break;
  }
  if (!ok) return TypeError("unary", UnaryOpName(op), t);
  auto n = NewNode(ExprKind::kUnary, result);
  n->unary_op = op;
  n->args = {*x};
  return Expr(n);
}

ExprOr Binary(BinaryOp op, const ExprOr& a, const ExprOr& b) {
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  const ScalarType t = (*a)->type;
  if ((*b)->type != t) {
    return absl::InvalidArgumentError(absl::StrCat("kernel IR: binary ", BinaryOpName(op),
                                                   " of ", ScalarTypeName(t), " and ",
                                                   ScalarTypeName((*b)->type)));
  }
  const bool numeric = IsIntType(t) || t == ScalarType::kFloat32 || t == ScalarType::kFloat64;
  ScalarType result = t;
  bool ok = false;
  switch (op) {
    case BinaryOp::kAdd: case BinaryOp::kSub: case BinaryOp::kMul: case BinaryOp::kTruncDiv:
    case BinaryOp::kFloorDiv: case BinaryOp::kRemainder: case BinaryOp::kFmod: case BinaryOp::kPow:
      ok = numeric;
      break;
    case BinaryOp::kTrueDiv:
      ok = t == ScalarType::kFloat32 || t == ScalarType::kFloat64;
      break;
    case BinaryOp::kMaximum: case BinaryOp::kMinimum:
      ok = numeric || t == ScalarType::kBool;
      break;
    case BinaryOp::kEq: case BinaryOp::kNe: case BinaryOp::kLt: case BinaryOp::kLe:
    case BinaryOp::kGt: case BinaryOp::kGe: case BinaryOp::kLogicalAnd: case BinaryOp::kLogicalOr:
    case BinaryOp::kLogicalXor:
      ok = numeric || t == ScalarType::kBool;
      result = ScalarType::kBool;
      break;
    case BinaryOp::kBitwiseAnd: case BinaryOp::kBitwiseOr: case BinaryOp::kBitwiseXor:
      ok = IsIntType(t) || t == ScalarType::kBool;
      break;
    case BinaryOp::kShiftLeft: case BinaryOp::kShiftRight:
      ok = IsIntType(t);
      break;
  }
  if (!ok) return TypeError("binary", BinaryOpName(op), t);
  auto n = NewNode(ExprKind::kBinary, result);
  n->binary_op = op;
  n->args = {*a, *b};
  return Expr(n);
}

ExprOr Select(const ExprOr& cond, const ExprOr& a, const ExprOr& b) {
  if (!cond.ok()) return cond.status();
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  if ((*cond)->type != ScalarType::kBool) return TypeError("select", "condition", (*cond)->type);
  if ((*a)->type != (*b)->type) {
    return absl::InvalidArgumentError(absl::StrCat("kernel IR: select of ",
                                                   ScalarTypeName((*a)->type), " and ",
                                                   ScalarTypeName((*b)->type)));
  }
  auto n = NewNode(ExprKind::kSelect, (*a)->type);
  n->args = {*cond, *a, *b};
  return Expr(n);
}

ExprOr Cast(ScalarType to, const ExprOr& x) {
  if (!x.ok()) return x.status();
  if ((*x)->type == to) return x;
  auto n = NewNode(ExprKind::kCast, to);
  n->args = {*x};
  return Expr(n);
}

absl::StatusOr<ScalarType> AccFieldType(const Accumulator& acc, AccField field) {
  bool ok = false;
  ScalarType t = acc.dtype;
  switch (acc.kind) {
    case AccKind::kSum: case AccKind::kProd: case AccKind::kMax: case AccKind::kMin:
      ok = field == AccField::kValue;
      break;
    case AccKind::kArgMax: case AccKind::kArgMin:
      ok = field == AccField::kValue || field == AccField::kIndex;
      if (field == AccField::kIndex) t = ScalarType::kInt64;
      break;
    case AccKind::kWelford:
      ok = field == AccField::kMean || field == AccField::kM2 || field == AccField::kCount;
      break;
    case AccKind::kOnlineSoftmax:
      ok = field == AccField::kMax || field == AccField::kSum;
      break;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("kernel IR: accumulator kind ",
                                                   AccKindName(acc.kind), " has no field ",
                                                   AccFieldName(field)));
  }
  return t;
}

ExprOr AccRead(const Accumulator& acc, AccField field) {
  if (acc.id < 0) return absl::InvalidArgumentError("kernel IR: read of an unset accumulator");
  KILN_ASSIGN_OR_RETURN(ScalarType t, AccFieldType(acc, field));
  auto n = NewNode(ExprKind::kAccRead, t);
  n->acc = acc;
  n->field = field;
  return Expr(n);
}

StmtOr Store(const Buffer& buffer, Index index, const ExprOr& value) {
  if (!value.ok()) return value.status();
  if (buffer.index < 0) return absl::InvalidArgumentError("kernel IR: store to an unset buffer");
  if (buffer.access == Access::kRead) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel IR: store to read-only buffer b", buffer.index));
  }
  if ((*value)->type != buffer.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kernel IR: store of ", ScalarTypeName((*value)->type), " to ",
        ScalarTypeName(buffer.dtype), " buffer b", buffer.index, " (cast first)"));
  }
  Stmt s;
  s.kind = StmtKind::kStore;
  s.buffer = buffer;
  s.index = std::move(index);
  s.value = *value;
  return s;
}

StmtOr Accumulate(const Accumulator& acc, const ExprOr& value) {
  if (!value.ok()) return value.status();
  if (acc.id < 0) return absl::InvalidArgumentError("kernel IR: unset accumulator");
  if ((*value)->type != acc.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kernel IR: accumulate ", ScalarTypeName((*value)->type), " into ",
        ScalarTypeName(acc.dtype), " accumulator a", acc.id));
  }
  Stmt s;
  s.kind = StmtKind::kAccumulate;
  s.acc = acc;
  s.value = *value;
  return s;
}

KernelBuilder::KernelBuilder(std::string debug_name) { kernel_.debug_name = std::move(debug_name); }

Size KernelBuilder::AddScalar() { return Size::Param(kernel_.num_scalars++); }

Buffer KernelBuilder::AddBuffer(ScalarType dtype, Access access, Size num_elements) {
  Buffer b;
  b.index = static_cast<int32_t>(kernel_.buffers.size());
  b.dtype = dtype;
  b.access = access;
  b.num_elements = std::move(num_elements);
  kernel_.buffers.push_back(b);
  return b;
}

Var KernelBuilder::AddOuter(Size extent) {
  kernel_.outer.push_back(std::move(extent));
  return Var{VarKind::kOuter, static_cast<int32_t>(kernel_.outer.size()) - 1};
}

Var KernelBuilder::AddReduce(Size extent) {
  kernel_.reduce.push_back(std::move(extent));
  return Var{VarKind::kReduce, static_cast<int32_t>(kernel_.reduce.size()) - 1};
}

Accumulator KernelBuilder::AddAccumulator(AccKind kind, ScalarType dtype, bool approx_exp) {
  Accumulator a;
  a.id = static_cast<int32_t>(kernel_.accumulators.size());
  a.kind = kind;
  a.dtype = dtype;
  a.approx_exp = approx_exp && kind == AccKind::kOnlineSoftmax;
  kernel_.accumulators.push_back(a);
  return a;
}

void KernelBuilder::BeginPhase() {
  kernel_.phases.emplace_back();
  in_body_ = false;
}

void KernelBuilder::BeginBody() { in_body_ = true; }

void KernelBuilder::Add(const StmtOr& stmt) {
  if (!status_.ok()) return;
  if (!stmt.ok()) {
    status_ = stmt.status();
    return;
  }
  if (in_body_) {
    kernel_.body.push_back(*stmt);
  } else {
    kernel_.phases.back().stmts.push_back(*stmt);
  }
}

absl::StatusOr<Kernel> KernelBuilder::Finish() {
  KILN_RETURN_IF_ERROR(status_);
  KILN_RETURN_IF_ERROR(VerifyKernel(kernel_));
  return kernel_;
}

}  // namespace kiln::kernel
