// Pointwise ops -> element functions (see lower.h). One table: each op names its operands (tensors
// or Python numbers), the type its arithmetic runs in, and how the operands combine.

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"
#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {
namespace {

namespace v1 = ::kiln::v1;
using graph::Arg;
using graph::Node;
using k::BinaryOp;
using k::ExprOr;
using k::ScalarType;
using k::UnaryOp;

struct Operand {
  int32_t value = -1;  // a tensor value, or -1 for a number
  Arg number;
  std::optional<ScalarType> as;  // the type the operand is cast to (default: the compute type)
};

using Combine = std::function<ExprOr(const std::vector<ExprOr>&, ScalarType ct)>;

struct PwDef {
  std::vector<Operand> operands;
  std::optional<ScalarType> compute;  // default: ComputeType(output dtype)
  Combine combine;
  bool cheap = false;
};

int Category(ScalarType t) { return t == ScalarType::kBool ? 0 : k::IsFloatType(t) ? 2 : 1; }
int ArgCategory(const Arg& a) { return a.kind == Arg::Kind::kBool ? 0 : a.kind == Arg::Kind::kFloat ? 2 : 1; }

ScalarType Promote(ScalarType a, ScalarType b) {
  if (a == b) return a;
  const int ca = Category(a), cb = Category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if (a == ScalarType::kFloat64 || b == ScalarType::kFloat64) return ScalarType::kFloat64;
    return ScalarType::kFloat32;  // f32 with anything, or f16 with bf16
  }
  auto rank = [](ScalarType t) {
    switch (t) {
      case ScalarType::kUInt8: return 1;
      case ScalarType::kInt8: return 1;
      case ScalarType::kInt32: return 3;
      default: return 4;
    }
  };
  if ((a == ScalarType::kUInt8 && b == ScalarType::kInt8) || (a == ScalarType::kInt8 && b == ScalarType::kUInt8)) {
    return ScalarType::kInt32;  // torch gives int16; no kernel type for it, close enough for compares
  }
  return rank(a) >= rank(b) ? a : b;
}

// torch.result_type over the operands (dimensioned tensors, then 0-d tensors, then numbers).
ScalarType ResultType(const OpGraph& g, const std::vector<Operand>& ops) {
  std::optional<ScalarType> dim, zero;
  int num_cat = -1;
  for (const Operand& o : ops) {
    if (o.value >= 0) {
      const LValue& v = g.values[o.value];
      auto& slot = v.sizes.empty() ? zero : dim;
      slot = slot ? Promote(*slot, v.dtype) : v.dtype;
    } else {
      num_cat = std::max(num_cat, ArgCategory(o.number));
    }
  }
  ScalarType r = dim ? *dim : zero ? *zero : ScalarType::kInt64;
  if (dim && zero && Category(*zero) > Category(*dim)) r = *zero;
  if (!dim && !zero) r = num_cat == 2 ? ScalarType::kFloat64 : num_cat == 0 ? ScalarType::kBool : ScalarType::kInt64;
  if (num_cat > Category(r)) r = num_cat == 2 ? ScalarType::kFloat32 : ScalarType::kInt64;
  return r;
}

Combine Un(UnaryOp op) {
  return [op](const std::vector<ExprOr>& x, ScalarType) { return k::Unary(op, x[0]); };
}
Combine Bin(BinaryOp op) {
  return [op](const std::vector<ExprOr>& x, ScalarType) { return k::Binary(op, x[0], x[1]); };
}

// A finite nonzero number whose magnitude is 2^k (int or float).
bool IsPowerOfTwo(const Arg& a) {
  double v = 0;
  if (a.kind == Arg::Kind::kFloat) {
    v = a.f;
  } else if (a.kind == Arg::Kind::kInt) {
    v = static_cast<double>(a.i);
  } else {
    return false;
  }
  if (!std::isfinite(v) || v == 0) return false;
  int exp = 0;
  return std::fabs(std::frexp(v, &exp)) == 0.5;
}

bool IsOne(const Arg& a) {
  return (a.kind == Arg::Kind::kInt && a.i == 1) || (a.kind == Arg::Kind::kFloat && a.f == 1.0);
}

// Python-number or tensor operand for schema argument i.
absl::StatusOr<Operand> Opnd(Lowerer& l, const Node& n, int i) {
  Operand o;
  if (i >= static_cast<int>(n.args.size())) return absl::UnimplementedError("missing argument");
  const Arg& a = n.args[i];
  if (a.kind == Arg::Kind::kValue) {
    KILN_ASSIGN_OR_RETURN(o.value, l.KernelValueOf(a));
  } else if (a.kind == Arg::Kind::kInt || a.kind == Arg::Kind::kFloat || a.kind == Arg::Kind::kBool) {
    o.number = a;
  } else {
    return absl::UnimplementedError("unsupported operand kind");
  }
  return o;
}

absl::StatusOr<PwDef> Define(Lowerer& l, const Node& n, ScalarType out) {
  const std::string& name = n.op->schema.name;
  const std::string& ov = n.op->schema.overload;
  PwDef d;
  auto opnd = [&](int i) -> absl::Status {
    KILN_ASSIGN_OR_RETURN(Operand o, Opnd(l, n, i));
    d.operands.push_back(o);
    return absl::OkStatus();
  };
  auto unary = [&](UnaryOp op) -> absl::StatusOr<PwDef> {
    KILN_RETURN_IF_ERROR(opnd(0));
    d.combine = Un(op);
    return d;
  };
  auto binary = [&](BinaryOp op) -> absl::StatusOr<PwDef> {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    d.combine = Bin(op);
    return d;
  };
  static const std::vector<std::pair<const char*, UnaryOp>> kUnary = {
      {"neg", UnaryOp::kNeg}, {"abs", UnaryOp::kAbs}, {"exp", UnaryOp::kExp}, {"exp2", UnaryOp::kExp2},
      {"expm1", UnaryOp::kExpm1}, {"log", UnaryOp::kLog}, {"log1p", UnaryOp::kLog1p}, {"log2", UnaryOp::kLog2},
      {"sqrt", UnaryOp::kSqrt}, {"rsqrt", UnaryOp::kRsqrt}, {"reciprocal", UnaryOp::kReciprocal},
      {"sin", UnaryOp::kSin}, {"cos", UnaryOp::kCos}, {"tanh", UnaryOp::kTanh}, {"sigmoid", UnaryOp::kSigmoid},
      {"erf", UnaryOp::kErf}, {"relu", UnaryOp::kRelu}, {"silu", UnaryOp::kSilu}, {"floor", UnaryOp::kFloor},
      {"ceil", UnaryOp::kCeil}, {"round", UnaryOp::kRound}, {"trunc", UnaryOp::kTrunc}, {"sign", UnaryOp::kSign},
      {"bitwise_not", UnaryOp::kBitwiseNot}};
  for (const auto& u : kUnary) {
    if (name == u.first && ov.empty()) {
      d.cheap = u.second == UnaryOp::kNeg || u.second == UnaryOp::kAbs || u.second == UnaryOp::kRelu ||
                u.second == UnaryOp::kBitwiseNot;
      return unary(u.second);
    }
  }
  if (name == "isnan" || name == "isinf" || name == "logical_not") {
    KILN_RETURN_IF_ERROR(opnd(0));
    const ScalarType in = l.g().values[d.operands[0].value].dtype;
    d.compute = ComputeType(in);
    d.combine = Un(name == "isnan" ? UnaryOp::kIsNan : name == "isinf" ? UnaryOp::kIsInf : UnaryOp::kLogicalNot);
    d.cheap = true;
    return d;
  }
  if (name == "add" || name == "sub" || name == "rsub") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    const Arg alpha = n.args.size() > 2 ? n.args[2] : Arg::Int(1);
    const bool one = IsOne(alpha);
    const BinaryOp op = name == "add" ? BinaryOp::kAdd : BinaryOp::kSub;
    const bool swap = name == "rsub";
    d.cheap = one;
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      ExprOr a = swap ? x[1] : x[0], b = swap ? x[0] : x[1];
      if (!one) b = k::Mul(b, Literal(ct, alpha));
      return k::Binary(op, a, b);
    };
    return d;
  }
  if (name == "mul") {
    d.cheap = true;
    return binary(BinaryOp::kMul);
  }
  if ((name == "div" && (ov == "Tensor" || ov == "Scalar")) || name == "true_divide") {
    KILN_ASSIGN_OR_RETURN(PwDef def, binary(BinaryOp::kTrueDiv));
    // By a number that is a power of two (attention's 1 / sqrt(64)): exact as a multiply.
    def.cheap = def.operands[1].value < 0 && IsPowerOfTwo(def.operands[1].number);
    return def;
  }
  if (name == "div") {  // Tensor_mode / Scalar_mode
    const Arg mode = n.args.size() > 2 ? n.args[2] : Arg::None();
    if (mode.kind == Arg::Kind::kNone) return binary(BinaryOp::kTrueDiv);
    if (mode.s == "trunc") return binary(BinaryOp::kTruncDiv);
    if (mode.s == "floor") return binary(BinaryOp::kFloorDiv);
    return absl::UnimplementedError("div rounding mode");
  }
  if (name == "pow") {
    if (ov == "Tensor_Scalar" && n.args.size() > 1 && n.args[1].kind != Arg::Kind::kValue) {
      const Arg e = n.args[1];
      const double ev = e.kind == Arg::Kind::kFloat ? e.f : static_cast<double>(e.i);
      if (ev == 2.0) {
        KILN_RETURN_IF_ERROR(opnd(0));
        d.combine = [](const std::vector<ExprOr>& x, ScalarType) { return k::Mul(x[0], x[0]); };
        return d;
      }
    }
    return binary(BinaryOp::kPow);
  }
  if (name == "maximum") return binary(BinaryOp::kMaximum);
  if (name == "minimum") return binary(BinaryOp::kMinimum);
  if (name == "remainder") return binary(BinaryOp::kRemainder);
  if (name == "fmod") return binary(BinaryOp::kFmod);
  if (name == "floor_divide") return binary(BinaryOp::kFloorDiv);
  static const std::vector<std::pair<const char*, BinaryOp>> kCompare = {
      {"eq", BinaryOp::kEq}, {"ne", BinaryOp::kNe}, {"lt", BinaryOp::kLt},
      {"le", BinaryOp::kLe}, {"gt", BinaryOp::kGt}, {"ge", BinaryOp::kGe}};
  for (const auto& c : kCompare) {
    if (name == c.first) {
      KILN_RETURN_IF_ERROR(opnd(0));
      KILN_RETURN_IF_ERROR(opnd(1));
      d.compute = ComputeType(ResultType(l.g(), d.operands));
      d.combine = Bin(c.second);
      d.cheap = true;
      return d;
    }
  }
  if (name == "logical_and" || name == "logical_or" || name == "logical_xor") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    d.compute = ScalarType::kBool;
    d.combine = Bin(name == "logical_and" ? BinaryOp::kLogicalAnd
                    : name == "logical_or" ? BinaryOp::kLogicalOr : BinaryOp::kLogicalXor);
    d.cheap = true;
    return d;
  }
  if (name == "bitwise_and" || name == "bitwise_or" || name == "bitwise_xor") {
    d.cheap = true;
    return binary(name == "bitwise_and" ? BinaryOp::kBitwiseAnd
                  : name == "bitwise_or" ? BinaryOp::kBitwiseOr : BinaryOp::kBitwiseXor);
  }
  if (name == "where") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    KILN_RETURN_IF_ERROR(opnd(2));
    d.operands[0].as = ScalarType::kBool;
    d.combine = [](const std::vector<ExprOr>& x, ScalarType) { return k::Select(x[0], x[1], x[2]); };
    d.cheap = true;
    return d;
  }
  if (name == "masked_fill") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    KILN_RETURN_IF_ERROR(opnd(2));
    d.operands[1].as = ScalarType::kBool;
    d.combine = [](const std::vector<ExprOr>& x, ScalarType) { return k::Select(x[1], x[2], x[0]); };
    d.cheap = true;  // a select, as where
    return d;
  }
  if (name == "clamp" || name == "clamp_min" || name == "clamp_max" || name == "hardtanh") {
    KILN_RETURN_IF_ERROR(opnd(0));
    const bool has_lo = name != "clamp_max" && n.args.size() > 1 && n.args[1].kind != Arg::Kind::kNone;
    const bool has_hi = name == "clamp_max" ? true
                        : name == "clamp_min" ? false
                        : n.args.size() > 2 && n.args[2].kind != Arg::Kind::kNone;
    if (has_lo) KILN_RETURN_IF_ERROR(opnd(1));
    if (has_hi) KILN_RETURN_IF_ERROR(opnd(name == "clamp_max" ? 1 : 2));
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType) -> ExprOr {
      ExprOr r = x[0];
      size_t i = 1;
      if (has_lo) r = k::Max(r, x[i++]);
      if (has_hi) r = k::Min(r, x[i++]);
      return r;
    };
    d.cheap = true;  // a max and a min
    return d;
  }
  if (name == "leaky_relu") {
    KILN_RETURN_IF_ERROR(opnd(0));
    const Arg slope = n.args.size() > 1 ? n.args[1] : Arg::Float(0.01);
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      return k::Select(k::Binary(BinaryOp::kGt, x[0], Literal(ct, Arg::Int(0))), x[0], k::Mul(x[0], Literal(ct, slope)));
    };
    return d;
  }
  if (name == "threshold_backward") {  // self <= threshold ? 0 : grad
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    const Arg th = n.args[2];
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      return k::Select(k::Binary(BinaryOp::kLe, x[1], Literal(ct, th)), Literal(ct, Arg::Int(0)), x[0]);
    };
    d.cheap = true;  // a compare and a select
    return d;
  }
  if (name == "sigmoid_backward" || name == "tanh_backward") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    const bool sig = name == "sigmoid_backward";
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      const ExprOr one = Literal(ct, Arg::Int(1));
      if (sig) return k::Mul(k::Mul(x[0], k::Sub(one, x[1])), x[1]);
      return k::Mul(x[0], k::Sub(one, k::Mul(x[1], x[1])));
    };
    return d;
  }
  if (name == "silu_backward") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    d.combine = [](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      const ExprOr one = Literal(ct, Arg::Int(1));
      const ExprOr s = k::Unary(UnaryOp::kSigmoid, x[1]);
      return k::Mul(k::Mul(x[0], s), k::Add(one, k::Mul(x[1], k::Sub(one, s))));
    };
    return d;
  }
  if (name == "gelu" || name == "gelu_backward") {
    const bool bwd = name == "gelu_backward";
    const int approx_arg = bwd ? 2 : 1;
    const std::string approx = static_cast<int>(n.args.size()) > approx_arg ? n.args[approx_arg].s : "none";
    if (approx != "none" && approx != "tanh") return absl::UnimplementedError("gelu approximation");
    if (!bwd) return unary(approx == "none" ? UnaryOp::kGelu : UnaryOp::kGeluTanh);
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    if (approx == "tanh") {
      d.combine = [](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
        // gelu(x) = 0.5 x (1 + t), t = tanh(u), u = c (x + k x^3), c = sqrt(2 / pi), k = 0.044715:
        // gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2); times g.
        const double c = 0.7978845608028654, kappa = 0.044715;
        const ExprOr x2 = k::Mul(x[1], x[1]);
        const ExprOr u = k::Mul(LiteralF(ct, c), k::Add(x[1], k::Mul(LiteralF(ct, kappa), k::Mul(x2, x[1]))));
        const ExprOr t = k::Unary(UnaryOp::kTanh, u);
        const ExprOr one = LiteralF(ct, 1.0);
        const ExprOr du = k::Mul(LiteralF(ct, c), k::Add(one, k::Mul(LiteralF(ct, 3.0 * kappa), x2)));
        const ExprOr left = k::Mul(LiteralF(ct, 0.5), k::Add(one, t));
        const ExprOr right = k::Mul(k::Mul(k::Mul(LiteralF(ct, 0.5), x[1]), k::Sub(one, k::Mul(t, t))), du);
        return k::Mul(x[0], k::Add(left, right));
      };
      return d;
    }
    d.combine = [](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      // cdf = 0.5 * (1 + erf(x / sqrt(2))); pdf = exp(-x^2 / 2) / sqrt(2 pi); g * (cdf + x * pdf)
      const ExprOr cdf = k::Mul(LiteralF(ct, 0.5), k::Add(LiteralF(ct, 1.0), k::Unary(UnaryOp::kErf,
                                                           k::Mul(x[1], LiteralF(ct, M_SQRT1_2)))));
      const ExprOr pdf = k::Mul(k::Exp(k::Mul(LiteralF(ct, -0.5), k::Mul(x[1], x[1]))),
                                LiteralF(ct, 0.3989422804014327));
      return k::Mul(x[0], k::Add(cdf, k::Mul(x[1], pdf)));
    };
    return d;
  }
  if (name == "mse_loss_backward") {  // norm * (self - target) * grad, as ATen's
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    KILN_RETURN_IF_ERROR(opnd(2));
    int64_t reduction = 1;
    if (n.args.size() > 3) {
      if (n.args[3].kind != Arg::Kind::kInt) return absl::UnimplementedError("mse_loss_backward reduction");
      reduction = n.args[3].i;
    }
    if (reduction < 0 || reduction > 2) return absl::UnimplementedError("mse_loss_backward reduction");
    double norm = 2.0;  // none and sum
    if (reduction == 1) {  // mean: 2 / self.numel()
      if (d.operands[1].value < 0) return absl::UnimplementedError("mse_loss_backward of a number");
      int64_t numel = 1;
      for (int64_t s : l.g().values[d.operands[1].value].sizes) numel *= s;
      if (numel == 0) return absl::UnimplementedError("mse_loss_backward of an empty tensor");
      norm = 2.0 / static_cast<double>(numel);
    }
    d.combine = [norm](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      return k::Mul(k::Mul(k::Sub(x[1], x[2]), LiteralF(ct, norm)), x[0]);
    };
    return d;
  }
  if (name == "native_dropout_backward") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    const Arg scale = n.args[2];
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      return k::Mul(k::Mul(x[0], x[1]), Literal(ct, scale));
    };
    return d;
  }
  if (name == "addcmul" || name == "addcdiv") {
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    KILN_RETURN_IF_ERROR(opnd(2));
    const Arg value = n.args.size() > 3 ? n.args[3] : Arg::Int(1);
    const bool mul = name == "addcmul";
    d.combine = [=](const std::vector<ExprOr>& x, ScalarType ct) -> ExprOr {
      const ExprOr t = mul ? k::Mul(x[1], x[2]) : k::Div(x[1], x[2]);
      return k::Add(x[0], k::Mul(Literal(ct, value), t));
    };
    return d;
  }
  if (name == "lerp") {  // self + weight * (end - self)
    KILN_RETURN_IF_ERROR(opnd(0));
    KILN_RETURN_IF_ERROR(opnd(1));
    KILN_RETURN_IF_ERROR(opnd(2));
    d.combine = [](const std::vector<ExprOr>& x, ScalarType) { return k::Add(x[0], k::Mul(x[2], k::Sub(x[1], x[0]))); };
    return d;
  }
  if (name == "convert_element_type" || name == "_to_copy" || name == "clone" || name == "lift_fresh_copy" ||
      name == "alias_copy") {
    if (name == "_to_copy") {
      // layout, device must not change the device kind; pin_memory/non_blocking are irrelevant.
      if (n.args.size() > 3 && n.args[3].kind == Arg::Kind::kDevice) {
        const Arg& dev = n.args[3];
        const auto& in_meta = l.g().values[l.KernelValueOf(n.args[0]).value_or(0)].meta;
        if (dev.device != in_meta.device().kind()) return absl::UnimplementedError("_to_copy across devices");
      }
    }
    KILN_RETURN_IF_ERROR(opnd(0));
    d.compute = ComputeType(out);  // a cast: no arithmetic, straight to the output type
    d.operands[0].as = l.g().values[d.operands[0].value].dtype;
    d.combine = [out](const std::vector<ExprOr>& x, ScalarType) { return k::Cast(out, x[0]); };
    d.cheap = true;
    return d;
  }
  if (name == "copy") {  // copy(self, src): src broadcast to self, in self's dtype
    KILN_RETURN_IF_ERROR(opnd(1));
    d.compute = ComputeType(out);
    d.operands[0].as = l.g().values[d.operands[0].value].dtype;
    d.combine = [out](const std::vector<ExprOr>& x, ScalarType) { return k::Cast(out, x[0]); };
    d.cheap = true;
    return d;
  }
  if (name == "fill" && ov == "Scalar") {
    const Arg v = n.args[1];
    d.compute = ComputeType(out);
    d.combine = [v](const std::vector<ExprOr>&, ScalarType ct) { return Literal(ct, v); };
    d.cheap = true;
    return d;
  }
  auto constant = [&](Arg v) -> absl::StatusOr<PwDef> {
    if (k::IsHalfType(out)) {
      d.compute = ScalarType::kFloat32;
    } else {
      d.compute = out;
    }
    d.combine = [v](const std::vector<ExprOr>&, ScalarType ct) { return Literal(ct, v); };
    d.cheap = true;
    return d;
  };
  if (name == "zeros_like" || name == "zeros" || name == "new_zeros") return constant(Arg::Int(0));
  if (name == "ones_like" || name == "ones" || name == "new_ones") return constant(Arg::Int(1));
  if (name == "full_like") return constant(n.args[1]);
  if (name == "full") return constant(n.args[1]);
  if (name == "new_full") return constant(n.args[2]);
  if (name == "scalar_tensor") return constant(n.args[0]);
  return absl::UnimplementedError(absl::StrCat("pointwise op ", n.target, " is not lowered"));
}

}  // namespace

absl::Status LowerPointwiseNode(Lowerer& l, int32_t node_index) {
  const Node& n = l.graph().nodes[node_index];
  if (n.type.kind != graph::Type::Kind::kTensor) return absl::UnimplementedError("non-tensor result");
  if (n.op->schema.name == "max_pool2d_with_indices_backward") return LowerMaxPool2dBackward(l, node_index);
  KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, n.type.tensor, ValueKind::kPointwise));
  v.op = n.op->schema.name;
  KILN_ASSIGN_OR_RETURN(const bool indexed, DefineIndexed(l, n, v));
  if (indexed) {
    l.SetResult(node_index, l.Add(std::move(v)));
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(PwDef d, Define(l, n, v.dtype));
  const ScalarType ct = d.compute.value_or(ComputeType(v.dtype));
  if (k::IsHalfType(ct)) return absl::UnimplementedError("half arithmetic");
  if (!k::IsFloatType(ct) && ct != ScalarType::kBool) {  // e.g. hardtanh(int64) with its float bounds
    for (const Arg& a : n.args) {
      if (a.kind == Arg::Kind::kFloat) return absl::UnimplementedError("float scalar in an integer computation");
    }
  }
  for (const Operand& o : d.operands) {
    if (o.value < 0) continue;
    const LValue& in = l.g().values[o.value];
    if (in.sizes.size() > v.sizes.size()) return absl::UnimplementedError("operand of higher rank");
    for (size_t i = 0; i < in.sizes.size(); ++i) {
      const int64_t os = v.sizes[i + v.sizes.size() - in.sizes.size()];
      if (in.sizes[i] != os && in.sizes[i] != 1) return absl::UnimplementedError("operand does not broadcast");
    }
    v.inputs.push_back(o.value);
  }
  v.op = n.op->schema.name;
  v.cheap = d.cheap;
  const ScalarType out = v.dtype;
  std::vector<std::vector<int64_t>> in_sizes;
  for (const Operand& o : d.operands) in_sizes.push_back(o.value >= 0 ? l.g().values[o.value].sizes : std::vector<int64_t>{});
  v.elem = [ops = d.operands, combine = d.combine, ct, out, in_sizes](LoadContext& ctx,
                                                                       const std::vector<Affine>& idx) -> ExprOr {
    std::vector<ExprOr> xs;
    for (size_t i = 0; i < ops.size(); ++i) {
      const ScalarType as = ops[i].as.value_or(ct);
      if (ops[i].value >= 0) {
        ExprOr x = ctx.Load(ops[i].value, BroadcastIndex(in_sizes[i], idx));
        if (x.ok() && k::IsHalfType((*x)->type) && as != (*x)->type) x = k::Cast(ScalarType::kFloat32, x);
        xs.push_back(k::Cast(as, x));
      } else {
        xs.push_back(Literal(as, ops[i].number));
      }
    }
    return k::Cast(out, combine(xs, ct));
  };
  l.SetResult(node_index, l.Add(std::move(v)));
  return absl::OkStatus();
}

}  // namespace kiln::lower::internal
