"""CUDA-graph mode for CUDA plans (option ``cuda_graphs``, ``KILN_CUDA_GRAPHS=1``; off by default).

``CudaGraphRunner(executor)`` wraps a kiln.executor.PlanExecutor of a CUDA artifact and, instead of
running the plan's steps one by one on every call, replays a ``torch.cuda.CUDAGraph`` of them.

Calls are keyed by the inputs' signature (dtype, sizes, strides and device of each tensor, the
values of the other inputs) and the data pointers of the *static-address* inputs: nn.Parameters and
tensors marked with torch._dynamo.mark_static_address. The graph reads those in place. Every other
tensor input is copied into a static buffer with the same sizes and strides before each replay
(one device-to-device copy of the memory the input spans, as torch's own cudagraphs copy
activations).

  1st call of a key   the plan runs as usual (the warm-up: binaries loaded, constants moved,
                      torch's libraries initialized).
  2nd call            one more run on a side stream, then the plan's run is captured into a
                      CUDAGraph with its own memory pool and replayed.
  later calls         copy the non-static inputs in, replay, copy the outputs out.

Outputs are copied out of the graph's memory pool after every replay, keeping their sizes,
strides, storage offsets relative to each other and the aliasing among them, so the results of
earlier calls stay valid (one device-to-device copy per output). Outputs that are views of an input
(AOTAutograd's forward graphs return the inputs they save for the backward) are the same views of
that call's input.

Limits (the plan then runs without a graph, exactly as without this option; logged once):
  * graphs with an op that mutates its arguments (input mutations kept in the graph) or with
    collectives (c10d): never captured;
  * an output that views an input as another dtype: that key is not captured;
  * a failing capture (an op that synchronizes with the host, e.g. ``.item()`` or ``nonzero``, or
    one that is not capturable): the plan runs without a graph from then on;
  * at most ``max_graphs`` (4) captured graphs per plan; other keys run without a graph;
  * each captured graph keeps its memory pool, static inputs and outputs until the plan (the
    compiled graph) is dropped; static shapes only (what kilnd compiles);
  * replays of one plan are serialized: a replay waits (on the GPU) for the previous replay's
    copy-out, so calls from several threads or streams do not overwrite each other's inputs;
  * randomness: torch's default CUDA generator is graph-safe (each replay advances its offset);
    other generators are not.
"""

import logging
import threading

import torch

from kiln import counters as stats_mod
from kiln import proto

log = logging.getLogger("kiln")

DEFAULT_MAX_GRAPHS = 4
_MAX_SEEN = 256


class _NotCapturable(Exception):
    pass


def graph_refusal(graph):
    """Why a kiln.proto.Graph must not be captured (a string), or None."""
    from kiln.deserialize import resolve_target

    for node in graph.nodes:
        if node.op != proto.Node.OP_CALL_FUNCTION:
            continue
        if "c10d" in node.target:
            return f"node {node.name} is a collective ({node.target})"
        if not node.target.startswith("aten.") and not node.target.startswith("prims."):
            continue
        try:
            op = resolve_target(node.target)
        except Exception:
            continue
        schema = getattr(op, "_schema", None)
        if schema is not None and schema.is_mutable:
            return f"node {node.name} ({node.target}) mutates its arguments"
    return None


def _is_static_address(t):
    return isinstance(t, torch.nn.Parameter) or getattr(t, "_dynamo_static_input_type", None) is not None


class CudaGraphRunner:
    """Runs a CUDA PlanExecutor through captured CUDA graphs (see the module docstring)."""

    def __init__(self, executor, max_graphs=DEFAULT_MAX_GRAPHS, name="graph"):
        self.executor = executor
        self.max_graphs = max_graphs
        self.name = name
        self.refusal = graph_refusal(executor.graph)
        self._seen = set()
        self._graphs = {}  # key -> _Captured
        self._failed = set()  # keys whose capture failed or was refused
        self._lock = threading.Lock()
        self._told = False
        if self.refusal:
            self._tell(f"not captured: {self.refusal}")

    def __getattr__(self, name):  # op_fallbacks, kernel_steps, ... of the executor
        if name == "executor":
            raise AttributeError(name)
        return getattr(self.executor, name)

    def _tell(self, why):
        if not self._told:
            self._told = True
            log.info("kiln: CUDA graphs: %s: %s; it runs without a CUDA graph", self.name, why)

    def __call__(self, inputs, symbols=None):
        if self.refusal:
            return self.executor(inputs, symbols)
        device = None
        for t in inputs:
            if isinstance(t, torch.Tensor):
                device = t.device
                break
        if device is None or not _DEVICE.applies(device):
            return self.executor(inputs, symbols)
        static = tuple(isinstance(t, torch.Tensor) and _is_static_address(t) for t in inputs)
        key = (_signature(inputs), static,
               tuple(t.data_ptr() if s else None for t, s in zip(inputs, static)))
        with self._lock:
            captured = self._graphs.get(key)
            if captured is not None:
                stats_mod.add("cuda_graph_replays")
                return captured.replay(inputs)
            plain = (key in self._failed or len(self._graphs) >= self.max_graphs
                     or _DEVICE.capturing(device))
            if not plain and key not in self._seen:
                if len(self._seen) < _MAX_SEEN:
                    self._seen.add(key)
                plain = True  # the warm-up call
            if not plain:
                try:
                    captured = _capture(self.executor, inputs, symbols, static, device)
                except _NotCapturable as e:  # this key only
                    if len(self._failed) < _MAX_SEEN:
                        self._failed.add(key)
                    self._tell(f"not captured for these inputs: {e}")
                except Exception as e:  # the plan cannot be captured (e.g. host syncs): never again
                    self.refusal = f"capture failed ({type(e).__name__}: {str(e)[:300]})"
                    self._tell(self.refusal)
                else:
                    self._graphs[key] = captured
                    stats_mod.add("cuda_graph_captures")
                    stats_mod.add("cuda_graph_replays")
                    return captured.replay(inputs)
        return self.executor(inputs, symbols)


def _signature(inputs):
    sig = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            sig.append((t.dtype, t.device, tuple(t.shape), tuple(t.stride())))
        else:
            sig.append((type(t).__name__, t if isinstance(t, (int, float, bool)) or t is None else id(t)))
    return tuple(sig)


def _extent(t):
    return sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1


def _span_of(t):
    """The elements of t's storage from its first to its last element, as a 1-d contiguous view
    (any strides, overlapping ones too: a plain memcpy)."""
    return t.as_strided((_extent(t),), (1,), t.storage_offset())


def _capture(executor, inputs, symbols, static, device):
    static_inputs = list(inputs)
    copied = []  # (input index, span): the static input is a view of `span`, which is filled from
    for i, (t, s) in enumerate(zip(inputs, static)):  # the bytes the input's elements span
        if isinstance(t, torch.Tensor) and not s:
            if t.numel() == 0:
                static_inputs[i] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
                continue
            span = torch.empty(_extent(t), dtype=t.dtype, device=t.device)
            span.copy_(_span_of(t))
            static_inputs[i] = span.as_strided(t.size(), t.stride(), 0)
            copied.append((i, span))
    graph, outputs = _DEVICE.capture(lambda: executor(static_inputs, symbols), device)
    # Outputs that alias an input (AOTAutograd's forward graphs return saved inputs): at a replay
    # they are the same view of that call's input; the rest is copied out of the graph's pool.
    by_storage = {}
    for i, t in enumerate(static_inputs):
        if isinstance(t, torch.Tensor):
            by_storage.setdefault(t.untyped_storage().data_ptr(), i)
    aliases = {}
    for k, o in enumerate(outputs):
        if not isinstance(o, torch.Tensor):
            continue
        i = by_storage.get(o.untyped_storage().data_ptr())
        if i is None:
            continue
        base = static_inputs[i]
        if o.dtype != base.dtype:
            raise _NotCapturable(f"output {k} views input {i} as another dtype")
        aliases[k] = (i, tuple(o.size()), tuple(o.stride()), o.storage_offset() - base.storage_offset())
    outputs = [None if k in aliases else o for k, o in enumerate(outputs)]
    return _Captured(graph, static_inputs, copied, outputs, aliases, device)


class _Captured:
    def __init__(self, graph, static_inputs, copied, outputs, aliases, device):
        self.graph = graph
        self.static_inputs = static_inputs
        self.copied = copied
        self.outputs = outputs  # the graph's outputs in its pool (None where `aliases` has one)
        self.aliases = aliases  # output index -> (input index, sizes, strides, relative offset)
        self.device = device
        self.done = None  # event recorded after the last replay's copy-out

    def replay(self, inputs):
        _DEVICE.wait(self.done, self.device)  # the previous replay's copy-out
        for i, span in self.copied:
            span.copy_(_span_of(inputs[i]))
        _DEVICE.replay(self.graph, self.device)
        out = copy_out(self.outputs)
        for k, (i, sizes, strides, offset) in self.aliases.items():
            t = inputs[i]
            out[k] = t.as_strided(sizes, strides, t.storage_offset() + offset)
        self.done = _DEVICE.record(self.done, self.device)
        return out


class _TorchCuda:
    """The few CUDA operations the runner needs (replaced by a stand-in in the CPU unit tests)."""

    @staticmethod
    def applies(device):
        return device.type == "cuda"

    @staticmethod
    def capturing(device):
        return torch.cuda.is_current_stream_capturing()

    @staticmethod
    def capture(run, device):
        """One warm-up run on a side stream (as torch's docs ask), then run() captured into a new
        CUDAGraph with its own memory pool; returns (graph, run's result)."""
        with torch.cuda.device(device):
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                run()
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = run()
        return graph, outputs

    @staticmethod
    def replay(graph, device):
        with torch.cuda.device(device):
            graph.replay()

    @staticmethod
    def wait(event, device):
        if event is not None:
            torch.cuda.current_stream(device).wait_event(event)

    @staticmethod
    def record(event, device):
        if event is None:
            event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        return event


_DEVICE = _TorchCuda()


def copy_out(outputs, keep=()):
    """New tensors with the values of `outputs` (a list that may hold non-tensors), laid out as
    they are: same sizes and strides, outputs that share a storage share one new storage at the
    same relative offsets. Items whose index is in `keep` and non-tensors are returned as they are."""
    result = list(outputs)
    groups = {}
    for i, o in enumerate(outputs):
        if not isinstance(o, torch.Tensor) or i in keep:
            continue
        if o.numel() == 0:
            result[i] = torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=o.device)
            continue
        groups.setdefault((o.device, o.untyped_storage().data_ptr()), []).append(i)
    for (device, _), idxs in groups.items():
        spans = []
        for i in idxs:
            o = outputs[i]
            size = o.element_size()
            start = o.storage_offset() * size
            extent = sum((n - 1) * st for n, st in zip(o.shape, o.stride())) + 1
            spans.append((start, start + extent * size))
        lo = min(a for a, _ in spans)
        lo -= lo % 16  # keeps every element-size-aligned offset aligned
        hi = max(b for _, b in spans)
        src = torch.empty(0, dtype=torch.uint8, device=device)
        src.set_(outputs[idxs[0]].untyped_storage(), lo, (hi - lo,), (1,))
        dst = src.clone().untyped_storage()
        for i in idxs:
            o = outputs[i]
            size = o.element_size()
            t = torch.empty(0, dtype=o.dtype, device=device)
            t.set_(dst, (o.storage_offset() * size - lo) // size, o.size(), o.stride())
            result[i] = t
    return result
