#ifndef KILN_SERVER_LOWER_KERNELIZE_H_
#define KILN_SERVER_LOWER_KERNELIZE_H_

// BuildKernels: each fused group of a Schedule -> one verified kernel IR Kernel.
//
// Takes an OpGraph and its Schedule. For every group with at least one store it builds a Kernel:
//   * pointwise group: outer space = the group's shape; the body stores each stored member at its
//     own strides, computing everything not stored elsewhere inline (shared subexpressions are
//     built once per kernel and index);
//   * row group: outer space = the domain's non-reduced dims, reduction space = the reduced dims;
//     phase 0 folds every accumulator of every row op in the group (horizontal siblings share the
//     loop); phase 1 (composites) stores the domain-shaped members; the body stores the
//     reduction-shaped members (epilogues included).
// A group over an empty shape gets no kernel (its values still exist, without elements).
// Buffers are the values the kernel reads or writes, in first-use order; `args[i]` is the value
// whose data pointer (at its own storage offset) the plan passes as buffer b<i>. A value that is a
// view of a stored value is passed as itself (the plan makes it a STORAGE_VIEW), so indices use the
// value's own strides and offset 0. Guarantees: every kernel passes VerifyKernel; errors are
// INTERNAL (a lowering bug), or UNIMPLEMENTED from an element function.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "server/kernel/kernel_ir.h"
#include "server/lower/fuse.h"
#include "server/lower/op_graph.h"

namespace kiln::lower {

struct GraphKernel {
  int32_t group = -1;
  kernel::Kernel kernel;
  std::vector<int32_t> args;  // value per buffer
};

struct KernelSet {
  std::vector<GraphKernel> kernels;
  std::vector<int32_t> kernel_of_group;  // -1 for a group with nothing to store
};

absl::StatusOr<KernelSet> BuildKernels(const OpGraph& g, const Schedule& s);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_KERNELIZE_H_
