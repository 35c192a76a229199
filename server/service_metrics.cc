#include "server/service_metrics.h"

#include "absl/time/clock.h"

namespace kiln {

std::string RenderServiceMetrics(const ServiceEnv& env) {
  PrometheusText text;
  text.Family("kiln_requests_total", "counter",
              "Compile/Lookup requests by outcome: memory_hit, disk_hit, shared_hit, compiled, "
              "joined, miss, and error codes; PutPackage/GetPackage as package_put, "
              "package_<tier>_hit, package_miss and package_<error code>.");
  for (const auto& [outcome, count] : env.stats->Requests()) {
    text.Sample("kiln_requests_total", {{"outcome", outcome}}, static_cast<double>(count));
  }
  cache::TieredCacheStats cache = env.cache->Stats();
  text.Family("kiln_cache_hits_total", "counter", "Cache hits by tier.");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_hits_total", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.hits));
  }
  text.Family("kiln_cache_bytes", "gauge", "Bytes stored, by tier.");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_bytes", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.store.bytes));
  }
  text.Family("kiln_cache_max_bytes", "gauge", "The bound on bytes stored, by tier.");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_max_bytes", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.store.max_bytes));
  }
  text.Family("kiln_cache_entries", "gauge", "Entries stored, by tier.");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_entries", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.store.entries));
  }
  text.Family("kiln_cache_evictions_total", "counter", "Entries evicted to stay within bounds.");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_evictions_total", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.store.evictions));
  }
  text.Family("kiln_cache_corruptions_total", "counter",
              "Corrupt entries found (on read, verify or startup) and removed.");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_corruptions_total", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.store.corruptions));
  }
  text.Family("kiln_cache_tier_failures_total", "counter",
              "Tier errors (the tier is skipped for a while; compiles never fail for it).");
  for (const cache::TierStats& t : cache.tiers) {
    text.Sample("kiln_cache_tier_failures_total", {{"tier", std::string(cache::TierName(t.tier))}},
                static_cast<double>(t.failures));
  }
  cache::CompileSchedulerStats sched = env.scheduler->Stats();
  text.Family("kiln_compiles_in_flight", "gauge", "Compiles running now.");
  text.Sample("kiln_compiles_in_flight", static_cast<double>(sched.in_flight));
  text.Family("kiln_compile_queue_depth", "gauge", "Distinct compiles waiting for a worker.");
  text.Sample("kiln_compile_queue_depth", static_cast<double>(sched.queued));
  text.Family("kiln_request_queue_depth", "gauge", "Requests waiting for a request thread.");
  text.Sample("kiln_request_queue_depth", static_cast<double>(env.executor->queued()));
  text.Family("kiln_compile_latency_seconds", "histogram",
              "Time from a cache miss to the stored artifact, for requests that compiled.");
  env.compile_latency->Write("kiln_compile_latency_seconds", &text);
  text.Family("kiln_uptime_seconds", "gauge", "Seconds since kilnd started.");
  text.Sample("kiln_uptime_seconds", absl::ToDoubleSeconds(absl::Now() - env.stats->start()));
  return text.text();
}

}  // namespace kiln
