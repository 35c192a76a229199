#ifndef KILN_SERVER_COMPILER_SERVICE_H_
#define KILN_SERVER_COMPILER_SERVICE_H_

// The kiln.v1.Compiler service (Compile, Lookup; PutPackage and GetPackage are forwarded to
// PackageService, package_service.h).
//
// Every method takes the request as raw bytes and parses it itself, so that bytes that are not a
// CompileRequest get INVALID_ARGUMENT (gRPC's generated handlers would answer INTERNAL). The work
// runs on kilnd's RequestExecutor, never on gRPC's callback threads; a full queue answers
// RESOURCE_EXHAUSTED. Every call honors the client's deadline and cancellation between phases.

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/compiler.grpc.pb.h"
#include "server/package_service.h"
#include "server/packages.h"
#include "server/service_env.h"

namespace kiln {

struct CompilerServiceOptions {
  // Fault injection for tests: each call waits this long (honoring its deadline and cancellation)
  // before it is processed. Zero in production.
  absl::Duration debug_delay = absl::ZeroDuration();
  // --max_package_bytes: the largest package PutPackage stores; 0 turns packages off.
  int64_t max_package_bytes = kDefaultMaxPackageBytes;
};

// Every method of kiln.v1.Compiler must appear here: a method left out answers UNIMPLEMENTED.
using CompilerServiceBase = kiln::v1::Compiler::WithRawCallbackMethod_Compile<
    kiln::v1::Compiler::WithRawCallbackMethod_Lookup<
        kiln::v1::Compiler::WithRawCallbackMethod_PutPackage<
            kiln::v1::Compiler::WithRawCallbackMethod_GetPackage<kiln::v1::Compiler::Service>>>>;

class CompilerService final : public CompilerServiceBase {
 public:
  CompilerService(CompilerServiceOptions options, const ServiceEnv* env);

  grpc::ServerUnaryReactor* Compile(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PutPackage(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetPackage(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

 private:
  enum class Method { kCompile, kLookup };

  grpc::ServerUnaryReactor* Start(Method method, grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response);
  // A reply: the response without its artifact, plus the serialized artifact, which is spliced in
  // as field 3 when the reply is written (no parse and re-serialize of a large artifact per hit).
  struct Reply {
    kiln::v1::CompileResponse response;
    std::string artifact;
  };
  // Runs on the executor. Parses, checks and answers one call.
  absl::StatusOr<Reply> Process(Method method, grpc::CallbackServerContext* context,
                                grpc::ByteBuffer* request);

  // A stored entry's serialized artifact, or nullopt (counted and evicted) when the entry does not
  // decode. The store verified the entry's SHA-256 on read; artifacts of another format never
  // reach here because the artifact format version is part of every key.
  std::optional<std::string> ReadHit(const std::string& key, const std::string& bytes);

  const CompilerServiceOptions options_;
  const ServiceEnv* const env_;
  PackageService packages_;
};

// OK, or DEADLINE_EXCEEDED / CANCELLED naming `phase`, for a call of any of kilnd's services.
absl::Status CheckCallAlive(grpc::CallbackServerContext* context, const char* phase);

// The outcome name counted in ServerStats for a failed call.
std::string OutcomeForStatus(const absl::Status& status);

// One unary call of kilnd's Compiler service, run on the RequestExecutor: a draining kilnd answers
// UNAVAILABLE; a full queue RESOURCE_EXHAUSTED; `work` (on an executor thread) returns the
// serialized response, or a status that is logged as "<method> failed" and answered. Failures
// and a full queue are counted in ServerStats under outcome(status); the call is counted as in
// flight (BeginCall/EndCall) from here to Finish.
grpc::ServerUnaryReactor* StartUnaryCall(
    const ServiceEnv* env, grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
    const char* method, std::function<std::string(const absl::Status&)> outcome,
    std::function<absl::StatusOr<std::string>()> work);

grpc::Status ToGrpcStatus(const absl::Status& status);

// Serializes `response` with `artifact` (a serialized kiln.v1.Artifact) as its field 3.
std::string SerializeWithArtifact(const kiln::v1::CompileResponse& response,
                                  const std::string& artifact);

// Appends a length-delimited field (bytes, string or message) to a serialized message: parsers
// accept fields in any order, so a large value need not be copied into the message first.
void AppendBytesField(int field_number, absl::string_view bytes, std::string* out);

// The answer to a call that arrives while kilnd drains for shutdown.
grpc::Status DrainingStatus();

}  // namespace kiln

#endif  // KILN_SERVER_COMPILER_SERVICE_H_
