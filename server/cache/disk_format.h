// The on-disk formats of DiskStore: entry files and the index file. Pure encoding, no I/O.
//
// Entry file (<dir>/<key[0:2]>/<key>), all integers little-endian:
//   [0, 8)    magic "KILNENT1"
//   [8, 12)   u32 format version (kDiskFormatVersion)
//   [12, 16)  u32 meta length M
//   [16, 24)  u64 payload length P
//   [24, 56)  SHA-256 of meta || payload
//   [56, 56+M)      meta: key, created ms, target, graph summary, debug name
//   [56+M, 56+M+P)  payload: the value given to Put
// Every header field is checked on every read: the magic, the version, the lengths against the
// file's size, the hash against the body, and the key in the meta against the file's name, so a
// flipped or truncated byte anywhere makes the entry corrupt (DATA_LOSS), never served.
// Bumping kDiskFormatVersion makes every older entry unreadable (treated as corrupt and removed).
//
// Index file (<dir>/index): the mutable metadata (hits, last hit) and the LRU order, which entry
// files do not hold. "KILNIDX1", u32 version, u64 count, then per entry (oldest use first): key,
// size, created, last hit, hits, target, graph summary, debug name; then a SHA-256 of everything
// before it. A damaged index is ignored as a whole (the store rebuilds from the entry files).
#ifndef KILN_SERVER_CACHE_DISK_FORMAT_H_
#define KILN_SERVER_CACHE_DISK_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/cache/store.h"

namespace kiln::cache {

inline constexpr uint32_t kDiskFormatVersion = 1;
inline constexpr size_t kEntryHeaderSize = 56;

// The header and meta of an entry file; the payload follows them in the file.
std::string EncodeEntryPrefix(absl::string_view key, const EntryMeta& meta,
                              absl::string_view payload);

struct DecodedEntry {
  EntryMeta meta;           // key, created_unix_ms and the descriptive fields
  size_t payload_offset = 0;
  size_t payload_size = 0;
};

// Checks a whole entry file (header, lengths, hash, key). DATA_LOSS describes what is wrong.
absl::StatusOr<DecodedEntry> DecodeEntryFile(absl::string_view file, absl::string_view key);

// How many bytes of the file DecodeEntryMetaOnly needs, given the first kEntryHeaderSize bytes.
absl::StatusOr<size_t> EntryPrefixSize(absl::string_view header);
// Parses header and meta without hashing the payload (startup scan); checks the lengths against
// `file_size` and the key. The payload is verified on the entry's first read.
absl::StatusOr<EntryMeta> DecodeEntryMetaOnly(absl::string_view prefix, int64_t file_size,
                                              absl::string_view key);

std::string EncodeIndex(const std::vector<EntryMeta>& oldest_first);
absl::StatusOr<std::vector<EntryMeta>> DecodeIndex(absl::string_view file);

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_DISK_FORMAT_H_
