#ifndef KILN_SERVER_GRAPH_GRAPH_PATH_H_
#define KILN_SERVER_GRAPH_GRAPH_PATH_H_

// The graph path, the single entry point for the service layer (Compile and Lookup):
//   ValidateTarget -> ImportGraph -> VerifyGraph -> ComputeKey
// Takes: a CompileRequest as received, the server's limits and compiler identity. Returns the
// verified IR, its cache key (with the record of hashed fields), the fallback nodes and per-phase
// timings ("import", "verify", "hash", in microseconds, as CompileResponse.timings names them).
// Errors: INVALID_ARGUMENT for a bad target or graph (naming the node), RESOURCE_EXHAUSTED for a
// graph over `limits`, INTERNAL for kiln's own bugs. Never crashes on any request; thread-safe.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/compiler.pb.h"
#include "server/graph/import.h"
#include "server/graph/ir.h"
#include "server/graph/key.h"

namespace kiln::graph {

struct PreparedGraph {
  Graph graph;
  CacheKey key;
  // Indices of the call nodes run by torch on the client (ops not in the registry).
  std::vector<int32_t> fallback_nodes;
  // {"import", us}, {"verify", us}, {"hash", us}.
  std::vector<std::pair<std::string, int64_t>> timings_us;
};

absl::StatusOr<PreparedGraph> PrepareGraph(const ::kiln::v1::CompileRequest& request, const GraphLimits& limits,
                                           const CompilerIdentity& compiler);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_GRAPH_PATH_H_
