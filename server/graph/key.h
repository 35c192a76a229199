#ifndef KILN_SERVER_GRAPH_KEY_H_
#define KILN_SERVER_GRAPH_KEY_H_

// Canonical encoding and cache key of a verified graph.
//
// Takes: a Graph that passed VerifyGraph, the request's Target and CompileOptions, and the
// server's CompilerIdentity. Produces the lowercase hex SHA-256 of a canonical encoding, and the
// record of every hashed field as (path, printable value) pairs, in hashing order. The encoding is
// built in one place (ComputeKey): kKeyFormatVersion, then each record field as
// <u32 len><path><u32 len><value>, so the record IS the hashed text and two keys can be compared
// field by field (DiffKeyRecords, for `kilnctl explain-miss`).
//
// What is hashed (everything that changes generated code) and what is not:
//   hashed:     target device kind, cuda_arch or cpu_isa; each CompilerIdentity entry;
//               options cuda_emit_ptx, disable_fusion, deterministic; symbol ranges (min/max);
//               per node: its kind, input index, call target, canonical arguments (schema order,
//               defaults filled, node references as %index), fallback kwargs (sorted by name), and
//               its metadata (dtype, sizes, strides, storage offset, device kind, layout);
//               constants' metadata and the SHA-256 of their bytes; Graph.free_layout_outputs when
//               not empty.
//   not hashed: node names, placeholder/get_attr/constant names, symbol names and hints, debug info,
//               device indices (cuda:0 vs cuda:3), requires_grad, list-vs-tuple spelling, keyword-
//               vs-positional spelling, options keep_source and compile_timeout_ms, ClientInfo,
//               Graph.kind and debug_name, and rank-specific collective arguments (process-group
//               names, tags and rank lists of _c10d_functional.* / c10d_functional.* ops, which
//               hash as the fixed token "<group>").
// Node order is FX order: two graphs that differ only in the order of independent nodes get
// different keys (correct, merely less sharing).

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/v1/graph.pb.h"
#include "server/graph/ir.h"

namespace kiln::graph {

// Bump to invalidate every existing cache entry when the meaning of any hashed field changes.
inline constexpr char kKeyFormatVersion[] = "kiln-graph-key/1";

// The toolchain identity that compiled artifacts depend on, e.g. {"cxx": "g++ 12.2.0",
// "nvrtc": "13.0"}. Supplied by the server; all entries are hashed.
struct CompilerIdentity {
  std::map<std::string, std::string> components;
};

struct KeyField {
  std::string path;   // "target.cuda_arch", "node[3].arg[1]", "input[0].meta"
  std::string value;  // printable: "sm_90", "%2", "f32[4, 8] strides [8, 1] cuda"
};

struct CacheKey {
  std::string hex;  // 64 lowercase hex digits
  std::vector<KeyField> record;
};

// INVALID_ARGUMENT unless: device is CPU or CUDA; CUDA has cuda_arch "sm_NN" / "sm_NNN" with an
// optional "a" suffix (e.g. sm_90a) and no cpu_isa; CPU has a -march token made of [a-z0-9.+_-],
// starting with a letter, at most 64 bytes, not "native", and no cuda_arch.
absl::Status ValidateTarget(const ::kiln::v1::Target& target);

absl::StatusOr<CacheKey> ComputeKey(const Graph& graph, const ::kiln::v1::Target& target,
                                    const ::kiln::v1::CompileOptions& options, const CompilerIdentity& compiler);

// One "path = value" line per field.
std::string FormatKeyRecord(const std::vector<KeyField>& record);

// Human-readable differences between two records ("node[3].meta: f32[..] -> f16[..]", "+ path",
// "- path"), in order; empty when they are equal.
std::vector<std::string> DiffKeyRecords(const std::vector<KeyField>& a, const std::vector<KeyField>& b);

}  // namespace kiln::graph

#endif  // KILN_SERVER_GRAPH_KEY_H_
