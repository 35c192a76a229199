#include "server/lower/memory_plan.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kiln::lower {

absl::StatusOr<MemoryPlan> PlanMemory(const std::vector<BufferRequest>& requests, int64_t alignment) {
  if (alignment <= 0) return absl::InvalidArgumentError("alignment must be positive");
  auto align = [alignment](int64_t x) { return (x + alignment - 1) / alignment * alignment; };
  for (const BufferRequest& r : requests) {
    if (r.bytes < 0 || r.first > r.last) return absl::InvalidArgumentError("bad buffer request");
  }
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (requests[a].bytes != requests[b].bytes) return requests[a].bytes > requests[b].bytes;
    return requests[a].first < requests[b].first;
  });
  MemoryPlan plan;
  plan.offsets.assign(requests.size(), -1);
  std::vector<size_t> placed;
  for (size_t i : order) {
    const BufferRequest& r = requests[i];
    const int64_t size = align(std::max<int64_t>(r.bytes, 1));
    std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of live-overlapping buffers
    for (size_t j : placed) {
      const BufferRequest& o = requests[j];
      if (o.last < r.first || r.last < o.first) continue;
      busy.push_back({plan.offsets[j], plan.offsets[j] + align(std::max<int64_t>(o.bytes, 1))});
    }
    std::sort(busy.begin(), busy.end());
    int64_t best = -1, best_gap = 0, cursor = 0;
    for (const auto& [b, e] : busy) {
      if (b > cursor) {
        const int64_t gap = b - cursor;
        if (gap >= size && (best < 0 || gap < best_gap)) {
          best = cursor;
          best_gap = gap;
        }
      }
      cursor = std::max(cursor, e);
    }
    if (best < 0) best = cursor;
    plan.offsets[i] = best;
    plan.workspace_bytes = std::max(plan.workspace_bytes, best + size);
    placed.push_back(i);
  }
  return plan;
}

std::string PrintMemoryPlan(const std::vector<BufferRequest>& requests, const MemoryPlan& plan) {
  std::string s;
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StrAppend(&s, "buffer ", i, ": ", requests[i].bytes, " bytes live [", requests[i].first, ", ",
                    requests[i].last, "] at ", plan.offsets[i], "\n");
  }
  absl::StrAppend(&s, "workspace: ", plan.workspace_bytes, " bytes\n");
  return s;
}

}  // namespace kiln::lower
