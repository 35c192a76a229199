#ifndef KILN_SERVER_SERVICE_ENV_H_
#define KILN_SERVER_SERVICE_ENV_H_

// What kilnd's gRPC services share: counters, the request executor, the cache tiers, the compile
// scheduler, the compiler, and the graph limits and toolchain identity that keys depend on.
// Owned by kilnd's main; the services hold a pointer.

#include <string>

#include "server/cache/compile_scheduler.h"
#include "server/cache/tiered_cache.h"
#include "server/graph/graph_path.h"
#include "server/graph_compiler.h"
#include "server/metrics.h"
#include "server/request_executor.h"
#include "server/server_stats.h"

namespace kiln {

struct ServiceEnv {
  ServerStats* stats = nullptr;
  RequestExecutor* executor = nullptr;
  cache::TieredCache* cache = nullptr;
  cache::CompileScheduler* scheduler = nullptr;
  GraphCompiler* compiler = nullptr;  // null: this kilnd compiles nothing (Compile: UNIMPLEMENTED)
  LatencyHistogram* compile_latency = nullptr;
  graph::GraphLimits limits;
  graph::CompilerIdentity identity;       // CPU keys: kiln, artifact format, g++ and its flags, prelude
  graph::CompilerIdentity cuda_identity;  // CUDA keys: kiln, artifact format, NVRTC, CUDA prelude

  // The toolchain identity that keys for `target` hold.
  const graph::CompilerIdentity& IdentityFor(const kiln::v1::Target& target) const {
    return target.device() == kiln::v1::DEVICE_KIND_CUDA ? cuda_identity : identity;
  }
  std::string cache_dir;
  int64_t cache_max_bytes = 0;
  int64_t max_entry_bytes = 0;  // bound on one stored entry (import checks it)
};

}  // namespace kiln

#endif  // KILN_SERVER_SERVICE_ENV_H_
