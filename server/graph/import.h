#ifndef KILN_SERVER_GRAPH_IMPORT_H_
#define KILN_SERVER_GRAPH_IMPORT_H_

// Import: kiln.v1.Graph (the wire form of an FX graph) -> Graph (ir.h).
//
// Takes: any kiln::v1::Graph, however malformed. Guarantees: never crashes, never allocates in
// proportion to a size the graph merely claims (a tensor claiming 2^62 elements costs nothing),
// never recurses deeper than the limits. On success:
//   * node names are resolved to indices; a reference to an unknown name (dangling), to the node
//     itself or to a later node (forward reference / cycle), duplicate names, a missing or second
//     output node, nodes after the output node, call_method/call_module nodes, unknown enum values
//     and malformed SymExprs were refused with INVALID_ARGUMENT naming the node;
//   * calls to registry ops have their arguments in schema order with keyword arguments moved to
//     their positions, defaults filled in and values normalized (see ir.h); unknown keyword
//     arguments, arguments given twice, too many positional or missing required arguments were
//     refused. Calls to other targets are fallbacks, kept as written (kwargs sorted by name);
//   * size limits (GraphLimits) were enforced with RESOURCE_EXHAUSTED naming the node.
// Not checked here (VerifyGraph does): argument types, metadata against inference, value ranges
// of sizes/strides, tensor element and byte limits.

#include <cstdint>

#include "absl/status/statusor.h"
#include "kiln/v1/graph.pb.h"
#include "server/graph/ir.h"

namespace kiln::graph {

// Limits on what a client may send. All are enforced with RESOURCE_EXHAUSTED and a message that
// names the node and the limit. Defaults fit real training graphs with a wide margin.
struct GraphLimits {
  int64_t max_nodes = 200000;              // nodes in the graph
  int64_t max_args_per_node = 1024;        // positional + keyword arguments of one node
  int64_t max_list_items = 65536;          // items of one list argument or list metadata
  int32_t max_nesting_depth = 4;           // lists within lists (arguments and metadata)
  int32_t max_rank = 16;                   // dimensions of a tensor
  int64_t max_constant_bytes = 256ll << 20;  // total bytes of Graph.constants
  int32_t max_symbols = 4096;              // Graph.symbols
  int32_t max_sym_expr_depth = 32;         // nesting of one SymExpr
  int64_t max_sym_expr_nodes = 4096;       // nodes of one SymExpr
  int64_t max_string_bytes = 4096;         // one string argument, name or target
  int64_t max_tensor_elements = 1ll << 42;  // elements of one tensor (at the symbols' hints)
  int64_t max_tensor_bytes = 1ll << 44;    // bytes of one tensor (16 TiB)
};

absl::StatusOr<Graph> ImportGraph(const ::kiln::v1::Graph& graph, const GraphLimits& limits);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_IMPORT_H_
