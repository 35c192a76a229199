// Pooling (max_pool2d_with_indices, avg_pool2d, _adaptive_avg_pool2d and their backward forms)
// and ops that write into a fresh copy or zeros: slice_scatter, select_scatter,
// as_strided_scatter, slice_backward, select_backward, index_add, flip, repeat, tril/triu.

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

// Layout of a pooling result: channels-last when the input is, else contiguous.
std::vector<SymExpr> PoolStrides(const InferContext& ctx, const TensorType& self, const std::vector<SymExpr>& sizes) {
  if (IsChannelsLast(ctx, self) && !IsContiguous(ctx, self)) return ChannelsLastStrides(sizes);
  return ContiguousStrides(sizes);
}

// int[2] parameter: [] -> `fallback`, [a] -> [a, a].
absl::StatusOr<std::vector<int64_t>> Pair(const InferContext& ctx, int i, const std::vector<int64_t>& fallback) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> v, ctx.IntList(i));
  if (v.empty()) return fallback;
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2) return absl::InvalidArgumentError(absl::StrCat("argument ", i, ": expected 1 or 2 values"));
  return v;
}

absl::StatusOr<SymExpr> PoolOutSize(const InferContext& ctx, const SymExpr& in, int64_t k, int64_t s, int64_t p,
                                    int64_t d, bool ceil_mode) {
  if (k <= 0 || s <= 0 || d <= 0 || p < 0 || p > k / 2) {
    return absl::InvalidArgumentError("pooling: bad kernel_size, stride, padding or dilation");
  }
  const SymExpr num = in + SymExpr::Const(2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0));
  SymExpr out = SymExpr::FloorDiv(num, SymExpr::Const(s)) + SymExpr::Const(1);
  if (ceil_mode && ctx.Hint((out - SymExpr::Const(1)) * SymExpr::Const(s)) >= ctx.Hint(in + SymExpr::Const(p))) {
    out = out - SymExpr::Const(1);
  }
  if (ctx.Hint(out) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("pooling: output size ", out.ToString(), " is too small"));
  }
  return out;
}

// max_pool2d_with_indices and avg_pool2d: (self, kernel, stride, padding, [dilation,] ceil_mode, ...).
InferFn Pool2d(bool with_dilation, bool with_indices) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
    if (self->rank() != 3 && self->rank() != 4) {
      return absl::InvalidArgumentError("pooling: expected a 3-D or 4-D input");
    }
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> k, Pair(ctx, 1, {}));
    if (k.empty()) return absl::InvalidArgumentError("pooling: kernel_size must have 1 or 2 values");
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> s, Pair(ctx, 2, k));
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> p, Pair(ctx, 3, {0, 0}));
    std::vector<int64_t> d = {1, 1};
    if (with_dilation) {
      KILN_ASSIGN_OR_RETURN(d, Pair(ctx, 4, {1, 1}));
    }
    const bool ceil_mode = ctx.Bool(with_dilation ? 5 : 4);
    std::vector<SymExpr> sizes = self->sizes;
    const int64_t h = self->rank() - 2;
    for (int i = 0; i < 2; ++i) {
      KILN_ASSIGN_OR_RETURN(sizes[h + i], PoolOutSize(ctx, self->sizes[h + i], k[i], s[i], p[i], d[i], ceil_mode));
    }
    TensorType out = NewTensor(self->dtype, sizes, *self);
    out.strides = PoolStrides(ctx, *self, sizes);
    if (!with_indices) return Type::Tensor(std::move(out));
    TensorType indices = out;
    indices.dtype = v1::DTYPE_INT64;
    return Type::List({Type::Tensor(std::move(out)), Type::Tensor(std::move(indices))});
  };
}

absl::StatusOr<Type> InferAdaptiveAvgPool(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> size, ctx.SymList(1));
  if ((self->rank() != 3 && self->rank() != 4) || size.size() != 2) {
    return absl::InvalidArgumentError("adaptive_avg_pool2d: expected a 3-D or 4-D input and 2 output sizes");
  }
  std::vector<SymExpr> sizes = self->sizes;
  sizes[self->rank() - 2] = size[0];
  sizes[self->rank() - 1] = size[1];
  TensorType out = NewTensor(self->dtype, sizes, *self);
  out.strides = PoolStrides(ctx, *self, sizes);
  return Type::Tensor(std::move(out));
}

// Backward of a pooling op: a gradient shaped like `self` (argument `self_arg`).
InferFn LikeInput(int self_arg, int dtype_from) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(self_arg));
    KILN_ASSIGN_OR_RETURN(const TensorType* dtype_src, ctx.RequireTensor(dtype_from));
    TensorType out = NewTensor(dtype_src->dtype, self->sizes, *self);
    out.strides = PoolStrides(ctx, *self, self->sizes);
    return Type::Tensor(std::move(out));
  };
}

// slice_scatter / select_scatter: a copy of self (preserve format).
absl::StatusOr<Type> InferScatterCopy(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(const TensorType* src, ctx.RequireTensor(1));
  (void)src;
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(2));
  KILN_RETURN_IF_ERROR(WrapDim(dim, self->rank()).status());
  TensorType out = *self;
  out.storage_offset = SymExpr();
  out.strides = EmptyLikeStrides(ctx, *self);
  return Type::Tensor(std::move(out));
}

// as_strided_scatter: self.clone(), then a strided slice of it overwritten.
absl::StatusOr<Type> InferAsStridedScatter(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> size, ctx.SymList(2));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> stride, ctx.SymList(3));
  if (size.size() != stride.size()) return absl::InvalidArgumentError("as_strided_scatter: mismatch in length of strides and shape");
  TensorType out = *self;
  out.storage_offset = SymExpr();
  out.strides = EmptyLikeStrides(ctx, *self);
  return Type::Tensor(std::move(out));
}

// slice_backward / select_backward: zeros of input_sizes with the gradient written into a slice.
absl::StatusOr<Type> InferSliceBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* grad, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(1));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(2));
  KILN_RETURN_IF_ERROR(WrapDim(dim, static_cast<int64_t>(sizes.size())).status());
  return Type::Tensor(NewTensor(grad->dtype, std::move(sizes), *grad));
}

// A copy of self with self's layout when dense (empty_like), else contiguous.
absl::StatusOr<Type> InferCopyOfSelf(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  TensorType out = *self;
  out.storage_offset = SymExpr();
  out.strides = EmptyLikeStrides(ctx, *self);
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferFlip(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ctx.IntList(1));
  for (int64_t d : dims) KILN_RETURN_IF_ERROR(WrapDim(d, self->rank()).status());
  return InferCopyOfSelf(ctx);
}

absl::StatusOr<Type> InferRepeat(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> repeats, ctx.SymList(1));
  if (static_cast<int64_t>(repeats.size()) < self->rank()) {
    return absl::InvalidArgumentError(
        "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor");
  }
  const size_t lead = repeats.size() - self->rank();
  std::vector<SymExpr> sizes;
  for (size_t i = 0; i < repeats.size(); ++i) {
    if (ctx.Hint(repeats[i]) < 0) return absl::InvalidArgumentError("repeat: negative repeat count");
    sizes.push_back(i < lead ? repeats[i] : repeats[i] * self->sizes[i - lead]);
  }
  return Type::Tensor(NewTensor(self->dtype, std::move(sizes), *self));
}

absl::StatusOr<Type> InferTriangle(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  if (self->rank() < 2) return absl::InvalidArgumentError("tril/triu: input tensor must have at least 2 dimensions");
  return Type::Tensor(NewTensor(self->dtype, self->sizes, *self));
}

}  // namespace

void RegisterPoolOps(std::vector<OpSpec>* specs) {
  auto add = [&](const char* schema, OpClass c, InferFn fn) { specs->push_back(OpSpec{"aten", schema, c, std::move(fn)}); };
  const OpClass kRed = OpClass::kReduction, kOther = OpClass::kOther, kPw = OpClass::kPointwise;
  add("max_pool2d_with_indices(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False) -> (Tensor, Tensor)",
      kRed, Pool2d(true, true));
  add("max_pool2d_with_indices_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode, Tensor indices) -> Tensor",
      kOther, LikeInput(1, 0));
  add("avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor",
      kRed, Pool2d(false, false));
  add("avg_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride, int[2] padding, bool ceil_mode, bool count_include_pad, int? divisor_override) -> Tensor",
      kOther, LikeInput(1, 0));
  add("_adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor", kRed, InferAdaptiveAvgPool);
  add("_adaptive_avg_pool2d_backward(Tensor grad_output, Tensor self) -> Tensor", kOther, LikeInput(1, 0));
  add("slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor",
      kOther, InferScatterCopy);
  add("select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor", kOther, InferScatterCopy);
  add("as_strided_scatter(Tensor self, Tensor src, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor",
      kOther, InferAsStridedScatter);
  add("slice_backward(Tensor grad_output, SymInt[] input_sizes, int dim, SymInt start, SymInt end, SymInt step) -> Tensor",
      kOther, InferSliceBackward);
  add("select_backward(Tensor grad_output, SymInt[] input_sizes, int dim, SymInt index) -> Tensor", kOther,
      InferSliceBackward);
  add("flip(Tensor self, int[] dims) -> Tensor", kOther, InferFlip);
  add("index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor", kOther,
      InferCopyOfSelf);
  add("repeat(Tensor self, SymInt[] repeats) -> Tensor", kOther, InferRepeat);
  add("tril(Tensor self, int diagonal=0) -> Tensor", kPw, InferTriangle);
  add("triu(Tensor self, int diagonal=0) -> Tensor", kPw, InferTriangle);
}

}  // namespace kiln::graph
