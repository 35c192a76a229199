#ifndef KILN_SERVER_CODEGEN_CUDA_GOLDEN_H_
#define KILN_SERVER_CODEGEN_CUDA_GOLDEN_H_

// What the CUDA emitter's golden tests share (cuda_emitter_test.cc, cuda_emit_long_rows_test.cc).
// Test-only.

#include <string>

#include "absl/status/statusor.h"
#include "server/codegen/cuda_emitter.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::codegen::testing {

// The kernel's function alone (no prelude), with gtest expectations that `k` built, verifies and
// emits ("" otherwise). KILN_PRINT_GOLDEN=1 prints it, to update a test's expectations
// intentionally. `launch`, when given, receives the kernel's launch.
std::string EmitOne(const absl::StatusOr<kernel::Kernel>& k, bool vectorize = true,
                    CudaLaunch* launch = nullptr, bool tile = true,
                    CudaLongRows long_rows = CudaLongRows::kAuto);

// How many times `needle` occurs in `haystack` (overlaps included).
int Count(const std::string& haystack, const std::string& needle);

}  // namespace kiln::codegen::testing

#endif  // KILN_SERVER_CODEGEN_CUDA_GOLDEN_H_
