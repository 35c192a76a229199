// Matrix products (extern), factories, indexing, tuple indexing, SymInt queries and arithmetic,
// and functional collectives.

#include <cmath>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/graph/infer.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"

namespace kiln::graph {

namespace {

namespace v1 = ::kiln::v1;

absl::Status SameDType(const TensorType& a, const TensorType& b, const char* op) {
  if (a.dtype != b.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": expected both operands to have the same dtype, but got ",
                                                   DTypeName(a.dtype), " and ", DTypeName(b.dtype)));
  }
  return absl::OkStatus();
}

absl::Status Match(const InferContext& ctx, const SymExpr& a, const SymExpr& b, const char* what) {
  if (!ctx.LikelyEqual(a, b)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " (", a.ToString(), " vs ", b.ToString(), ")"));
  }
  return absl::OkStatus();
}

// mm(a, b) with a at `ia` and b at `ib`; `batched` for bmm.
InferFn MatMul(int ia, int ib, bool batched, int bias = -1) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* a, ctx.RequireTensor(ia));
    KILN_ASSIGN_OR_RETURN(const TensorType* b, ctx.RequireTensor(ib));
    const int64_t r = batched ? 3 : 2;
    if (a->rank() != r || b->rank() != r) {
      return absl::InvalidArgumentError(absl::StrCat("expected ", r, "-D tensors, got ", a->rank(), "-D and ",
                                                     b->rank(), "-D"));
    }
    KILN_RETURN_IF_ERROR(SameDType(*a, *b, batched ? "bmm" : "mm"));
    KILN_RETURN_IF_ERROR(Match(ctx, a->sizes[r - 1], b->sizes[r - 2], "mat1 and mat2 shapes cannot be multiplied"));
    std::vector<SymExpr> sizes;
    if (batched) {
      KILN_RETURN_IF_ERROR(Match(ctx, a->sizes[0], b->sizes[0], "batch sizes of bmm operands differ"));
      sizes.push_back(a->sizes[0]);
    }
    sizes.push_back(a->sizes[r - 2]);
    sizes.push_back(b->sizes[r - 1]);
    if (bias >= 0) {
      KILN_ASSIGN_OR_RETURN(const TensorType* c, ctx.RequireTensor(bias));
      KILN_RETURN_IF_ERROR(SameDType(*a, *c, "addmm"));
      KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> bs, BroadcastShapes(ctx, {&c->sizes, &sizes}));
      KILN_RETURN_IF_ERROR(Match(ctx, SymExpr::Mul(bs), SymExpr::Mul(sizes), "self cannot broadcast to the result"));
    }
    return Type::Tensor(NewTensor(a->dtype, std::move(sizes), *a));
  };
}

absl::StatusOr<DType> FactoryDType(const InferContext& ctx, int dtype_arg, int fill_arg) {
  if (auto d = ctx.OptDType(dtype_arg)) return *d;
  if (fill_arg < 0) return kDefaultFloat;
  KILN_ASSIGN_OR_RETURN(std::optional<Operand> op, ctx.GetOperand(fill_arg));
  if (!op) return kDefaultFloat;
  if (op->tensor) return op->tensor->dtype;
  return IsFloatingDType(op->scalar_dtype) ? kDefaultFloat : op->scalar_dtype;
}

TensorType FactoryTensor(const InferContext& ctx, DType dtype, std::vector<SymExpr> sizes, int device_arg) {
  TensorType t;
  t.dtype = dtype;
  t.strides = ContiguousStrides(sizes);
  t.sizes = std::move(sizes);
  t.device = v1::DEVICE_KIND_CPU;
  if (ctx.arg(device_arg).kind == Arg::Kind::kDevice) {
    t.device = ctx.arg(device_arg).device;
    t.device_index = ctx.arg(device_arg).device_index;
  }
  return t;
}

// full/zeros/ones/empty/rand/randn(size, [fill,] *, dtype, layout, device, ...).
InferFn Factory(int fill_arg) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(0));
    for (const SymExpr& s : sizes) {
      if (ctx.Hint(s) < 0) return absl::InvalidArgumentError("negative dimension in size");
    }
    const int first_kw = fill_arg >= 0 ? 2 : 1;
    KILN_ASSIGN_OR_RETURN(DType dtype, FactoryDType(ctx, first_kw, fill_arg));
    return Type::Tensor(FactoryTensor(ctx, dtype, std::move(sizes), first_kw + 2));
  };
}

absl::StatusOr<Type> InferEmptyStrided(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> strides, ctx.SymList(1));
  if (sizes.size() != strides.size()) return absl::InvalidArgumentError("empty_strided: sizes and strides differ in length");
  TensorType t = FactoryTensor(ctx, ctx.OptDType(2).value_or(kDefaultFloat), sizes, 4);
  t.strides = std::move(strides);
  return Type::Tensor(std::move(t));
}

// new_zeros/new_ones/new_empty/new_full(self, size, [fill,] *, dtype, layout, device, ...)
InferFn NewFactory(int fill_arg) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
    KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(1));
    const int kw = fill_arg >= 0 ? 3 : 2;
    TensorType t = NewTensor(ctx.OptDType(kw).value_or(self->dtype), std::move(sizes), *self);
    if (ctx.arg(kw + 2).kind == Arg::Kind::kDevice) t.device = ctx.arg(kw + 2).device;
    return Type::Tensor(std::move(t));
  };
}

absl::StatusOr<Type> InferScalarTensor(const InferContext& ctx) {
  return Type::Tensor(FactoryTensor(ctx, ctx.OptDType(1).value_or(kDefaultFloat), {}, 3));
}

// arange(start, end, step, *, dtype, layout, device, pin_memory) with start/end/step at the given
// positions (-1: default 0 / 1).
InferFn Arange(int start_arg, int end_arg, int step_arg, int dtype_arg) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    bool any_float = false;
    double v[3] = {0, 0, 1};
    std::optional<SymExpr> sym_end;
    const int args[3] = {start_arg, end_arg, step_arg};
    for (int k = 0; k < 3; ++k) {
      if (args[k] < 0) continue;
      const Arg& a = ctx.arg(args[k]);
      if (a.kind == Arg::Kind::kFloat) {
        any_float = true;
        v[k] = a.f;
      } else {
        KILN_ASSIGN_OR_RETURN(SymExpr e, ctx.SymOf(a));
        v[k] = static_cast<double>(ctx.Hint(e));
        if (k == 1 && !e.is_const()) sym_end = e;
      }
    }
    if (v[2] == 0) return absl::InvalidArgumentError("arange: step must be nonzero");
    DType dtype = ctx.OptDType(dtype_arg).value_or(any_float ? kDefaultFloat : v1::DTYPE_INT64);
    SymExpr length;
    if (sym_end && !any_float && v[0] == 0 && v[2] == 1) {
      length = *sym_end;
    } else {
      const double n = std::ceil((v[1] - v[0]) / v[2]);
      if (!(n < 9.0e18)) return absl::InvalidArgumentError("arange: too many elements");
      length = SymExpr::Const(n > 0 ? static_cast<int64_t>(n) : 0);
    }
    return Type::Tensor(FactoryTensor(ctx, dtype, {length}, dtype_arg + 2));
  };
}

absl::StatusOr<Type> InferGetItem(const InferContext& ctx) {
  const Type& seq = ctx.ValueType(ctx.arg(0));
  if (seq.kind != Type::Kind::kList) return absl::InvalidArgumentError("getitem: argument 0 is not a tuple or list");
  KILN_ASSIGN_OR_RETURN(int64_t i, ctx.Int(1));
  const int64_t n = static_cast<int64_t>(seq.items.size());
  if (i < -n || i >= n) {
    return absl::InvalidArgumentError(absl::StrCat("getitem: index ", i, " out of range for ", n, " items"));
  }
  return seq.items[i < 0 ? i + n : i];
}

enum class SymQuery { kSize, kStride, kNumel, kOffset };
InferFn SymQueryFn(SymQuery q) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
    if (q == SymQuery::kNumel) return Type::SymInt(NumElements(self->sizes));
    if (q == SymQuery::kOffset) return Type::SymInt(self->storage_offset);
    KILN_ASSIGN_OR_RETURN(int64_t d, ctx.Int(1));
    KILN_ASSIGN_OR_RETURN(d, WrapDim(d, self->rank()));
    if (self->rank() == 0) return absl::InvalidArgumentError("sym_size/sym_stride of a 0-dim tensor");
    return Type::SymInt(q == SymQuery::kSize ? self->sizes[d] : self->strides[d]);
  };
}

enum class SymOp { kAdd, kSub, kMul, kFloorDiv, kMod, kNeg, kMax, kMin };
InferFn SymArith(SymOp op) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    auto a = ctx.Sym(0);
    auto b = op == SymOp::kNeg ? absl::StatusOr<SymExpr>(SymExpr()) : ctx.Sym(1);
    if (!a.ok() || !b.ok()) return Type();  // float arithmetic or unknown: take the graph's
    switch (op) {
      case SymOp::kAdd: return Type::SymInt(*a + *b);
      case SymOp::kSub: return Type::SymInt(*a - *b);
      case SymOp::kMul: return Type::SymInt(*a * *b);
      case SymOp::kFloorDiv:
        if (ctx.Hint(*b, 1) == 0) return absl::InvalidArgumentError("integer division by zero");
        return Type::SymInt(SymExpr::FloorDiv(*a, *b));
      case SymOp::kMod:
        if (ctx.Hint(*b, 1) == 0) return absl::InvalidArgumentError("integer modulo by zero");
        return Type::SymInt(SymExpr::Mod(*a, *b));
      case SymOp::kNeg: return Type::SymInt(SymExpr::Neg(*a));
      case SymOp::kMax: return Type::SymInt(SymExpr::Max({*a, *b}));
      case SymOp::kMin: return Type::SymInt(SymExpr::Min({*a, *b}));
    }
    return Type();
  };
}

// all_gather / reduce_scatter change dim 0 by the group size; others keep the input's layout.
InferFn Collective(int group_size_arg, bool gather) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
    if (group_size_arg < 0) {
      TensorType t = *self;
      t.storage_offset = SymExpr();
      t.strides = EmptyLikeStrides(ctx, *self);
      return Type::Tensor(std::move(t));
    }
    KILN_ASSIGN_OR_RETURN(int64_t g, ctx.Int(group_size_arg));
    if (g <= 0 || self->rank() == 0) return absl::InvalidArgumentError("bad group_size or 0-dim input");
    std::vector<SymExpr> sizes = self->sizes;
    sizes[0] = gather ? sizes[0] * SymExpr::Const(g) : SymExpr::FloorDiv(sizes[0], SymExpr::Const(g));
    return Type::Tensor(NewTensor(self->dtype, std::move(sizes), *self));
  };
}

absl::StatusOr<Type> InferCopyInplace(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  return Type::Tensor(*self);
}

}  // namespace

void RegisterMiscOps(std::vector<OpSpec>* specs) {
  auto add = [&](const char* ns, const char* schema, OpClass c, InferFn fn, const char* target = nullptr) {
    specs->push_back(OpSpec{ns, schema, c, std::move(fn), target});
  };
  const OpClass kExt = OpClass::kExtern, kOther = OpClass::kOther;
  add("aten", "mm(Tensor self, Tensor mat2) -> Tensor", kExt, MatMul(0, 1, false));
  add("aten", "bmm(Tensor self, Tensor mat2) -> Tensor", kExt, MatMul(0, 1, true));
  add("aten", "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor", kExt,
      MatMul(1, 2, false, 0));
  add("aten", "baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
      kExt, MatMul(1, 2, true, 0));
  const std::string tail = "*, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None";
  static const std::string kFull = "full(SymInt[] size, Scalar fill_value, " + tail + ") -> Tensor";
  static const std::string kZeros = "zeros(SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kOnes = "ones(SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kRand = "rand(SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kRandn = "randn(SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kEmpty = "empty.memory_format(SymInt[] size, " + tail +
                                    ", MemoryFormat? memory_format=None) -> Tensor";
  static const std::string kEmptyStrided = "empty_strided(SymInt[] size, SymInt[] stride, " + tail + ") -> Tensor";
  static const std::string kScalarTensor = "scalar_tensor(Scalar s, " + tail + ") -> Tensor";
  static const std::string kArangeSS = "arange.start_step(Scalar start, Scalar end, Scalar step=1, " + tail + ") -> Tensor";
  static const std::string kArangeS = "arange.start(Scalar start, Scalar end, " + tail + ") -> Tensor";
  static const std::string kArange = "arange(Scalar end, " + tail + ") -> Tensor";
  static const std::string kNewZeros = "new_zeros(Tensor self, SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kNewOnes = "new_ones(Tensor self, SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kNewEmpty = "new_empty(Tensor self, SymInt[] size, " + tail + ") -> Tensor";
  static const std::string kNewFull = "new_full(Tensor self, SymInt[] size, Scalar fill_value, " + tail + ") -> Tensor";
  add("aten", kFull.c_str(), kOther, Factory(1));
  add("aten", kZeros.c_str(), kOther, Factory(-1));
  add("aten", kOnes.c_str(), kOther, Factory(-1));
  add("aten", kRand.c_str(), kOther, Factory(-1));
  add("aten", kRandn.c_str(), kOther, Factory(-1));
  add("aten", kEmpty.c_str(), kOther, Factory(-1));
  add("aten", kEmptyStrided.c_str(), kOther, InferEmptyStrided);
  add("aten", kScalarTensor.c_str(), kOther, InferScalarTensor);
  add("aten", kArangeSS.c_str(), kOther, Arange(0, 1, 2, 3));
  add("aten", kArangeS.c_str(), kOther, Arange(0, 1, -1, 2));
  add("aten", kArange.c_str(), kOther, Arange(-1, 0, -1, 1));
  add("aten", kNewZeros.c_str(), kOther, NewFactory(-1));
  add("aten", kNewOnes.c_str(), kOther, NewFactory(-1));
  add("aten", kNewEmpty.c_str(), kOther, NewFactory(-1));
  add("aten", kNewFull.c_str(), kOther, NewFactory(2));
  // Runs as aten (an extern step): AOTAutograd leaves one per mutated input at the end of a graph.
  add("aten", "copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)", kExt, InferCopyInplace);

  add("operator", "getitem(Any self, int idx) -> Any", kOther, InferGetItem, "operator.getitem");
  add("operator", "getitem(Any self, int idx) -> Any", kOther, InferGetItem, "_operator.getitem");
  add("aten", "sym_size.int(Tensor self, int dim) -> SymInt", kOther, SymQueryFn(SymQuery::kSize));
  add("aten", "sym_stride.int(Tensor self, int dim) -> SymInt", kOther, SymQueryFn(SymQuery::kStride));
  add("aten", "sym_numel(Tensor self) -> SymInt", kOther, SymQueryFn(SymQuery::kNumel));
  add("aten", "sym_storage_offset(Tensor self) -> SymInt", kOther, SymQueryFn(SymQuery::kOffset));
  struct Arith {
    const char* name;
    SymOp op;
  };
  for (const Arith& a : {Arith{"add", SymOp::kAdd}, Arith{"sub", SymOp::kSub}, Arith{"mul", SymOp::kMul},
                         Arith{"floordiv", SymOp::kFloorDiv}, Arith{"mod", SymOp::kMod}}) {
    static std::deque<std::string>* names = new std::deque<std::string>();
    names->push_back(absl::StrCat(a.name, "(Any a, Any b) -> Any"));
    const char* schema = names->back().c_str();
    names->push_back(absl::StrCat("operator.", a.name));
    specs->push_back(OpSpec{"operator", schema, kOther, SymArith(a.op), names->back().c_str()});
    names->push_back(absl::StrCat("_operator.", a.name));
    specs->push_back(OpSpec{"operator", schema, kOther, SymArith(a.op), names->back().c_str()});
  }
  add("operator", "neg(Any a) -> Any", kOther, SymArith(SymOp::kNeg), "operator.neg");
  add("operator", "neg(Any a) -> Any", kOther, SymArith(SymOp::kNeg), "_operator.neg");
  add("torch", "sym_max(Any a, Any b) -> Any", kOther, SymArith(SymOp::kMax), "torch.sym_max");
  add("torch", "sym_min(Any a, Any b) -> Any", kOther, SymArith(SymOp::kMin), "torch.sym_min");

  // Functional collectives. Rank-specific arguments (group_name, tag, ranks) are hashed as a fixed
  // token by key.cc.
  add("_c10d_functional", "all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor", kOther, Collective(-1, false));
  add("_c10d_functional", "all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor", kOther,
      Collective(1, true));
  add("_c10d_functional", "reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor",
      kOther, Collective(2, false));
  add("_c10d_functional", "wait_tensor(Tensor tensor) -> Tensor", kOther, Collective(-1, false));
  add("_c10d_functional", "broadcast(Tensor input, int src, str group_name) -> Tensor", kOther, Collective(-1, false));
  add("c10d_functional", "all_reduce(Tensor self, str reduceOp, str tag, int[] ranks, int group_size) -> Tensor",
      kOther, Collective(-1, false));
  add("c10d_functional", "all_gather_into_tensor(Tensor shard, str tag, int[] ranks, int group_size) -> Tensor",
      kOther, Collective(3, true));
  add("c10d_functional", "reduce_scatter_tensor(Tensor input, str reduceOp, str tag, int[] ranks, int group_size) -> Tensor",
      kOther, Collective(4, false));
  add("c10d_functional", "wait_tensor(Tensor self) -> Tensor", kOther, Collective(-1, false));
}

}  // namespace kiln::graph
