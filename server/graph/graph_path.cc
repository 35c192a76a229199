#include "server/graph/graph_path.h"

#include <spdlog/spdlog.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/base/status_macros.h"
#include "server/graph/verify.h"

namespace kiln::graph {

absl::StatusOr<PreparedGraph> PrepareGraph(const ::kiln::v1::CompileRequest& request, const GraphLimits& limits,
                                           const CompilerIdentity& compiler) {
  KILN_RETURN_IF_ERROR(ValidateTarget(request.target()));
  PreparedGraph out;
  absl::Time start = absl::Now();
  auto lap = [&](const char* phase) {
    const absl::Time now = absl::Now();
    out.timings_us.emplace_back(phase, absl::ToInt64Microseconds(now - start));
    start = now;
  };
  KILN_ASSIGN_OR_RETURN(out.graph, ImportGraph(request.graph(), limits));
  lap("import");
  KILN_RETURN_IF_ERROR(VerifyGraph(out.graph, limits));
  lap("verify");
  KILN_ASSIGN_OR_RETURN(out.key, ComputeKey(out.graph, request.target(), request.options(), compiler));
  lap("hash");
  for (size_t i = 0; i < out.graph.nodes.size(); ++i) {
    if (out.graph.nodes[i].is_fallback()) out.fallback_nodes.push_back(static_cast<int32_t>(i));
  }
  SPDLOG_DEBUG("graph '{}': {} nodes, {} fallbacks, key {}", out.graph.debug_name, out.graph.nodes.size(),
               out.fallback_nodes.size(), out.key.hex);
  return out;
}

}  // namespace kiln::graph
