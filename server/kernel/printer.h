#ifndef KILN_SERVER_KERNEL_PRINTER_H_
#define KILN_SERVER_KERNEL_PRINTER_H_

// Readable text for kernel IR, for dumps between stages, test expectations and kilnctl. Pure
// functions of their input; the debug name is C-escaped and quoted. Format:
//   kernel "softmax"
//     scalars: 1
//     buffers: b0: f32 read [128*n0], b1: f32 write [128*n0]
//     outer: o0 < n0
//     reduce: r0 < 128
//     accumulators: a0: online_softmax f32
//     phase 0:
//       a0 <- load(b0, 128*o0 + r0)
//     phase 1:
//       b1[128*o0 + r0] = true_div(exp(sub(load(b0, 128*o0 + r0), a0.max)), a0.sum)

#include <string>

#include "server/kernel/kernel_ir.h"

namespace kiln::kernel {

std::string PrintIndex(const Index& index);
std::string PrintExpr(const Expr& e);
std::string PrintStmt(const Stmt& s);
std::string PrintKernel(const Kernel& k);

}  // namespace kiln::kernel

#endif  // KILN_SERVER_KERNEL_PRINTER_H_
