#ifndef KILN_SERVER_LOWER_CONV_LAYOUT_H_
#define KILN_SERVER_LOWER_CONV_LAYOUT_H_

// Channels-last layouts around 2-D convolutions (CUDA targets), as Inductor's layout optimization
// does: cuDNN runs convolutions of NHWC tensors (bf16/f16 above all) much faster than NCHW ones.
//
// Contract. Changes only the strides (and the meta's strides) of values whose layout is kiln's own
// choice; everything that reads or writes them (kernels, the plan, the client) follows the strides
// of the op graph. Convolutions and poolings (max_pool2d_with_indices, avg_pool2d,
// _adaptive_avg_pool2d: "layout-following steps") return channels-last results for a
// channels-last input on CUDA. Only graphs with a convolution change. A 4-D value becomes
// channels-last (strides C*H*W... in N, H, W, C order) when
//   * a kernel computes it (kPointwise, kRowOutput) in a floating type, at least one
//     layout-following step reads it (as argument 0), every step that reads it is such a step
//     whose 4-D results may follow (below), no view reads it, and it is not a graph output
//     (outputs keep the strides the graph states); or
//   * a kernel computes it (kPointwise) in a floating type, only kernels read it (it is stored
//     for a windowed read such as max_pool2d's, or for several readers), it is not a graph
//     output, and one of its inputs of the same sizes is channels-last: it follows that input
//     rather than transposing; or
//   * a layout-following step produces it from a channels-last input: torch returns it
//     channels-last (max_pool2d's indices too); or
//   * a kernel computes it in a floating type, only convolutions whose input is channels-last
//     read it, each as its weight (argument 1; autocast's casts of parameters), no view reads
//     it, and it is not a graph output (torch would copy an NCHW weight to NHWC per call); or
//   * a kernel computes it (kPointwise) in a floating type, only kernels read it (no steps, no
//     views), every one of them whose value is used computes a channels-last value (at least one
//     does), and it is not a graph output: it follows its readers
//     (a ResNet stem's batch norm before the max_pool2d kernel, when the convolution read the
//     NCHW image: the transposition then happens in that pointwise kernel, not in the windows);
//     readers that are only returned at free positions (below) do not count; or
//   * a kernel computes it (kPointwise, any dtype), it is only returned, at free positions, and
//     one of its inputs is channels-last (a training forward's saved max_pool2d indices).
// A step's results may follow when none is a graph output or has a storage offset and their
// readers allow it by the first rule's conditions (kernels, layout-following steps, no views), so
// the plan always states the strides torch returns. Graph inputs, constants, outputs and views
// never change. "Graph output" above means an output at a position other than
// Graph.free_layout_outputs': a training forward's saved tensors, returned only at such positions,
// are chosen for like any other value (the client reports the plan's strides to AOTAutograd, which
// compiles the backward for them; client/python/kiln/layouts.py). Every decision is logged at
// debug level. Returns how many values changed.

#include "server/lower/op_graph.h"

namespace kiln::lower {

int ChooseConvLayouts(OpGraph* g);

}  // namespace kiln::lower

#endif  // KILN_SERVER_LOWER_CONV_LAYOUT_H_
