#ifndef KILN_SERVER_GRAPH_INFER_H_
#define KILN_SERVER_GRAPH_INFER_H_

// Shared pieces of torch's meta semantics used by the ops_*.cc inference functions: type promotion
// (c10::promoteTypes and at::native::result_type with "wrapped number" scalars), broadcasting,
// dimension wrapping, TensorIterator's output-stride rule, empty_like's stride rule, and view
// stride computation (at::detail::computeStride).

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/graph/ir.h"
#include "server/graph/op_registry.h"

namespace kiln::graph {

inline constexpr DType kDefaultFloat = ::kiln::v1::DTYPE_FLOAT32;

// c10::promoteTypes; UNSPECIFIED when torch refuses (e.g. uint16 with int32, float8 mixes).
DType PromoteTypes(DType a, DType b);

// How a pointwise op derives its result dtype from the promoted dtype (torch's
// ELEMENTWISE_TYPE_PROMOTION_KIND).
enum class Promotion { kDefault, kIntToFloat, kAlwaysBool, kComplexToFloat, kNoPromote };

// at::result_type over the operands (tensors of rank > 0, zero-dim tensors, wrapped scalars).
absl::StatusOr<DType> ResultType(absl::Span<const Operand> operands);
// ResultType then `kind`.
absl::StatusOr<DType> PointwiseDType(absl::Span<const Operand> operands, Promotion kind);

// Wraps a possibly negative dim into [0, rank); rank 0 accepts -1 and 0.
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank);

// Broadcast shape of the given shapes (torch's infer_size).
absl::StatusOr<std::vector<SymExpr>> BroadcastShapes(
    const InferContext& ctx, const std::vector<const std::vector<SymExpr>*>& shapes);

// The output strides TensorIterator allocates for `out_sizes` given its input tensors.
std::vector<SymExpr> ElementwiseStrides(const InferContext& ctx, const std::vector<SymExpr>& out_sizes,
                                        const std::vector<const TensorType*>& inputs);

// Strides that torch.empty_like(t) (preserve_format) gives.
std::vector<SymExpr> EmptyLikeStrides(const InferContext& ctx, const TensorType& t);
bool IsContiguous(const InferContext& ctx, const TensorType& t);
bool IsChannelsLast(const InferContext& ctx, const TensorType& t);  // rank 4 (NHWC) or 5 (NDHWC)
bool IsNonOverlappingAndDense(const InferContext& ctx, const TensorType& t);
std::vector<SymExpr> ChannelsLastStrides(const std::vector<SymExpr>& sizes);

// at::detail::computeStride: the strides of a view of `t` with `new_sizes`, or nullopt if the
// view is impossible without a copy.
std::optional<std::vector<SymExpr>> ViewStrides(const InferContext& ctx, const TensorType& t,
                                                const std::vector<SymExpr>& new_sizes);

// A tensor of `dtype` and `sizes` with contiguous strides on `like`'s device.
TensorType NewTensor(DType dtype, std::vector<SymExpr> sizes, const TensorType& like);
// Device of a pointwise result: the first non-CPU-scalar tensor's.
const TensorType* DeviceSource(const std::vector<const TensorType*>& tensors);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_INFER_H_
