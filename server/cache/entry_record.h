// The value kiln stores under a cache key: the serialized kiln.v1.Artifact plus optional named
// sections that `kilnctl show` displays (generated source, the compile log, the key record...).
//
// Contract: EncodeEntryRecord/DecodeEntryRecord round-trip exactly (section order and duplicate
// names are preserved). Decode refuses anything that is not a complete record of this format
// version (DATA_LOSS), so a record from a newer or older kilnd is never misread. The encoding is
// versioned separately from the store's file format: the stores treat it as opaque bytes.
//
// Section names used by kilnd (a convention, not enforced):
//   "source/<file name>"  generated source, one section per file
//   "log"                 the compiler's log
//   "key_record"          a serialized kiln.v1.Entry carrying only key_record (for explain-miss)
//   "timings"             a serialized kiln.v1.Entry carrying only timings
//   "graph"               readable graph text
//   "package"             a package's opaque data (the record's artifact is empty; server/packages.h)
#ifndef KILN_SERVER_CACHE_ENTRY_RECORD_H_
#define KILN_SERVER_CACHE_ENTRY_RECORD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/cache/store.h"

namespace kiln::cache {

inline constexpr uint32_t kEntryRecordVersion = 1;

struct EntrySection {
  std::string name;
  Bytes data;
};

struct EntryRecord {
  Bytes artifact;  // a serialized kiln.v1.Artifact
  std::vector<EntrySection> sections;

  // The first section with this name, or nullptr.
  const EntrySection* Find(absl::string_view name) const;
  // Every section whose name starts with `prefix` (e.g. "source/"), in order.
  std::vector<const EntrySection*> FindAll(absl::string_view prefix) const;
};

Bytes EncodeEntryRecord(const EntryRecord& record);
absl::StatusOr<EntryRecord> DecodeEntryRecord(absl::string_view bytes);

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_ENTRY_RECORD_H_
