#include "server/graph/infer.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::graph {

namespace v1 = ::kiln::v1;

namespace {

constexpr DType kUndef = v1::DTYPE_UNSPECIFIED;

bool IsNewUnsigned(DType d) {
  return d == v1::DTYPE_UINT16 || d == v1::DTYPE_UINT32 || d == v1::DTYPE_UINT64;
}
bool IsFloat8(DType d) { return d == v1::DTYPE_FLOAT8_E4M3FN || d == v1::DTYPE_FLOAT8_E5M2; }

DType ToComplex(DType d) { return d == v1::DTYPE_FLOAT64 ? v1::DTYPE_COMPLEX128 : v1::DTYPE_COMPLEX64; }

DType PromoteSkipUndefined(DType a, DType b) {
  if (a == kUndef) return b;
  if (b == kUndef) return a;
  return PromoteTypes(a, b);
}

DType CombineCategories(DType higher, DType lower) {
  if (IsComplexDType(higher)) return higher;
  if (IsComplexDType(lower)) {
    if (IsFloatingDType(higher)) return ToComplex(higher);
    return lower;
  }
  if (IsFloatingDType(higher)) return higher;
  if (higher == v1::DTYPE_BOOL || IsFloatingDType(lower)) return PromoteSkipUndefined(higher, lower);
  if (higher != kUndef) return higher;
  return lower;
}

std::string ShapeString(const std::vector<SymExpr>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", ", [](std::string* o, const SymExpr& e) {
                        o->append(e.ToString());
                      }), "]");
}

}  // namespace

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  if (a == kUndef || b == kUndef) return kUndef;
  if (a == v1::DTYPE_BOOL) return b;
  if (b == v1::DTYPE_BOOL) return a;
  if (IsFloat8(a) || IsFloat8(b) || IsNewUnsigned(a) || IsNewUnsigned(b)) return kUndef;
  if (IsComplexDType(a) || IsComplexDType(b)) {
    if (a == v1::DTYPE_COMPLEX128 || b == v1::DTYPE_COMPLEX128) return v1::DTYPE_COMPLEX128;
    if (a == v1::DTYPE_FLOAT64 || b == v1::DTYPE_FLOAT64) return v1::DTYPE_COMPLEX128;
    return v1::DTYPE_COMPLEX64;
  }
  const bool fa = IsFloatingDType(a), fb = IsFloatingDType(b);
  if (fa && fb) {
    if (DTypeItemSize(a) == 2 && DTypeItemSize(b) == 2) return v1::DTYPE_FLOAT32;  // f16 + bf16
    return DTypeItemSize(a) >= DTypeItemSize(b) ? a : b;
  }
  if (fa) return a;
  if (fb) return b;
  // Both integral (bool handled): uint8 with a signed type.
  if (a == v1::DTYPE_UINT8 || b == v1::DTYPE_UINT8) {
    DType other = a == v1::DTYPE_UINT8 ? b : a;
    return other == v1::DTYPE_INT8 ? v1::DTYPE_INT16 : other;
  }
  return DTypeItemSize(a) >= DTypeItemSize(b) ? a : b;
}

absl::StatusOr<DType> ResultType(absl::Span<const Operand> operands) {
  DType dim = kUndef, zero = kUndef, wrapped = kUndef;
  for (const Operand& op : operands) {
    DType current;
    DType* slot;
    if (op.tensor == nullptr) {
      current = op.scalar_dtype;
      if (IsFloatingDType(current)) current = kDefaultFloat;
      if (IsComplexDType(current)) current = v1::DTYPE_COMPLEX64;
      slot = &wrapped;
    } else {
      current = op.tensor->dtype;
      slot = op.tensor->rank() == 0 ? &zero : &dim;
    }
    DType next = PromoteSkipUndefined(*slot, current);
    if (next == kUndef && current != kUndef) {
      return absl::InvalidArgumentError(absl::StrCat("cannot promote ", DTypeName(*slot), " and ",
                                                     DTypeName(current)));
    }
    *slot = next;
  }
  DType r = CombineCategories(dim, CombineCategories(zero, wrapped));
  if (r == kUndef) return absl::InvalidArgumentError("no operand to infer a dtype from");
  return r;
}

absl::StatusOr<DType> PointwiseDType(absl::Span<const Operand> operands, Promotion kind) {
  if (kind == Promotion::kNoPromote) {
    for (const Operand& op : operands) {
      if (op.tensor) return op.tensor->dtype;
    }
    return absl::InvalidArgumentError("expected a tensor operand");
  }
  auto r = ResultType(operands);
  if (!r.ok()) return r.status();
  switch (kind) {
    case Promotion::kIntToFloat:
      return IsIntegralDType(*r, true) ? kDefaultFloat : *r;
    case Promotion::kAlwaysBool:
      return v1::DTYPE_BOOL;
    case Promotion::kComplexToFloat:
      return *r == v1::DTYPE_COMPLEX64 ? v1::DTYPE_FLOAT32
             : *r == v1::DTYPE_COMPLEX128 ? v1::DTYPE_FLOAT64 : *r;
    default:
      return *r;
  }
}

absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r) {
    return absl::InvalidArgumentError(absl::StrCat("dimension out of range (expected to be in range of [",
                                                   -r, ", ", r - 1, "], but got ", dim, ")"));
  }
  return dim < 0 ? dim + r : dim;
}

absl::StatusOr<std::vector<SymExpr>> BroadcastShapes(
    const InferContext& ctx, const std::vector<const std::vector<SymExpr>*>& shapes) {
  std::vector<SymExpr> out;
  for (const std::vector<SymExpr>* s : shapes) {
    const size_t n = std::max(out.size(), s->size());
    std::vector<SymExpr> next(n);
    for (size_t i = 0; i < n; ++i) {
      const bool has_a = i < out.size(), has_b = i < s->size();
      const SymExpr a = has_a ? out[out.size() - 1 - i] : SymExpr::Const(1);
      const SymExpr b = has_b ? (*s)[s->size() - 1 - i] : SymExpr::Const(1);
      SymExpr r;
      if (!has_a) {
        r = b;
      } else if (!has_b || a == b) {
        r = a;
      } else if (ctx.Hint(a, -1) == 1) {
        r = b;
      } else if (ctx.Hint(b, -1) == 1) {
        r = a;
      } else if (ctx.LikelyEqual(a, b)) {
        r = a;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeString(out), " and ",
                                                       ShapeString(*s), " cannot be broadcast"));
      }
      next[n - 1 - i] = r;
    }
    out = std::move(next);
  }
  return out;
}

bool IsContiguous(const InferContext& ctx, const TensorType& t) {
  int64_t expected = 1;
  for (int64_t d = t.rank() - 1; d >= 0; --d) {
    int64_t size = ctx.Hint(t.sizes[d], -1);
    if (size == 0) return true;
  }
  for (int64_t d = t.rank() - 1; d >= 0; --d) {
    int64_t size = ctx.Hint(t.sizes[d], -1);
    if (size == 1) continue;
    if (d >= static_cast<int64_t>(t.strides.size()) || ctx.Hint(t.strides[d], -1) != expected) {
      return false;
    }
    if (__builtin_mul_overflow(expected, size, &expected)) return false;
  }
  return true;
}

bool IsChannelsLast(const InferContext& ctx, const TensorType& t) {
  static const int kOrder4[] = {1, 3, 2, 0};
  static const int kOrder5[] = {1, 4, 3, 2, 0};
  if ((t.rank() != 4 && t.rank() != 5) || t.strides.size() != t.sizes.size()) return false;
  const int* order = t.rank() == 4 ? kOrder4 : kOrder5;
  int64_t expected = 1;
  for (int i = 0; i < t.rank(); ++i) {
    int d = order[i];
    int64_t size = ctx.Hint(t.sizes[d], -1);
    if (size == 1) continue;
    if (ctx.Hint(t.strides[d], -1) != expected) return false;
    if (__builtin_mul_overflow(expected, size, &expected)) return false;
  }
  return true;
}

std::vector<SymExpr> ChannelsLastStrides(const std::vector<SymExpr>& sizes) {
  std::vector<SymExpr> s(sizes.size());
  if (sizes.size() == 4) {
    s[1] = SymExpr::Const(1);
    s[3] = sizes[1];
    s[2] = s[3] * sizes[3];
    s[0] = s[2] * sizes[2];
    return s;
  }
  if (sizes.size() == 5) {
    s[1] = SymExpr::Const(1);
    s[4] = sizes[1];
    s[3] = s[4] * sizes[4];
    s[2] = s[3] * sizes[3];
    s[0] = s[2] * sizes[2];
    return s;
  }
  return ContiguousStrides(sizes);
}

bool IsNonOverlappingAndDense(const InferContext& ctx, const TensorType& t) {
  const int64_t n = t.rank();
  if (static_cast<int64_t>(t.strides.size()) != n) return false;
  std::vector<int64_t> size(n), stride(n);
  for (int64_t i = 0; i < n; ++i) {
    size[i] = ctx.Hint(t.sizes[i], -1);
    stride[i] = ctx.Hint(t.strides[i], -1);
  }
  if (n == 1) return size[0] < 2 || stride[0] == 1;
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    if (size[a] < 2) return false;
    if (size[b] < 2) return true;
    return stride[a] < stride[b];
  });
  int64_t require = 1;
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = size[perm[i]];
    if (s < 2) return true;
    if (stride[perm[i]] != require) return false;
    if (__builtin_mul_overflow(require, s, &require)) return false;
  }
  return true;
}

std::vector<SymExpr> EmptyLikeStrides(const InferContext& ctx, const TensorType& t) {
  if (IsNonOverlappingAndDense(ctx, t)) return t.strides;
  if (IsChannelsLast(ctx, t)) return ChannelsLastStrides(t.sizes);
  return ContiguousStrides(t.sizes);
}

std::vector<SymExpr> ElementwiseStrides(const InferContext& ctx, const std::vector<SymExpr>& out,
                                        const std::vector<const TensorType*>& inputs) {
  const int64_t ndim = static_cast<int64_t>(out.size());
  if (ndim == 0) return {};
  bool same_shape = !inputs.empty();
  for (const TensorType* t : inputs) {
    if (t->rank() != ndim || t->strides.size() != t->sizes.size()) {
      same_shape = false;
      break;
    }
    for (int64_t i = 0; i < ndim && same_shape; ++i) {
      same_shape = ctx.LikelyEqual(t->sizes[i], out[i]);
    }
  }
  if (same_shape) {
    bool all_contig = true, all_cl = true, all_dense_same = true;
    for (const TensorType* t : inputs) {
      all_contig = all_contig && IsContiguous(ctx, *t);
      all_cl = all_cl && IsChannelsLast(ctx, *t);
      all_dense_same = all_dense_same && IsNonOverlappingAndDense(ctx, *t);
      for (int64_t i = 0; i < ndim && all_dense_same; ++i) {
        all_dense_same = ctx.LikelyEqual(t->strides[i], inputs[0]->strides[i]);
      }
    }
    if (all_contig) return ContiguousStrides(out);
    if (all_cl) return ChannelsLastStrides(out);
    if (all_dense_same) return inputs[0]->strides;
  }
  std::vector<int64_t> shape(ndim);
  for (int64_t i = 0; i < ndim; ++i) shape[i] = ctx.Hint(out[i], 1);
  std::vector<std::vector<int64_t>> strides;
  for (const TensorType* t : inputs) {
    if (t->strides.size() != t->sizes.size() || t->rank() > ndim) continue;
    std::vector<int64_t> s(ndim, 0);
    const int64_t offset = ndim - t->rank();
    for (int64_t i = offset; i < ndim; ++i) {
      int64_t in_size = ctx.Hint(t->sizes[i - offset], 1);
      s[i] = (in_size == 1 && shape[i] != 1) ? 0 : ctx.Hint(t->strides[i - offset], 0);
    }
    strides.push_back(std::move(s));
  }
  auto should_swap = [&](int64_t d0, int64_t d1) {
    for (const auto& s : strides) {
      const int64_t s0 = s[d0], s1 = s[d1];
      if (s0 == 0 || s1 == 0) continue;
      if (s0 < s1) return -1;
      if (s0 > s1) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  std::vector<int64_t> perm(ndim);  // perm[0] is the fastest-moving dim
  for (int64_t i = 0; i < ndim; ++i) perm[i] = ndim - 1 - i;
  for (int64_t i = 1; i < ndim; ++i) {
    int64_t dim1 = i;
    for (int64_t dim0 = i - 1; dim0 >= 0; --dim0) {
      int cmp = should_swap(perm[dim0], perm[dim1]);
      if (cmp > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (cmp < 0) {
        break;
      }
    }
  }
  std::vector<SymExpr> result(ndim);
  SymExpr running = SymExpr::Const(1);
  for (int64_t i = 0; i < ndim; ++i) {
    result[perm[i]] = running;
    running = running * out[perm[i]];
  }
  return result;
}

std::optional<std::vector<SymExpr>> ViewStrides(const InferContext& ctx, const TensorType& t,
                                                const std::vector<SymExpr>& new_sizes) {
  const int64_t old_rank = t.rank();
  if (t.strides.size() != t.sizes.size()) return std::nullopt;
  bool empty = false;
  for (const SymExpr& s : t.sizes) empty = empty || ctx.Hint(s, 1) == 0;
  if (old_rank == 0) return ContiguousStrides(new_sizes);
  if (empty) {
    bool same = static_cast<int64_t>(new_sizes.size()) == old_rank;
    for (int64_t i = 0; same && i < old_rank; ++i) same = t.sizes[i] == new_sizes[i];
    return same ? t.strides : ContiguousStrides(new_sizes);
  }
  const int64_t new_rank = static_cast<int64_t>(new_sizes.size());
  std::vector<SymExpr> new_strides(new_rank);
  int64_t view_d = new_rank - 1;
  SymExpr chunk_base = t.strides.back();
  SymExpr tensor_numel = SymExpr::Const(1), view_numel = SymExpr::Const(1);
  for (int64_t tensor_d = old_rank - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel = tensor_numel * t.sizes[tensor_d];
    if (tensor_d == 0 ||
        (ctx.Hint(t.sizes[tensor_d - 1], -1) != 1 &&
         !ctx.LikelyEqual(t.strides[tensor_d - 1], tensor_numel * chunk_base))) {
      while (view_d >= 0 && (ctx.Hint(view_numel, 0) < ctx.Hint(tensor_numel, 0) ||
                             ctx.Hint(new_sizes[view_d], -1) == 1)) {
        new_strides[view_d] = view_numel * chunk_base;
        view_numel = view_numel * new_sizes[view_d];
        --view_d;
      }
      if (!ctx.LikelyEqual(view_numel, tensor_numel)) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base = t.strides[tensor_d - 1];
        tensor_numel = SymExpr::Const(1);
        view_numel = SymExpr::Const(1);
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

TensorType NewTensor(DType dtype, std::vector<SymExpr> sizes, const TensorType& like) {
  TensorType t;
  t.dtype = dtype;
  t.strides = ContiguousStrides(sizes);
  t.sizes = std::move(sizes);
  t.device = like.device;
  t.device_index = like.device_index;
  return t;
}

const TensorType* DeviceSource(const std::vector<const TensorType*>& tensors) {
  for (const TensorType* t : tensors) {
    if (t && (t->rank() > 0 || t->device != v1::DEVICE_KIND_CPU)) return t;
  }
  for (const TensorType* t : tensors) {
    if (t) return t;
  }
  return nullptr;
}

}  // namespace kiln::graph
