#ifndef KILN_SERVER_LOWER_FUSE_H_
#define KILN_SERVER_LOWER_FUSE_H_

// ScheduleAndFuse: an OpGraph -> an ordered schedule of kernels (fused groups) and extern steps.
//
// Takes the output of LowerGraph. Decides which values are computed inline (fused into the
// kernel that reads them) and which are realized (computed by a kernel of their own group and,
// if anything outside that group reads them, stored). The rules, each decision logged at debug
// level ("fuse: ..."):
//   1. Realized: graph outputs and the roots of output views; values an extern step reads (the
//      root of a view); every row-op output; a pointwise value under a view that is not an affine
//      window of it; with disable_fusion, every pointwise value (one kernel per op).
//   2. Recompute rule: a pointwise value read by more than one consumer is realized unless it is
//      cheap (one simple op: add/sub/mul without alpha, division by a power of two, neg, abs,
//      relu, clamp, compare, select, masked_fill, threshold_backward, logical and bitwise ops,
//      isnan/isinf, cast, copy, fill); a value read by a composite (softmax, layer norm: they
//      read their input twice) is realized unless cheap. So an expensive producer is computed at most once per element of
//      each kernel that reads it, and a non-cheap one at most once in the whole plan.
//   3. Vertical fusion: a realized pointwise value joins the group of a value it reads when the
//      iteration spaces agree: a pointwise group of the same shape (unless it reads a non-cheap
//      member through a view at another index: that would compute it twice); or a row group's body (shape
//      of the reduction result) or phase 1 (the composite's domain), reached only through
//      same-shape elementwise edges (the epilogue index must be the row op's own); or, for a
//      value of the domain's shape that reads the row's results only through broadcasts along
//      exactly the reduced dims (x * rsqrt(mean(x^2) + eps) * w), a phase after the reductions
//      (one kernel, x read once). Prologues are implicit: producers of a row op's input that
//      are not realized are inlined into phase 0.
//   3b. Chaining: a row op over the same domain and reduce dims as a composite's group (softmax)
//      that reads that composite's phase results at the domain's index and no other member
//      (the softmax backward of a softmax recomputed in the backward) folds its accumulators in
//      the composite's phase and computes its own phase results in a third phase: one kernel, the
//      probabilities never stored.
//   4. Horizontal fusion: a reduction joins an earlier reduction group with the same domain and
//      reduce dims that it does not read (sum with sum of squares; var_mean is one Welford); a
//      pointwise value that joins no group by rule 3 joins the latest pointwise group of the same
//      shape that it does not read (an output and a saved activation computed from the same
//      inputs: they are read once).
//   5. Ordering: a value never joins a group scheduled before anything it reads (an extern step,
//      another kernel), nor before an in-place step (aten.copy_ ...); so steps (mm, fallbacks)
//      split fusion and their consumers fuse after them.
//   6. Pruning: a group member is stored only if it is a graph output, read by a step, or read by
//      another kernel; everything else stays in registers.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/lower/op_graph.h"

namespace kiln::lower {

struct FuseOptions {
  bool disable_fusion = false;
};

struct Group {
  enum class Kind : uint8_t { kPointwise, kRow };
  Kind kind = Kind::kPointwise;
  std::vector<int64_t> shape;     // pointwise: the iteration shape; row: the domain
  std::vector<int> reduce_dims;   // row groups
  std::vector<int32_t> row_ops;   // row groups: the first and its horizontal siblings
  std::vector<int32_t> members;   // values this kernel computes, in order
  std::vector<int8_t> stage;      // per member: 0 in the body (row groups: at the row's index), or
                                  // the phase computing it (1; 2 after a chained row op's sums)
  std::vector<int8_t> row_stage;  // per row op: the phase its accumulators fold in (1: chained)
  std::vector<int32_t> stores;    // members written to memory
  int32_t order = -1;             // position in Schedule::items
};

struct ScheduleItem {
  bool is_step = false;
  int32_t index = -1;  // into Schedule::groups or OpGraph::steps
};

struct Schedule {
  std::vector<Group> groups;
  std::vector<ScheduleItem> items;
  std::vector<int32_t> group_of;  // per value: the group computing it, or -1
  std::vector<bool> stored;       // per value: has storage (inputs, constants, step outputs, stores)
  std::vector<std::string> log;   // the fusion decisions, also logged at debug level
};

absl::StatusOr<Schedule> ScheduleAndFuse(const OpGraph& g, const FuseOptions& options);

std::string PrintSchedule(const OpGraph& g, const Schedule& s);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_FUSE_H_
