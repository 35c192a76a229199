#ifndef KILN_SERVER_GRAPH_COMPILER_H_
#define KILN_SERVER_GRAPH_COMPILER_H_

// The compiler behind kiln.v1.Compiler.Compile: takes a verified, hashed graph and produces an
// artifact (binaries and a plan). Implementations: one per target device kind. The service calls
// it on a compile-scheduler worker, once per key however many clients ask (single-flight).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/compiler.pb.h"
#include "server/graph/graph_path.h"

namespace kiln {

struct CompileResult {
  kiln::v1::Artifact artifact;  // the service fills format_version, target and checksum
  std::vector<std::pair<std::string, std::string>> sources;  // (file name, text)
  std::string log;                                           // the compilers' output
  std::vector<std::pair<std::string, int64_t>> timings_us;   // (phase, microseconds)
  std::string summary;  // e.g. "5 kernels, 1 fallback op"
  std::vector<kiln::v1::Diagnostic> diagnostics;
};

class GraphCompiler {
 public:
  virtual ~GraphCompiler() = default;
  // Compiles `prepared` for request.target(). May take seconds. INVALID_ARGUMENT or UNIMPLEMENTED
  // for graphs it cannot compile (the client runs them eagerly), INTERNAL with the log attached
  // for compiler failures, DEADLINE_EXCEEDED past its time limit.
  virtual absl::StatusOr<CompileResult> Compile(const graph::PreparedGraph& prepared,
                                                const kiln::v1::CompileRequest& request) = 0;
};

}  // namespace kiln

#endif  // KILN_SERVER_GRAPH_COMPILER_H_
