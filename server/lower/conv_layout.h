#ifndef KILN_SERVER_LOWER_CONV_LAYOUT_H_
#define KILN_SERVER_LOWER_CONV_LAYOUT_H_

// Channels-last layouts around 2-D convolutions (CUDA targets), as Inductor's layout optimization
// does: cuDNN runs convolutions of NHWC tensors (bf16/f16 above all) much faster than NCHW ones.
//
// Contract. Changes only the strides (and the meta's strides) of values whose layout is kiln's own
// choice; everything that reads or writes them (kernels, the plan, the client) follows the strides
// of the op graph. A 4-D floating value becomes channels-last (strides C*H*W... in N, H, W, C
// order) when
//   * a kernel computes it (kPointwise, kRowOutput), it is read by at least one convolution (as
//     the input, argument 0), every step that reads it is such a convolution, no view reads it,
//     and it is not a graph output (outputs keep the strides the graph states); or
//   * a convolution produces it (kStepOutput) from a channels-last input (torch then returns it
//     channels-last), with the same conditions on its readers, or no step reading it at all.
// Graph inputs, constants, outputs and views never change. Every decision is logged at debug
// level. Returns how many values changed.

#include "server/lower/op_graph.h"

namespace kiln::lower {

int ChooseConvLayouts(OpGraph* g);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_CONV_LAYOUT_H_
