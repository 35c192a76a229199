#ifndef KILN_SERVER_PACKAGES_H_
#define KILN_SERVER_PACKAGES_H_

// Packages: opaque client blobs (kiln.compile stores torch's AOT-compiled functions) kept in the
// cache tiers beside compiled artifacts, so that they are bounded, evicted, listed, purged,
// exported and imported like them. This is the pure logic of Compiler.PutPackage/GetPackage; the
// gRPC plumbing is package_service.h.
//
// Contract:
//  - A package is stored under PackageStoreKey(client key): SHA-256 over a domain string and the
//    client's key, so a client key never names a compiled graph's entry (and the reverse).
//  - The stored value is a cache::EntryRecord with an empty artifact and one section "package"
//    holding the data; DecodePackageRecord gives the data back exactly, and refuses (DATA_LOSS)
//    anything else, e.g. a compiled graph's record.
//  - Errors name the field or limit and what to do; they never echo the client's data.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/cache/entry_record.h"
#include "server/cache/store.h"

namespace kiln {

// Hashed before the client's key (with a '\0' after it). Changing it orphans every stored package.
inline constexpr absl::string_view kPackageKeyDomain = "kiln.package.v1";
// The EntryRecord section that holds a package's data.
inline constexpr absl::string_view kPackageSection = "package";
// --max_package_bytes' default.
inline constexpr int64_t kDefaultMaxPackageBytes = int64_t{64} << 20;
// Bounds on the descriptive fields kilnd keeps (longer ones are cut at a UTF-8 boundary).
inline constexpr size_t kMaxPackageSummaryBytes = 200;
inline constexpr size_t kMaxPackageNameBytes = 200;
inline constexpr size_t kMaxPackageTargetBytes = 64;

// The cache key of the package that the client calls `client_key`: lowercase hex SHA-256 of
// kPackageKeyDomain, '\0', client_key. INVALID_ARGUMENT when client_key is not 64 lowercase hex.
absl::StatusOr<std::string> PackageStoreKey(absl::string_view client_key);

// OK while packages are on (max_package_bytes > 0); else FAILED_PRECONDITION naming the flag.
absl::Status CheckPackagesEnabled(int64_t max_package_bytes);
// OK for 1..max_package_bytes bytes of data; INVALID_ARGUMENT for none, RESOURCE_EXHAUSTED naming
// the size, the limit and the flag for more.
absl::Status CheckPackageSize(int64_t size, int64_t max_package_bytes);

// The value stored for a package, and its data back.
std::string EncodePackageRecord(absl::string_view data);
absl::StatusOr<std::string> DecodePackageRecord(absl::string_view record_bytes);
// True for a record that EncodePackageRecord made (admin tools tell packages from graphs by it).
bool IsPackageRecord(const cache::EntryRecord& record);

// "package: <summary>" made one line and cut to kMaxPackageSummaryBytes, or "package, N bytes"
// when the summary is empty.
std::string PackageSummaryLine(absl::string_view summary, int64_t data_bytes);
// The metadata stored with a package (descriptive fields made one line and bounded).
cache::EntryMeta PackageMeta(absl::string_view target, absl::string_view debug_name,
                             absl::string_view summary, int64_t data_bytes);

// `text` with control characters replaced by spaces and cut to at most `max_bytes` bytes without
// splitting a UTF-8 sequence.
std::string OneLine(absl::string_view text, size_t max_bytes);

}  // namespace kiln

#endif  // KILN_SERVER_PACKAGES_H_
