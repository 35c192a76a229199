#ifndef KILN_SERVER_BUNDLE_H_
#define KILN_SERVER_BUNDLE_H_

// The portable bundle of cache entries that `kilnctl export` writes and `kilnctl import` loads.
//
// Layout (little-endian):
//   "KILNBNDL" u32 version(=1)
//   entries: u64 summary_len, EntrySummary bytes, u64 record_len, EntryRecord bytes,
//            32-byte SHA-256 over (summary bytes, record bytes)
//   end:     u64 0
// A reader checks every length against its bound and every entry's SHA-256; the importer then
// re-verifies each entry as kilnd would its own (artifact checksum, and the key recomputed from
// the stored request), so a bundle can never plant an artifact under a key it does not match.

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kiln/v1/admin.pb.h"

namespace kiln {

std::string BundleHeader();
std::string BundleEntry(const kiln::v1::EntrySummary& summary, absl::string_view record);
std::string BundleEnd();

struct BundleItem {
  kiln::v1::EntrySummary summary;
  std::string record;
};

// Parses a bundle incrementally: Feed() bytes as they arrive, take complete items with Next().
class BundleReader {
 public:
  explicit BundleReader(int64_t max_entry_bytes) : max_entry_bytes_(max_entry_bytes) {}

  // INVALID_ARGUMENT for a malformed bundle (bad magic, version, over-long entry, bad checksum).
  absl::Status Feed(absl::string_view bytes);
  bool HasNext() const { return !items_.empty(); }
  BundleItem Next();
  // OK once the end marker was read; INVALID_ARGUMENT "truncated" otherwise.
  absl::Status Finish() const;

 private:
  absl::Status Parse();

  const int64_t max_entry_bytes_;
  std::string buffer_;
  bool header_done_ = false;
  bool ended_ = false;
  int64_t entries_ = 0;
  std::deque<BundleItem> items_;
};

}  // namespace kiln

#endif  // KILN_SERVER_BUNDLE_H_
