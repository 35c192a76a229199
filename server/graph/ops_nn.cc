// Neural-network ops: softmax/log_softmax (+ backward), layer norm and batch norm (+ backward),
// convolution (+ backward), embedding (+ dense backward), gather/scatter/index ops, nll_loss,
// padding and pooling.

#include <algorithm>
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

bool IsHalf(DType d) { return d == v1::DTYPE_FLOAT16 || d == v1::DTYPE_BFLOAT16; }

// A tensor like `t` (empty_like) with another dtype.
TensorType LikeTensor(const InferContext& ctx, const TensorType& t, DType dtype) {
  TensorType out = t;
  out.dtype = dtype;
  out.storage_offset = SymExpr();
  out.strides = EmptyLikeStrides(ctx, t);
  return out;
}

absl::StatusOr<Type> InferSoftmax(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_RETURN_IF_ERROR(WrapDim(dim, self->rank()).status());
  const bool half_to_float = ctx.Bool(2);
  if (half_to_float && !IsHalf(self->dtype)) {
    return absl::InvalidArgumentError("conversion is supported for Half/BFloat16 type only");
  }
  TensorType out = LikeTensor(ctx, *self, half_to_float ? v1::DTYPE_FLOAT32 : self->dtype);
  if (!IsContiguous(ctx, *self)) out.strides.clear();  // backend-dependent: take the graph's
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferSoftmaxBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* grad, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(2));
  KILN_RETURN_IF_ERROR(WrapDim(dim, grad->rank()).status());
  auto dtype = ctx.OptDType(3);
  TensorType out = LikeTensor(ctx, *grad, dtype.value_or(grad->dtype));
  if (!IsContiguous(ctx, *grad)) out.strides.clear();
  return Type::Tensor(std::move(out));
}

// mean/rstd dtype: float for half inputs on CUDA; backend-dependent on CPU (not checked).
DType StatsDType(const TensorType& input) {
  if (!IsHalf(input.dtype)) return input.dtype;
  return input.device == v1::DEVICE_KIND_CUDA ? v1::DTYPE_FLOAT32 : v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Type> InferLayerNorm(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> normalized, ctx.SymList(1));
  const int64_t n = static_cast<int64_t>(normalized.size());
  if (n == 0 || n > input->rank()) {
    return absl::InvalidArgumentError("native_layer_norm: normalized_shape must be non-empty and fit the input");
  }
  const int64_t axis = input->rank() - n;
  for (int64_t i = 0; i < n; ++i) {
    if (!ctx.LikelyEqual(normalized[i], input->sizes[axis + i])) {
      return absl::InvalidArgumentError("native_layer_norm: normalized_shape does not match the input's trailing dims");
    }
  }
  for (int w : {2, 3}) {
    const TensorType* p = ctx.tensor(w);
    if (p != nullptr && p->rank() != n) {
      return absl::InvalidArgumentError("native_layer_norm: weight/bias must have normalized_shape");
    }
  }
  TensorType out = NewTensor(input->dtype, input->sizes, *input);
  std::vector<SymExpr> stat_sizes(input->sizes.begin(), input->sizes.begin() + axis);
  stat_sizes.resize(input->rank(), SymExpr::Const(1));
  TensorType stats = NewTensor(StatsDType(*input), stat_sizes, *input);
  return Type::List({Type::Tensor(out), Type::Tensor(stats), Type::Tensor(stats)});
}

absl::StatusOr<Type> InferGroupNorm(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(SymExpr n, ctx.Sym(3));
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.Int(6));
  if (group <= 0 || input->rank() < 2) return absl::InvalidArgumentError("native_group_norm: bad group or input rank");
  if (!ctx.LikelyEqual(n, input->sizes[0])) return absl::InvalidArgumentError("native_group_norm: N does not match the input");
  TensorType out = LikeTensor(ctx, *input, input->dtype);
  if (!IsContiguous(ctx, *input)) out.strides.clear();  // backend-dependent
  TensorType stats = NewTensor(IsHalf(input->dtype) ? v1::DTYPE_UNSPECIFIED : input->dtype,
                               {n, SymExpr::Const(group)}, *input);
  return Type::List({Type::Tensor(out), Type::Tensor(stats), Type::Tensor(stats)});
}

// Output i of a backward op: like tensor `like` when output_mask[i], else None.
Type MaskedLike(const InferContext& ctx, const std::vector<bool>& mask, size_t i, const TensorType* like,
                bool contiguous) {
  if (i >= mask.size() || !mask[i] || like == nullptr) return Type::None();
  if (contiguous) return Type::Tensor(NewTensor(like->dtype, like->sizes, *like));
  return Type::Tensor(LikeTensor(ctx, *like, like->dtype));
}

absl::StatusOr<std::vector<bool>> BoolMask(const InferContext& ctx, int i) {
  const Arg& a = ctx.arg(i);
  if (a.kind != Arg::Kind::kList) return absl::InvalidArgumentError("output_mask must be a list of bools");
  std::vector<bool> out;
  for (const Arg& b : a.list) out.push_back(b.kind == Arg::Kind::kBool && b.b);
  return out;
}

absl::StatusOr<Type> InferLayerNormBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(1));
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, BoolMask(ctx, 7));
  return Type::List({MaskedLike(ctx, mask, 0, input, true), MaskedLike(ctx, mask, 1, ctx.tensor(5), true),
                     MaskedLike(ctx, mask, 2, ctx.tensor(6), true)});
}

// native_batch_norm and friends: (out, save_mean, save_invstd[, running_mean, running_var]).
InferFn BatchNorm(int training_arg, bool functional) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(0));
    if (input->rank() < 2) return absl::InvalidArgumentError("batch_norm: input must have at least 2 dims");
    const bool training = training_arg < 0 ? false : ctx.Bool(training_arg);
    TensorType out = LikeTensor(ctx, *input, input->dtype);
    TensorType stats = NewTensor(StatsDType(*input), {input->sizes[1]}, *input);
    if (!training) stats.sizes.clear();  // backend-dependent (empty or [C]): not checked
    std::vector<Type> items = {Type::Tensor(out), Type::Tensor(stats), Type::Tensor(stats)};
    if (!training) {
      items[1].kind = Type::Kind::kUnknown;
      items[2].kind = Type::Kind::kUnknown;
    }
    if (functional) {
      for (int i : {3, 4}) {
        KILN_ASSIGN_OR_RETURN(const TensorType* r, ctx.RequireTensor(i));
        TensorType updated = NewTensor(r->dtype, r->sizes, *r);
        // Low-precision running statistics: torch's decomposition (the CPU graph) returns the
        // update in the statistics' f32, CUDA's kernel in the running buffer's own dtype.
        if (r->dtype != stats.dtype) updated.dtype = ::kiln::v1::DTYPE_UNSPECIFIED;
        items.push_back(Type::Tensor(std::move(updated)));
      }
    }
    return Type::List(std::move(items));
  };
}

absl::StatusOr<Type> InferBatchNormBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(1));
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, BoolMask(ctx, 9));
  const TensorType* weight = ctx.tensor(2);
  Type gi = MaskedLike(ctx, mask, 0, input, false);
  // Its strides are not checked: torch's decomposition (what fake tensors and the meta device
  // compute) orders them as elementwise ops over grad_out and input do, CUDA's kernel as input's
  // suggested memory format; they differ once one of the two is channels-last and the other not
  // (a training backward whose saved activations kilnd made channels-last, kiln.layouts). kiln's
  // kernels write the strides the graph states.
  // Unasked by output_mask, it is not checked at all: torch's decomposition (the meta function
  // behind fake tensors) returns grad_input anyway (kiln computes it only when asked).
  if (gi.kind == Type::Kind::kTensor) {
    gi.tensor.strides.clear();
  } else {
    gi = Type{};
  }
  Type gw = Type::None(), gb = Type::None();
  if (input->rank() >= 2) {
    TensorType c = NewTensor(weight ? weight->dtype : input->dtype, {input->sizes[1]}, *input);
    if (mask.size() > 1 && mask[1]) gw = Type::Tensor(c);
    if (mask.size() > 2 && mask[2]) gb = Type::Tensor(c);
  }
  return Type::List({gi, gw, gb});
}

absl::StatusOr<std::vector<SymExpr>> ConvParams(const InferContext& ctx, int i, size_t n, const char* what) {
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> v, ctx.SymList(i));
  if (v.size() == 1 && n > 1) v.assign(n, v[0]);
  if (v.size() != n) return absl::InvalidArgumentError(absl::StrCat("convolution: expected ", what, " to have ", n, " elements"));
  return v;
}

// Output memory format of a convolution: channels-last when the input or weight is.
std::vector<SymExpr> ConvStrides(const InferContext& ctx, const TensorType& input, const TensorType& weight,
                                 const std::vector<SymExpr>& sizes) {
  const bool cl = (IsChannelsLast(ctx, input) && !IsContiguous(ctx, input)) ||
                  (IsChannelsLast(ctx, weight) && !IsContiguous(ctx, weight));
  return cl ? ChannelsLastStrides(sizes) : ContiguousStrides(sizes);
}

absl::StatusOr<Type> InferConvolution(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(const TensorType* weight, ctx.RequireTensor(1));
  const int64_t rank = input->rank();
  if (rank < 3 || weight->rank() != rank) {
    return absl::InvalidArgumentError("convolution: expected input and weight of the same rank >= 3");
  }
  const size_t nsp = static_cast<size_t>(rank - 2);
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> stride, ConvParams(ctx, 3, nsp, "stride"));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> padding, ConvParams(ctx, 4, nsp, "padding"));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> dilation, ConvParams(ctx, 5, nsp, "dilation"));
  const bool transposed = ctx.Bool(6);
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> out_pad, ConvParams(ctx, 7, nsp, "output_padding"));
  KILN_ASSIGN_OR_RETURN(SymExpr groups, ctx.Sym(8));
  if (ctx.Hint(groups) <= 0) return absl::InvalidArgumentError("convolution: non-positive groups is not supported");
  if (input->dtype != weight->dtype) {
    return absl::InvalidArgumentError(absl::StrCat("convolution: input type (", DTypeName(input->dtype),
                                                   ") and weight type (", DTypeName(weight->dtype), ") should be the same"));
  }
  const SymExpr one = SymExpr::Const(1);
  std::vector<SymExpr> sizes = {input->sizes[0], transposed ? weight->sizes[1] * groups : weight->sizes[0]};
  for (size_t i = 0; i < nsp; ++i) {
    const SymExpr in = input->sizes[2 + i], k = weight->sizes[2 + i];
    if (ctx.Hint(stride[i]) <= 0) return absl::InvalidArgumentError("convolution: non-positive stride");
    SymExpr o;
    if (transposed) {
      o = (in - one) * stride[i] - SymExpr::Const(2) * padding[i] + dilation[i] * (k - one) + out_pad[i] + one;
    } else {
      o = SymExpr::FloorDiv(in + SymExpr::Const(2) * padding[i] - dilation[i] * (k - one) - one, stride[i]) + one;
    }
    if (ctx.Hint(o) <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("convolution: calculated output size ", o.ToString(),
                                                     " is too small"));
    }
    sizes.push_back(o);
  }
  TensorType out = NewTensor(input->dtype, sizes, *input);
  out.strides = ConvStrides(ctx, *input, *weight, sizes);
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferConvolutionBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* grad, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(const TensorType* input, ctx.RequireTensor(1));
  KILN_ASSIGN_OR_RETURN(const TensorType* weight, ctx.RequireTensor(2));
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, BoolMask(ctx, 10));
  std::vector<Type> items(3, Type::None());
  if (mask.size() > 0 && mask[0]) {
    TensorType gi = NewTensor(grad->dtype, input->sizes, *input);
    gi.strides = ConvStrides(ctx, *input, *weight, input->sizes);
    items[0] = Type::Tensor(std::move(gi));
  }
  if (mask.size() > 1 && mask[1]) {
    TensorType gw = NewTensor(grad->dtype, weight->sizes, *weight);
    gw.strides = ConvStrides(ctx, *input, *weight, weight->sizes);
    items[1] = Type::Tensor(std::move(gw));
  }
  if (mask.size() > 2 && mask[2] && grad->rank() >= 2) {
    items[2] = Type::Tensor(NewTensor(grad->dtype, {grad->sizes[1]}, *grad));
  }
  return Type::List(std::move(items));
}

absl::StatusOr<Type> InferEmbedding(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* weight, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(const TensorType* indices, ctx.RequireTensor(1));
  if (weight->rank() != 2) return absl::InvalidArgumentError("embedding: 'weight' must be 2-D");
  if (indices->dtype != v1::DTYPE_INT64 && indices->dtype != v1::DTYPE_INT32) {
    return absl::InvalidArgumentError("embedding: indices must be int32 or int64");
  }
  std::vector<SymExpr> sizes = indices->sizes;
  sizes.push_back(weight->sizes[1]);
  return Type::Tensor(NewTensor(weight->dtype, std::move(sizes), *weight));
}

absl::StatusOr<Type> InferEmbeddingBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* grad, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(SymExpr num_weights, ctx.Sym(2));
  if (grad->rank() == 0) return absl::InvalidArgumentError("embedding_dense_backward: 0-dim grad");
  return Type::Tensor(NewTensor(grad->dtype, {num_weights, grad->sizes.back()}, *grad));
}

absl::StatusOr<Type> InferGather(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(const TensorType* index, ctx.RequireTensor(2));
  KILN_RETURN_IF_ERROR(WrapDim(dim, self->rank()).status());
  // torch accepts int64 and int32 indices, and an empty index of any dtype (nothing is indexed).
  const bool empty_index = std::any_of(index->sizes.begin(), index->sizes.end(),
                                       [](const SymExpr& s) { return s.is_const(0); });
  if (index->dtype != v1::DTYPE_INT64 && index->dtype != v1::DTYPE_INT32 && !empty_index) {
    return absl::InvalidArgumentError("gather(): Expected dtype int64 or int32 for index");
  }
  if (!empty_index && std::max<int64_t>(index->rank(), 1) != std::max<int64_t>(self->rank(), 1)) {
    return absl::InvalidArgumentError("Index tensor must have the same number of dimensions as input tensor");
  }
  return Type::Tensor(NewTensor(self->dtype, index->sizes, *self));
}

absl::StatusOr<Type> InferScatter(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_RETURN_IF_ERROR(WrapDim(dim, self->rank()).status());
  KILN_ASSIGN_OR_RETURN(const TensorType* index, ctx.RequireTensor(2));
  if (index->dtype != v1::DTYPE_INT64 && index->dtype != v1::DTYPE_INT32) {
    return absl::InvalidArgumentError("scatter(): Expected dtype int64 or int32 for index");
  }
  return Type::Tensor(LikeTensor(ctx, *self, self->dtype));
}

absl::StatusOr<Type> InferIndexSelect(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(const TensorType* index, ctx.RequireTensor(2));
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self->rank()));
  if (index->rank() > 1) return absl::InvalidArgumentError("index_select(): Index is supposed to be a vector");
  std::vector<SymExpr> sizes = self->sizes;
  if (!sizes.empty()) sizes[dim] = NumElements(index->sizes);
  return Type::Tensor(NewTensor(self->dtype, std::move(sizes), *self));
}

absl::StatusOr<Type> InferIndex(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<const TensorType*> indices, ctx.TensorList(1));
  if (static_cast<int64_t>(indices.size()) > self->rank()) {
    return absl::InvalidArgumentError("index: too many indices for tensor");
  }
  std::vector<const std::vector<SymExpr>*> shapes;
  int64_t first = -1, last = -1;
  bool adjacent = true;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] == nullptr) continue;
    if (indices[i]->dtype == v1::DTYPE_BOOL || indices[i]->dtype == v1::DTYPE_UINT8) return Type();  // data-dependent
    if (!IsIntegralDType(indices[i]->dtype, false)) {
      return absl::InvalidArgumentError("tensors used as indices must be long, int, byte or bool tensors");
    }
    if (first < 0) first = static_cast<int64_t>(i);
    if (last >= 0 && last + 1 != static_cast<int64_t>(i)) adjacent = false;
    last = static_cast<int64_t>(i);
    shapes.push_back(&indices[i]->sizes);
  }
  if (shapes.empty()) return Type::Tensor(*self);
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> bshape, BroadcastShapes(ctx, shapes));
  std::vector<SymExpr> sizes;
  if (adjacent) {
    sizes.assign(self->sizes.begin(), self->sizes.begin() + first);
    sizes.insert(sizes.end(), bshape.begin(), bshape.end());
    sizes.insert(sizes.end(), self->sizes.begin() + last + 1, self->sizes.end());
  } else {
    sizes = bshape;
    for (int64_t i = 0; i < self->rank(); ++i) {
      if (i >= static_cast<int64_t>(indices.size()) || indices[i] == nullptr) sizes.push_back(self->sizes[i]);
    }
  }
  TensorType out = NewTensor(self->dtype, std::move(sizes), *self);
  if (out.rank() > 0) out.strides.clear();  // TensorIterator over restrided operands: take the graph's
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferIndexPut(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  return Type::Tensor(LikeTensor(ctx, *self, self->dtype));
}

absl::StatusOr<Type> InferNllLoss(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t reduction, ctx.Int(3));
  if (self->rank() < 1 || self->rank() > 2) return absl::InvalidArgumentError("nll_loss: input tensor should be 1D or 2D");
  std::vector<SymExpr> sizes;
  if (reduction == 0 && self->rank() == 2) sizes.push_back(self->sizes[0]);
  return Type::List({Type::Tensor(NewTensor(self->dtype, sizes, *self)), Type::Tensor(NewTensor(self->dtype, {}, *self))});
}

absl::StatusOr<Type> InferNllLossBackward(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(1));
  return Type::Tensor(NewTensor(self->dtype, self->sizes, *self));
}

absl::StatusOr<Type> InferConstantPad(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> pad, ctx.SymList(1));
  if (pad.size() % 2 != 0 || static_cast<int64_t>(pad.size() / 2) > self->rank()) {
    return absl::InvalidArgumentError("constant_pad_nd: padding length must be even and at most twice the rank");
  }
  std::vector<SymExpr> sizes = self->sizes;
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    SymExpr& s = sizes[self->rank() - 1 - i];
    s = s + pad[2 * i] + pad[2 * i + 1];
    if (ctx.Hint(s) < 0) return absl::InvalidArgumentError("constant_pad_nd: resulting size is negative");
  }
  TensorType out = NewTensor(self->dtype, sizes, *self);
  if (IsChannelsLast(ctx, *self) && !IsContiguous(ctx, *self)) out.strides = ChannelsLastStrides(out.sizes);
  return Type::Tensor(std::move(out));
}

}  // namespace

void RegisterNnOps(std::vector<OpSpec>* specs) {
  auto add = [&](const char* schema, OpClass c, InferFn fn) { specs->push_back(OpSpec{"aten", schema, c, std::move(fn)}); };
  const OpClass kRed = OpClass::kReduction, kOther = OpClass::kOther, kExt = OpClass::kExtern;
  add("_softmax(Tensor self, int dim, bool half_to_float) -> Tensor", kRed, InferSoftmax);
  add("_log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor", kRed, InferSoftmax);
  add("_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor", kRed,
      InferSoftmaxBackward);
  add("_log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype) -> Tensor", kRed,
      InferSoftmaxBackward);
  add("native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
      kRed, InferLayerNorm);
  add("native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      kRed, InferLayerNormBackward);
  add("native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C, SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)",
      kRed, InferGroupNorm);
  add("native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
      kRed, BatchNorm(5, false));
  add("_native_batch_norm_legit_functional(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      kRed, BatchNorm(5, true));
  add("_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)",
      kRed, BatchNorm(-1, false));
  add("native_batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor? running_mean, Tensor? running_var, Tensor? save_mean, Tensor? save_invstd, bool train, float eps, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      kRed, InferBatchNormBackward);
  add("convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor",
      kExt, InferConvolution);
  add("convolution_backward(Tensor grad_output, Tensor input, Tensor weight, SymInt[]? bias_sizes, SymInt[] stride, SymInt[] padding, SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      kExt, InferConvolutionBackward);
  add("embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False, bool sparse=False) -> Tensor",
      kOther, InferEmbedding);
  add("embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights, SymInt padding_idx, bool scale_grad_by_freq) -> Tensor",
      kOther, InferEmbeddingBackward);
  add("gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor", kOther, InferGather);
  add("scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", kOther, InferScatter);
  add("scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor", kOther, InferScatter);
  add("scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor", kOther, InferScatter);
  add("index_select(Tensor self, int dim, Tensor index) -> Tensor", kOther, InferIndexSelect);
  add("index.Tensor(Tensor self, Tensor?[] indices) -> Tensor", kOther, InferIndex);
  add("index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor", kOther, InferIndexPut);
  add("nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index) -> (Tensor output, Tensor total_weight)",
      kRed, InferNllLoss);
  add("nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight, int reduction, SymInt ignore_index, Tensor total_weight) -> Tensor",
      kOther, InferNllLossBackward);
  add("constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor", kOther, InferConstantPad);
}

}  // namespace kiln::graph
