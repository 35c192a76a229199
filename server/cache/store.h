// The artifact store interface: one small contract that every cache tier implements (the in-memory
// LRU, the on-disk content-addressed store, and later a shared tier such as Redis).
//
// Contract:
//  - Keys are lowercase hex SHA-256 strings: exactly 64 characters in [0-9a-f]. Any other key is
//    refused with INVALID_ARGUMENT before it reaches a file name or a network command.
//  - Values are opaque bytes (kiln encodes an EntryRecord, see entry_record.h). A store never
//    serves bytes other than those that were Put under the key: a corrupt entry is a miss.
//  - A miss is not an error: Get returns OK with std::nullopt. An error status means the tier itself
//    is failing (I/O error, unreachable server); callers (TieredCache) count it and skip the tier.
//  - INVALID_ARGUMENT (bad key) and RESOURCE_EXHAUSTED (a value larger than the whole store) are
//    about the request, not the tier; see IsTierFailure().
//  - Every method is thread-safe.
//  - Metadata: the caller supplies the descriptive fields of EntryMeta (target, graph_summary,
//    debug_name and, when copying an entry between tiers, created/last_hit/hits); the store owns
//    key and size_bytes and keeps created/last_hit/hits up to date.
#ifndef KILN_SERVER_CACHE_STORE_H_
#define KILN_SERVER_CACHE_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cache {

using Bytes = std::string;

// What admin lists about an entry. Times are Unix milliseconds (as in kiln.v1.EntrySummary).
struct EntryMeta {
  std::string key;             // set by the store
  int64_t size_bytes = 0;      // bytes this entry occupies in the store; set by the store
  int64_t created_unix_ms = 0;   // 0 on Put: the store uses now
  int64_t last_hit_unix_ms = 0;  // 0 on Put: the store uses created
  int64_t hits = 0;              // kept by the store; a Put may seed it (tier-to-tier copies)
  std::string target;          // opaque to the store, e.g. "cuda:sm_90", "cpu:x86-64-v3"
  std::string graph_summary;   // one line, e.g. "forward, 42 nodes, 5 kernels, 1 fallback op"
  std::string debug_name;
};

struct StoreStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t max_bytes = 0;
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t puts = 0;
  int64_t evictions = 0;    // removed to stay within max_bytes
  int64_t corruptions = 0;  // entries found corrupt (on read, on Verify or at startup) and removed
  int64_t errors = 0;       // I/O or transport errors returned to callers
};

struct PurgeOptions {
  bool all = false;
  // When !all: remove entries whose most recent use (max of created and last hit) is older than
  // this Unix time in milliseconds.
  int64_t older_than_unix_ms = 0;
};

struct PurgeResult {
  int64_t removed = 0;
  int64_t freed_bytes = 0;
};

struct VerifyResult {
  int64_t checked = 0;
  int64_t ok = 0;
  std::vector<std::string> corrupt_keys;  // already removed from the store
};

// True for exactly 64 characters of lowercase hex.
bool IsValidKey(absl::string_view key);
// OK or INVALID_ARGUMENT naming the problem (without echoing an over-long key in full).
absl::Status ValidateKey(absl::string_view key);
// False for statuses that describe the request rather than the tier (INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED, NOT_FOUND); true for any other error.
bool IsTierFailure(const absl::Status& status);

class Store {
 public:
  virtual ~Store() = default;

  // A short name for logs and stats: "memory", "disk", "redis".
  virtual absl::string_view Name() const = 0;

  // Reads an entry. `touch`: count a hit and make the entry most recently used (Get); without it
  // (Peek) the read leaves no trace, for admin tools.
  virtual absl::StatusOr<std::optional<Bytes>> Read(absl::string_view key, bool touch) = 0;
  absl::StatusOr<std::optional<Bytes>> Get(absl::string_view key) { return Read(key, true); }
  absl::StatusOr<std::optional<Bytes>> Peek(absl::string_view key) { return Read(key, false); }

  // Records on an entry's metadata a hit that a faster tier served: hits + 1, last hit = now, most
  // recently used; without reading the value and without counting in StoreStats::hits. The tiered
  // cache calls it on slower tiers so that they keep what is hot and their hit counts (which
  // survive restarts) stay complete. Cheap (no I/O; a remote tier may batch it); OK when absent.
  virtual absl::Status Touch(absl::string_view key) = 0;

  // Stores (or replaces) an entry, evicting least recently used entries to stay within bounds.
  virtual absl::Status Put(absl::string_view key, absl::string_view value,
                           const EntryMeta& meta) = 0;

  // Removes an entry; returns the bytes freed. NOT_FOUND when the key is not stored.
  virtual absl::StatusOr<int64_t> Remove(absl::string_view key) = 0;

  // Metadata of one entry without reading its value or counting a hit.
  virtual absl::StatusOr<std::optional<EntryMeta>> Stat(absl::string_view key) = 0;

  // Metadata of every entry, most recently used first.
  virtual absl::StatusOr<std::vector<EntryMeta>> List() = 0;

  virtual StoreStats Stats() const = 0;

  virtual absl::StatusOr<PurgeResult> Purge(const PurgeOptions& options) = 0;

  // Re-reads every entry and checks it; corrupt entries are removed and reported.
  virtual absl::StatusOr<VerifyResult> Verify() = 0;
};

}  // namespace kiln::cache

#endif  // KILN_SERVER_CACHE_STORE_H_
