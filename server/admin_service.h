#ifndef KILN_SERVER_ADMIN_SERVICE_H_
#define KILN_SERVER_ADMIN_SERVICE_H_

// The kiln.v1.Admin service used by kilnctl. GetStats reports the server's counters; the cache
// operations answer UNIMPLEMENTED, saying so, until the artifact cache exists.

#include <string>

#include "grpcpp/grpcpp.h"
#include "kiln/v1/admin.grpc.pb.h"
#include "server/request_executor.h"
#include "server/server_stats.h"

namespace kiln {

struct AdminServiceOptions {
  std::string cache_dir;
  int request_threads = 0;
};

class AdminService final : public kiln::v1::Admin::Service {
 public:
  AdminService(AdminServiceOptions options, const RequestExecutor* executor,
               const ServerStats* stats);

  grpc::Status GetStats(grpc::ServerContext* context, const kiln::v1::GetStatsRequest* request,
                        kiln::v1::Stats* response) override;
  grpc::Status ListEntries(grpc::ServerContext*, const kiln::v1::ListEntriesRequest*,
                           kiln::v1::ListEntriesResponse*) override;
  grpc::Status GetEntry(grpc::ServerContext*, const kiln::v1::GetEntryRequest*,
                        kiln::v1::Entry*) override;
  grpc::Status Evict(grpc::ServerContext*, const kiln::v1::EvictRequest*,
                     kiln::v1::EvictResponse*) override;
  grpc::Status Purge(grpc::ServerContext*, const kiln::v1::PurgeRequest*,
                     kiln::v1::PurgeResponse*) override;
  grpc::Status Verify(grpc::ServerContext*, const kiln::v1::VerifyRequest*,
                      kiln::v1::VerifyResponse*) override;
  grpc::Status Export(grpc::ServerContext*, const kiln::v1::ExportRequest*,
                      grpc::ServerWriter<kiln::v1::BundleChunk>*) override;
  grpc::Status Import(grpc::ServerContext*, grpc::ServerReader<kiln::v1::BundleChunk>*,
                      kiln::v1::ImportResponse*) override;

 private:
  const AdminServiceOptions options_;
  const RequestExecutor* const executor_;
  const ServerStats* const stats_;
};

}  // namespace kiln

#endif  // KILN_SERVER_ADMIN_SERVICE_H_
