#ifndef KILN_SERVER_SERVICE_METRICS_H_
#define KILN_SERVER_SERVICE_METRICS_H_

// kilnd's /metrics page: requests by outcome, hits by tier, compile latency, queue depths, cache
// bytes and entries, evictions and corruptions, in Prometheus text format.

#include <string>

#include "server/service_env.h"

namespace kiln {

std::string RenderServiceMetrics(const ServiceEnv& env);

}  // namespace kiln

#endif  // KILN_SERVER_SERVICE_METRICS_H_
