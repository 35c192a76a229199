#include "server/cache/disk_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/cache/encoding.h"

namespace kiln::cache {
namespace {

constexpr absl::string_view kEntryMagic = "KILNENT1";
constexpr absl::string_view kIndexMagic = "KILNIDX1";
constexpr uint32_t kIndexVersion = 1;

std::string EncodeMeta(absl::string_view key, const EntryMeta& meta) {
  std::string out;
  ByteWriter w(&out);
  w.String(key);
  w.I64(meta.created_unix_ms);
  w.String(meta.target);
  w.String(meta.graph_summary);
  w.String(meta.debug_name);
  return out;
}

struct Header {
  uint32_t meta_size = 0;
  uint64_t payload_size = 0;
  absl::string_view hash;
};

absl::StatusOr<Header> ParseHeader(absl::string_view bytes) {
  ByteReader r(bytes);
  absl::string_view magic;
  uint32_t version = 0;
  Header h;
  if (!r.Raw(kEntryMagic.size(), &magic)) return absl::DataLossError("truncated header");
  if (magic != kEntryMagic) return absl::DataLossError("bad magic");
  if (!r.U32(&version) || !r.U32(&h.meta_size) || !r.U64(&h.payload_size) || !r.Raw(32, &h.hash)) {
    return absl::DataLossError("truncated header");
  }
  if (version != kDiskFormatVersion) {
    return absl::DataLossError(
        absl::StrCat("format version ", version, ", expected ", kDiskFormatVersion));
  }
  return h;
}

absl::Status CheckSizes(const Header& h, uint64_t file_size) {
  const uint64_t want = kEntryHeaderSize + uint64_t{h.meta_size} + h.payload_size;
  if (h.payload_size > file_size || want != file_size) {
    return absl::DataLossError(absl::StrCat("file is ", file_size, " bytes, header says ", want));
  }
  return absl::OkStatus();
}

absl::StatusOr<EntryMeta> ParseMeta(absl::string_view bytes, absl::string_view key) {
  ByteReader r(bytes);
  EntryMeta meta;
  if (!r.String(&meta.key) || !r.I64(&meta.created_unix_ms) || !r.String(&meta.target) ||
      !r.String(&meta.graph_summary) || !r.String(&meta.debug_name) || r.remaining() != 0) {
    return absl::DataLossError("malformed meta");
  }
  if (meta.key != key) return absl::DataLossError("entry holds a different key");
  return meta;
}

}  // namespace

std::string EncodeEntryPrefix(absl::string_view key, const EntryMeta& meta,
                              absl::string_view payload) {
  const std::string encoded_meta = EncodeMeta(key, meta);
  const Sha256Digest hash = Sha256({encoded_meta, payload});
  std::string out;
  out.reserve(kEntryHeaderSize + encoded_meta.size());
  ByteWriter w(&out);
  w.Raw(kEntryMagic);
  w.U32(kDiskFormatVersion);
  w.U32(static_cast<uint32_t>(encoded_meta.size()));
  w.U64(payload.size());
  w.Raw(absl::string_view(reinterpret_cast<const char*>(hash.data()), hash.size()));
  w.Raw(encoded_meta);
  return out;
}

absl::StatusOr<DecodedEntry> DecodeEntryFile(absl::string_view file, absl::string_view key) {
  absl::StatusOr<Header> h = ParseHeader(file);
  if (!h.ok()) return h.status();
  if (absl::Status s = CheckSizes(*h, file.size()); !s.ok()) return s;
  absl::string_view meta_bytes = file.substr(kEntryHeaderSize, h->meta_size);
  absl::string_view payload = file.substr(kEntryHeaderSize + h->meta_size);
  const Sha256Digest hash = Sha256({meta_bytes, payload});
  if (std::memcmp(hash.data(), h->hash.data(), hash.size()) != 0) {
    return absl::DataLossError("SHA-256 mismatch");
  }
  absl::StatusOr<EntryMeta> meta = ParseMeta(meta_bytes, key);
  if (!meta.ok()) return meta.status();
  DecodedEntry out;
  out.meta = *std::move(meta);
  out.payload_offset = kEntryHeaderSize + h->meta_size;
  out.payload_size = payload.size();
  return out;
}

absl::StatusOr<size_t> EntryPrefixSize(absl::string_view header) {
  absl::StatusOr<Header> h = ParseHeader(header);
  if (!h.ok()) return h.status();
  return kEntryHeaderSize + size_t{h->meta_size};
}

absl::StatusOr<EntryMeta> DecodeEntryMetaOnly(absl::string_view prefix, int64_t file_size,
                                              absl::string_view key) {
  absl::StatusOr<Header> h = ParseHeader(prefix);
  if (!h.ok()) return h.status();
  if (absl::Status s = CheckSizes(*h, static_cast<uint64_t>(file_size)); !s.ok()) return s;
  if (prefix.size() < kEntryHeaderSize + h->meta_size) return absl::DataLossError("truncated meta");
  return ParseMeta(prefix.substr(kEntryHeaderSize, h->meta_size), key);
}

std::string EncodeIndex(const std::vector<EntryMeta>& oldest_first) {
  std::string out;
  ByteWriter w(&out);
  w.Raw(kIndexMagic);
  w.U32(kIndexVersion);
  w.U64(oldest_first.size());
  for (const EntryMeta& m : oldest_first) {
    w.String(m.key);
    w.I64(m.size_bytes);
    w.I64(m.created_unix_ms);
    w.I64(m.last_hit_unix_ms);
    w.I64(m.hits);
    w.String(m.target);
    w.String(m.graph_summary);
    w.String(m.debug_name);
  }
  const Sha256Digest hash = Sha256({out});
  w.Raw(absl::string_view(reinterpret_cast<const char*>(hash.data()), hash.size()));
  return out;
}

absl::StatusOr<std::vector<EntryMeta>> DecodeIndex(absl::string_view file) {
  if (file.size() < kIndexMagic.size() + 4 + 8 + 32) return absl::DataLossError("index truncated");
  absl::string_view body = file.substr(0, file.size() - 32);
  const Sha256Digest hash = Sha256({body});
  if (std::memcmp(hash.data(), file.data() + body.size(), hash.size()) != 0) {
    return absl::DataLossError("index SHA-256 mismatch");
  }
  ByteReader r(body);
  absl::string_view magic;
  uint32_t version = 0;
  uint64_t count = 0;
  if (!r.Raw(kIndexMagic.size(), &magic) || magic != kIndexMagic || !r.U32(&version) ||
      version != kIndexVersion || !r.U64(&count)) {
    return absl::DataLossError("index has a bad magic or version");
  }
  std::vector<EntryMeta> out;
  out.reserve(std::min<uint64_t>(count, body.size() / 64));
  for (uint64_t i = 0; i < count; ++i) {
    EntryMeta m;
    if (!r.String(&m.key) || !r.I64(&m.size_bytes) || !r.I64(&m.created_unix_ms) ||
        !r.I64(&m.last_hit_unix_ms) || !r.I64(&m.hits) || !r.String(&m.target) ||
        !r.String(&m.graph_summary) || !r.String(&m.debug_name)) {
      return absl::DataLossError("index truncated");
    }
    out.push_back(std::move(m));
  }
  if (r.remaining() != 0) return absl::DataLossError("trailing bytes in index");
  return out;
}

}  // namespace kiln::cache
