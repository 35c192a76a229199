#ifndef KILN_SERVER_LOWER_LOWER_INTERNAL_H_
#define KILN_SERVER_LOWER_LOWER_INTERNAL_H_

// Shared by lower.cc, lower_pointwise.cc and lower_reduction.cc; not a public interface.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/base/status_macros.h"
#include "server/graph/ir.h"
#include "server/lower/lower.h"
#include "server/lower/op_graph.h"

namespace kiln::lower::internal {

std::optional<k::ScalarType> ToScalarType(graph::DType d);
// Index of an input of `in_sizes` broadcast to an output index.
std::vector<Affine> BroadcastIndex(const std::vector<int64_t>& in_sizes, const std::vector<Affine>& out);
// A literal of type t from a Python number (rounded as torch converts scalars: to float for f32).
k::ExprOr Literal(k::ScalarType t, const graph::Arg& a);
k::ExprOr LiteralF(k::ScalarType t, double v);
// The arithmetic type for values of type t (f16/bf16 compute in f32).
k::ScalarType ComputeType(k::ScalarType t);

class Lowerer {
 public:
  Lowerer(const graph::Graph& graph, OpGraph* g, const LowerOptions& options = {})
      : graph_(graph), g_(*g), options_(options) {}

  const graph::Graph& graph() const { return graph_; }
  const LowerOptions& options() const { return options_; }
  OpGraph& g() { return g_; }
  // The value of tensor argument `a` (UNIMPLEMENTED unless it names a tensor node).
  absl::StatusOr<int32_t> ValueOf(const graph::Arg& a) const;
  // Like ValueOf, and UNIMPLEMENTED unless kernels can read the value's dtype.
  absl::StatusOr<int32_t> KernelValueOf(const graph::Arg& a) const;
  // A new value of `kind` for the node's tensor type `t` (UNIMPLEMENTED for dtypes or shapes the
  // kernels cannot represent). Not yet recorded as the node's result.
  absl::StatusOr<LValue> NewValue(int32_t node, const graph::TensorType& t, ValueKind kind) const;
  int32_t Add(LValue v);  // assigns the id
  void SetResult(int32_t node, int32_t value) { node_value[node] = value; }
  void SetItems(int32_t node, std::vector<int32_t> items) { node_items[node] = std::move(items); }

  std::vector<int32_t> node_value;
  std::vector<std::vector<int32_t>> node_items;

 private:
  const graph::Graph& graph_;
  OpGraph& g_;
  LowerOptions options_;
};

// A value loaded and cast to t (f16/bf16 through f32).
inline ElemFn LoadAs(int32_t value, k::ScalarType t) {
  return [value, t](LoadContext& ctx, const std::vector<Affine>& idx) -> k::ExprOr {
    k::ExprOr x = ctx.Load(value, idx);
    if (x.ok() && k::IsHalfType((*x)->type) && t != k::ScalarType::kFloat32) x = k::Cast(k::ScalarType::kFloat32, x);
    return k::Cast(t, x);
  };
}

// Collects one RowOp and its output values for a node; Finish records them.
struct RowBuilder {
  Lowerer& l;
  int32_t node_index;
  const graph::Node& node;
  RowOp row;
  std::vector<LValue> outs;

  absl::Status Output(int item, bool in_phase, decltype(RowOutput::fn) fn) {
    if (item >= 0 && (node.type.kind != graph::Type::Kind::kList || item >= static_cast<int>(node.type.items.size()))) {
      return absl::UnimplementedError("missing result item");
    }
    const graph::Type& t = item < 0 ? node.type : node.type.items[item];
    if (t.kind != graph::Type::Kind::kTensor) return absl::UnimplementedError("non-tensor reduction result");
    KILN_ASSIGN_OR_RETURN(LValue v, l.NewValue(node_index, t.tensor, ValueKind::kRowOutput));
    v.item = item;
    v.op = row.name;
    if (!in_phase) {
      const size_t outer = row.domain.size() - row.reduce_dims.size();
      if (v.sizes.size() != row.domain.size() && v.sizes.size() != outer) {
        return absl::UnimplementedError("reduction result of unexpected rank");
      }
    } else if (v.sizes != row.domain) {
      return absl::UnimplementedError("row output of unexpected shape");
    }
    outs.push_back(std::move(v));
    RowOutput o;
    o.in_phase = in_phase;
    o.fn = std::move(fn);
    row.outputs.push_back(std::move(o));
    return absl::OkStatus();
  }

  absl::Status Finish() { return Finish(nullptr); }

  // With `ids`: returns the output values instead of recording them as the node's result.
  absl::Status Finish(std::vector<int32_t>* ids_out) {
    const int32_t row_id = static_cast<int32_t>(l.g().row_ops.size());
    std::vector<int32_t> ids;
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i].row_op = row_id;
      outs[i].inputs = row.inputs;
      const int32_t id = l.Add(std::move(outs[i]));
      row.outputs[i].value = id;
      ids.push_back(id);
    }
    row.node = node_index;
    l.g().row_ops.push_back(std::move(row));
    if (ids_out != nullptr) {
      *ids_out = ids;
    } else if (node.type.kind == graph::Type::Kind::kList) {
      l.SetItems(node_index, ids);
    } else {
      l.SetResult(node_index, ids[0]);
    }
    return absl::OkStatus();
  }
};


// The graph dtype of an accumulator type (f32, f64, i32, i64), or nullopt.
std::optional<graph::DType> ToDType(k::ScalarType t);
// A new contiguous row-op value (kRowOutput) of `dtype` and `sizes` on the device of the node's
// result (its first item's), named `op`; the caller adds it to b.outs with its RowOutput.
absl::StatusOr<LValue> NewRowValue(Lowerer& l, const RowBuilder& b, graph::DType dtype,
                                   const std::vector<int64_t>& sizes, const std::string& op);

// A sum/mean/prod/amax/amin with fewer outputs than a GPU has SMs' worth of rows (< 32) over at
// least 65536 elements each (loss.sum() of a big tensor): records a first row op of partials
// (one per output and p-th of the outermost reduced dim that has a divisor p near 2048 / outputs,
// of the accumulator's type, in the workspace) and makes `b` the same reduction over those p
// partials. On GPUs (options().gpu) also a column reduction (its innermost dim kept) with 32 to
// 2047 outputs and >= 2^21 elements in all (an RMSNorm's or a bias's weight gradient): p partials
// per output of >= 256 rows each, p the smallest divisor of a reduced dim giving outputs * p >=
// 8192 (ColumnSplit in lower_split.cc). Deterministic (fixed order); the same result up to the
// order of the additions. Does nothing for any other row op. Call before b.Finish().
absl::Status SplitFewOutputReduction(Lowerer& l, RowBuilder& b);

// On GPUs (options().gpu): _softmax / _log_softmax over one dim with fewer than 128 rows (fewer
// than a GPU has SMs) of at least 65536 columns (64 x 262144 logits). One row op would leave SMs
// idle or hold each row in a cluster that reads, reduces and writes in turn; instead three ops
// that spread over the GPU and read the input twice: partials (each row's p chunks of >= 2048
// columns, about 8192 partial rows in all: the online softmax's max and sum of each, [..., p, ...]
// in the accumulator's type), each row's max M and sum S (an online softmax over m_c + log(s_c);
// log_softmax: L = M + log(S)), and the node's result, pointwise: exp(x - M) / S or x - L.
// Measured on the H200 (GPU time, % of a 1 GiB copy): f32 64 x 262144 49% -> 58%, bf16 32% -> 50%.
// Not where the GPU has clusters for f32 results of 32+ rows of at most
// options().cluster_row_columns: one row op, a cluster per row (as fast, one kernel; lower_split.cc).
// Returns false (nothing added) for any other case; true when the node's result is recorded.
absl::StatusOr<bool> SplitFewRowSoftmax(Lowerer& l, RowBuilder& b, int32_t x, k::ScalarType ct, k::ScalarType out,
                                        bool log);

// Each returns UNIMPLEMENTED for an op (or variant/dtype) it does not lower; nothing is added then.
absl::Status LowerPointwiseNode(Lowerer& l, int32_t node);
absl::Status LowerRowNode(Lowerer& l, int32_t node);
// lo <= i < hi, as a bool expression (the mask of reads that may fall outside a value).
k::ExprOr InRange(const Affine& i, int64_t lo, int64_t hi);
// Position-dependent ops (lower_indexed.cc): sets v's elem/inputs and returns true, or returns
// false for any other op.
absl::StatusOr<bool> DefineIndexed(Lowerer& l, const graph::Node& n, LValue& v);
// Normalization ops with several outputs (lower_norm.cc).
absl::Status LowerLayerNormBackward(Lowerer& l, int32_t node);
absl::Status LowerBatchNorm(Lowerer& l, int32_t node);
// max_pool2d_with_indices as element functions over its output (lower_pool.cc).
absl::Status LowerMaxPool2d(Lowerer& l, int32_t node);
// max_pool2d_with_indices_backward: a gather over each input element's windows, computed over a
// split of H and W by the stride and viewed back as the graph's 4-D result (lower_pool.cc).
absl::Status LowerMaxPool2dBackward(Lowerer& l, int32_t node);

}  // namespace kiln::lower::internal

#endif  // KILN_SERVER_LOWER_LOWER_INTERNAL_H_
