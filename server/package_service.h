#ifndef KILN_SERVER_PACKAGE_SERVICE_H_
#define KILN_SERVER_PACKAGE_SERVICE_H_

// Compiler.PutPackage and Compiler.GetPackage: the package store (packages.h) over gRPC.
// CompilerService owns one and forwards those two methods to it (one gRPC service holds all of
// kiln.v1.Compiler's methods).
//
// Like Compile/Lookup: the request arrives as raw bytes and is parsed here (bytes that are not the
// request message get INVALID_ARGUMENT), the work runs on kilnd's RequestExecutor (a full queue
// answers RESOURCE_EXHAUSTED), a draining kilnd answers UNAVAILABLE, and the client's deadline and
// cancellation are checked before the cache is touched. Outcomes are counted in ServerStats as
// "package_put", "package_<tier>_hit", "package_miss" and "package_<status code>"; logs carry keys
// and sizes only, never the client's bytes.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/service_env.h"

namespace kiln {

class PackageService {
 public:
  // max_package_bytes: --max_package_bytes (0: both methods answer FAILED_PRECONDITION).
  PackageService(int64_t max_package_bytes, const ServiceEnv* env);

  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer* request, grpc::ByteBuffer* response);
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const grpc::ByteBuffer* request, grpc::ByteBuffer* response);

 private:
  // Run on the executor; each returns the serialized response.
  absl::StatusOr<std::string> ProcessPut(grpc::CallbackServerContext* context,
                                         grpc::ByteBuffer* request);
  absl::StatusOr<std::string> ProcessGet(grpc::CallbackServerContext* context,
                                         grpc::ByteBuffer* request);

  const int64_t max_package_bytes_;
  const ServiceEnv* const env_;
};

}  // namespace kiln

#endif  // KILN_SERVER_PACKAGE_SERVICE_H_
