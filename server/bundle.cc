#include "server/bundle.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/cache/encoding.h"

namespace kiln {
namespace {

constexpr char kMagic[] = "KILNBNDL";
constexpr uint32_t kVersion = 1;

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

std::string Digest(absl::string_view summary, absl::string_view record) {
  cache::Sha256Digest d = cache::Sha256({summary, record});
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

std::string BundleHeader() {
  std::string out(kMagic, 8);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((kVersion >> (8 * i)) & 0xff));
  return out;
}

std::string BundleEntry(const kiln::v1::EntrySummary& summary, absl::string_view record) {
  std::string s = summary.SerializeAsString();
  std::string out;
  PutU64(&out, s.size());
  out += s;
  PutU64(&out, record.size());
  out.append(record.data(), record.size());
  out += Digest(s, record);
  return out;
}

std::string BundleEnd() {
  std::string out;
  PutU64(&out, 0);
  return out;
}

absl::Status BundleReader::Feed(absl::string_view bytes) {
  if (ended_ && !bytes.empty()) {
    return absl::InvalidArgumentError("bundle: bytes after the end marker");
  }
  buffer_.append(bytes.data(), bytes.size());
  return Parse();
}

BundleItem BundleReader::Next() {
  BundleItem item = std::move(items_.front());
  items_.pop_front();
  return item;
}

absl::Status BundleReader::Finish() const {
  if (!ended_) {
    return absl::InvalidArgumentError(absl::StrCat("bundle: truncated after ", entries_,
                                                   " entries (no end marker)"));
  }
  return absl::OkStatus();
}

absl::Status BundleReader::Parse() {
  if (!header_done_) {
    if (buffer_.size() < 12) return absl::OkStatus();
    if (memcmp(buffer_.data(), kMagic, 8) != 0) {
      return absl::InvalidArgumentError("bundle: not a kiln bundle (bad magic)");
    }
    uint32_t version = 0;
    for (int i = 0; i < 4; ++i) version |= static_cast<uint32_t>(static_cast<uint8_t>(buffer_[8 + i])) << (8 * i);
    if (version != kVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle: version ", version, " is not supported (this kilnd reads ", kVersion, ")"));
    }
    buffer_.erase(0, 12);
    header_done_ = true;
  }
  for (;;) {
    if (ended_) {
      if (!buffer_.empty()) return absl::InvalidArgumentError("bundle: bytes after the end marker");
      return absl::OkStatus();
    }
    if (buffer_.size() < 8) return absl::OkStatus();
    uint64_t summary_len = GetU64(buffer_.data());
    if (summary_len == 0) {
      ended_ = true;
      buffer_.erase(0, 8);
      continue;
    }
    if (summary_len > (1u << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle: entry ", entries_, " has a ", summary_len, "-byte summary (limit 1 MiB)"));
    }
    if (buffer_.size() < 8 + summary_len + 8) return absl::OkStatus();
    uint64_t record_len = GetU64(buffer_.data() + 8 + summary_len);
    if (record_len > static_cast<uint64_t>(max_entry_bytes_)) {
      return absl::InvalidArgumentError(absl::StrCat("bundle: entry ", entries_, " is ", record_len,
                                                     " bytes; the limit is ", max_entry_bytes_));
    }
    uint64_t total = 8 + summary_len + 8 + record_len + 32;
    if (buffer_.size() < total) return absl::OkStatus();
    absl::string_view summary(buffer_.data() + 8, summary_len);
    absl::string_view record(buffer_.data() + 16 + summary_len, record_len);
    absl::string_view digest(buffer_.data() + 16 + summary_len + record_len, 32);
    if (Digest(summary, record) != digest) {
      return absl::InvalidArgumentError(
          absl::StrCat("bundle: entry ", entries_, " is corrupt (checksum mismatch)"));
    }
    BundleItem item;
    if (!item.summary.ParseFromArray(summary.data(), static_cast<int>(summary.size()))) {
      return absl::InvalidArgumentError(absl::StrCat("bundle: entry ", entries_, " has a bad summary"));
    }
    item.record = std::string(record);
    items_.push_back(std::move(item));
    buffer_.erase(0, total);
    ++entries_;
  }
}

}  // namespace kiln
