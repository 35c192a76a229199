#include "server/admin_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/version.h"

namespace kiln {
namespace {

grpc::Status NoCacheYet(const char* method) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                      absl::StrCat("Admin.", method, ": kilnd ", kKilnVersion,
                                   " has no artifact cache yet, so there are no entries to ",
                                   "manage"));
}

}  // namespace

AdminService::AdminService(AdminServiceOptions options, const RequestExecutor* executor,
                           const ServerStats* stats)
    : options_(std::move(options)), executor_(executor), stats_(stats) {}

grpc::Status AdminService::GetStats(grpc::ServerContext*, const kiln::v1::GetStatsRequest*,
                                    kiln::v1::Stats* response) {
  response->set_server_version(kKilnVersion);
  response->set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - stats_->start()));
  for (const auto& [outcome, count] : stats_->Requests()) {
    (*response->mutable_requests())[outcome] = count;
  }
  response->set_compiles_queued(static_cast<int64_t>(executor_->queued()));
  response->set_workers(options_.request_threads);
  response->set_cache_dir(options_.cache_dir);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListEntries(grpc::ServerContext*, const kiln::v1::ListEntriesRequest*,
                                       kiln::v1::ListEntriesResponse*) {
  return NoCacheYet("ListEntries");
}
grpc::Status AdminService::GetEntry(grpc::ServerContext*, const kiln::v1::GetEntryRequest*,
                                    kiln::v1::Entry*) {
  return NoCacheYet("GetEntry");
}
grpc::Status AdminService::Evict(grpc::ServerContext*, const kiln::v1::EvictRequest*,
                                 kiln::v1::EvictResponse*) {
  return NoCacheYet("Evict");
}
grpc::Status AdminService::Purge(grpc::ServerContext*, const kiln::v1::PurgeRequest*,
                                 kiln::v1::PurgeResponse*) {
  return NoCacheYet("Purge");
}
grpc::Status AdminService::Verify(grpc::ServerContext*, const kiln::v1::VerifyRequest*,
                                  kiln::v1::VerifyResponse*) {
  return NoCacheYet("Verify");
}
grpc::Status AdminService::Export(grpc::ServerContext*, const kiln::v1::ExportRequest*,
                                  grpc::ServerWriter<kiln::v1::BundleChunk>*) {
  return NoCacheYet("Export");
}
grpc::Status AdminService::Import(grpc::ServerContext*,
                                  grpc::ServerReader<kiln::v1::BundleChunk>*,
                                  kiln::v1::ImportResponse*) {
  return NoCacheYet("Import");
}

}  // namespace kiln
