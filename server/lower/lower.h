#ifndef KILN_SERVER_LOWER_LOWER_H_
#define KILN_SERVER_LOWER_LOWER_H_

// LowerGraph: a verified graph (server/graph) -> the op-level representation (op_graph.h).
//
// Takes a Graph that passed VerifyGraph and the indices of its fallback nodes. Every call node
// becomes exactly one of:
//   * a pointwise value (registry pointwise ops, casts, copies, fills and factory constants):
//     an element function with torch's broadcasting and type promotion, scalars as exact literals;
//     position-dependent ones too (cat, pads, slice/select_backward, tril/triu, nll_loss_backward's
//     one-hot gradient: lower_indexed.cc);
//   * a view (registry view ops): no computation, just the node's sizes/strides/offset;
//   * a row op (reductions sum/mean/prod/amax/amin/max/min/argmax/argmin/any/all/var/std/var_mean,
//     _softmax, _log_softmax, native_layer_norm, mse_loss); a sum/mean/prod/amax/amin with fewer than 32
//     outputs over >= 65536 elements each becomes two row ops (partials, then the reduction of
//     the partials: lower_split.cc), so that a full reduction spreads over the whole machine, and
//     so does one over columns with fewer than 2048 outputs on GPUs (options.gpu); on GPUs a
//     _softmax/_log_softmax over fewer than 128 rows of >= 65536 columns
//     becomes partials, each row's max and sum (log_softmax: its log-sum-exp) and a pointwise op
//     (lower_split.cc), except f32 ones of 32+ rows that a thread-block cluster holds
//     (options.cluster_row_columns);
//   * an extern step (registry extern ops: mm, bmm, addmm, baddbmm, convolution, ...), or a
//     fallback step (fallback nodes, and any op or dtype this file cannot lower; its reason is
//     recorded). getitem nodes only select a tuple item.
// Guarantees: unsupported things never produce wrong code: they become fallback steps.
// Errors: UNIMPLEMENTED for graphs with symbolic sizes or non-tensor values that a step would
// need (the client runs them eagerly); INTERNAL for inconsistencies.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/graph/ir.h"
#include "server/lower/op_graph.h"

namespace kiln::lower {

struct LowerOptions {
  // The target is a GPU: softmaxes over few long rows split over the whole GPU (three ops, see
  // SplitFewRowSoftmax in lower_internal.h); CPUs keep one row op (a row stays in a core's cache).
  bool gpu = false;
  // The longest row a thread-block cluster holds in registers (sm_90+: the CUDA emitter's
  // LongestClusterRow, server/codegen/cuda_long_rows.h); 0: no clusters. f32 softmaxes over few
  // rows (32 to 127) of at most this many columns stay one row op, which the emitter spreads over
  // a cluster per row, read once (lower_split.cc).
  int64_t cluster_row_columns = 0;
};

absl::StatusOr<OpGraph> LowerGraph(const graph::Graph& graph, const std::vector<int32_t>& fallback_nodes,
                                   const LowerOptions& options = {});

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_LOWER_H_
