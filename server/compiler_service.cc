#include "server/compiler_service.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "server/version.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

using kiln::v1::CompileRequest;
using kiln::v1::CompileResponse;

absl::Time DeadlineOf(const grpc::ServerContextBase* context) {
  return absl::FromChrono(context->deadline());
}

const char* MethodName(bool lookup) { return lookup ? "Lookup" : "Compile"; }

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

std::string OutcomeForStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return "invalid_argument";
    case absl::StatusCode::kUnimplemented: return "unimplemented";
    case absl::StatusCode::kResourceExhausted: return "resource_exhausted";
    case absl::StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case absl::StatusCode::kCancelled: return "cancelled";
    default: return "internal";
  }
}

CompilerService::CompilerService(CompilerServiceOptions options, RequestExecutor* executor,
                                 ServerStats* stats)
    : options_(options), executor_(executor), stats_(stats) {}

grpc::ServerUnaryReactor* CompilerService::Compile(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  return Start(Method::kCompile, context, request, response);
}

grpc::ServerUnaryReactor* CompilerService::Lookup(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return Start(Method::kLookup, context, request, response);
}

grpc::ServerUnaryReactor* CompilerService::Start(Method method,
                                                 grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // gRPC keeps `request` alive until Finish; the executor may consume it.
  auto* mutable_request = const_cast<grpc::ByteBuffer*>(request);
  bool accepted = executor_->TrySubmit([this, method, context, mutable_request, response,
                                        reactor] {
    absl::StatusOr<CompileResponse> result = Process(method, context, mutable_request);
    if (!result.ok()) {
      stats_->Count(OutcomeForStatus(result.status()));
      spdlog::info("{} failed: {}", MethodName(method == Method::kLookup),
                   result.status().ToString());
      reactor->Finish(ToGrpcStatus(result.status()));
      return;
    }
    bool own_buffer = false;
    grpc::Status serialized =
        grpc::SerializationTraits<CompileResponse>::Serialize(*result, response, &own_buffer);
    reactor->Finish(serialized);
  });
  if (!accepted) {
    stats_->Count("resource_exhausted");
    reactor->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("kilnd is overloaded: ", executor_->max_queued(),
                     " requests are already queued (--max_queued_requests); retry in a few "
                     "seconds")));
  }
  return reactor;
}

absl::Status CompilerService::CheckAlive(grpc::CallbackServerContext* context,
                                         const char* phase) const {
  // The deadline first: gRPC also cancels a call whose deadline passed.
  if (absl::Now() >= DeadlineOf(context)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the client's deadline passed before kilnd finished (", phase, ")"));
  }
  if (context->IsCancelled()) {
    return absl::CancelledError(absl::StrCat("the client cancelled the call (", phase, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CompileResponse> CompilerService::Process(Method method,
                                                         grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* request) {
  const bool lookup = method == Method::kLookup;
  if (absl::Status s = CheckAlive(context, "queued"); !s.ok()) return s;

  if (options_.debug_delay > absl::ZeroDuration()) {
    absl::Time until = absl::Now() + options_.debug_delay;
    while (absl::Now() < until) {
      if (absl::Status s = CheckAlive(context, "debug delay"); !s.ok()) return s;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  CompileRequest parsed;
  size_t request_bytes = request->Length();
  grpc::Status parse = grpc::SerializationTraits<CompileRequest>::Deserialize(request, &parsed);
  if (!parse.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        MethodName(lookup), ": the request (", request_bytes,
        " bytes) is not a valid kiln.v1.CompileRequest; is the client speaking the kiln.v1 "
        "protocol?"));
  }
  if (parsed.graph().nodes_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(MethodName(lookup), ": the request has no graph (graph.nodes is empty)"));
  }
  if (parsed.target().device() == kiln::v1::DEVICE_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        MethodName(lookup), ": target.device is not set; say CPU or CUDA"));
  }
  if (absl::Status s = CheckAlive(context, "parsed"); !s.ok()) return s;

  return absl::UnimplementedError(absl::StrCat(
      "kilnd ", kKilnVersion, " cannot ", lookup ? "look up" : "compile",
      " graphs yet: the graph path and compiler are not built; the client runs this graph "
      "eagerly"));
}

}  // namespace kiln
