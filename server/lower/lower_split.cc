// Reductions with few outputs over many elements -> two row ops (see SplitFewOutputReduction in
// lower_internal.h).

#include <algorithm>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {
namespace {

constexpr int64_t kMaxOutputs = 32;         // at or above: the row kernels already fill the GPU
constexpr int64_t kMinCount = int64_t{1} << 16;  // elements per output before splitting pays
constexpr int64_t kPartialRows = 2048;      // partial rows over all outputs (~15 per SM)
constexpr int64_t kMinPartialLength = 2048;  // elements per partial row

std::optional<graph::DType> ToDType(k::ScalarType t) {
  switch (t) {
    case k::ScalarType::kFloat32: return v1::DTYPE_FLOAT32;
    case k::ScalarType::kFloat64: return v1::DTYPE_FLOAT64;
    case k::ScalarType::kInt32: return v1::DTYPE_INT32;
    case k::ScalarType::kInt64: return v1::DTYPE_INT64;
    default: return std::nullopt;
  }
}

// The largest divisor of n that is <= limit (>= 1).
int64_t LargestDivisorAtMost(int64_t n, int64_t limit) {
  for (int64_t p = std::min(n, limit); p > 1; --p) {
    if (n % p == 0) return p;
  }
  return 1;
}

}  // namespace

absl::Status SplitFewOutputReduction(Lowerer& l, RowBuilder& b) {
  RowOp& row = b.row;
  if (row.composite || row.accs.size() != 1) return absl::OkStatus();
  const k::AccKind kind = row.accs[0].kind;
  if (kind != k::AccKind::kSum && kind != k::AccKind::kProd && kind != k::AccKind::kMax &&
      kind != k::AccKind::kMin) {
    return absl::OkStatus();
  }
  for (const RowOutput& o : row.outputs) {
    if (o.in_phase) return absl::OkStatus();
  }
  const std::optional<graph::DType> acc_dtype = ToDType(row.accs[0].dtype);
  if (!acc_dtype) return absl::OkStatus();
  const std::vector<int64_t> domain = row.domain;
  const std::set<int> reduced(row.reduce_dims.begin(), row.reduce_dims.end());
  int64_t outputs = 1, count = 1;
  for (size_t i = 0; i < domain.size(); ++i) (reduced.count(static_cast<int>(i)) ? count : outputs) *= domain[i];
  if (outputs >= kMaxOutputs || count < kMinCount) return absl::OkStatus();
  const int64_t target = std::max<int64_t>(2, std::min(kPartialRows / outputs, count / kMinPartialLength));
  // The outermost reduced dim with a divisor p near the target: p partials per output, each over
  // that dim's d / p consecutive indices and every other reduced dim. p == size: not split.
  int dim = -1;
  int64_t p = 1;
  for (int d : row.reduce_dims) {
    const int64_t c = LargestDivisorAtMost(domain[d], std::min(4 * target, count / kMinPartialLength));
    if (c >= std::max<int64_t>(2, target / 4)) {
      dim = d;
      p = c;
      break;
    }
  }
  if (dim < 0) return absl::OkStatus();
  const bool split = p < domain[dim];
  const int64_t inner = domain[dim] / p;

  // Row op 1: the partials, one per (output, p), of the accumulator's type, contiguous.
  RowBuilder pb{l, b.node_index, b.node, RowOp{}, {}};
  pb.row.name = row.name + "_partial";
  pb.row.inputs = row.inputs;
  for (int i = 0; i < static_cast<int>(domain.size()); ++i) {
    if (i == dim) {
      pb.row.domain.push_back(p);
      if (split) pb.row.domain.push_back(inner);
    } else {
      pb.row.domain.push_back(domain[i]);
    }
    const int at = i < dim || !split ? i : i + 1;  // position of original dim i (dim: its p part)
    if (i == dim) {
      if (split) pb.row.reduce_dims.push_back(dim + 1);
    } else if (reduced.count(i)) {
      pb.row.reduce_dims.push_back(at);
    }
  }
  // A partial-domain index -> the original domain's index.
  auto to_domain = [dim, split, inner](const std::vector<Affine>& idx) {
    if (!split) return idx;
    std::vector<Affine> out(idx.begin(), idx.begin() + dim);
    out.push_back(AffAdd(AffScale(idx[dim], inner), idx[dim + 1]));
    out.insert(out.end(), idx.begin() + dim + 2, idx.end());
    return out;
  };
  const ElemFn value = row.accs[0].value;
  pb.row.accs.push_back({kind, row.accs[0].dtype, [value, to_domain](LoadContext& ctx, const std::vector<Affine>& idx) {
                           return value(ctx, to_domain(idx));
                         }});
  graph::TensorType t;
  t.dtype = *acc_dtype;
  std::vector<int64_t> sizes;
  for (int i = 0; i < static_cast<int>(domain.size()); ++i) {
    if (i == dim) sizes.push_back(p);
    if (i != dim && !reduced.count(i)) sizes.push_back(domain[i]);
  }
  int64_t stride = 1;
  t.sizes.resize(sizes.size());
  t.strides.resize(sizes.size());
  for (size_t i = sizes.size(); i-- > 0;) {
    t.sizes[i] = graph::SymExpr::Const(sizes[i]);
    t.strides[i] = graph::SymExpr::Const(stride);
    stride *= sizes[i];
  }
  t.storage_offset = graph::SymExpr::Const(0);
  const graph::Type& result = b.node.type.kind == graph::Type::Kind::kList ? b.node.type.items[0] : b.node.type;
  t.device = result.tensor.device;
  t.device_index = result.tensor.device_index;
  KILN_ASSIGN_OR_RETURN(LValue partial, l.NewValue(b.node_index, t, ValueKind::kRowOutput));
  partial.op = pb.row.name;
  pb.outs.push_back(std::move(partial));
  RowOutput po;
  po.fn = [](LoadContext&, const AccReader& a, const std::vector<Affine>&) { return a(0, k::AccField::kValue); };
  pb.row.outputs.push_back(std::move(po));
  std::vector<int32_t> ids;
  KILN_RETURN_IF_ERROR(pb.Finish(&ids));
  const int32_t partial_id = ids[0];

  // Row op 2 (this node's): the same reduction over the partials: dim now of size p, the other
  // reduced dims (folded into the partials) of size 1, so that outputs keep their indices.
  for (int i : row.reduce_dims) row.domain[i] = i == dim ? p : 1;
  row.inputs = {partial_id};
  std::vector<int> keep;  // the domain dims that index the partials
  for (int i = 0; i < static_cast<int>(domain.size()); ++i) {
    if (i == dim || !reduced.count(i)) keep.push_back(i);
  }
  const k::ScalarType acc = row.accs[0].dtype;
  row.accs[0].value = [partial_id, keep, acc](LoadContext& ctx, const std::vector<Affine>& idx) {
    std::vector<Affine> at;
    for (int i : keep) at.push_back(idx[i]);
    return LoadAs(partial_id, acc)(ctx, at);
  };
  return absl::OkStatus();
}

}  // namespace kiln::lower::internal
