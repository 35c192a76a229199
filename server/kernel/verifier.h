#ifndef KILN_SERVER_KERNEL_VERIFIER_H_
#define KILN_SERVER_KERNEL_VERIFIER_H_

// VerifyKernel: checks everything about a Kernel that the Make functions cannot see locally.
// Takes any Kernel; returns OK or INTERNAL (a malformed kernel is a bug in the lowering, not in the
// user's graph) naming the statement and the problem. Checked:
//   * parameter tables: buffers[i].index == i, accumulators[i].id == i, every Size in range of the
//     scalars and not overflowed, constant extents non-negative;
//   * every expression's type follows the Make rules (nodes built by hand are re-checked);
//   * every Buffer/Accumulator a node names matches the kernel's table (dtype, access, kind);
//   * loop variables exist; reduction variables appear only in phases;
//   * stores go to write buffers only; Accumulate only in phases; each accumulator is updated in
//     exactly one phase and read only in later phases or the body;
//   * when every size involved is a constant, each load and store index lies in
//     [0, num_elements) of its buffer for the whole iteration space.
// Run it between stages in tests; KernelBuilder::Finish runs it too.

#include "absl/status/status.h"
#include "server/kernel/kernel_ir.h"

namespace kiln::kernel {

absl::Status VerifyKernel(const Kernel& kernel);

}  // namespace kiln::kernel

#endif  // KILN_SERVER_KERNEL_VERIFIER_H_
