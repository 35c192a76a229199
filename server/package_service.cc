#include "server/package_service.h"

#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "kiln/v1/compiler.pb.h"
#include "server/base/status_macros.h"
#include "server/compiler_service.h"
#include "server/packages.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

constexpr char kPut[] = "PutPackage";
constexpr char kGet[] = "GetPackage";

// "package_" + the lowercase status code, e.g. "package_invalid_argument".
std::string PackageOutcome(const absl::Status& status) {
  return absl::StrCat("package_", absl::AsciiStrToLower(absl::StatusCodeToString(status.code())));
}

// Parses raw request bytes; INVALID_ARGUMENT naming the method and the expected message.
template <typename Message>
absl::Status ParseRequest(const char* method, grpc::ByteBuffer* bytes, Message* message) {
  const size_t size = bytes->Length();
  if (grpc::SerializationTraits<Message>::Deserialize(bytes, message).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      method, ": the request (", size, " bytes) is not a valid ",
      Message::descriptor()->full_name(), "; is the client speaking the kiln.v1 protocol?"));
}

// Prefixes a status's message with the method name, keeping its code.
absl::Status InMethod(const char* method, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(method, ": ", status.message()));
}

// What both methods check first: the call is still wanted, packages are on, the request parses
// and its key is well-formed. Returns the store key.
template <typename Request>
absl::StatusOr<std::string> OpenRequest(const char* method, grpc::CallbackServerContext* context,
                                        int64_t max_package_bytes, grpc::ByteBuffer* bytes,
                                        Request* request) {
  if (absl::Status s = CheckCallAlive(context, "queued"); !s.ok()) return s;
  if (absl::Status s = CheckPackagesEnabled(max_package_bytes); !s.ok()) return InMethod(method, s);
  if (absl::Status s = ParseRequest(method, bytes, request); !s.ok()) return s;
  absl::StatusOr<std::string> store_key = PackageStoreKey(request->key());
  if (!store_key.ok()) return InMethod(method, store_key.status());
  return store_key;
}

}  // namespace

PackageService::PackageService(int64_t max_package_bytes, const ServiceEnv* env)
    : max_package_bytes_(max_package_bytes), env_(env) {}

// gRPC keeps `request` alive until Finish; the executor may consume it (hence the const_cast).
grpc::ServerUnaryReactor* PackageService::Put(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  auto* bytes = const_cast<grpc::ByteBuffer*>(request);
  return StartUnaryCall(env_, context, response, kPut, PackageOutcome,
                        [this, context, bytes] { return ProcessPut(context, bytes); });
}

grpc::ServerUnaryReactor* PackageService::Get(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  auto* bytes = const_cast<grpc::ByteBuffer*>(request);
  return StartUnaryCall(env_, context, response, kGet, PackageOutcome,
                        [this, context, bytes] { return ProcessGet(context, bytes); });
}

absl::StatusOr<std::string> PackageService::ProcessPut(grpc::CallbackServerContext* context,
                                                       grpc::ByteBuffer* request_bytes) {
  const char* method = kPut;
  kiln::v1::PutPackageRequest request;
  KILN_ASSIGN_OR_RETURN(const std::string store_key,
                        OpenRequest(method, context, max_package_bytes_, request_bytes, &request));
  const int64_t size = static_cast<int64_t>(request.data().size());
  if (absl::Status s = CheckPackageSize(size, max_package_bytes_); !s.ok()) {
    return InMethod(method, s);
  }
  const cache::EntryMeta meta =
      PackageMeta(request.target(), request.debug_name(), request.summary(), size);
  std::string record = EncodePackageRecord(request.data());
  request.clear_data();  // the record holds the only copy from here on
  if (absl::Status s = CheckCallAlive(context, "encoded"); !s.ok()) return s;

  const int tiers = env_->cache->Put(store_key, record, meta);
  if (tiers == 0) {
    return absl::InternalError(absl::StrCat(
        method, ": no cache tier stored the package (", size,
        " bytes): a tier is failing or the entry exceeds its bound (--cache_max_bytes); see "
        "kilnd's log"));
  }
  spdlog::debug("PutPackage: stored {} ({} bytes, record {} bytes) in {} tier(s)", store_key, size,
                record.size(), tiers);
  env_->stats->Count("package_put");
  kiln::v1::PutPackageResponse response;
  response.set_store_key(store_key);
  return response.SerializeAsString();
}

absl::StatusOr<std::string> PackageService::ProcessGet(grpc::CallbackServerContext* context,
                                                       grpc::ByteBuffer* request_bytes) {
  const char* method = kGet;
  kiln::v1::GetPackageRequest request;
  KILN_ASSIGN_OR_RETURN(const std::string store_key,
                        OpenRequest(method, context, max_package_bytes_, request_bytes, &request));

  kiln::v1::GetPackageResponse response;
  response.set_store_key(store_key);
  std::optional<cache::CacheHit> hit = env_->cache->Get(store_key);
  std::optional<std::string> data;
  if (hit.has_value()) {
    absl::StatusOr<std::string> decoded = DecodePackageRecord(hit->value);
    if (decoded.ok()) {
      data = *std::move(decoded);
    } else {
      // The bytes passed the store's checksum but are not a package: never serve them.
      spdlog::error("cache entry {} is not a usable package ({}); removing it and treating it as a "
                    "miss", store_key, std::string(decoded.status().message()));
      env_->stats->Count("corrupt_entry");
      (void)env_->cache->Remove(store_key);
    }
  }
  if (!data.has_value()) {
    response.set_source(kiln::v1::CACHE_SOURCE_MISS);
    env_->stats->Count("package_miss");
    spdlog::debug("GetPackage: {} is not stored", store_key);
    return response.SerializeAsString();
  }
  static constexpr kiln::v1::CacheSource kSources[] = {kiln::v1::CACHE_SOURCE_MEMORY_HIT,
                                                       kiln::v1::CACHE_SOURCE_DISK_HIT,
                                                       kiln::v1::CACHE_SOURCE_SHARED_HIT};
  response.set_found(true);
  response.set_source(kSources[static_cast<int>(hit->tier)]);
  env_->stats->Count(absl::StrCat("package_", cache::TierName(hit->tier), "_hit"));
  spdlog::debug("GetPackage: {} hit in the {} tier ({} bytes)", store_key,
                std::string(cache::TierName(hit->tier)), data->size());
  // The data goes in as field 2 after the rest: no copy of it into the message first.
  std::string out = response.SerializeAsString();
  AppendBytesField(kiln::v1::GetPackageResponse::kDataFieldNumber, *data, &out);
  return out;
}

}  // namespace kiln
