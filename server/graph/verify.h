#ifndef KILN_SERVER_GRAPH_VERIFY_H_
#define KILN_SERVER_GRAPH_VERIFY_H_

// Verify: checks that a Graph (imported, or built by hand in tests) is well formed and that its
// metadata is what torch would compute. Runs after import and between stages in tests.
//
// Takes: any Graph. Guarantees on OK:
//   * exactly one kOutput node, last; every node reference points to an earlier, non-output node;
//     input indices are 0, 1, 2, ... in order; constants exist and match their get_attr metadata;
//   * every tensor has a known dtype, device kind and layout, rank <= limits.max_rank, as many
//     strides as sizes, and sizes, strides and storage offset that are >= 0 and whose addressing
//     (offset + sum((size-1)*stride)) fits in int64 at the symbols' hints; element count and byte
//     size within limits (RESOURCE_EXHAUSTED otherwise);
//   * symbol ranges are consistent (min <= max);
//   * every call to a registry op has one argument per schema argument, each of the schema's type,
//     and its metadata agrees with inference: same dtype, same shape (symbolic sizes equal or equal
//     at the hints), same strides on every dimension of size != 1 (tensors with elements), same
//     device kind. Fallback calls are only range-checked.
// Errors: INVALID_ARGUMENT "node 'add_3' (aten.add.Tensor): inferred shape [4, 8] but the graph
// says [4, 9]", always naming the node by its client name and target.

#include "absl/status/status.h"
#include "server/graph/import.h"
#include "server/graph/ir.h"
#include "server/graph/schema.h"

namespace kiln::graph {

absl::Status VerifyGraph(const Graph& graph, const GraphLimits& limits);
absl::Status VerifyGraph(const Graph& graph);  // default limits

// Whether `arg` is acceptable for a schema parameter of type `type` in `graph`; the reason if not.
absl::Status CheckArgType(const Graph& graph, const SchemaType& type, const Arg& arg);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_VERIFY_H_
