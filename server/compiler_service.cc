#include "server/compiler_service.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "server/cache/entry_record.h"
#include "server/cache_entry.h"
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

grpc::Status DrainingStatus() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "kilnd is shutting down and accepts no new calls; retry on another server");
}

std::string OutcomeForStatus(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return "invalid_argument";
    case absl::StatusCode::kUnimplemented: return "unimplemented";
    case absl::StatusCode::kResourceExhausted: return "resource_exhausted";
    case absl::StatusCode::kDeadlineExceeded: return "deadline_exceeded";
    case absl::StatusCode::kCancelled: return "cancelled";
    case absl::StatusCode::kFailedPrecondition: return "failed_precondition";
    default: return "internal";
  }
}

CompilerService::CompilerService(CompilerServiceOptions options, const ServiceEnv* env)
    : options_(options), env_(env), packages_(options.max_package_bytes, env) {}

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

grpc::ServerUnaryReactor* CompilerService::PutPackage(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return packages_.Put(context, request, response);
}

grpc::ServerUnaryReactor* CompilerService::GetPackage(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return packages_.Get(context, request, response);
}

grpc::ServerUnaryReactor* CompilerService::Start(Method method,
                                                 grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  // gRPC keeps `request` alive until Finish; the executor may consume it.
  auto* mutable_request = const_cast<grpc::ByteBuffer*>(request);
  return StartUnaryCall(env_, context, response, MethodName(method == Method::kLookup),
                        OutcomeForStatus,
                        [this, method, context, mutable_request]() -> absl::StatusOr<std::string> {
                          absl::Time start = absl::Now();
                          absl::StatusOr<Reply> result = Process(method, context, mutable_request);
                          if (!result.ok()) return result.status();
                          kiln::v1::PhaseTiming* total = result->response.add_timings();
                          total->set_phase("total");
                          total->set_micros(absl::ToInt64Microseconds(absl::Now() - start));
                          return SerializeWithArtifact(result->response, result->artifact);
                        });
}

grpc::ServerUnaryReactor* StartUnaryCall(
    const ServiceEnv* env, grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
    const char* method, std::function<std::string(const absl::Status&)> outcome,
    std::function<absl::StatusOr<std::string>()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (env->stats->draining()) {
    reactor->Finish(DrainingStatus());
    return reactor;
  }
  env->stats->BeginCall();
  bool accepted = env->executor->TrySubmit([env, response, reactor, method, outcome,
                                            work = std::move(work)] {
    absl::StatusOr<std::string> result = work();
    if (!result.ok()) {
      env->stats->Count(outcome(result.status()));
      spdlog::info("{} failed: {}", method, result.status().ToString());
      env->stats->EndCall();
      reactor->Finish(ToGrpcStatus(result.status()));
      return;
    }
    auto* bytes = new std::string(*std::move(result));
    grpc::Slice slice(bytes->data(), bytes->size(),
                      [](void* p) { delete static_cast<std::string*>(p); }, bytes);
    *response = grpc::ByteBuffer(&slice, 1);
    env->stats->EndCall();
    reactor->Finish(grpc::Status::OK);
  });
  if (!accepted) {
    env->stats->EndCall();
    const absl::Status overloaded = absl::ResourceExhaustedError(
        absl::StrCat("kilnd is overloaded: ", env->executor->max_queued(),
                     " requests are already queued (--max_queued_requests); retry in a few "
                     "seconds"));
    env->stats->Count(outcome(overloaded));
    reactor->Finish(ToGrpcStatus(overloaded));
  }
  return reactor;
}

absl::Status CheckCallAlive(grpc::CallbackServerContext* context, const char* phase) {
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

absl::StatusOr<CompilerService::Reply> CompilerService::Process(Method method,
                                                         grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* request) {
  const bool lookup = method == Method::kLookup;
  if (absl::Status s = CheckCallAlive(context, "queued"); !s.ok()) return s;

  if (options_.debug_delay > absl::ZeroDuration()) {
    absl::Time until = absl::Now() + options_.debug_delay;
    while (absl::Now() < until) {
      if (absl::Status s = CheckCallAlive(context, "debug delay"); !s.ok()) return s;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  auto parsed = std::make_shared<CompileRequest>();
  size_t request_bytes = request->Length();
  grpc::Status parse = grpc::SerializationTraits<CompileRequest>::Deserialize(request, parsed.get());
  if (!parse.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        MethodName(lookup), ": the request (", request_bytes,
        " bytes) is not a valid kiln.v1.CompileRequest; is the client speaking the kiln.v1 "
        "protocol?"));
  }
  if (parsed->graph().nodes_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(MethodName(lookup), ": the request has no graph (graph.nodes is empty)"));
  }
  if (parsed->target().device() == kiln::v1::DEVICE_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        MethodName(lookup), ": target.device is not set; say CPU or CUDA"));
  }

  // Graph path: import -> verify -> canonicalize and hash.
  absl::StatusOr<graph::PreparedGraph> prepared_or =
      graph::PrepareGraph(*parsed, env_->limits, env_->IdentityFor(parsed->target()));
  if (!prepared_or.ok()) return prepared_or.status();
  auto prepared = std::make_shared<const graph::PreparedGraph>(*std::move(prepared_or));
  if (absl::Status s = CheckCallAlive(context, "hashed"); !s.ok()) return s;

  Reply reply;
  CompileResponse& response = reply.response;
  response.set_key(prepared->key.hex);
  response.set_server_version(kKilnVersion);
  for (const auto& [phase, us] : prepared->timings_us) {
    kiln::v1::PhaseTiming* t = response.add_timings();
    t->set_phase(phase);
    t->set_micros(us);
  }
  auto add_timing = [&response](const char* phase, absl::Duration d) {
    kiln::v1::PhaseTiming* t = response.add_timings();
    t->set_phase(phase);
    t->set_micros(absl::ToInt64Microseconds(d));
  };
  const std::string& key = prepared->key.hex;

  absl::Time lookup_start = absl::Now();
  std::optional<cache::CacheHit> hit = env_->cache->Get(key);
  std::optional<std::string> artifact;
  if (hit.has_value()) artifact = ReadHit(key, hit->value);
  add_timing("lookup", absl::Now() - lookup_start);
  if (artifact.has_value()) {
    static constexpr kiln::v1::CacheSource kSources[] = {kiln::v1::CACHE_SOURCE_MEMORY_HIT,
                                                         kiln::v1::CACHE_SOURCE_DISK_HIT,
                                                         kiln::v1::CACHE_SOURCE_SHARED_HIT};
    response.set_source(kSources[static_cast<int>(hit->tier)]);
    reply.artifact = *std::move(artifact);
    env_->stats->Count(absl::StrCat(cache::TierName(hit->tier), "_hit"));
    return reply;
  }
  if (lookup) {
    response.set_source(kiln::v1::CACHE_SOURCE_MISS);
    env_->stats->Count("miss");
    return reply;
  }
  if (env_->compiler == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "this kilnd serves cached artifacts only (--no_compile) and has none for key ",
        key.substr(0, 16), "... (", TargetName(parsed->target()),
        "); the client runs this graph eagerly"));
  }

  // Miss: join the compile in flight for this key, or start one. The compile function owns what
  // it uses (it outlives this call if the client gives up) and stores the artifact itself.
  cache::TieredCache* tiers = env_->cache;
  GraphCompiler* compiler = env_->compiler;
  auto compile = [tiers, compiler, prepared, parsed]() -> absl::StatusOr<std::string> {
    const std::string& key = prepared->key.hex;
    if (std::optional<cache::CacheHit> again = tiers->Peek(key)) return again->value;
    absl::StatusOr<CompileResult> result = compiler->Compile(*prepared, *parsed);
    if (!result.ok()) return result.status();
    cache::EntryMeta meta;
    meta.target = TargetName(parsed->target());
    meta.graph_summary = absl::StrCat(parsed->graph().nodes_size(), " nodes, ", result->summary);
    meta.debug_name = parsed->graph().debug_name();
    std::string bytes =
        cache::EncodeEntryRecord(MakeEntryRecord(*prepared, *parsed, *std::move(result)));
    tiers->Put(key, bytes, meta);  // a cache error never fails the compile
    return bytes;
  };
  absl::Time compile_start = absl::Now();
  cache::CompileReply compiled = env_->scheduler->Run(key, compile, DeadlineOf(context));
  add_timing("compile_wait", absl::Now() - compile_start);
  if (!compiled.status.ok()) {
    if (compiled.role == cache::CompileRole::kNegativeHit) env_->stats->Count("negative_hit");
    return compiled.status;
  }
  absl::StatusOr<cache::EntryRecord> record = cache::DecodeEntryRecord(*compiled.bytes);
  if (!record.ok()) {
    return absl::InternalError(absl::StrCat("the compiled entry does not decode: ",
                                            record.status().message()));
  }
  reply.artifact = std::move(record->artifact);
  if (const cache::EntrySection* t = record->Find("timings")) {
    kiln::v1::Entry timings;
    if (timings.ParseFromString(t->data)) {
      for (const auto& phase : timings.timings()) {
        if (phase.phase() != "import" && phase.phase() != "verify" && phase.phase() != "hash") {
          *response.add_timings() = phase;
        }
      }
    }
  }
  const bool joined = compiled.role == cache::CompileRole::kJoined;
  response.set_source(joined ? kiln::v1::CACHE_SOURCE_JOINED : kiln::v1::CACHE_SOURCE_COMPILED);
  env_->stats->Count(joined ? "joined" : "compiled");
  if (!joined && env_->compile_latency != nullptr) {
    env_->compile_latency->Observe(absl::Now() - compile_start);
  }
  return reply;
}

std::optional<std::string> CompilerService::ReadHit(const std::string& key,
                                                    const std::string& bytes) {
  absl::StatusOr<cache::EntryRecord> record = cache::DecodeEntryRecord(bytes);
  if (record.ok() && !record->artifact.empty()) return std::move(record->artifact);
  // The bytes passed the store's checksum but do not decode: never serve them.
  spdlog::error("cache entry {} is unusable ({}); removing it and treating it as a miss", key,
                record.ok() ? std::string("no artifact") : std::string(record.status().message()));
  env_->stats->Count("corrupt_entry");
  (void)env_->cache->Remove(key);
  return std::nullopt;
}

std::string SerializeWithArtifact(const CompileResponse& response, const std::string& artifact) {
  std::string out = response.SerializeAsString();
  if (!artifact.empty()) AppendBytesField(3, artifact, &out);  // field 3: artifact
  return out;
}

void AppendBytesField(int field_number, absl::string_view bytes, std::string* out) {
  out->reserve(out->size() + bytes.size() + 16);
  auto varint = [out](uint64_t n) {
    for (; n >= 0x80; n >>= 7) out->push_back(static_cast<char>((n & 0x7f) | 0x80));
    out->push_back(static_cast<char>(n));
  };
  varint((static_cast<uint64_t>(field_number) << 3) | 2);  // tag: length-delimited
  varint(bytes.size());
  out->append(bytes.data(), bytes.size());
}

}  // namespace kiln
