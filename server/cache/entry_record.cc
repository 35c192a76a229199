#include "server/cache/entry_record.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/cache/encoding.h"

namespace kiln::cache {
namespace {

constexpr absl::string_view kMagic = "KILNREC1";

}  // namespace

const EntrySection* EntryRecord::Find(absl::string_view name) const {
  for (const EntrySection& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<const EntrySection*> EntryRecord::FindAll(absl::string_view prefix) const {
  std::vector<const EntrySection*> out;
  for (const EntrySection& s : sections) {
    if (absl::StartsWith(s.name, prefix)) out.push_back(&s);
  }
  return out;
}

Bytes EncodeEntryRecord(const EntryRecord& record) {
  size_t size = kMagic.size() + 4 + 8 + record.artifact.size() + 4;
  for (const EntrySection& s : record.sections) size += 4 + s.name.size() + 8 + s.data.size();
  Bytes out;
  out.reserve(size);
  ByteWriter w(&out);
  w.Raw(kMagic);
  w.U32(kEntryRecordVersion);
  w.U64(record.artifact.size());
  w.Raw(record.artifact);
  w.U32(static_cast<uint32_t>(record.sections.size()));
  for (const EntrySection& s : record.sections) {
    w.String(s.name);
    w.U64(s.data.size());
    w.Raw(s.data);
  }
  return out;
}

absl::StatusOr<EntryRecord> DecodeEntryRecord(absl::string_view bytes) {
  ByteReader r(bytes);
  absl::string_view magic;
  uint32_t version = 0;
  if (!r.Raw(kMagic.size(), &magic) || magic != kMagic) {
    return absl::DataLossError("not a kiln entry record (bad magic)");
  }
  if (!r.U32(&version) || version != kEntryRecordVersion) {
    return absl::DataLossError(absl::StrCat("entry record format version ", version,
                                            " is not the supported version ",
                                            kEntryRecordVersion));
  }
  EntryRecord record;
  uint64_t n = 0;
  absl::string_view data;
  uint32_t count = 0;
  if (!r.U64(&n) || n > r.remaining() || !r.Raw(n, &data) || !r.U32(&count)) {
    return absl::DataLossError("truncated entry record");
  }
  record.artifact.assign(data.data(), data.size());
  for (uint32_t i = 0; i < count; ++i) {
    EntrySection s;
    if (!r.String(&s.name) || !r.U64(&n) || n > r.remaining() || !r.Raw(n, &data)) {
      return absl::DataLossError(absl::StrCat("truncated entry record (section ", i, ")"));
    }
    s.data.assign(data.data(), data.size());
    record.sections.push_back(std::move(s));
  }
  if (r.remaining() != 0) return absl::DataLossError("trailing bytes after entry record");
  return record;
}

}  // namespace kiln::cache
