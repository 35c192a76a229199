// Reductions with few outputs over many elements -> two row ops, and softmaxes over few long rows
// on GPUs -> partials, each row's max and sum (log_softmax: its log-sum-exp) and a pointwise op
// (see SplitFewOutputReduction and SplitFewRowSoftmax in lower_internal.h).

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "server/lower/lower_internal.h"

namespace kiln::lower::internal {
namespace {

constexpr int64_t kMaxOutputs = 32;         // at or above: the row kernels already fill the GPU
constexpr int64_t kMinCount = int64_t{1} << 16;  // elements per output before splitting pays
constexpr int64_t kPartialRows = 2048;      // partial rows over all outputs (~15 per SM)
constexpr int64_t kMinPartialLength = 2048;  // elements per partial row
constexpr int64_t kMinSoftmaxChunk = 2048;   // softmax: columns per chunk
constexpr int64_t kMaxSoftmaxRows = 128;     // softmax: fewer rows than a GPU has SMs
constexpr int64_t kSoftmaxPartialRows = 8192;  // softmax: partial rows over all rows
// With clusters (LowerOptions::cluster_row_columns), f32 rows that a cluster holds stay one row op from
// this many rows. GPU time per call on the H200 (tests/gpu/softmax_shapes.py, 2026-11-22), one
// cluster per row against the split: 64 x 262144 55 vs 55 us, log_softmax 54 vs 55, 100 x
// 131072 39 vs 43; but 16 x 262144 16 vs 12 (one wave of clusters: loads, then reductions).
constexpr int64_t kMinClusterSoftmaxRows = 32;
// GPUs, column reductions (the innermost dim kept: outputs consecutive in memory, each over rows
// far apart). The column kernel gives a block a few outputs and all their rows, so a few hundred
// outputs fill a few dozen blocks: Llama's RMSNorm weight gradient, 768 outputs over 4096 rows of
// bf16 products, ran as 48 blocks on the H200's 132 SMs (17 us, 43% of copy), while 3072 outputs
// (GPT's MLP bias gradient) fill the GPU (384 blocks, 93% of copy). Below this many outputs (16
// bf16 points a block: under a block per SM), the rows split into partials (as a batch norm's do,
// lower_norm.cc):
constexpr int64_t kColumnSplitOutputs = 2048;
constexpr int64_t kColumnPartialPoints = 8192;  // outputs x partials wanted at least
constexpr int64_t kMinColumnPartialRows = 256;  // rows a partial keeps at least
constexpr int64_t kMinColumnElements = int64_t{1} << 21;  // smaller reductions: one launch is less

// The largest divisor of n that is <= limit (>= 1).
int64_t LargestDivisorAtMost(int64_t n, int64_t limit) {
  for (int64_t p = std::min(n, limit); p > 1; --p) {
    if (n % p == 0) return p;
  }
  return 1;
}

// A column reduction's split: (the reduced dim, p) such that outputs * p >= kColumnPartialPoints
// with the smallest such p (p divides the dim's size), each partial keeping at least
// kMinColumnPartialRows rows; else the largest outputs * p that keeps them; (-1, 1): no split.
// Outermost dims first. 768 outputs over [8, 512] rows: p = 16 of the 512 (12288 partials of 256).
std::pair<int, int64_t> ColumnSplit(const std::vector<int64_t>& domain, const std::vector<int>& reduce_dims,
                                    int64_t outputs, int64_t count) {
  std::pair<int, int64_t> best{-1, 1};
  for (int d : reduce_dims) {
    for (int64_t c = 2; c <= domain[d] && count / c >= kMinColumnPartialRows; ++c) {
      if (domain[d] % c != 0) continue;
      if (c > best.second) best = {d, c};
      if (outputs * c >= kColumnPartialPoints) return best;
    }
  }
  return best;
}

}  // namespace

std::optional<graph::DType> ToDType(k::ScalarType t) {
  switch (t) {
    case k::ScalarType::kFloat32: return v1::DTYPE_FLOAT32;
    case k::ScalarType::kFloat64: return v1::DTYPE_FLOAT64;
    case k::ScalarType::kInt32: return v1::DTYPE_INT32;
    case k::ScalarType::kInt64: return v1::DTYPE_INT64;
    default: return std::nullopt;
  }
}

absl::StatusOr<LValue> NewRowValue(Lowerer& l, const RowBuilder& b, graph::DType dtype,
                                   const std::vector<int64_t>& sizes, const std::string& op) {
  graph::TensorType t;
  t.dtype = dtype;
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
  KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(b.node_index, t, ValueKind::kRowOutput));
  v.op = op;
  return v;
}


absl::StatusOr<bool> SplitFewRowSoftmax(Lowerer& l, RowBuilder& b, int32_t x, k::ScalarType ct, k::ScalarType out,
                                        bool log) {
  const RowOp& row = b.row;
  if (row.reduce_dims.size() != 1 || b.node.type.kind != graph::Type::Kind::kTensor) return false;
  if (!l.options().gpu) return false;
  const std::optional<graph::DType> acc_dtype = ToDType(ct);
  if (!acc_dtype) return false;
  const std::vector<int64_t> domain = row.domain;
  const int rd = row.reduce_dims[0];
  const int64_t count = domain[rd];
  int64_t rows = 1;
  for (size_t i = 0; i < domain.size(); ++i) rows *= static_cast<int>(i) == rd ? 1 : domain[i];
  if (rows >= kMaxSoftmaxRows || count < kMinCount) return false;
  // A cluster per row reads an f32 row once in one kernel (split: 3 kernels and the row read twice).
  if (out == k::ScalarType::kFloat32 && count <= l.options().cluster_row_columns && rows >= kMinClusterSoftmaxRows) {
    return false;
  }
  // p chunks of the row (consecutive columns), about kSoftmaxPartialRows partial rows in all,
  // each of at least kMinSoftmaxChunk columns.
  const int64_t p = LargestDivisorAtMost(count, std::max<int64_t>(1, std::min(kSoftmaxPartialRows / rows,
                                                                              count / kMinSoftmaxChunk)));
  if (p < 2) return false;
  const int64_t inner = count / p;
  std::vector<int64_t> part_sizes = domain;  // [..., p, ...]: the partials and the combine's domain
  part_sizes[rd] = p;
  std::vector<int64_t> row_sizes;  // [...]: one statistic per row
  for (size_t i = 0; i < domain.size(); ++i) {
    if (static_cast<int>(i) != rd) row_sizes.push_back(domain[i]);
  }

  // 1. Partials: the online softmax's (max, sum of exp(x - max)) of each chunk, over the domain
  //    [..., p, inner, ...] (rd split into p and inner). Not composite (one phase): a pointwise
  //    producer of x (logits / temperature) fuses into it and into 3 instead of being realized.
  RowBuilder pb{l, b.node_index, b.node, RowOp{}, {}};
  pb.row.name = row.name + "_partial";
  pb.row.inputs = {x};
  pb.row.domain = part_sizes;
  pb.row.domain.insert(pb.row.domain.begin() + rd + 1, inner);
  pb.row.reduce_dims = {rd + 1};
  const ElemFn xv = LoadAs(x, ct);
  // A 16-bit result: the partial sums' exps may be approximate (an error of ~1e-6 in L).
  const bool approx = k::IsHalfType(out);
  pb.row.accs.push_back({k::AccKind::kOnlineSoftmax, ct, [xv, rd, inner](LoadContext& ctx, const std::vector<Affine>& idx) {
                           std::vector<Affine> at(idx.begin(), idx.begin() + rd);
                           at.push_back(AffAdd(AffScale(idx[rd], inner), idx[rd + 1]));
                           at.insert(at.end(), idx.begin() + rd + 2, idx.end());
                           return xv(ctx, at);
                         }, approx});
  for (k::AccField field : {k::AccField::kMax, k::AccField::kSum}) {
    KILN_ASSIGN_OR_RETURN(LValue v, NewRowValue(l, pb, *acc_dtype, part_sizes, pb.row.name));
    pb.outs.push_back(std::move(v));
    RowOutput o;
    o.fn = [field](LoadContext&, const AccReader& a, const std::vector<Affine>&) { return a(0, field); };
    pb.row.outputs.push_back(std::move(o));
  }
  std::vector<int32_t> partials;
  KILN_RETURN_IF_ERROR(pb.Finish(&partials));

  // 2. Per row, an online softmax over m_c + log(s_c) (an all -inf chunk: -inf, no weight): the
  //    row's max M and sum S = sum_c s_c exp(m_c - M); log_softmax takes L = M + log(S), the
  //    row's log-sum-exp. NaN in a row makes M NaN; an all -inf row gives M = -inf.
  RowBuilder cb{l, b.node_index, b.node, RowOp{}, {}};
  cb.row.name = row.name + (log ? "_lse" : "_max_sum");
  cb.row.inputs = partials;
  cb.row.domain = part_sizes;
  cb.row.reduce_dims = {rd};
  const int32_t pm = partials[0], ps = partials[1];
  cb.row.accs.push_back({k::AccKind::kOnlineSoftmax, ct, [pm, ps, ct](LoadContext& ctx, const std::vector<Affine>& idx) {
                           return k::Add(LoadAs(pm, ct)(ctx, idx), k::Log(LoadAs(ps, ct)(ctx, idx)));
                         }});
  std::vector<std::function<k::ExprOr(const AccReader&)>> stats;
  if (log) {
    stats.push_back([](const AccReader& a) { return k::Add(a(0, k::AccField::kMax), k::Log(a(0, k::AccField::kSum))); });
  } else {
    stats.push_back([](const AccReader& a) { return a(0, k::AccField::kMax); });
    stats.push_back([](const AccReader& a) { return a(0, k::AccField::kSum); });
  }
  for (const auto& stat : stats) {
    KILN_ASSIGN_OR_RETURN(LValue stat_value, NewRowValue(l, cb, *acc_dtype, row_sizes, cb.row.name));
    cb.outs.push_back(std::move(stat_value));
    RowOutput so;
    so.fn = [stat](LoadContext&, const AccReader& a, const std::vector<Affine>&) { return stat(a); };
    cb.row.outputs.push_back(std::move(so));
  }
  std::vector<int32_t> row_stats;  // M and S, or L
  KILN_RETURN_IF_ERROR(cb.Finish(&row_stats));

  // 3. The node's result, pointwise: exp(x - M) / S (as the one-op softmax: exp(x - L) would
  //    carry L's rounding, ~1e-6 relative at L ~ 25, into every result), or x - L.
  KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(b.node_index, b.node.type.tensor, ValueKind::kPointwise));
  if (v.sizes != domain) return absl::UnimplementedError("softmax result of unexpected shape");
  v.op = row.name;
  v.inputs = {x};
  v.inputs.insert(v.inputs.end(), row_stats.begin(), row_stats.end());
  v.elem = [xv, row_stats, ct, out, rd, log](LoadContext& ctx, const std::vector<Affine>& idx) {
    std::vector<Affine> at(idx.begin(), idx.begin() + rd);
    at.insert(at.end(), idx.begin() + rd + 1, idx.end());
    const k::ExprOr shifted = k::Sub(xv(ctx, idx), LoadAs(row_stats[0], ct)(ctx, at));
    if (log) return k::Cast(out, shifted);
    return k::Cast(out, k::Div(k::Exp(shifted), LoadAs(row_stats[1], ct)(ctx, at)));
  };
  l.SetResult(b.node_index, l.Add(std::move(v)));
  return true;
}

absl::Status SplitFewOutputReduction(Lowerer& l, RowBuilder& b) {
  RowOp& row = b.row;
  if (row.composite || row.accs.empty()) return absl::OkStatus();
  std::vector<graph::DType> acc_dtypes;  // each accumulator's partials
  for (const RowAcc& a : row.accs) {
    if (a.kind != k::AccKind::kSum && a.kind != k::AccKind::kProd && a.kind != k::AccKind::kMax &&
        a.kind != k::AccKind::kMin) {
      return absl::OkStatus();
    }
    const std::optional<graph::DType> t = ToDType(a.dtype);
    if (!t) return absl::OkStatus();
    acc_dtypes.push_back(*t);
  }
  for (const RowOutput& o : row.outputs) {
    if (o.in_phase) return absl::OkStatus();
  }
  const std::vector<int64_t> domain = row.domain;
  const std::set<int> reduced(row.reduce_dims.begin(), row.reduce_dims.end());
  int64_t outputs = 1, count = 1;
  for (size_t i = 0; i < domain.size(); ++i) (reduced.count(static_cast<int>(i)) ? count : outputs) *= domain[i];
  int dim = -1;
  int64_t p = 1;
  if (outputs >= kMaxOutputs) {
    const bool column = !domain.empty() && !reduced.count(static_cast<int>(domain.size()) - 1);
    if (!l.options().gpu || !column || outputs >= kColumnSplitOutputs ||
        outputs * count < kMinColumnElements) {
      return absl::OkStatus();
    }
    std::tie(dim, p) = ColumnSplit(domain, row.reduce_dims, outputs, count);
  } else {
    if (count < kMinCount) return absl::OkStatus();
    const int64_t target = std::max<int64_t>(2, std::min(kPartialRows / outputs, count / kMinPartialLength));
    // The outermost reduced dim with a divisor p near the target: p partials per output, each
    // over that dim's d / p consecutive indices and every other reduced dim. p == size: not split.
    for (int d : row.reduce_dims) {
      const int64_t c = LargestDivisorAtMost(domain[d], std::min(4 * target, count / kMinPartialLength));
      if (c >= std::max<int64_t>(2, target / 4)) {
        dim = d;
        p = c;
        break;
      }
    }
  }
  if (dim < 0) return absl::OkStatus();
  const bool split = p < domain[dim];
  const int64_t inner = domain[dim] / p;

  // Row op 1: the partials, one per (output, p) and accumulator, of its type, contiguous.
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
  std::vector<int64_t> sizes;
  for (int i = 0; i < static_cast<int>(domain.size()); ++i) {
    if (i == dim) sizes.push_back(p);
    if (i != dim && !reduced.count(i)) sizes.push_back(domain[i]);
  }
  for (size_t a = 0; a < row.accs.size(); ++a) {
    const ElemFn value = row.accs[a].value;
    pb.row.accs.push_back({row.accs[a].kind, row.accs[a].dtype,
                           [value, to_domain](LoadContext& ctx, const std::vector<Affine>& idx) {
                             return value(ctx, to_domain(idx));
                           }});
    KILN_ASSIGN_OR_RETURN(LValue partial, NewRowValue(l, b, acc_dtypes[a], sizes, pb.row.name));
    pb.outs.push_back(std::move(partial));
    RowOutput po;
    po.fn = [a](LoadContext&, const AccReader& r, const std::vector<Affine>&) {
      return r(static_cast<int>(a), k::AccField::kValue);
    };
    pb.row.outputs.push_back(std::move(po));
  }
  std::vector<int32_t> partial_ids;
  KILN_RETURN_IF_ERROR(pb.Finish(&partial_ids));

  // Row op 2 (this node's): the same reduction over the partials: dim now of size p, the other
  // reduced dims (folded into the partials) of size 1, so that outputs keep their indices.
  for (int i : row.reduce_dims) row.domain[i] = i == dim ? p : 1;
  row.inputs = partial_ids;
  std::vector<int> keep;  // the domain dims that index the partials
  for (int i = 0; i < static_cast<int>(domain.size()); ++i) {
    if (i == dim || !reduced.count(i)) keep.push_back(i);
  }
  for (size_t a = 0; a < row.accs.size(); ++a) {
    const int32_t partial_id = partial_ids[a];
    const k::ScalarType acc = row.accs[a].dtype;
    row.accs[a].value = [partial_id, keep, acc](LoadContext& ctx, const std::vector<Affine>& idx) {
      std::vector<Affine> at;
      for (int i : keep) at.push_back(idx[i]);
      return LoadAs(partial_id, acc)(ctx, at);
    };
  }
  return absl::OkStatus();
}

}  // namespace kiln::lower::internal
