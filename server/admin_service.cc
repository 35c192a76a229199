#include "server/admin_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/bundle.h"
#include "server/cache/entry_record.h"
#include "server/cache_entry.h"
#include "server/compiler_service.h"
#include "server/packages.h"
#include "server/version.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 10000;
constexpr size_t kExportChunkBytes = 1 << 20;

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

grpc::Status CheckKey(const std::string& key) {
  absl::Status s = cache::ValidateKey(key);
  return s.ok() ? grpc::Status::OK : ToGrpcStatus(s);
}

bool Matches(const cache::EntryMeta& meta, const kiln::v1::ListEntriesRequest& request) {
  if (!absl::StartsWith(meta.key, request.key_prefix())) return false;
  if (meta.size_bytes < request.min_size_bytes()) return false;
  if (request.device() == kiln::v1::DEVICE_KIND_CPU && !absl::StartsWith(meta.target, "cpu:")) {
    return false;
  }
  if (request.device() == kiln::v1::DEVICE_KIND_CUDA && !absl::StartsWith(meta.target, "cuda:")) {
    return false;
  }
  return true;
}

}  // namespace

grpc::Status AdminService::GetStats(grpc::ServerContext*, const kiln::v1::GetStatsRequest*,
                                    kiln::v1::Stats* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  response->set_server_version(kKilnVersion);
  response->set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - env_->stats->start()));
  for (const auto& [outcome, count] : env_->stats->Requests()) {
    (*response->mutable_requests())[outcome] = count;
  }
  response->set_cache_dir(env_->cache_dir);
  if (cache::Store* disk = env_->cache->store(cache::Tier::kDisk)) {
    cache::StoreStats s = disk->Stats();
    response->set_entries(s.entries);
    response->set_cache_bytes(s.bytes);
    response->set_cache_max_bytes(s.max_bytes);
    response->set_evictions(s.evictions);
  }
  int64_t corruptions = 0;
  for (const auto& tier : env_->cache->Stats().tiers) corruptions += tier.store.corruptions;
  response->set_corruptions(corruptions);
  cache::CompileSchedulerStats sched = env_->scheduler->Stats();
  response->set_compiles_in_flight(sched.in_flight);
  response->set_compiles_queued(sched.queued);
  response->set_workers(sched.workers);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListEntries(grpc::ServerContext*,
                                       const kiln::v1::ListEntriesRequest* request,
                                       kiln::v1::ListEntriesResponse* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  if (request->limit() < 0) return Invalid("ListEntries: limit must not be negative");
  std::vector<cache::EntryMeta> entries;
  for (cache::EntryMeta& meta : env_->cache->List()) {
    if (Matches(meta, *request)) entries.push_back(std::move(meta));
  }
  using Meta = cache::EntryMeta;
  auto sort_key = [&](const Meta& m) -> int64_t {
    switch (request->sort_by()) {
      case kiln::v1::ListEntriesRequest::SORT_BY_CREATED: return m.created_unix_ms;
      case kiln::v1::ListEntriesRequest::SORT_BY_SIZE: return m.size_bytes;
      case kiln::v1::ListEntriesRequest::SORT_BY_HITS: return m.hits;
      default: return std::max(m.last_hit_unix_ms, m.created_unix_ms);
    }
  };
  std::stable_sort(entries.begin(), entries.end(), [&](const Meta& a, const Meta& b) {
    return request->ascending() ? sort_key(a) < sort_key(b) : sort_key(a) > sort_key(b);
  });
  int64_t offset = 0;
  if (!request->page_token().empty() &&
      (!absl::SimpleAtoi(request->page_token(), &offset) || offset < 0)) {
    return Invalid("ListEntries: page_token is not one this server issued");
  }
  int limit = request->limit() == 0 ? kDefaultPageSize : std::min(request->limit(), kMaxPageSize);
  response->set_total(static_cast<int64_t>(entries.size()));
  for (int64_t i = offset; i < static_cast<int64_t>(entries.size()) && i < offset + limit; ++i) {
    FillSummary(entries[i], response->add_entries());
  }
  if (offset + limit < static_cast<int64_t>(entries.size())) {
    response->set_next_page_token(absl::StrCat(offset + limit));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::GetEntry(grpc::ServerContext*, const kiln::v1::GetEntryRequest* request,
                                    kiln::v1::Entry* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  if (grpc::Status s = CheckKey(request->key()); !s.ok()) return s;
  std::optional<cache::EntryMeta> meta = env_->cache->Stat(request->key());
  std::optional<cache::CacheHit> hit = env_->cache->Peek(request->key());
  if (!meta.has_value() || !hit.has_value()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no cache entry with key ", request->key()));
  }
  absl::StatusOr<cache::EntryRecord> record = cache::DecodeEntryRecord(hit->value);
  if (!record.ok()) return ToGrpcStatus(record.status());
  FillEntry(*meta, *record, *request, response);
  return grpc::Status::OK;
}

grpc::Status AdminService::Evict(grpc::ServerContext*, const kiln::v1::EvictRequest* request,
                                 kiln::v1::EvictResponse* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  if (grpc::Status s = CheckKey(request->key()); !s.ok()) return s;
  absl::StatusOr<int64_t> freed = env_->cache->Remove(request->key());
  if (!freed.ok()) return ToGrpcStatus(freed.status());
  response->set_freed_bytes(*freed);
  spdlog::info("evicted {} ({} bytes) on request", request->key(), *freed);
  return grpc::Status::OK;
}

grpc::Status AdminService::Purge(grpc::ServerContext*, const kiln::v1::PurgeRequest* request,
                                 kiln::v1::PurgeResponse* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  if (!request->all() && request->older_than_seconds() <= 0) {
    return Invalid("Purge: set all, or older_than_seconds to a positive number");
  }
  cache::PurgeOptions options;
  options.all = request->all();
  options.older_than_unix_ms =
      absl::ToUnixMillis(absl::Now() - absl::Seconds(request->older_than_seconds()));
  cache::PurgeResult result = env_->cache->Purge(options);
  response->set_removed(result.removed);
  response->set_freed_bytes(result.freed_bytes);
  spdlog::info("purge ({}): removed {} entries, {} bytes",
               request->all() ? "all" : absl::StrCat("older than ", request->older_than_seconds(), " s"),
               result.removed, result.freed_bytes);
  return grpc::Status::OK;
}

grpc::Status AdminService::Verify(grpc::ServerContext*, const kiln::v1::VerifyRequest*,
                                  kiln::v1::VerifyResponse* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  cache::VerifyResult result = env_->cache->Verify();
  int64_t ok = result.ok;
  std::vector<std::string> corrupt = result.corrupt_keys;
  // The store checked its own checksums; also check each artifact as Compile would serve it.
  for (const cache::EntryMeta& meta : env_->cache->List()) {
    std::optional<cache::CacheHit> hit = env_->cache->Peek(meta.key);
    if (!hit.has_value()) continue;
    absl::StatusOr<cache::EntryRecord> record = cache::DecodeEntryRecord(hit->value);
    absl::Status s = !record.ok()                ? record.status()
                     : IsPackageRecord(*record) ? absl::OkStatus()  // opaque: nothing to check
                                                : ReadArtifact(*record).status();
    if (!s.ok()) {
      spdlog::error("verify: entry {} is unusable ({}); removing it", meta.key, std::string(s.message()));
      (void)env_->cache->Remove(meta.key);
      corrupt.push_back(meta.key);
      --ok;
    }
  }
  response->set_checked(result.checked);
  response->set_ok(ok);
  for (const std::string& key : corrupt) response->add_corrupt_keys(key);
  return grpc::Status::OK;
}

grpc::Status AdminService::Export(grpc::ServerContext* context,
                                  const kiln::v1::ExportRequest* request,
                                  grpc::ServerWriter<kiln::v1::BundleChunk>* writer) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  if (keys.empty()) {
    for (const cache::EntryMeta& meta : env_->cache->List()) keys.push_back(meta.key);
  }
  std::string pending = BundleHeader();
  auto flush = [&](bool all) {
    while (pending.size() >= kExportChunkBytes || (all && !pending.empty())) {
      size_t n = std::min(pending.size(), kExportChunkBytes);
      kiln::v1::BundleChunk chunk;
      chunk.set_data(pending.substr(0, n));
      pending.erase(0, n);
      if (!writer->Write(chunk)) return false;
    }
    return true;
  };
  int64_t exported = 0;
  for (const std::string& key : keys) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "export cancelled");
    if (grpc::Status s = CheckKey(key); !s.ok()) return s;
    std::optional<cache::EntryMeta> meta = env_->cache->Stat(key);
    std::optional<cache::CacheHit> hit = env_->cache->Peek(key);
    if (!meta.has_value() || !hit.has_value()) {
      if (!request->keys().empty()) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no cache entry with key ", key));
      }
      continue;  // evicted while exporting everything
    }
    kiln::v1::EntrySummary summary;
    FillSummary(*meta, &summary);
    pending += BundleEntry(summary, hit->value);
    ++exported;
    if (!flush(false)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  }
  pending += BundleEnd();
  if (!flush(true)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  spdlog::info("exported {} entries", exported);
  return grpc::Status::OK;
}

absl::Status AdminService::VerifyImported(const std::string& key, const std::string& record_bytes) {
  if (absl::Status s = cache::ValidateKey(key); !s.ok()) return s;
  absl::StatusOr<cache::EntryRecord> record = cache::DecodeEntryRecord(record_bytes);
  if (!record.ok()) return record.status();
  // A package's data is opaque and its client key is not kept: there is nothing to recompute.
  if (IsPackageRecord(*record)) return absl::OkStatus();
  if (absl::Status s = ReadArtifact(*record).status(); !s.ok()) return s;
  const cache::EntrySection* stored_request = record->Find("request");
  kiln::v1::CompileRequest request;
  if (stored_request == nullptr || !request.ParseFromString(stored_request->data)) {
    return absl::InvalidArgumentError("the entry carries no compile request to re-verify");
  }
  absl::StatusOr<graph::PreparedGraph> prepared =
      graph::PrepareGraph(request, env_->limits, env_->IdentityFor(request.target()));
  if (!prepared.ok()) return prepared.status();
  if (prepared->key.hex != key) {
    return absl::InvalidArgumentError(
        "its key does not match its graph on this server (another kilnd build, toolchain or kiln "
        "version compiled it, or the bundle was altered)");
  }
  return absl::OkStatus();
}

grpc::Status AdminService::Import(grpc::ServerContext*,
                                  grpc::ServerReader<kiln::v1::BundleChunk>* reader,
                                  kiln::v1::ImportResponse* response) {
  if (env_->stats->draining()) return DrainingStatus();
  CallScope call(env_->stats);
  BundleReader bundle(env_->max_entry_bytes);
  kiln::v1::BundleChunk chunk;
  int64_t imported = 0, skipped = 0, rejected = 0;
  while (reader->Read(&chunk)) {
    if (absl::Status s = bundle.Feed(chunk.data()); !s.ok()) return ToGrpcStatus(s);
    while (bundle.HasNext()) {
      BundleItem item = bundle.Next();
      const std::string& key = item.summary.key();
      if (env_->cache->Stat(key).has_value()) {
        ++skipped;
        continue;
      }
      if (absl::Status s = VerifyImported(key, item.record); !s.ok()) {
        spdlog::warn("import: rejected entry {}: {}", key.substr(0, 64), std::string(s.message()));
        ++rejected;
        continue;
      }
      cache::EntryMeta meta;
      meta.target = TargetName(item.summary.target());
      meta.graph_summary = item.summary.graph_summary();
      meta.debug_name = item.summary.debug_name();
      meta.created_unix_ms = item.summary.created_unix_ms();
      if (env_->cache->Put(key, item.record, meta) == 0) {
        return grpc::Status(grpc::StatusCode::INTERNAL,
                            absl::StrCat("import: no cache tier accepted entry ", key));
      }
      ++imported;
    }
  }
  if (absl::Status s = bundle.Finish(); !s.ok()) return ToGrpcStatus(s);
  response->set_imported(imported);
  response->set_skipped(skipped);
  response->set_rejected(rejected);
  spdlog::info("import: {} imported, {} already present, {} rejected", imported, skipped, rejected);
  return grpc::Status::OK;
}

}  // namespace kiln
