#ifndef KILN_SERVER_ADMIN_SERVICE_H_
#define KILN_SERVER_ADMIN_SERVICE_H_

// The kiln.v1.Admin service used by kilnctl: counters, and listing, reading, evicting, purging,
// verifying, exporting and importing cache entries. Reads for admin never count as hits.

#include <string>

#include "grpcpp/grpcpp.h"
#include "kiln/v1/admin.grpc.pb.h"
#include "server/service_env.h"

namespace kiln {

class AdminService final : public kiln::v1::Admin::Service {
 public:
  explicit AdminService(const ServiceEnv* env) : env_(env) {}

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
  // Checks one imported entry as kilnd checks its own: artifact checksum, and the key recomputed
  // from the stored request with this server's limits and toolchain. A package (packages.h) is
  // accepted as it is: its data is opaque and its client key is not stored.
  absl::Status VerifyImported(const std::string& key, const std::string& record_bytes);

  const ServiceEnv* const env_;
};

}  // namespace kiln

#endif  // KILN_SERVER_ADMIN_SERVICE_H_
