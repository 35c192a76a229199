// Views and shape ops: view/_unsafe_view/reshape (torch's computeStride, refusing what torch
// refuses), permute, transpose, t, expand, squeeze, unsqueeze, slice, select, narrow, split,
// split_with_sizes, unbind, as_strided, alias, unfold; and the copying shape ops cat and stack.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/graph/infer.h"
#include "server/graph/op_registry.h"
#include "server/base/status_macros.h"

namespace kiln::graph {

namespace {

namespace v1 = ::kiln::v1;

std::string Shape(const std::vector<SymExpr>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", ", [](std::string* o, const SymExpr& e) {
                        o->append(e.ToString());
                      }), "]");
}

// Resolves a single -1 in `sizes` against the element count of `self`.
absl::Status InferSize(const InferContext& ctx, const TensorType& self, std::vector<SymExpr>* sizes) {
  const SymExpr numel = NumElements(self.sizes);
  int infer = -1;
  std::vector<SymExpr> known;
  for (size_t i = 0; i < sizes->size(); ++i) {
    const SymExpr& s = (*sizes)[i];
    if (s.is_const(-1)) {
      if (infer >= 0) return absl::InvalidArgumentError("only one dimension can be inferred");
      infer = static_cast<int>(i);
    } else if (s.is_const() && s.value() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("invalid shape dimension ", s.value()));
    } else {
      known.push_back(s);
    }
  }
  const SymExpr known_numel = SymExpr::Mul(known);
  if (infer >= 0) {
    if (ctx.Hint(known_numel, 1) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot reshape tensor of ", numel.ToString(),
                                                     " elements into shape ", Shape(*sizes)));
    }
    (*sizes)[infer] = SymExpr::FloorDiv(numel, known_numel);
  }
  if (!ctx.LikelyEqual(SymExpr::Mul(*sizes), numel)) {
    return absl::InvalidArgumentError(absl::StrCat("shape '", Shape(*sizes), "' is invalid for input of size ",
                                                   numel.ToString()));
  }
  return absl::OkStatus();
}

enum class ViewKind { kView, kUnsafeView, kReshape };

InferFn View(ViewKind kind) {
  return [=](const InferContext& ctx) -> absl::StatusOr<Type> {
    KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
    KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(1));
    KILN_RETURN_IF_ERROR(InferSize(ctx, *self, &sizes));
    TensorType out = *self;
    auto strides = ViewStrides(ctx, *self, sizes);
    if (strides) {
      out.strides = *strides;
    } else if (kind == ViewKind::kView) {
      return absl::InvalidArgumentError(
          "view size is not compatible with input tensor's size and stride (at least one dimension "
          "spans across two contiguous subspaces). Use .reshape(...) instead.");
    } else {
      out.strides = ContiguousStrides(sizes);
      out.storage_offset = SymExpr();
    }
    out.sizes = std::move(sizes);
    return Type::Tensor(std::move(out));
  };
}

absl::StatusOr<Type> InferPermute(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ctx.IntList(1));
  if (static_cast<int64_t>(dims.size()) != self->rank()) {
    return absl::InvalidArgumentError("permute: number of dims don't match");
  }
  TensorType out = *self;
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t d, WrapDim(dims[i], self->rank()));
    if (seen[d]) return absl::InvalidArgumentError("permute: repeated dim");
    seen[d] = true;
    out.sizes[i] = self->sizes[d];
    out.strides[i] = self->strides[d];
  }
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> Transpose(const TensorType& self, int64_t d0, int64_t d1) {
  KILN_ASSIGN_OR_RETURN(d0, WrapDim(d0, self.rank()));
  KILN_ASSIGN_OR_RETURN(d1, WrapDim(d1, self.rank()));
  TensorType out = self;
  if (self.rank() > 0) {
    std::swap(out.sizes[d0], out.sizes[d1]);
    std::swap(out.strides[d0], out.strides[d1]);
  }
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferTranspose(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t d0, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(int64_t d1, ctx.Int(2));
  return Transpose(*self, d0, d1);
}

absl::StatusOr<Type> InferT(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  if (self->rank() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("t() expects a tensor with <= 2 dimensions, but self is ",
                                                   self->rank(), "D"));
  }
  if (self->rank() < 2) return Type::Tensor(*self);
  return Transpose(*self, 0, 1);
}

absl::StatusOr<Type> InferExpand(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(1));
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  if (ndim < self->rank()) {
    return absl::InvalidArgumentError(absl::StrCat("expand: the number of sizes provided (", ndim,
                                                   ") must be >= the number of dimensions (", self->rank(), ")"));
  }
  TensorType out = *self;
  out.sizes.assign(ndim, SymExpr());
  out.strides.assign(ndim, SymExpr());
  for (int64_t i = ndim - 1; i >= 0; --i) {
    const int64_t dim = self->rank() - 1 - (ndim - 1 - i);
    SymExpr size = dim >= 0 ? self->sizes[dim] : SymExpr::Const(1);
    SymExpr stride = dim >= 0 ? self->strides[dim]
                              : (i + 1 < ndim ? out.sizes[i + 1] * out.strides[i + 1] : SymExpr::Const(1));
    SymExpr target = sizes[i];
    if (target.is_const(-1)) {
      if (dim < 0) return absl::InvalidArgumentError("expand: -1 is not allowed in a leading, non-existing dimension");
      target = size;
    }
    if (!ctx.LikelyEqual(size, target)) {
      if (ctx.Hint(size, -1) != 1) {
        return absl::InvalidArgumentError(absl::StrCat("expand: the expanded size of the tensor (", target.ToString(),
                                                       ") must match the existing size (", size.ToString(),
                                                       ") at non-singleton dimension ", i));
      }
      stride = SymExpr();
    }
    out.sizes[i] = target;
    out.strides[i] = stride;
  }
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> Squeeze(const InferContext& ctx, const TensorType& self, std::vector<int64_t> dims,
                             bool all) {
  std::vector<bool> drop(self.rank(), false);
  if (all) {
    for (int64_t i = 0; i < self.rank(); ++i) drop[i] = self.sizes[i].is_const(1);
  }
  for (int64_t d : dims) {
    KILN_ASSIGN_OR_RETURN(int64_t w, WrapDim(d, self.rank()));
    if (self.rank() > 0 && ctx.Hint(self.sizes[w], -1) == 1) drop[w] = true;
  }
  TensorType out = self;
  out.sizes.clear();
  out.strides.clear();
  for (int64_t i = 0; i < self.rank(); ++i) {
    if (drop[i]) continue;
    out.sizes.push_back(self.sizes[i]);
    out.strides.push_back(self.strides[i]);
  }
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferSqueezeDim(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t d, ctx.Int(1));
  return Squeeze(ctx, *self, {d}, false);
}
absl::StatusOr<Type> InferSqueezeDims(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> d, ctx.IntList(1));
  return Squeeze(ctx, *self, d, false);
}
absl::StatusOr<Type> InferSqueezeAll(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  return Squeeze(ctx, *self, {}, true);
}

absl::StatusOr<Type> InferUnsqueeze(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t d, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(d, WrapDim(d, self->rank() + 1));
  TensorType out = *self;
  SymExpr stride = d >= self->rank() ? SymExpr::Const(1) : self->sizes[d] * self->strides[d];
  out.sizes.insert(out.sizes.begin() + d, SymExpr::Const(1));
  out.strides.insert(out.strides.begin() + d, stride);
  return Type::Tensor(std::move(out));
}

// self[..., start:end:step, ...] along `dim`; start/end may be None (nullopt).
absl::StatusOr<TensorType> Slice(const InferContext& ctx, const TensorType& self, int64_t dim,
                                 std::optional<SymExpr> start, std::optional<SymExpr> end, int64_t step) {
  if (self.rank() == 0) return absl::InvalidArgumentError("slice() cannot be applied to a 0-dim tensor");
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self.rank()));
  if (step <= 0) return absl::InvalidArgumentError("slice step must be positive");
  const SymExpr size = self.sizes[dim];
  const int64_t hsize = ctx.Hint(size, 0);
  SymExpr s = start.value_or(SymExpr());
  SymExpr e = end.value_or(size);
  if (ctx.Hint(s) < 0) s = s + size;
  if (ctx.Hint(e) < 0) e = e + size;
  if (ctx.Hint(s) < 0) s = SymExpr();
  if (ctx.Hint(s) > hsize) s = size;
  if (ctx.Hint(e) >= hsize) e = size;
  if (ctx.Hint(e) < ctx.Hint(s)) e = s;
  TensorType out = self;
  out.storage_offset = self.storage_offset + s * self.strides[dim];
  out.sizes[dim] = SymExpr::CeilDiv(e - s, SymExpr::Const(step));
  out.strides[dim] = self.strides[dim] * SymExpr::Const(step);
  return out;
}

absl::StatusOr<Type> InferSlice(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  std::optional<SymExpr> start, end;
  if (!ctx.is_none(2)) {
    KILN_ASSIGN_OR_RETURN(start, ctx.Sym(2));
  }
  if (!ctx.is_none(3)) {
    KILN_ASSIGN_OR_RETURN(end, ctx.Sym(3));
  }
  KILN_ASSIGN_OR_RETURN(int64_t step, ctx.Int(4));
  KILN_ASSIGN_OR_RETURN(TensorType out, Slice(ctx, *self, dim, start, end, step));
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferNarrow(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(SymExpr start, ctx.Sym(2));
  KILN_ASSIGN_OR_RETURN(SymExpr length, ctx.Sym(3));
  if (ctx.Hint(length) < 0) return absl::InvalidArgumentError("narrow(): length must be non-negative");
  KILN_ASSIGN_OR_RETURN(TensorType out, Slice(ctx, *self, dim, start, start + length, 1));
  return Type::Tensor(std::move(out));
}

absl::StatusOr<TensorType> Select(const InferContext& ctx, const TensorType& self, int64_t dim, SymExpr index) {
  if (self.rank() == 0) return absl::InvalidArgumentError("select() cannot be applied to a 0-dim tensor");
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self.rank()));
  const int64_t hsize = ctx.Hint(self.sizes[dim], 0);
  const int64_t hindex = ctx.Hint(index);
  if (hindex < -hsize || hindex >= hsize) {
    return absl::InvalidArgumentError(absl::StrCat("select(): index ", index.ToString(),
                                                   " out of range for tensor of size ", Shape(self.sizes),
                                                   " at dimension ", dim));
  }
  if (hindex < 0) index = index + self.sizes[dim];
  TensorType out = self;
  out.storage_offset = self.storage_offset + index * self.strides[dim];
  out.sizes.erase(out.sizes.begin() + dim);
  out.strides.erase(out.strides.begin() + dim);
  return out;
}

absl::StatusOr<Type> InferSelect(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(SymExpr index, ctx.Sym(2));
  KILN_ASSIGN_OR_RETURN(TensorType out, Select(ctx, *self, dim, index));
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> SplitSizes(const InferContext& ctx, const TensorType& self, int64_t dim,
                                const std::vector<SymExpr>& sizes) {
  std::vector<Type> items;
  SymExpr start;
  for (const SymExpr& s : sizes) {
    KILN_ASSIGN_OR_RETURN(TensorType piece, Slice(ctx, self, dim, start, start + s, 1));
    piece.sizes[dim < 0 ? dim + self.rank() : dim] = s;
    items.push_back(Type::Tensor(std::move(piece)));
    start = start + s;
  }
  return Type::List(std::move(items));
}

absl::StatusOr<Type> InferSplit(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(SymExpr split, ctx.Sym(1));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(2));
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self->rank()));
  if (self->rank() == 0) return absl::InvalidArgumentError("split() cannot be applied to a 0-dim tensor");
  const SymExpr size = self->sizes[dim];
  const int64_t hsplit = ctx.Hint(split), hsize = ctx.Hint(size);
  if (hsplit < 0 || (hsplit == 0 && hsize != 0)) {
    return absl::InvalidArgumentError("split_size can only be 0 if dimension size is 0");
  }
  const int64_t chunks = hsplit == 0 ? 1 : std::max<int64_t>((hsize + hsplit - 1) / hsplit, 1);
  if (chunks > 65536) return absl::InvalidArgumentError("split: too many chunks");
  std::vector<SymExpr> sizes(chunks, split);
  sizes.back() = size - split * SymExpr::Const(chunks - 1);
  return SplitSizes(ctx, *self, dim, sizes);
}

absl::StatusOr<Type> InferSplitWithSizes(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(std::vector<SymExpr> sizes, ctx.SymList(1));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(2));
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self->rank()));
  if (self->rank() == 0) return absl::InvalidArgumentError("split() cannot be applied to a 0-dim tensor");
  if (!ctx.LikelyEqual(SymExpr::Add(sizes), self->sizes[dim])) {
    return absl::InvalidArgumentError(absl::StrCat("split_with_sizes expects split_sizes to sum exactly to ",
                                                   self->sizes[dim].ToString()));
  }
  return SplitSizes(ctx, *self, dim, sizes);
}

absl::StatusOr<Type> InferUnbind(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self->rank()));
  if (self->rank() == 0) return absl::InvalidArgumentError("unbind() cannot be applied to a 0-dim tensor");
  const int64_t n = ctx.Hint(self->sizes[dim]);
  if (!self->sizes[dim].is_const() || n > 65536) {
    return absl::InvalidArgumentError("unbind() needs a small constant dimension size");
  }
  std::vector<Type> items;
  for (int64_t i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(TensorType t, Select(ctx, *self, dim, SymExpr::Const(i)));
    items.push_back(Type::Tensor(std::move(t)));
  }
  return Type::List(std::move(items));
}

absl::StatusOr<Type> InferAsStrided(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  TensorType out = *self;
  KILN_ASSIGN_OR_RETURN(out.sizes, ctx.SymList(1));
  KILN_ASSIGN_OR_RETURN(out.strides, ctx.SymList(2));
  if (out.sizes.size() != out.strides.size()) {
    return absl::InvalidArgumentError("as_strided: mismatch in length of strides and shape");
  }
  for (const SymExpr& s : out.strides) {
    if (ctx.Hint(s) < 0) return absl::InvalidArgumentError("as_strided: negative strides are not supported");
  }
  if (ctx.num_args() > 3 && !ctx.is_none(3)) {
    KILN_ASSIGN_OR_RETURN(out.storage_offset, ctx.Sym(3));
  }
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferAlias(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  return Type::Tensor(*self);
}

absl::StatusOr<Type> InferUnfold(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const TensorType* self, ctx.RequireTensor(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  KILN_ASSIGN_OR_RETURN(int64_t size, ctx.Int(2));
  KILN_ASSIGN_OR_RETURN(int64_t step, ctx.Int(3));
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, self->rank()));
  if (step <= 0 || size < 0) return absl::InvalidArgumentError("unfold: step must be > 0 and size >= 0");
  TensorType out = *self;
  if (self->rank() == 0) {
    out.sizes.push_back(SymExpr::Const(size));
    out.strides.push_back(SymExpr::Const(1));
    return Type::Tensor(std::move(out));
  }
  if (ctx.Hint(self->sizes[dim]) < size) return absl::InvalidArgumentError("unfold: size is larger than the dimension");
  out.sizes[dim] = SymExpr::FloorDiv(self->sizes[dim] - SymExpr::Const(size), SymExpr::Const(step)) + SymExpr::Const(1);
  out.strides[dim] = self->strides[dim] * SymExpr::Const(step);
  out.sizes.push_back(SymExpr::Const(size));
  out.strides.push_back(self->strides[dim]);
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferCat(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<const TensorType*> all, ctx.TensorList(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  std::vector<const TensorType*> tensors;
  std::vector<Operand> ops;
  for (const TensorType* t : all) {
    if (t == nullptr) return absl::InvalidArgumentError("cat: expected tensors, got None");
    ops.push_back(Operand{t});
    const bool legacy_empty = t->rank() == 1 && t->sizes[0].is_const(0);
    if (!legacy_empty) tensors.push_back(t);
  }
  if (ops.empty()) return absl::InvalidArgumentError("cat expects a non-empty list of tensors");
  KILN_ASSIGN_OR_RETURN(DType dtype, ResultType(ops));
  if (tensors.empty()) return Type::Tensor(NewTensor(dtype, {SymExpr()}, *all[0]));
  const TensorType& first = *tensors[0];
  if (first.rank() == 0) return absl::InvalidArgumentError("zero-dimensional tensor cannot be concatenated");
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, first.rank()));
  std::vector<SymExpr> sizes = first.sizes;
  std::vector<SymExpr> along = {first.sizes[dim]};
  bool all_cl = IsChannelsLast(ctx, first) && !IsContiguous(ctx, first);
  for (size_t k = 1; k < tensors.size(); ++k) {
    const TensorType& t = *tensors[k];
    if (t.rank() != first.rank()) {
      return absl::InvalidArgumentError(absl::StrCat("Tensors must have same number of dimensions: got ",
                                                     first.rank(), " and ", t.rank()));
    }
    for (int64_t i = 0; i < t.rank(); ++i) {
      if (i != dim && !ctx.LikelyEqual(t.sizes[i], first.sizes[i])) {
        return absl::InvalidArgumentError(absl::StrCat("Sizes of tensors must match except in dimension ", dim,
                                                       ": expected ", first.sizes[i].ToString(), " but got ",
                                                       t.sizes[i].ToString(), " for tensor number ", k));
      }
    }
    along.push_back(t.sizes[dim]);
    all_cl = all_cl && IsChannelsLast(ctx, t) && !IsContiguous(ctx, t);
  }
  sizes[dim] = SymExpr::Add(along);
  TensorType out = NewTensor(dtype, sizes, first);
  if (all_cl) out.strides = ChannelsLastStrides(out.sizes);
  return Type::Tensor(std::move(out));
}

absl::StatusOr<Type> InferStack(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<const TensorType*> all, ctx.TensorList(0));
  KILN_ASSIGN_OR_RETURN(int64_t dim, ctx.Int(1));
  if (all.empty() || all[0] == nullptr) return absl::InvalidArgumentError("stack expects a non-empty list of tensors");
  std::vector<Operand> ops;
  for (const TensorType* t : all) {
    if (t == nullptr) return absl::InvalidArgumentError("stack: expected tensors, got None");
    if (t->rank() != all[0]->rank()) return absl::InvalidArgumentError("stack expects each tensor to be equal size");
    for (int64_t i = 0; i < t->rank(); ++i) {
      if (!ctx.LikelyEqual(t->sizes[i], all[0]->sizes[i])) {
        return absl::InvalidArgumentError("stack expects each tensor to be equal size");
      }
    }
    ops.push_back(Operand{t});
  }
  KILN_ASSIGN_OR_RETURN(DType dtype, ResultType(ops));
  KILN_ASSIGN_OR_RETURN(dim, WrapDim(dim, all[0]->rank() + 1));
  std::vector<SymExpr> sizes = all[0]->sizes;
  sizes.insert(sizes.begin() + dim, SymExpr::Const(static_cast<int64_t>(all.size())));
  return Type::Tensor(NewTensor(dtype, std::move(sizes), *all[0]));
}

}  // namespace

void RegisterViewOps(std::vector<OpSpec>* specs) {
  auto view = [&](const char* schema, InferFn fn) {
    specs->push_back(OpSpec{"aten", schema, OpClass::kView, std::move(fn)});
  };
  view("view(Tensor(a) self, SymInt[] size) -> Tensor(a)", View(ViewKind::kView));
  view("_unsafe_view(Tensor self, SymInt[] size) -> Tensor", View(ViewKind::kUnsafeView));
  view("reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)", View(ViewKind::kReshape));
  view("permute(Tensor(a) self, int[] dims) -> Tensor(a)", InferPermute);
  view("transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", InferTranspose);
  view("t(Tensor(a) self) -> Tensor(a)", InferT);
  view("expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)", InferExpand);
  view("squeeze.dim(Tensor(a) self, int dim) -> Tensor(a)", InferSqueezeDim);
  view("squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a)", InferSqueezeDims);
  view("squeeze(Tensor(a) self) -> Tensor(a)", InferSqueezeAll);
  view("unsqueeze(Tensor(a) self, int dim) -> Tensor(a)", InferUnsqueeze);
  view("slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)",
       InferSlice);
  view("narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)", InferNarrow);
  view("select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)", InferSelect);
  view("split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]", InferSplit);
  view("split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]",
       InferSplitWithSizes);
  view("unsafe_split.Tensor(Tensor self, SymInt split_size, int dim=0) -> Tensor[]", InferSplit);
  view("unsafe_split_with_sizes(Tensor self, SymInt[] split_sizes, int dim=0) -> Tensor[]", InferSplitWithSizes);
  view("unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]", InferUnbind);
  view("as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)",
       InferAsStrided);
  view("_reshape_alias(Tensor(a) self, SymInt[] size, SymInt[] stride) -> Tensor(a)", InferAsStrided);
  view("alias(Tensor(a) self) -> Tensor(a)", InferAlias);
  view("detach(Tensor(a) self) -> Tensor(a)", InferAlias);
  view("unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)", InferUnfold);
  specs->push_back(OpSpec{"aten", "cat(Tensor[] tensors, int dim=0) -> Tensor", OpClass::kOther, InferCat});
  specs->push_back(OpSpec{"aten", "stack(Tensor[] tensors, int dim=0) -> Tensor", OpClass::kOther, InferStack});
}

}  // namespace kiln::graph
