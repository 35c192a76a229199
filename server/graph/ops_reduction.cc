// Reductions: sum, mean, prod, amax/amin, var/std (+ var_mean), argmax/argmin, any/all, max/min
// with indices, logsumexp. Output: contiguous, reduced dims removed (or kept as 1 with keepdim).

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

enum class RDType {
  kSumLike,   // dtype arg, else integral (and bool) -> i64, else self's
  kSame,      // dtype arg, else self's
  kFloatOnly, // dtype arg, else self's, which must be floating or complex (mean)
  kReal,      // complex -> real (var, std)
  kLong,      // i64 (argmax)
  kBool,      // bool, but uint8 stays uint8 (any, all)
  kIntToFloat // logsumexp
};

struct ReductionSpec {
  int dim_arg;      // -1: reduce everything
  bool dim_is_list; // int[] dim vs int dim
  int keepdim_arg;  // -1: no keepdim
  int dtype_arg;    // -1: none
  RDType rdtype;
  int outputs;      // 1, or 2 (values + indices, or var + mean)
};

absl::StatusOr<TensorType> ReduceShape(const InferContext& ctx, const TensorType& self,
                                       const ReductionSpec& spec) {
  const int64_t rank = self.rank();
  std::vector<bool> reduce(rank, false);
  bool all = spec.dim_arg < 0 || ctx.is_none(spec.dim_arg);
  if (!all) {
    std::vector<int64_t> dims;
    if (spec.dim_is_list) {
      KILN_ASSIGN_OR_RETURN(dims, ctx.IntList(spec.dim_arg));
      all = dims.empty();
    } else {
      KILN_ASSIGN_OR_RETURN(int64_t d, ctx.Int(spec.dim_arg));
      dims.push_back(d);
    }
    for (int64_t d : dims) {
      KILN_ASSIGN_OR_RETURN(int64_t w, WrapDim(d, rank));
      if (rank == 0) continue;
      if (reduce[w]) return absl::InvalidArgumentError(absl::StrCat("dim ", w, " appears multiple times"));
      reduce[w] = true;
    }
  }
  const bool keepdim = spec.keepdim_arg >= 0 && ctx.Bool(spec.keepdim_arg);
  std::vector<SymExpr> sizes;
  for (int64_t i = 0; i < rank; ++i) {
    if (all || reduce[i]) {
      if (keepdim) sizes.push_back(SymExpr::Const(1));
    } else {
      sizes.push_back(self.sizes[i]);
    }
  }
  return NewTensor(self.dtype, std::move(sizes), self);
}

InferFn Reduction(ReductionSpec spec) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
    KILN_ASSIGN_OR_RETURN(TensorType out, ReduceShape(ctx, *self, spec));
    std::optional<DType> dtype_arg = spec.dtype_arg >= 0 ? ctx.OptDType(spec.dtype_arg) : std::nullopt;
    DType d = self->dtype;
    switch (spec.rdtype) {
      case RDType::kSumLike:
        d = dtype_arg ? *dtype_arg : IsIntegralDType(d, true) ? v1::DTYPE_INT64 : d;
        break;
      case RDType::kSame:
        d = dtype_arg.value_or(d);
        break;
      case RDType::kFloatOnly:
        d = dtype_arg.value_or(d);
        if (!IsFloatingDType(d) && !IsComplexDType(d)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mean(): could not infer output dtype. Input dtype must be either a floating point or "
              "complex dtype. Got: ", DTypeName(d)));
        }
        break;
      case RDType::kReal:
        if (dtype_arg) {
          d = *dtype_arg;
          break;
        }
        d = d == v1::DTYPE_COMPLEX64 ? v1::DTYPE_FLOAT32 : d == v1::DTYPE_COMPLEX128 ? v1::DTYPE_FLOAT64 : d;
        if (!IsFloatingDType(d)) {
          return absl::InvalidArgumentError("var/std need a floating point or complex tensor");
        }
        break;
      case RDType::kLong:
        d = v1::DTYPE_INT64;
        break;
      case RDType::kBool:
        d = d == v1::DTYPE_UINT8 ? v1::DTYPE_UINT8 : v1::DTYPE_BOOL;
        break;
      case RDType::kIntToFloat:
        d = IsIntegralDType(d, true) ? kDefaultFloat : d;
        break;
    }
    out.dtype = d;
    if (spec.outputs == 1) return Type::Tensor(std::move(out));
    TensorType second = out;
    if (spec.rdtype == RDType::kReal) {
      second.dtype = self->dtype;  // var_mean: (var, mean)
    } else {
      second.dtype = v1::DTYPE_INT64;  // (values, indices)
    }
    return Type::List({Type::Tensor(std::move(out)), Type::Tensor(std::move(second))});
  };
}

// cumsum/cumprod: same shape, contiguous, dtype like sum's.
absl::StatusOr<Type> InferScan(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_RETURN_IF_ERROR(WrapDim(dim, self->rank()).status());
  DType d = ctx.OptDType(2).value_or(IsIntegralDType(self->dtype, true) ? v1::DTYPE_INT64 : self->dtype);
  return Type::Tensor(NewTensor(d, self->sizes, *self));
}

}  // namespace

void RegisterReductionOps(std::vector<OpSpec>* specs) {
  auto add = [&](const char* schema, ReductionSpec spec) {
    specs->push_back(OpSpec{"aten", schema, OpClass::kReduction, Reduction(spec)});
  };
  using R = RDType;
  add("sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      {1, true, 2, 3, R::kSumLike, 1});
  add("sum(Tensor self, *, ScalarType? dtype=None) -> Tensor", {-1, true, -1, 1, R::kSumLike, 1});
  add("mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      {1, true, 2, 3, R::kFloatOnly, 1});
  add("mean(Tensor self, *, ScalarType? dtype=None) -> Tensor", {-1, true, -1, 1, R::kFloatOnly, 1});
  add("prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      {1, false, 2, 3, R::kSumLike, 1});
  add("prod(Tensor self, *, ScalarType? dtype=None) -> Tensor", {-1, true, -1, 1, R::kSumLike, 1});
  add("amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", {1, true, 2, -1, R::kSame, 1});
  add("amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor", {1, true, 2, -1, R::kSame, 1});
  add("var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
      {1, true, 3, -1, R::kReal, 1});
  add("std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> Tensor",
      {1, true, 3, -1, R::kReal, 1});
  add("var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False) -> (Tensor, Tensor)",
      {1, true, 3, -1, R::kReal, 2});
  add("linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
      {2, true, 3, 4, R::kReal, 1});
  add("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", {1, false, 2, -1, R::kLong, 1});
  add("argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", {1, false, 2, -1, R::kLong, 1});
  add("any.dim(Tensor self, int dim, bool keepdim=False) -> Tensor", {1, false, 2, -1, R::kBool, 1});
  add("any.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor", {1, true, 2, -1, R::kBool, 1});
  add("any(Tensor self) -> Tensor", {-1, true, -1, -1, R::kBool, 1});
  add("all.dim(Tensor self, int dim, bool keepdim=False) -> Tensor", {1, false, 2, -1, R::kBool, 1});
  add("all.dims(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor", {1, true, 2, -1, R::kBool, 1});
  add("all(Tensor self) -> Tensor", {-1, true, -1, -1, R::kBool, 1});
  add("max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
      {1, false, 2, -1, R::kSame, 2});
  add("min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
      {1, false, 2, -1, R::kSame, 2});
  add("max(Tensor self) -> Tensor", {-1, true, -1, -1, R::kSame, 1});
  add("min(Tensor self) -> Tensor", {-1, true, -1, -1, R::kSame, 1});
  specs->push_back(OpSpec{"aten", "cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
                          OpClass::kReduction, InferScan});
  specs->push_back(OpSpec{"aten", "cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor",
                          OpClass::kReduction, InferScan});
  add("logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor", {1, true, 2, -1, R::kIntToFloat, 1});
}

}  // namespace kiln::graph
