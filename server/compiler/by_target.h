#ifndef KILN_SERVER_COMPILER_BY_TARGET_H_
#define KILN_SERVER_COMPILER_BY_TARGET_H_

// ByTargetCompiler: the GraphCompiler kilnd serves, handing each request to the compiler for its
// target's device kind (CPU: cpu_compiler.h, CUDA: cuda_compiler.h). A kind without a compiler
// (e.g. CUDA on a kilnd that found no NVRTC) gets `unavailable[kind]`'s status, which says why.

#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/graph_compiler.h"

namespace kiln::compiler {

class ByTargetCompiler : public GraphCompiler {
 public:
  // Not owned; null entries are allowed.
  void Set(kiln::v1::DeviceKind kind, GraphCompiler* compiler, absl::Status unavailable = absl::OkStatus()) {
    compilers_[kind] = {compiler, std::move(unavailable)};
  }

  absl::StatusOr<CompileResult> Compile(const graph::PreparedGraph& prepared,
                                        const kiln::v1::CompileRequest& request) override {
    auto it = compilers_.find(request.target().device());
    if (it == compilers_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("no compiler for target device ",
                                                     kiln::v1::DeviceKind_Name(request.target().device())));
    }
    if (it->second.first == nullptr) return it->second.second;
    return it->second.first->Compile(prepared, request);
  }

 private:
  std::map<kiln::v1::DeviceKind, std::pair<GraphCompiler*, absl::Status>> compilers_;
};

}  // namespace kiln::compiler

#endif  // KILN_SERVER_COMPILER_BY_TARGET_H_
