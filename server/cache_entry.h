#ifndef KILN_SERVER_CACHE_ENTRY_H_
#define KILN_SERVER_CACHE_ENTRY_H_

// What kilnd stores per cache key, and how admin reads it back.
//
// A package (Compiler.PutPackage) is a record with no artifact and one section, "package" (see
// packages.h). A compiled graph's entry is a cache::EntryRecord: the serialized kiln.v1.Artifact
// plus named sections:
//   "request"     the CompileRequest (graph, target, options; ClientInfo cleared), so that an
//                 imported entry can be re-verified by recomputing its key
//   "graph"       the readable graph (graph::PrintGraph)
//   "key_record"  the hashed fields (a serialized kiln.v1.Entry holding only key_record), for
//                 kilnctl explain-miss
//   "timings"     per-phase times (a serialized kiln.v1.Entry holding only timings)
//   "summary"     one line, e.g. "5 kernels, 1 fallback op"
//   "log"         the compilers' output
//   "source/NAME" generated source files
// The artifact's checksum (SHA-256 over its binaries and plan) is set on store and checked on
// every read: a mismatch is treated like a corrupt entry.

#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/admin.pb.h"
#include "kiln/v1/compiler.pb.h"
#include "server/cache/entry_record.h"
#include "server/cache/store.h"
#include "server/graph/graph_path.h"
#include "server/graph_compiler.h"

namespace kiln {

inline constexpr int32_t kArtifactFormatVersion = 1;

// "cpu:x86-64-v3" / "cuda:sm_90": how targets are named in EntryMeta and kilnctl.
std::string TargetName(const kiln::v1::Target& target);
// Parses TargetName's output back (for EntrySummary.target).
kiln::v1::Target ParseTargetName(const std::string& name);

// Lowercase hex SHA-256 over the artifact's binaries and plan (the checksum field excluded).
std::string ArtifactChecksum(const kiln::v1::Artifact& artifact);

// Builds the record to store for a freshly compiled graph; fills the artifact's format version,
// target and checksum.
cache::EntryRecord MakeEntryRecord(const graph::PreparedGraph& prepared,
                                   const kiln::v1::CompileRequest& request, CompileResult result);

// Parses and checks a stored record's artifact: DATA_LOSS if it does not parse, has an unknown
// format version, or its checksum does not match.
absl::StatusOr<kiln::v1::Artifact> ReadArtifact(const cache::EntryRecord& record);

// Fills an admin Entry from the store's metadata and record, honoring the include_* flags. For a
// package (packages.h) only the summary and package_bytes.
void FillEntry(const cache::EntryMeta& meta, const cache::EntryRecord& record,
               const kiln::v1::GetEntryRequest& request, kiln::v1::Entry* entry);

void FillSummary(const cache::EntryMeta& meta, kiln::v1::EntrySummary* summary);

}  // namespace kiln

#endif  // KILN_SERVER_CACHE_ENTRY_H_
