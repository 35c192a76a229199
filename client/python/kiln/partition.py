"""kiln's partition of AOTAutograd's joint graph: torch's min-cut partitioner
(min_cut_rematerialization_partition), with two changes that let it save fewer bytes for the
backward. kiln.backend.make_aot builds its partition function from these wrappers:

  * _without_detaches(partition_fn): min-cut sees the joint graph without its aten.detach nodes,
    which it may not recompute through.
  * _rows_recomputable(partition_fn): min-cut may recompute softmaxes (_ROW_OPS) in the backward,
    in the calling thread only while a kiln partition runs (a thread-local switch read by kiln's
    wrapper of torch._functorch.partitioners.get_default_op_list); Inductor's partitions are
    unchanged.
"""

import logging
import threading

import torch

log = logging.getLogger("kiln")


def _without_detaches(partition_fn):
    """partition_fn on the joint graph without its aten.detach nodes (each reader of one reads its
    input instead), as Inductor's decompositions make them aliases it then drops. Autograd
    formulas save `result.detach()` (exp, relu, tanh, sigmoid...); inside the traced joint graph a
    detach changes nothing, but min-cut may not recompute through it, so it saved both relu and
    exp of relu(x).exp() where without it it saves relu and recomputes exp in the backward (half
    the saved bytes). A detach that is itself a graph output stays (output aliasing is AOTAutograd's
    business)."""
    detach = torch.ops.aten.detach.default

    def partition(joint_module, joint_inputs, **kwargs):
        graph = joint_module.graph
        outputs = set()
        for node in graph.nodes:
            if node.op == "output":
                torch.fx.node.map_arg(node.args, lambda a: outputs.add(a))
        changed = False
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not detach or node in outputs:
                continue
            if not node.args or not isinstance(node.args[0], torch.fx.Node):
                continue
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            changed = True
        if changed:
            joint_module.recompile()
        return partition_fn(joint_module, joint_inputs, **kwargs)

    return partition


# The row ops that min-cut may recompute in a backward when kiln partitions (besides its own
# list): a softmax (log_softmax) and its backward, which Inductor sees decomposed into reductions
# and pointwise ops that min-cut does recompute. kilnd computes a recomputed softmax in its
# backward's row kernel (fuse.h, rule 3b), so a bf16 attention saves its bf16 scores for the
# backward instead of the f32 probabilities: half the bytes, and no f32 write in the forward.
_ROW_OPS = ("_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data")
_ROWS = threading.local()  # .on: this thread is in a kiln partition
_ROWS_LOCK = threading.Lock()


def _rows_recomputable(partition_fn):
    """partition_fn with _ROW_OPS recomputable by min-cut, in this thread only. min-cut reads its
    op lists from torch._functorch.partitioners.get_default_op_list at each call; kiln wraps that
    function once (the wrapper adds the ops only while a kiln partition runs in the calling thread,
    so Inductor's partitions are unchanged). Without that function (another torch), partition_fn
    as it is."""
    import torch._functorch.partitioners as partitioners

    with _ROWS_LOCK:
        current = getattr(partitioners, "get_default_op_list", None)
        if current is not None and not getattr(current, "_kiln_rows", False):
            def op_list(original=current):
                types = original()
                if getattr(_ROWS, "on", False):
                    try:
                        for name in _ROW_OPS:
                            op = getattr(torch.ops.aten, name)
                            types.fusible_ops.add(op)
                            types.recomputable_ops.add(op)
                    except Exception as e:  # another torch's OpTypes: its own lists
                        log.debug("kiln: softmax recomputation not offered to min-cut (%s: %s)",
                                  type(e).__name__, e)
                return types

            op_list._kiln_rows = True
            partitioners.get_default_op_list = op_list

    def partition(joint_module, joint_inputs, **kwargs):
        was = getattr(_ROWS, "on", False)
        _ROWS.on = True
        try:
            return partition_fn(joint_module, joint_inputs, **kwargs)
        finally:
            _ROWS.on = was

    return partition
