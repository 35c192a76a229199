// Pointwise ops: unary, binary and ternary math, comparisons, logical and bitwise ops, casts,
// copies, random-like and the *_backward forms of activations. Output: broadcast shape,
// torch's type promotion, TensorIterator's output strides.

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/graph/infer.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"

namespace kiln::graph {

namespace {

namespace v1 = ::kiln::v1;
constexpr OpClass kPw = OpClass::kPointwise;

enum class Check { kNone, kIntegral, kNotBool };

// A pointwise op over the arguments `operands` (their dtypes promote) and `shape_only` (they
// broadcast but do not promote, e.g. where's condition).
// `order` lists the arguments in the order the op's TensorIterator adds them (by default, argument
// order); the first operand's layout wins ties in the output strides.
enum class OutLayout { kIterator, kContiguous };
InferFn Pointwise(std::vector<int> operands, Promotion kind, std::vector<int> shape_only = {},
                  Check check = Check::kNone, std::vector<int> order = {}, OutLayout layout = OutLayout::kIterator) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    std::vector<Operand> ops;
    std::vector<const TensorType*> tensors;
    std::vector<int> all = shape_only;
    all.insert(all.end(), operands.begin(), operands.end());
    std::sort(all.begin(), all.end());
    if (!order.empty()) all = order;
    for (int i : all) {
      KILN_ASSIGN_OR_RETURN(std::optional<Operand> op, ctx.GetOperand(i));
      if (!op) continue;
      if (op->tensor) tensors.push_back(op->tensor);
      if (std::find(operands.begin(), operands.end(), i) != operands.end()) ops.push_back(*op);
    }
    if (tensors.empty()) return absl::InvalidArgumentError("expected at least one tensor argument");
    KILN_ASSIGN_OR_RETURN(DType dtype, PointwiseDType(ops, kind));
    if (check == Check::kIntegral) {
      KILN_ASSIGN_OR_RETURN(DType r, ResultType(ops));
      if (!IsIntegralDType(r, true)) {
        return absl::InvalidArgumentError(
            absl::StrCat("bitwise ops need integral or bool tensors, got ", DTypeName(r)));
      }
    }
    if (check == Check::kNotBool && dtype == v1::DTYPE_BOOL) {
      return absl::InvalidArgumentError("this op does not support bool tensors");
    }
    std::vector<const std::vector<SymExpr>*> shapes;
    for (const TensorType* t : tensors) shapes.push_back(&t->sizes);
    KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, BroadcastShapes(ctx, shapes));
    TensorType out;
    out.dtype = dtype;
    out.strides = layout == OutLayout::kContiguous ? ContiguousStrides(sizes) : ElementwiseStrides(ctx, sizes, tensors);
    out.sizes = std::move(sizes);
    const TensorType* dev = DeviceSource(tensors);
    out.device = dev->device;
    out.device_index = dev->device_index;
    return Type::Tensor(std::move(out));
  };
}

// div with rounding_mode: true division promotes ints to float, floor/trunc do not.
absl::StatusOr<Type> InferDivMode(const InferContext& ctx) {
  const bool true_div = ctx.is_none(2);
  if (!true_div && ctx.Str(2) != "floor" && ctx.Str(2) != "trunc") {
    return absl::InvalidArgumentError(absl::StrCat("div expected rounding_mode to be one of None, "
                                                   "'trunc', or 'floor' but found '", ctx.Str(2), "'"));
  }
  return Pointwise({0, 1}, true_div ? Promotion::kIntToFloat : Promotion::kDefault)(ctx);
}

absl::StatusOr<Type> InferGelu(const InferContext& ctx) {
  const std::string a = ctx.Str(ctx.num_args() - 1);
  if (a != "none" && a != "tanh") {
    return absl::InvalidArgumentError(absl::StrCat("approximate must be 'none' or 'tanh', got '", a, "'"));
  }
  const int n = ctx.num_args() == 2 ? 1 : 2;  // gelu(self, approximate) or gelu_backward(g, self, ..)
  std::vector<int> ops;
  for (int i = 0; i < n; ++i) ops.push_back(i);
  return Pointwise(ops, Promotion::kDefault)(ctx);
}

// mse_loss: (self - target)^2 (reduction 0: none) or its mean (1, the default) or sum (2) as a
// 0-d tensor, in the promoted dtype.
absl::StatusOr<Type> InferMseLoss(const InferContext& ctx) {
  int64_t reduction = 1;
  if (ctx.num_args() > 2 && !ctx.is_none(2)) {
    KILN_ASSIGN_OR_RETURN(reduction, ctx.Int(2));
  }
  if (reduction < 0 || reduction > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("mse_loss: reduction must be 0 (none), 1 (mean) or 2 (sum), got ", reduction));
  }
  KILN_ASSIGN_OR_RETURN(Type t, Pointwise({0, 1}, Promotion::kDefault)(ctx));
  if (reduction != 0) {
    t.tensor.sizes.clear();
    t.tensor.strides.clear();
  }
  return t;
}

// A result laid out like empty_like(self) (or per memory_format), with dtype `dtype_arg` or self's.
absl::StatusOr<Type> LikeSelf(const InferContext& ctx, int dtype_arg, int device_arg, int format_arg) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  TensorType out = *self;
  out.storage_offset = SymExpr();
  if (auto d = ctx.OptDType(dtype_arg); d && dtype_arg >= 0) out.dtype = *d;
  if (device_arg >= 0 && ctx.arg(device_arg).kind == Arg::Kind::kDevice) {
    out.device = ctx.arg(device_arg).device;
    out.device_index = ctx.arg(device_arg).device_index;
  }
  MemoryFormat format = v1::MEMORY_FORMAT_PRESERVE;
  if (format_arg >= 0 && ctx.arg(format_arg).kind == Arg::Kind::kMemoryFormat) {
    format = ctx.arg(format_arg).memory_format;
  }
  switch (format) {
    case v1::MEMORY_FORMAT_CONTIGUOUS:
      out.strides = ContiguousStrides(out.sizes);
      break;
    case v1::MEMORY_FORMAT_CHANNELS_LAST:
    case v1::MEMORY_FORMAT_CHANNELS_LAST_3D:
      if (out.rank() != (format == v1::MEMORY_FORMAT_CHANNELS_LAST ? 4 : 5)) {
        return absl::InvalidArgumentError("channels_last memory format needs a 4-d (or 5-d) tensor");
      }
      out.strides = ChannelsLastStrides(out.sizes);
      break;
    default:
      out.strides = EmptyLikeStrides(ctx, *self);
  }
  return Type::Tensor(std::move(out));
}

InferFn Like(int dtype_arg, int device_arg, int format_arg) {
  return [=](const InferContext& ctx) { return LikeSelf(ctx, dtype_arg, device_arg, format_arg); };
}

absl::StatusOr<Type> InferConvertElementType(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* a, ctx.RequireTensor(0));
  TensorType out = *a;
  out.storage_offset = SymExpr();
  out.dtype = ctx.OptDType(1).value_or(a->dtype);
  out.strides = ElementwiseStrides(ctx, a->sizes, {a});
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferNativeDropout(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Type out, LikeSelf(ctx, -1, -1, -1));
  Type mask = out;
  mask.tensor.dtype = v1::DTYPE_BOOL;
  return Type::List({out, mask});
}

const char* const kUnaryFloat[] = {
    "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos",
    "tan", "tanh", "sigmoid", "erf", "erfc", "erfinv", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "reciprocal", "lgamma", "digamma", "i0"};
const char* const kUnarySame[] = {"neg", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac",
                                  "relu", "silu", "mish", "hardswish", "hardsigmoid", "positive"};
const char* const kUnaryBool[] = {"isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit",
                                  "logical_not"};
const char* const kCompare[] = {"eq", "ne", "lt", "le", "gt", "ge"};
const char* const kBinarySame[] = {"maximum", "minimum", "fmax", "fmin", "remainder", "fmod",
                                   "floor_divide"};

// Schema strings must outlive registration; keep generated ones here.
std::deque<std::string>& Storage() {
  static auto* s = new std::deque<std::string>();
  return *s;
}
const char* Keep(std::string s) {
  Storage().push_back(std::move(s));
  return Storage().back().c_str();
}

}  // namespace

void RegisterPointwiseOps(std::vector<OpSpec>* specs) {
  const Promotion kDef = Promotion::kDefault, kFloat = Promotion::kIntToFloat,
                  kBool = Promotion::kAlwaysBool, kSame = Promotion::kNoPromote;
  auto add = [&](const char* schema, InferFn fn, const char* ns = "aten") {
    specs->push_back(OpSpec{ns, schema, kPw, std::move(fn)});
  };
  for (const char* op : {"add", "sub", "rsub"}) {
    add(Keep(absl::StrCat(op, ".Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor")),
        Pointwise({0, 1}, kDef, {}, Check::kNone));
    add(Keep(absl::StrCat(op, ".Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor")),
        Pointwise({0, 1}, kDef));
  }
  add("mul.Tensor(Tensor self, Tensor other) -> Tensor", Pointwise({0, 1}, kDef));
  add("mul.Scalar(Tensor self, Scalar other) -> Tensor", Pointwise({0, 1}, kDef));
  add("div.Tensor(Tensor self, Tensor other) -> Tensor", Pointwise({0, 1}, kFloat));
  add("div.Scalar(Tensor self, Scalar other) -> Tensor", Pointwise({0, 1}, kFloat));
  add("div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor", InferDivMode);
  add("div.Scalar_mode(Tensor self, Scalar other, *, str? rounding_mode) -> Tensor", InferDivMode);
  add("true_divide.Tensor(Tensor self, Tensor other) -> Tensor", Pointwise({0, 1}, kFloat));
  add("pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor", Pointwise({0, 1}, kDef));
  add("pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor", Pointwise({0, 1}, kDef));
  add("pow.Scalar(Scalar self, Tensor exponent) -> Tensor", Pointwise({0, 1}, kDef));
  add("atan2(Tensor self, Tensor other) -> Tensor", Pointwise({0, 1}, kFloat));
  for (const char* op : kUnaryFloat) add(Keep(absl::StrCat(op, "(Tensor self) -> Tensor")), Pointwise({0}, kFloat));
  for (const char* op : kUnarySame) add(Keep(absl::StrCat(op, "(Tensor self) -> Tensor")), Pointwise({0}, kDef));
  add("abs(Tensor self) -> Tensor", Pointwise({0}, Promotion::kComplexToFloat));
  add("round.decimals(Tensor self, *, int decimals) -> Tensor", Pointwise({0}, kDef));
  for (const char* op : kUnaryBool) add(Keep(absl::StrCat(op, "(Tensor self) -> Tensor")), Pointwise({0}, kBool));
  add("bitwise_not(Tensor self) -> Tensor", Pointwise({0}, kDef, {}, Check::kIntegral));
  for (const char* op : kCompare) {
    add(Keep(absl::StrCat(op, ".Tensor(Tensor self, Tensor other) -> Tensor")), Pointwise({0, 1}, kBool));
    add(Keep(absl::StrCat(op, ".Scalar(Tensor self, Scalar other) -> Tensor")), Pointwise({0, 1}, kBool));
  }
  for (const char* op : {"logical_and", "logical_or", "logical_xor"}) {
    add(Keep(absl::StrCat(op, "(Tensor self, Tensor other) -> Tensor")), Pointwise({0, 1}, kBool));
  }
  for (const char* op : {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
                         "bitwise_right_shift"}) {
    const bool shift = absl::StrContains(op, "shift");
    add(Keep(absl::StrCat(op, ".Tensor(Tensor self, Tensor other) -> Tensor")),
        Pointwise({0, 1}, kDef, {}, Check::kIntegral));
    add(Keep(absl::StrCat(op, shift ? ".Tensor_Scalar" : ".Scalar", "(Tensor self, Scalar other) -> Tensor")),
        Pointwise({0, 1}, kDef, {}, Check::kIntegral));
  }
  for (const char* op : kBinarySame) {
    const bool has_scalar = std::string(op) == "remainder" || std::string(op) == "fmod";
    add(Keep(absl::StrCat(op, has_scalar ? ".Tensor" : "", "(Tensor self, Tensor other) -> Tensor")),
        Pointwise({0, 1}, kDef));
    if (has_scalar) {
      add(Keep(absl::StrCat(op, ".Scalar(Tensor self, Scalar other) -> Tensor")), Pointwise({0, 1}, kDef));
    }
  }
  add("where.self(Tensor condition, Tensor self, Tensor other) -> Tensor", Pointwise({1, 2}, kDef, {0}));
  add("where.ScalarSelf(Tensor condition, Scalar self, Tensor other) -> Tensor", Pointwise({1, 2}, kDef, {0}));
  add("where.ScalarOther(Tensor condition, Tensor self, Scalar other) -> Tensor", Pointwise({1, 2}, kDef, {0}));
  add("where.Scalar(Tensor condition, Scalar self, Scalar other) -> Tensor", Pointwise({1, 2}, kDef, {0}));
  // masked_fill is clone(expand(self), contiguous_format) then masked_fill_.
  add("masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor",
      Pointwise({0}, kSame, {1}, Check::kNone, {}, OutLayout::kContiguous));
  add("masked_fill.Tensor(Tensor self, Tensor mask, Tensor value) -> Tensor",
      Pointwise({0}, kSame, {1}, Check::kNone, {}, OutLayout::kContiguous));
  add("clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor", Pointwise({0, 1, 2}, kDef));
  add("clamp.Tensor(Tensor self, Tensor? min=None, Tensor? max=None) -> Tensor", Pointwise({0, 1, 2}, kDef));
  add("clamp_min(Tensor self, Scalar min) -> Tensor", Pointwise({0, 1}, kDef));
  add("clamp_min.Tensor(Tensor self, Tensor min) -> Tensor", Pointwise({0, 1}, kDef));
  add("clamp_max(Tensor self, Scalar max) -> Tensor", Pointwise({0, 1}, kDef));
  add("clamp_max.Tensor(Tensor self, Tensor max) -> Tensor", Pointwise({0, 1}, kDef));
  add("lerp.Scalar(Tensor self, Tensor end, Scalar weight) -> Tensor", Pointwise({0, 1, 2}, kDef));
  add("lerp.Tensor(Tensor self, Tensor end, Tensor weight) -> Tensor", Pointwise({0, 1, 2}, kDef));
  add("addcmul(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor", Pointwise({0, 1, 2}, kDef));
  add("addcdiv(Tensor self, Tensor tensor1, Tensor tensor2, *, Scalar value=1) -> Tensor", Pointwise({0, 1, 2}, kDef));
  add("gelu(Tensor self, *, str approximate='none') -> Tensor", InferGelu);
  add("gelu_backward(Tensor grad_output, Tensor self, *, str approximate='none') -> Tensor", InferGelu);
  add("hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor", Pointwise({0}, kDef));
  add("leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor", Pointwise({0}, kDef));
  add("elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor", Pointwise({0}, kDef));
  add("softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor", Pointwise({0}, kDef));
  add("threshold(Tensor self, Scalar threshold, Scalar value) -> Tensor", Pointwise({0}, kDef));
  // threshold_backward's and leaky_relu_backward's TensorIterators take self before grad_output.
  add("threshold_backward(Tensor grad_output, Tensor self, Scalar threshold) -> Tensor",
      Pointwise({0, 1}, kDef, {}, Check::kNone, {1, 0}));
  add("silu_backward(Tensor grad_output, Tensor self) -> Tensor", Pointwise({0, 1}, kDef));
  add("sigmoid_backward(Tensor grad_output, Tensor output) -> Tensor", Pointwise({0, 1}, kDef));
  add("tanh_backward(Tensor grad_output, Tensor output) -> Tensor", Pointwise({0, 1}, kDef));
  add("hardswish_backward(Tensor grad_output, Tensor self) -> Tensor", Pointwise({0, 1}, kDef));
  add("hardsigmoid_backward(Tensor grad_output, Tensor self) -> Tensor", Pointwise({0, 1}, kDef));
  add("mish_backward(Tensor grad_output, Tensor self) -> Tensor", Pointwise({0, 1}, kDef));
  add("hardtanh_backward(Tensor grad_output, Tensor self, Scalar min_val, Scalar max_val) -> Tensor", Pointwise({0, 1}, kDef));
  add("leaky_relu_backward(Tensor grad_output, Tensor self, Scalar negative_slope, bool self_is_result) -> Tensor",
      Pointwise({0, 1}, kDef, {}, Check::kNone, {1, 0}));
  add("elu_backward(Tensor grad_output, Scalar alpha, Scalar scale, Scalar input_scale, bool is_result, Tensor self_or_result) -> Tensor", Pointwise({0, 5}, kDef));
  add("softplus_backward(Tensor grad_output, Tensor self, Scalar beta, Scalar threshold) -> Tensor", Pointwise({0, 1}, kDef));
  add("native_dropout_backward(Tensor grad_output, Tensor mask, float scale) -> Tensor", Pointwise({0}, kSame, {1}));
  // mse_loss lowers as a reduction over all dims (or, with reduction 0, pointwise: lower_reduction.cc).
  specs->push_back(OpSpec{"aten", "mse_loss(Tensor self, Tensor target, int reduction=1) -> Tensor",
                          OpClass::kReduction, InferMseLoss});
  add("mse_loss_backward(Tensor grad_output, Tensor self, Tensor target, int reduction) -> Tensor",
      Pointwise({0, 1, 2}, kDef));
  add("native_dropout(Tensor input, float p, bool? train) -> (Tensor, Tensor)", InferNativeDropout);
  add("_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, bool non_blocking=False, MemoryFormat? memory_format=None) -> Tensor",
      Like(1, 3, 6));
  add("convert_element_type(Tensor a, ScalarType dtype) -> Tensor", InferConvertElementType, "prims");
  add("clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", Like(-1, -1, 1));
  add("lift_fresh_copy(Tensor self) -> Tensor", Like(-1, -1, -1));
  add("copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor", Like(-1, -1, -1));
  add("fill.Scalar(Tensor self, Scalar value) -> Tensor", Like(-1, -1, -1));
  add("fill.Tensor(Tensor self, Tensor value) -> Tensor", Like(-1, -1, -1));
  const char* kLikeTail =
      "*, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, "
      "MemoryFormat? memory_format=None) -> Tensor";
  for (const char* op : {"zeros_like", "ones_like", "empty_like", "rand_like", "randn_like"}) {
    add(Keep(absl::StrCat(op, "(Tensor self, ", kLikeTail)), Like(1, 3, 5));
  }
  add(Keep(absl::StrCat("full_like(Tensor self, Scalar fill_value, ", kLikeTail)), Like(2, 4, 6));
  add("bernoulli.p(Tensor self, float p, *, Generator? generator=None) -> Tensor", Like(-1, -1, -1));
  add("bernoulli.default(Tensor self, *, Generator? generator=None) -> Tensor", Like(-1, -1, -1));
}

}  // namespace kiln::graph
