#ifndef KILN_SERVER_COMPILER_SERVICE_H_
#define KILN_SERVER_COMPILER_SERVICE_H_

// The kiln.v1.Compiler service (Compile, Lookup).
//
// Both methods take the request as raw bytes and parse it themselves, so that bytes that are not a
// CompileRequest get INVALID_ARGUMENT (gRPC's generated handlers would answer INTERNAL). The work
// runs on kilnd's RequestExecutor, never on gRPC's callback threads; a full queue answers
// RESOURCE_EXHAUSTED. Every call honors the client's deadline and cancellation between phases.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/compiler.grpc.pb.h"
#include "server/request_executor.h"
#include "server/server_stats.h"

namespace kiln {

struct CompilerServiceOptions {
  // Fault injection for tests: each call waits this long (honoring its deadline and cancellation)
  // before it is processed. Zero in production.
  absl::Duration debug_delay = absl::ZeroDuration();
};

using CompilerServiceBase = kiln::v1::Compiler::WithRawCallbackMethod_Compile<
    kiln::v1::Compiler::WithRawCallbackMethod_Lookup<kiln::v1::Compiler::Service>>;

class CompilerService final : public CompilerServiceBase {
 public:
  CompilerService(CompilerServiceOptions options, RequestExecutor* executor, ServerStats* stats);

  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

 private:
  enum class Method { kCompile, kLookup };

  grpc::ServerUnaryReactor* Start(Method method, grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response);
  // Runs on the executor. Parses, checks and answers one call.
  absl::StatusOr<kiln::v1::CompileResponse> Process(Method method,
                                                    grpc::CallbackServerContext* context,
                                                    grpc::ByteBuffer* request);
  // OK, or DEADLINE_EXCEEDED / CANCELLED naming `phase`.
  absl::Status CheckAlive(grpc::CallbackServerContext* context, const char* phase) const;

  const CompilerServiceOptions options_;
  RequestExecutor* const executor_;
  ServerStats* const stats_;
};

// The outcome name counted in ServerStats for a failed call.
std::string OutcomeForStatus(const absl::Status& status);

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kiln

#endif  // KILN_SERVER_COMPILER_SERVICE_H_
