"""``kiln.precompile`` (this module: kiln.precompiler): fill kilnd's cache for a target without running the compiled result.

A CPU-only job (no GPU, CPU-only torch) captures a model's graphs exactly as
``torch.compile(model, backend="kiln")`` would in the process that later runs it (TorchDynamo, then
AOTAutograd with the same partitioner: the inference graph, or the forward and backward graphs),
and sends each one to kilnd's ``Compile`` for the requested target. When the GPU nodes start, their
graphs have the same keys and are served from the cache.

How it captures without computing: the model is deep-copied with its parameters and buffers
replaced by tensors on the ``meta`` device (same sizes, strides, dtypes and requires_grad; tied
weights stay tied), the example inputs are replaced by meta tensors likewise, and the compiled
model is called once (and, for training, ``backward()`` of the sum of its outputs): meta tensors
carry metadata only, so nothing is computed and no memory of the model's size is allocated. The
serialized graphs then have every ``meta`` device (tensor metadata and device arguments) rewritten
to the target's device, ``cuda`` index 0 (the key ignores the index) or ``cpu``; tensors the
model explicitly puts on the CPU stay there, as they would in the real process. The user's model
is not modified.

What can differ from a real capture on the target device (those graphs then get other keys and
are compiled on first use, as without precompile):
  * ops whose decomposition or meta function depends on the device: ``scaled_dot_product_attention``
    (the backend choice: flash/efficient/math), convolutions whose output memory format depends on
    cuDNN, ops with device-specific AOTAutograd handling (RNG functionalization on CUDA when
    ``torch._functorch.config.functionalize_rng_ops`` is set);
  * Python code that branches on the device (``x.is_cuda``, ``x.device.type == "cuda"``) sees
    ``meta``; tensors held in plain attributes (not parameters or buffers) stay real and on the CPU;
  * dynamic shapes: graphs are captured with static shapes (``dynamic=False``), as a process's
    first compile for a shape is; graphs a process compiles after automatic-dynamic recompiles,
    or with ``mark_dynamic``, are not covered;
  * autocast, ``torch.backends`` flags and Dynamo/AOTAutograd configuration must match the real
    process's (they are whatever this process has set). CUDA autocast cannot: a torch without
    CUDA disables ``torch.autocast("cuda")`` (it warns), and meta tensors never take CUDA's
    autocast path, so a model trained under it is captured as its fp32 graphs, whose keys differ
    (precompile a model that converts its own dtypes, or on a machine with a GPU);
  * ``training=False`` captures the inference graph, as the model runs under ``torch.no_grad()``;
    a process that calls it with gradients enabled and parameters requiring grad runs the
    training forward graph instead (use ``training=True`` for it).
Dynamo keeps cache entries (guarded on meta tensors) for the model's code in this process: run
precompile in its own process (a CI job), or call ``torch._dynamo.reset()`` before running the
model itself here. kiln.stats() is not changed by precompile.
"""

import contextlib
import copy
import dataclasses
import itertools

import grpc
import torch

from kiln import options as options_mod
from kiln import proto
from kiln import server as server_mod
from kiln.errors import KilnError

_KIND_NAMES = {proto.GRAPH_KIND_FORWARD: "forward", proto.GRAPH_KIND_BACKWARD: "backward",
               proto.GRAPH_KIND_INFERENCE: "inference"}
_SOURCE_NAMES = {proto.CACHE_SOURCE_MEMORY_HIT: "memory_hit", proto.CACHE_SOURCE_DISK_HIT: "disk_hit",
                 proto.CACHE_SOURCE_SHARED_HIT: "shared_hit", proto.CACHE_SOURCE_COMPILED: "compiled",
                 proto.CACHE_SOURCE_JOINED: "joined", proto.CACHE_SOURCE_MISS: "miss"}
_SEVERITY = {1: "info", 2: "warning", 3: "error"}


@dataclasses.dataclass
class PrecompileRecord:
    """What kilnd answered for one captured graph."""

    kind: str  # "inference" | "forward" | "backward"
    key: str  # the cache key ("" if kilnd refused the graph before hashing it)
    source: str  # "compiled" | "joined" | "memory_hit" | "disk_hit" | "shared_hit"; "" on error
    kernels: int = 0  # kernel steps in the artifact's plan
    op_fallbacks: int = 0  # aten steps marked fallback (ops kiln runs with torch)
    diagnostics: list = dataclasses.field(default_factory=list)  # [{"severity", "code", "message", "node"}]
    error: str = ""  # "UNIMPLEMENTED: ..." when Compile failed
    debug_name: str = ""

    @property
    def ok(self):
        return not self.error


def parse_target(target, opts=None):
    """"cuda:sm_90" | "cpu" | "cpu:x86-64-v3" (or a kiln.proto.Target) -> kiln.proto.Target."""
    if isinstance(target, proto.Target):
        return target
    text = str(target).strip()
    kind, _, detail = text.partition(":")
    kind = kind.lower()
    if kind == "cuda":
        if not (detail.startswith("sm_") and detail[3:].isdigit() and len(detail) > 4):
            raise ValueError(f"precompile target {target!r}: say cuda:sm_<NN>, e.g. cuda:sm_90 (the "
                             "architecture of the GPUs that will run it)")
        return proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch=detail)
    if kind == "cpu":
        if detail == "native":
            raise ValueError("precompile target cpu:native: name the ISA level (cpu:x86-64-v3); "
                             "native would make the key machine-dependent")
        if not detail:
            from kiln.requests import detect_cpu_isa

            detail = (opts.cpu_isa if opts is not None else "") or detect_cpu_isa()
        return proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa=detail)
    raise ValueError(f"precompile target {target!r}: use cuda:sm_<NN>, cpu or cpu:<isa>")


def precompile(model_or_fn, example_inputs, target="cuda:sm_90", training=False, *, kwargs=None,
               options=None, strict=True, timeout=None):
    """Captures `model_or_fn` as ``torch.compile(model_or_fn, backend="kiln")`` would for
    `example_inputs` and has kilnd compile each graph for `target`, without running anything.

    model_or_fn: an nn.Module (deep-copied onto the meta device; the original is untouched) or a
      function (called with meta tensors). example_inputs: the positional arguments (a tuple or
      list; a single tensor is one argument), tensors on any device; only their sizes, strides,
      dtypes and requires_grad matter. kwargs: keyword arguments, likewise.
    target: "cuda:sm_90" (any sm_NN), "cpu" (options cpu_isa / KILN_CPU_ISA, else this machine's
      level, as the backend would pick) or "cpu:<isa>" such as "cpu:x86-64-v3".
    training: False: the inference graph (the model run under torch.no_grad()); True: the forward
      and backward graphs of a training step.
    options: as for the backend (kiln.options): server (default the embedded kilnd), timeout,
      deterministic, disable_fusion and training_layouts (they change the keys, so use the values
      the training job will use), cpu_isa, debug (sends keep_source).
    strict: raise kiln.KilnError after all graphs were sent if any failed (its ``records``
      attribute holds the records); False: return the records, failures with ``error`` set.
    Returns [PrecompileRecord] in capture order.

    Example (a CPU-only CI job filling the cluster's cache for H100/H200 nodes)::

        import kiln, torch
        model = MyModel()  # weights need not be loaded: only shapes matter
        x = torch.empty(32, 1024)
        for r in kiln.precompile(model, (x,), target="cuda:sm_90", training=True,
                                 options={"server": "kilnd.internal:7878"}):
            print(r.kind, r.key[:16], r.source, r.kernels, r.op_fallbacks)
    """
    opts = options_mod.resolve(options)
    target_pb = parse_target(target, opts)
    device = proto.Device(kind=target_pb.device, index=0 if target_pb.device == proto.DEVICE_KIND_CUDA else -1)
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    fn = _meta_clone(model_or_fn)
    args = _to_meta(tuple(example_inputs))
    kw = _to_meta(dict(kwargs or {}))
    sender = _Sender(opts, target_pb, timeout if timeout is not None else opts.timeout)
    records = []

    def send(kind, graph):  # each graph as it is captured: a backward needs its forward's plan
        rewrite_devices(graph, proto.DEVICE_KIND_META, device)
        record, plan = sender.send(kind, graph)
        records.append(record)
        return plan

    _capture(fn, args, kw, training, send, opts.training_layouts)
    if not records:
        raise KilnError("kiln.precompile: Dynamo captured no graph (a function without tensor ops, "
                        "or one that Dynamo skips)")
    failed = [r for r in records if r.error]
    if failed and strict:
        error = KilnError(f"kiln.precompile: {len(failed)} of {len(records)} graphs failed for target "
                          f"{_target_text(target_pb)}: " + "; ".join(f"{r.kind}: {r.error}" for r in failed))
        error.records = records
        raise error
    return records


# -- capture --------------------------------------------------------------------------------------


def _meta_tensor(t):
    m = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(m, requires_grad=t.requires_grad)
    if t.requires_grad:
        m.requires_grad_(True)
    return m


def _meta_clone(obj):
    orig = getattr(obj, "_orig_mod", None)  # an already torch.compile'd module
    if isinstance(orig, torch.nn.Module):
        obj = orig
    if not isinstance(obj, torch.nn.Module):
        return obj
    memo = {}
    # Parameters, buffers, and plain tensor attributes of the modules (self.mask = torch.ones(...)
    # without register_buffer): every tensor the copy holds goes to the meta device.
    attrs = (v for m in obj.modules() for v in vars(m).values() if isinstance(v, torch.Tensor))
    for t in itertools.chain(obj.parameters(), obj.buffers(), attrs):
        if id(t) not in memo:
            memo[id(t)] = _meta_tensor(t)
    try:
        return copy.deepcopy(obj, memo)
    except Exception as e:
        raise KilnError(f"kiln.precompile: cannot copy the model onto the meta device ({type(e).__name__}: "
                        f"{e}); build it on the meta device instead (with torch.device('meta'): "
                        "model = MyModel()) and pass that") from None


def _to_meta(tree):
    from torch.utils._pytree import tree_map

    return tree_map(lambda x: _meta_tensor(x) if isinstance(x, torch.Tensor) else x, tree)


def _capture(fn, args, kwargs, training, send, training_layouts=True):
    """Captures the graphs as the kiln backend would and calls send(GRAPH_KIND_*, kiln.proto.Graph)
    with each, in capture order; send returns the graph's kiln.proto.Plan or None. A forward's plan
    decides its saved tensors' strides, which its backward is captured for (kiln.layouts)."""
    from torch._functorch.aot_autograd import make_boxed_func

    from kiln import layouts
    from kiln.backend import make_aot
    from kiln.requests import serialize_aot_graph

    count = [0]

    def compiler_for(kind):
        def compile_fn(gm, example_inputs):
            name = f"precompile {_KIND_NAMES.get(kind, 'graph')} graph {count[0]}"
            count[0] += 1
            graph = serialize_aot_graph(gm, example_inputs, kind, name, training_layouts)
            plan = send(kind, graph)
            if graph.free_layout_outputs and plan is not None:
                layouts.report_output_strides(gm, layouts.plan_output_strides(plan))
            return make_boxed_func(gm)  # runs on meta tensors: metadata only

        return compile_fn

    aot = make_aot(compiler_for)

    def backend(gm, example_inputs, **unused):
        return aot(gm, example_inputs)

    patches = {"automatic_dynamic_shapes": False}
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            patches[name] = max(getattr(torch._dynamo.config, name), 1 << 16)
    with torch._dynamo.config.patch(**patches), _explain_foreign_tensors():
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        if training:
            with torch.enable_grad():
                out = compiled(*args, **kwargs)
                from torch.utils._pytree import tree_leaves

                losses = [o.sum() for o in tree_leaves(out)
                          if isinstance(o, torch.Tensor) and o.requires_grad and o.grad_fn is not None]
                if not losses:
                    raise KilnError("kiln.precompile(training=True): no output requires grad (do the "
                                    "parameters or inputs require grad?)")
                torch.autograd.backward(losses)
        else:
            with torch.no_grad():
                compiled(*args, **kwargs)


@contextlib.contextmanager
def _explain_foreign_tensors():
    """Turns the capture's "device mismatch ... meta and X" (a tensor the model or function reaches
    that precompile did not move to the meta device) into a KilnError that says what to do."""
    try:
        yield
    except KilnError:
        raise
    except Exception as e:
        text = str(e)
        mismatch = "same device" in text or "device mismatch" in text.lower()
        if not mismatch or "meta" not in text:
            raise
        first = next((line.strip() for line in text.splitlines() if "meta" in line), type(e).__name__)
        raise KilnError(
            "kiln.precompile: the capture met a real tensor beside the meta ones (" + first + "): "
            "precompile moves the model's parameters, buffers and tensor attributes and the example "
            "inputs to the meta device, but not tensors reached otherwise (a closure's or default "
            "argument's, a global's, e.g. a loss's targets); pass them as inputs, register them as "
            "buffers, or create them on the meta device") from None


def rewrite_devices(graph, from_kind, to):
    """Sets every Device of kind `from_kind` in `graph` (node metadata, arguments, constants' metadata)
    to the kiln.proto.Device `to`, in place; returns the graph."""

    def fix_device(d):
        if d.kind == from_kind:
            d.CopyFrom(to)

    def fix_meta(meta):
        kind = meta.WhichOneof("kind")
        if kind == "tensor":
            fix_device(meta.tensor.device)
        elif kind == "list":
            for item in meta.list.items:
                fix_meta(item)

    def fix_arg(arg):
        kind = arg.WhichOneof("value")
        if kind == "device":
            fix_device(arg.device)
        elif kind == "list":
            for item in arg.list.items:
                fix_arg(item)

    for node in graph.nodes:
        fix_meta(node.meta)
        for a in node.args:
            fix_arg(a)
        for k in node.kwargs:
            fix_arg(k.value)
    for c in graph.constants:
        fix_device(c.meta.device)
    return graph


# -- sending --------------------------------------------------------------------------------------


class _Sender:
    def __init__(self, opts, target, timeout):
        self.opts, self.target, self.timeout = opts, target, timeout
        self.address = None
        self.start_error = None
        try:
            from kiln.backend import _server_address

            self.address = _server_address(opts, force_check=True)
        except server_mod.ServerError as e:
            self.start_error = f"SERVER_START: {e}"

    def request(self, graph):
        from kiln.requests import request_for_graph

        return request_for_graph(self.opts, graph, self.target, self.timeout)

    def send(self, kind, graph):
        """(PrecompileRecord, the artifact's kiln.proto.Plan or None)."""
        record = PrecompileRecord(kind=_KIND_NAMES.get(kind, "graph"), key="", source="",
                                  debug_name=graph.debug_name)
        if self.start_error:
            record.error = self.start_error
            return record, None
        request = self.request(graph)
        client = server_mod.CONNECTIONS.client(self.address)
        try:
            response = client.compile(request, timeout=self.timeout)
        except grpc.RpcError as e:
            code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
            details = e.details() if callable(getattr(e, "details", None)) else str(e)
            record.error = f"{getattr(code, 'name', code)}: {details}"
            if code != grpc.StatusCode.UNAVAILABLE:
                try:  # the key, for the report: Lookup hashes without compiling
                    record.key = client.lookup(request, timeout=min(30.0, self.timeout)).key
                except grpc.RpcError:
                    pass
            return record, None
        record.key = response.key
        record.source = _SOURCE_NAMES.get(response.source, str(response.source))
        record.diagnostics = [{"severity": _SEVERITY.get(d.severity, "unspecified"), "code": d.code,
                               "message": d.message, "node": d.node} for d in response.diagnostics]
        if response.HasField("artifact"):
            for step in response.artifact.plan.steps:
                kind_ = step.WhichOneof("kind")
                if kind_ == "kernel":
                    record.kernels += 1
                elif kind_ == "aten" and step.aten.fallback:
                    record.op_fallbacks += 1
            return record, response.artifact.plan
        record.error = f"kilnd answered {record.source or 'nothing'} without an artifact"
        return record, None


def _target_text(target):
    if target.device == proto.DEVICE_KIND_CUDA:
        return f"cuda:{target.cuda_arch}"
    return f"cpu:{target.cpu_isa}"


__all__ = ["precompile", "PrecompileRecord", "parse_target", "rewrite_devices"]
