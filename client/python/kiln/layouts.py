"""Layouts kilnd chooses for the tensors a training forward saves for its backward.

AOTAutograd passes a forward's saved tensors to the backward as they are, and lets the forward's
compiler report their strides (TracingContext.output_strides) so that it compiles the backward for
those strides. kiln uses that so that kilnd may make a convolution network's saved activations
channels-last on CUDA (server/lower/conv_layout.h), as Inductor's layout optimization does:
  * saved_tensor_positions(gm): the forward's output positions holding saved tensors only, sent as
    Graph.free_layout_outputs;
  * plan_output_strides(plan) and report_output_strides(strides): the strides of the forward's
    plan, handed to AOTAutograd;
  * repropagate(gm, example_inputs): the backward graph's metadata recomputed for the strides
    AOTAutograd gave its inputs (FakeTensorProp), so that the graph kiln sends states them;
  * backward_inputs(bw_module, fw_gm, strides): those inputs ahead of the backward compile, for
    sending the backward to kilnd as soon as the forward's plan is known.
A forward that runs eagerly reports nothing, and its backward keeps the traced strides. Inputs
whose strides differ from what a backward plan was compiled for fail its guards, and kiln compiles
a plan for them (kiln.backend), so a forward plan that falls back to eager stays correct.
"""

import functools
import logging

import torch

log = logging.getLogger("kiln")


def saved_tensor_positions(gm):
    """Output positions of a training forward graph `gm` that hold tensors saved for the backward
    only (not graph inputs, not also returned at another position), ascending; [] when AOTAutograd's
    metadata is not at hand or does not match the graph's outputs."""
    outputs = _output_args(gm)
    saved = _saved_slice(outputs)
    if saved is None:
        return []
    positions = range(saved[0], saved[1])
    elsewhere = {id(outputs[i]) for i in range(len(outputs)) if i not in positions}
    return [i for i in positions
            if isinstance(outputs[i], torch.fx.Node) and outputs[i].op != "placeholder"
            and id(outputs[i]) not in elsewhere]


def plan_output_strides(plan):
    """The strides of each output of a kiln.proto.Plan (None for a non-tensor output, or one whose
    strides are symbolic), as TracingContext.output_strides holds them."""
    strides = []
    for o in plan.outputs:
        meta = plan.values[o].meta if 0 <= o < len(plan.values) else None
        if meta is None or len(meta.strides) != len(meta.sizes) or any(
                s.WhichOneof("value") != "constant" for s in meta.strides):
            strides.append(None)
        else:
            strides.append(tuple(s.constant for s in meta.strides))
    return strides


def report_output_strides(gm, strides):
    """Hands a forward plan's output strides to AOTAutograd (when it asked for them: inside its
    forward compile), which compiles the backward for them. Nothing when the count does not match
    the graph's outputs."""
    from torch._guards import TracingContext

    tc = TracingContext.try_get()
    if tc is None or tc.output_strides is None or tc.output_strides or strides is None:
        return
    outputs = _output_args(gm)
    if outputs is None or len(outputs) != len(strides):
        return
    tc.output_strides.extend(strides)


def backward_inputs(bw_module, fw_gm, strides):
    """The example inputs AOTAutograd will give the backward compiler of `bw_module` once forward
    `fw_gm`'s plan reported `strides` (its placeholders' meta["val"], the saved tensors'
    re-strided as AOTAutograd does), for sending the backward ahead; None when the metadata does
    not match."""
    outputs = _output_args(fw_gm)
    saved = _saved_slice(outputs)
    if saved is None or strides is None or len(strides) != len(outputs):
        return None
    start, stop, num_symints = saved
    vals = [n.meta.get("val") for n in bw_module.graph.nodes if n.op == "placeholder"]
    if num_symints + stop - start > len(vals):
        return None
    for j, real in enumerate(strides[start:stop]):
        val = vals[num_symints + j]
        if real is not None and isinstance(val, torch.Tensor) and not _symbolic(val) and val.stride() != real:
            vals[num_symints + j] = val.as_strided(val.shape, real)
    return vals


def repropagate(gm, example_inputs):
    """Recomputes every node's meta["val"] of a static graph (FakeTensorProp) from
    `example_inputs` when they have other strides than its placeholders' metadata (AOTAutograd's
    placeholder_list for a backward), so that the serialized graph states the strides the plan
    will be given; and for a graph traced on the meta device (kiln.precompile) with a convolution,
    whose meta kernels return NCHW results where CUDA's return channels-last ones. Returns whether
    it did; on failure the metadata stays as traced (logged at debug level)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return False
    redo = False
    for node, x in zip(placeholders, example_inputs):
        val = node.meta.get("val")
        if not (isinstance(x, torch.Tensor) and isinstance(val, torch.Tensor)):
            continue
        if _symbolic(x) or _symbolic(val):
            return False
        if tuple(x.shape) == tuple(val.shape) and x.stride() != val.stride():
            redo = True
    redo = redo or any(n.target in _CONVOLUTIONS and _on_meta(n.meta.get("val")) for n in gm.graph.nodes)
    if not redo:
        return False
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(list(example_inputs))
    if mode is None:
        return False
    saved = {n: n.meta.get("val") for n in gm.graph.nodes}
    try:
        _propagation_class()(gm, mode).propagate_dont_convert_inputs(*example_inputs)
    except Exception as e:
        for n, val in saved.items():
            n.meta["val"] = val
        log.debug("kiln: graph metadata kept as traced (%s: %s)", type(e).__name__, e)
        return False
    return True


@functools.lru_cache(maxsize=None)
def _propagation_class():
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class Propagation(FakeTensorProp):
        """FakeTensorProp, with the memory format CUDA's convolutions give their results (cuDNN's)
        on the meta device too (kiln.precompile captures there) and for fake CUDA tensors where
        cuDNN is missing (torch's fake kernels then return NCHW): a channels-last input or weight
        gives channels-last results, as kilnd infers."""

        def call_function(self, target, args, kwargs):
            out = super().call_function(target, args, kwargs)
            if target not in _CONVOLUTIONS:
                return out
            conv = target is torch.ops.aten.convolution.default
            inputs = args[0:2] if conv else args[1:3]
            if not any(isinstance(t, torch.Tensor) and t.device.type in ("meta", "cuda") and t.dim() == 4
                       and _channels_last(t) for t in inputs):
                return out
            if conv:
                return _as_channels_last(out)
            return tuple(_as_channels_last(t) if k < 2 else t for k, t in enumerate(out))

    return Propagation


_CONVOLUTIONS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


def _on_meta(val):
    items = val if isinstance(val, (list, tuple)) else (val,)
    return any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in items)


def _channels_last(t):
    return (t.is_contiguous(memory_format=torch.channels_last)
            and not t.is_contiguous(memory_format=torch.contiguous_format))


def _as_channels_last(t):
    if not isinstance(t, torch.Tensor) or t.dim() != 4 or _channels_last(t):
        return t
    n, c, h, w = t.shape
    return t.new_empty_strided(t.shape, (h * w * c, 1, w * c, c))


def _saved_slice(outputs):
    """(start, stop, symints): the forward outputs `outputs` at [start, stop) are the tensors
    saved for the backward, followed by `symints` saved SymInts, per AOTAutograd's metadata of the
    graph being compiled; None when that is not at hand or does not match `outputs`."""
    from torch._guards import TracingContext

    tc = TracingContext.try_get()
    meta = getattr(tc, "fw_metadata", None) if tc is not None else None
    if outputs is None:
        return None
    try:
        saved = meta.tensors_saved_for_backwards_slice
        num_symints = meta.num_symints_saved_for_bw or 0
    except Exception:  # no metadata, or AOTAutograd has not filled it in (e.g. tensor subclasses)
        return None
    if saved.step not in (None, 1):
        return None
    start, stop, _ = saved.indices(len(outputs))  # slice(first saved, -symints or None)
    if stop + num_symints != len(outputs):
        return None  # a layout this module does not know: leave every output as traced
    return start, stop, num_symints


def _output_args(gm):
    for node in reversed(gm.graph.nodes):
        if node.op == "output":
            out = node.args[0]
            return list(out) if isinstance(out, (list, tuple)) else [out]
    return None


def _symbolic(t):
    return any(isinstance(d, torch.SymInt) for d in (*t.shape, *t.stride()))
