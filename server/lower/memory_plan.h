#ifndef KILN_SERVER_LOWER_MEMORY_PLAN_H_
#define KILN_SERVER_LOWER_MEMORY_PLAN_H_

// PlanMemory: places the intermediates of a plan in ONE workspace by liveness.
//
// Takes buffer requests: bytes and the live range [first, last] in schedule positions (the step
// that writes the buffer through the last step that reads it, inclusive). Returns an offset per
// request, each a multiple of `alignment`, such that two buffers whose live ranges intersect never
// overlap in memory; and the workspace size (the peak: the largest offset + aligned size).
// Algorithm: greedy by size (largest first); each buffer goes into the smallest gap between
// already placed, live-overlapping buffers that fits it (best fit), else above the highest one.
// Deterministic for a given input. INVALID_ARGUMENT for negative sizes or inverted ranges.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::lower {

struct BufferRequest {
  int64_t bytes = 0;
  int32_t first = 0;
  int32_t last = 0;
};

struct MemoryPlan {
  std::vector<int64_t> offsets;  // parallel to the requests
  int64_t workspace_bytes = 0;
};

absl::StatusOr<MemoryPlan> PlanMemory(const std::vector<BufferRequest>& requests, int64_t alignment = 64);

std::string PrintMemoryPlan(const std::vector<BufferRequest>& requests, const MemoryPlan& plan);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_MEMORY_PLAN_H_
