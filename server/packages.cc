#include "server/packages.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/cache/encoding.h"

namespace kiln {

absl::StatusOr<std::string> PackageStoreKey(absl::string_view client_key) {
  if (absl::Status s = cache::ValidateKey(client_key); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "package key: ", s.message(), "; the client chooses it, e.g. a SHA-256 of what the "
        "package depends on"));
  }
  std::string hashed;
  hashed.reserve(kPackageKeyDomain.size() + 1 + client_key.size());
  hashed.append(kPackageKeyDomain.data(), kPackageKeyDomain.size());
  hashed.push_back('\0');
  hashed.append(client_key.data(), client_key.size());
  return cache::Sha256Hex(hashed);
}

absl::Status CheckPackagesEnabled(int64_t max_package_bytes) {
  if (max_package_bytes > 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "this kilnd stores no packages (--max_package_bytes=0); set --max_package_bytes to a "
      "positive size, or run without the package store");
}

absl::Status CheckPackageSize(int64_t size, int64_t max_package_bytes) {
  if (absl::Status s = CheckPackagesEnabled(max_package_bytes); !s.ok()) return s;
  if (size <= 0) {
    return absl::InvalidArgumentError("package data is empty; a package holds at least one byte");
  }
  if (size > max_package_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "package data of ", size, " bytes exceeds this kilnd's limit of ", max_package_bytes,
        " bytes (--max_package_bytes); raise the flag or store a smaller package"));
  }
  return absl::OkStatus();
}

std::string EncodePackageRecord(absl::string_view data) {
  cache::EntryRecord record;
  record.sections.push_back({std::string(kPackageSection), std::string(data)});
  return cache::EncodeEntryRecord(record);
}

bool IsPackageRecord(const cache::EntryRecord& record) {
  return record.artifact.empty() && record.Find(kPackageSection) != nullptr;
}

absl::StatusOr<std::string> DecodePackageRecord(absl::string_view record_bytes) {
  absl::StatusOr<cache::EntryRecord> record = cache::DecodeEntryRecord(record_bytes);
  if (!record.ok()) return record.status();
  if (!IsPackageRecord(*record)) {
    return absl::DataLossError(
        "the entry is not a package (it has an artifact, or no \"package\" section)");
  }
  for (cache::EntrySection& section : record->sections) {
    if (section.name == kPackageSection) return std::move(section.data);
  }
  return absl::InternalError("unreachable: the package section vanished");
}

std::string OneLine(absl::string_view text, size_t max_bytes) {
  if (text.size() > max_bytes) {
    size_t cut = max_bytes;
    // Never end inside a UTF-8 sequence: back up over continuation bytes (10xxxxxx).
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    text = text.substr(0, cut);
  }
  std::string out(text);
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) c = ' ';
  }
  return out;
}

std::string PackageSummaryLine(absl::string_view summary, int64_t data_bytes) {
  std::string line = OneLine(summary, kMaxPackageSummaryBytes);
  if (line.find_first_not_of(' ') == std::string::npos) {
    return absl::StrCat("package, ", data_bytes, " bytes");
  }
  return absl::StrCat("package: ", line);
}

cache::EntryMeta PackageMeta(absl::string_view target, absl::string_view debug_name,
                             absl::string_view summary, int64_t data_bytes) {
  cache::EntryMeta meta;
  meta.target = OneLine(target, kMaxPackageTargetBytes);
  meta.debug_name = OneLine(debug_name, kMaxPackageNameBytes);
  meta.graph_summary = PackageSummaryLine(summary, data_bytes);
  return meta;
}

}  // namespace kiln
