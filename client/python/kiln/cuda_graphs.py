"""CUDA-graph mode for CUDA plans (option ``cuda_graphs``, ``KILN_CUDA_GRAPHS=1``; off by default).

``CudaGraphRunner(executor)`` wraps a kiln.executor.PlanExecutor of a CUDA artifact and, instead of
running the plan's steps one by one on every call, replays a ``torch.cuda.CUDAGraph`` of them.

Calls are keyed by the inputs' signature (dtype, sizes, strides and device of each tensor, the
values of the other inputs) and the data pointers of the *static-address* inputs: nn.Parameters,
tensors marked with torch._dynamo.mark_static_address, the saved tensors that a captured training
forward keeps in its memory (below) and the static-address inputs it returns for its backward.
The graph reads those in place. Every other tensor input is copied into a static buffer with the
same sizes and strides before each replay (one device-to-device copy of the memory the input
spans, as torch's own cudagraphs copy activations; one torch._foreach_copy_ per dtype where
several inputs have it).

  1st call of a key   the plan runs as usual (the warm-up: binaries loaded, constants moved,
                      torch's libraries initialized).
  2nd call            one more run on a side stream, then the plan's run is captured into a
                      CUDAGraph with its own memory pool and replayed.
  later calls         copy the non-static inputs in, replay, copy the outputs out. kiln.backend
                      tries replay_if_captured before its guard: a captured key
                      holds everything the guard checks, so replays skip it.

Outputs are copied out of the graph's memory pool after a replay, keeping their sizes, strides,
storage offsets relative to each other and the aliasing among them, so the results of earlier
calls stay valid: one torch._foreach_copy_ per dtype into new tensors, planned once per capture
(kiln._cuda_graph_copy.CopyOut). Outputs that are views of an input (AOTAutograd's forward graphs
return the inputs they save for the backward) are the same views of that call's input. An output
with a storage of its own whose copies were released before the next call 3 times in a row in
the first 8 replays (a backward's gradients: autograd hands them to .grad, and zero_grad drops
them) is returned in place from then on, as saved tensors are (below); if a call finds one still
in use (gradient accumulation), that call runs without the graph, and the next one captures the
graph again (a new memory pool; the caller keeps the old one's tensor), copying that output.

A training forward's tensors saved for the backward only (Graph.saved_outputs, which the client
fills from AOTAutograd's metadata) are not copied: the call returns them where the replay wrote
them, in the graph's memory, and the backward, whose capture key then holds their addresses,
reads them in place. The next replay would overwrite them, so a call first checks that none of
what the previous replay returned there is still referenced (torch's storage use counts); if one
is (two forwards before a backward, retain_graph), that call runs the plan without the graph
(counted as cuda_graph_busy).

Input updates kept in the graph (batch norm's running statistics, a compiled optimizer's
parameters: AOTAutograd's `aten.copy_(input, new value)` nodes) are captured with the rest. A
static-address input is updated in place by each replay (its values from before the capture's
warm-up run are put back, so that the capturing call updates it once). Any other updated input
is copied back from its static buffer after each replay.

Limits (the plan then runs without a graph, exactly as without this option; logged once):
  * graphs with collectives (c10d), or with an op that writes into a view of an input (not
    AOTAutograd's form, which writes the input itself): never captured;
  * an output that views an input as another dtype, or an updated input (not of static address)
    that shares its memory with another input: that key is not captured;
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
import weakref

import torch

from kiln import counters as stats_mod
from kiln._exec_kernels import _current_stream
from kiln._cuda_graph_copy import copy_out  # noqa: F401 (API)
from kiln._cuda_graph_copy import _HAS_INTERNAL_OVERLAP, CopyOut, _extent, _span_of, storage_owners
from kiln._cuda_graph_inspect import inspect_graph
from kiln.executor import _CUDA_CURRENT, _FAST_EMPTY

log = logging.getLogger("kiln")

DEFAULT_MAX_GRAPHS = 4
_USE_COUNT = torch._C._storage_Use_Count
_MAX_SEEN = 256
PROMOTE_AFTER = 3  # releases in a row before an output is returned in place (_Captured._observe)
WATCHED_REPLAYS = 8


class _NotCapturable(Exception):
    pass


def _is_static_address(t):
    return isinstance(t, torch.nn.Parameter) or getattr(t, "_dynamo_static_input_type", None) is not None


# The storages whose tensors other graphs read in place (static, keyed by address), by data pointer:
#   _KEPT_STORAGES: the saved tensors that captured forwards return in their own memory (a graph's
#     private memory is not handed to other allocations while the graph lives, so an input whose
#     storage starts there is that output or a view of it) -> that _Captured;
#   _STATIC_STORAGES: the static-address inputs that captured forwards return as saved tensors
#     (AOTAutograd may hand a backward a parameter as a plain tensor, which _is_static_address does
#     not recognize) -> a weak reference to the storage, so that a freed one's address is forgotten.
_KEPT_STORAGES = weakref.WeakValueDictionary()
_STATIC_STORAGES = {}


def _read_in_place(ptr):
    if ptr in _KEPT_STORAGES:
        return True
    ref = _STATIC_STORAGES.get(ptr)
    if ref is None:
        return False
    if ref.expired():
        _STATIC_STORAGES.pop(ptr, None)
        return False
    return True


def _remember_static_storages(storages):
    from torch.multiprocessing.reductions import StorageWeakRef

    for ptr, ref in list(_STATIC_STORAGES.items()):
        if ref.expired():
            _STATIC_STORAGES.pop(ptr, None)
    for st in storages:
        _STATIC_STORAGES[st.data_ptr()] = StorageWeakRef(st)


def _static_flags(inputs):
    """Per input: True (a static-address tensor: read in place, keyed by address), False (a tensor
    copied into the graph's static buffer) or None (not a tensor)."""
    lookup = len(_KEPT_STORAGES) > 0 or len(_STATIC_STORAGES) > 0
    return tuple((_is_static_address(t) or (lookup and _read_in_place(t.untyped_storage().data_ptr())))
                 if isinstance(t, torch.Tensor) else None for t in inputs)


def _key(device, inputs, flags):
    """A call's capture key: the device; per tensor input its dtype, sizes, strides and, for a
    static-address one, its address; the other inputs' values. Raises AttributeError when an input
    is not what `flags` says it is (then the flags are recomputed)."""
    return device, tuple([(t.dtype, t.shape, t.stride(), t.data_ptr()) if f
                          else (t.dtype, t.shape, t.stride()) if f is False
                          else _value_key(t) for t, f in zip(inputs, flags)])


def _value_key(v):
    if isinstance(v, torch.Tensor):
        raise AttributeError("a tensor where the flags have none")
    return type(v).__name__, v if isinstance(v, (int, float, bool)) or v is None else id(v)


class CudaGraphRunner:
    """Runs a CUDA PlanExecutor through captured CUDA graphs (see the module docstring)."""

    def __init__(self, executor, max_graphs=DEFAULT_MAX_GRAPHS, name="graph"):
        self.executor = executor
        self.max_graphs = max_graphs
        self.name = name
        self.refusal, self.updated = inspect_graph(executor.graph)
        self.kept_outputs = frozenset(getattr(executor.graph, "saved_outputs", ()))
        self._flags = None  # the last _static_flags: computed again when a key is not found
        self._first = 0  # the index of the first tensor in _flags (its device is the key's)
        self._seen = set()
        self._graphs = {}  # key -> _Captured
        self._failed = set()  # keys whose capture failed or was refused
        self._copied_outputs = set()  # once returned in place and then found in use: always copied
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

    def replay_if_captured(self, inputs):
        """The outputs of a replay when a graph is captured for these inputs' key and no output of
        its last replay is still in use; else None, and nothing ran (then call the runner).

        kiln.backend calls this before its guards: the key holds every tensor input's dtype, sizes
        and strides (and the address of those read in place) and the other inputs' types and
        values, so inputs with a captured key pass the guards that the capture's inputs passed.
        (A tensor's device is not in the key: a copied input is copied into the graph's buffer
        from wherever it is, and a static-address one on another device has another address.)"""
        static = self._flags
        if not self._graphs or self.refusal or static is None or len(static) != len(inputs):
            return None
        with self._lock:
            try:
                key = _key(inputs[self._first].device, inputs, static)
            except AttributeError:  # an input is not what the flags say
                return None
            captured = self._graphs.get(key)
            if captured is None or captured.busy():
                return None
            stats_mod.add("cuda_graph_replays")
            return captured.replay(inputs)

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
        with self._lock:
            static = self._flags
            key = None
            if static is not None and len(static) == len(inputs):
                try:
                    key = _key(device, inputs, static)
                except AttributeError:
                    key = None
            captured = self._graphs.get(key) if key is not None else None
            if captured is None:
                fresh = _static_flags(inputs)
                if fresh != static or key is None:
                    static = self._flags = fresh
                    self._first = next(i for i, f in enumerate(fresh) if f is not None)
                    key = _key(device, inputs, static)
                    captured = self._graphs.get(key)
            if captured is not None:
                if captured.busy():
                    stats_mod.add("cuda_graph_busy")
                    if captured.demote:  # its memory stays with the caller: capture again
                        self._graphs.pop(key, None)
                        self._copied_outputs |= captured.demote
                    return self.executor(inputs, symbols)
                stats_mod.add("cuda_graph_replays")
                return captured.replay(inputs)
            plain = (key in self._failed or len(self._graphs) >= self.max_graphs
                     or _DEVICE.capturing(device))
            if not plain and key not in self._seen:
                if len(self._seen) < _MAX_SEEN:
                    self._seen.add(key)
                plain = True  # the warm-up call
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("kiln: CUDA graphs: %s: warm-up of a new key (%d keys captured); inputs "
                              "read in place (S) or copied (c): %s", self.name, len(self._graphs),
                              "".join("S" if f else "c" if f is False else "-" for f in static))
            if not plain:
                try:
                    captured = _capture(self.executor, inputs, symbols, static, device, self.updated,
                                        self.kept_outputs, frozenset(self._copied_outputs))
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


def _capture(executor, inputs, symbols, static, device, updated=(), kept=frozenset(),
             copied_outputs=frozenset()):
    static_inputs = list(inputs)
    # (input index, its static buffer, whether the buffer is filled from the bytes the input
    # spans): the static input is a view of a buffer of that span; an input without internal
    # overlap is copied element by element into that view (the same sizes and strides), any other
    # (expanded, overlapping) as the bytes it spans.
    copied = []
    for i, (t, s) in enumerate(zip(inputs, static)):
        if isinstance(t, torch.Tensor) and not s:
            if t.numel() == 0:
                static_inputs[i] = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
                continue
            span = torch.empty(_extent(t), dtype=t.dtype, device=t.device)
            span.copy_(_span_of(t))
            static_inputs[i] = span.as_strided(t.size(), t.stride(), 0)
            whole = _HAS_INTERNAL_OVERLAP(t) != 0
            copied.append((i, span if whole else static_inputs[i], whole))
    written_back = []  # (input index, its static buffer): copied back after each replay
    saved = []  # (static-address input, its values before the capture's runs)
    for i in updated:
        t = inputs[i] if i < len(inputs) else None
        if not isinstance(t, torch.Tensor):
            continue
        if static[i]:
            saved.append((t, t.clone()))
            continue
        storage = t.untyped_storage().data_ptr()
        for j, u in enumerate(inputs):
            if j != i and isinstance(u, torch.Tensor) and u.untyped_storage().data_ptr() == storage:
                raise _NotCapturable(f"input {i}, which the graph updates, shares memory with input {j}")
        written_back.append((i, static_inputs[i]))
    graph, outputs = _DEVICE.capture(executor, static_inputs, symbols, static, device)
    for t, values in saved:  # the warm-up run updated them; the replay that follows will
        t.copy_(values)
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
        offset = o.storage_offset() - base.storage_offset()
        aliases[k] = (i, tuple(o.size()), tuple(o.stride()), offset,
                      o.size() == base.size() and o.stride() == base.stride() and offset == 0)
    outputs = [None if k in aliases else o for k, o in enumerate(outputs)]
    kept = {k for k in kept if k < len(outputs) and isinstance(outputs[k], torch.Tensor)}
    # A kept output must not share its memory with a copied one (their copies would not alias).
    copied_storages = {o.untyped_storage().data_ptr() for k, o in enumerate(outputs)
                       if isinstance(o, torch.Tensor) and k not in kept}
    kept = {k for k in kept if outputs[k].untyped_storage().data_ptr() not in copied_storages}
    static_storages = [static_inputs[i].untyped_storage() for i, *_ in aliases.values() if static[i]]
    # Not kept: static_inputs (the graph reads the static-address inputs of later calls at the
    # same addresses, and holding a kept output of another graph would keep that graph busy).
    return _Captured(graph, copied, written_back, outputs, aliases, kept, static_storages, device,
                     copied_outputs)


class _Captured:
    def __init__(self, graph, copied, written_back, outputs, aliases, kept, static_storages, device,
                 copied_outputs=frozenset()):
        self.graph = graph
        # The copy-in, by dtype: [(buffers, [(input index, whether its span is copied)])]. A
        # torch._foreach_copy_ per dtype with several inputs (one launch on the host: each copy_
        # is a launch of its own, tens of microseconds of host time on a busy host).
        by_dtype = {}
        for i, buffer, whole in copied:
            buffers, sources = by_dtype.setdefault(buffer.dtype, ([], []))
            buffers.append(buffer)
            sources.append((i, whole))
        self.copy_in = list(by_dtype.values())
        self.written_back = written_back
        self.outputs = outputs  # the graph's outputs in its pool (None where `aliases` has one)
        # output index -> (input index, sizes, strides, relative offset, whether it is the input)
        self.aliases = aliases
        self.kept = frozenset(kept)  # outputs returned in place (saved tensors), not copied out
        self.in_place = set()  # other outputs returned in place, once seen released (_observe)
        self.demote = set()  # of those, the ones a call found still in use (the runner captures again)
        # Outputs that may be returned in place: a storage no other output shares, not kept.
        owners = storage_owners(outputs)
        self.candidates = {k: 0 for k, o in enumerate(outputs)  # -> releases seen in a row
                           if k not in self.kept and k not in copied_outputs
                           and isinstance(o, torch.Tensor) and o.numel() > 0
                           and owners[o.untyped_storage().data_ptr()] == 1}
        self.watched = {}  # candidate -> weak reference to the storage of its last copy
        self.observed = 0
        self.device = device
        # torch's allocation function for compiled code, for the copies (on the current device)
        self.alloc = _FAST_EMPTY["cuda"] if device.type == "cuda" else None
        self.last = None  # the stream of the last replay (_TorchCuda.order)
        for k in self.kept:
            _KEPT_STORAGES[outputs[k].untyped_storage().data_ptr()] = self
        _remember_static_storages(static_storages)
        self._plan()

    def _plan(self, out=()):
        """The copy-out of the outputs not returned in place, and the storages of those returned in
        place with their use counts while only this object holds them: a higher count means
        something still uses what a replay returned there. out: the outputs of the replay under
        way (its views of the storages returned in place do not count as idle)."""
        handed = self.kept | self.in_place
        self.copy_out = CopyOut(self.outputs, handed)
        self.handed = tuple((k, self.outputs[k]) for k in sorted(handed))  # (index, output)
        storages = {}
        for k, t in self.handed:
            st = t.untyped_storage()
            storages.setdefault(st.data_ptr(), (st, k))
        self.storages = [st for st, _ in storages.values()]  # holds them: their _cdata stay valid
        self.storage_outputs = [k for _, k in storages.values()]
        self.cdata = [st._cdata for st in self.storages]
        self.idle_counts = list(map(_USE_COUNT, self.cdata))
        where = {st.data_ptr(): i for i, st in enumerate(self.storages)}
        for o in out:
            i = where.get(o.untyped_storage().data_ptr()) if isinstance(o, torch.Tensor) else None
            if i is not None:
                self.idle_counts[i] -= 1

    def busy(self):
        """Whether a tensor that a replay returned in place is still in use (the next replay would
        overwrite it). Outputs other than saved tensors found in use are noted in `demote`: their
        memory now belongs to the caller, so the runner drops this graph and captures a new one
        that copies them. A count under the idle one (a miscounted idle state) counts as busy
        too: the call then runs without the graph rather than risk overwriting a tensor in use."""
        counts = list(map(_USE_COUNT, self.cdata))
        if counts == self.idle_counts:
            return False
        for k, count, idle in zip(self.storage_outputs, counts, self.idle_counts):
            if count > idle and k in self.in_place:
                self.demote.add(k)
        return True

    def replay(self, inputs):
        self.last = _DEVICE.order(self.last, self.device)  # after the previous replay's copy-out
        for buffers, sources in self.copy_in:
            if len(buffers) == 1:
                i, whole = sources[0]
                buffers[0].copy_(_span_of(inputs[i]) if whole else inputs[i])
            else:
                torch._foreach_copy_(buffers, [_span_of(inputs[i]) if whole else inputs[i]
                                               for i, whole in sources])
        _DEVICE.replay(self.graph, self.device, inputs)
        for i, buffer in self.written_back:
            inputs[i].copy_(buffer)
        fast = self.alloc is not None and self.device.index == _CUDA_CURRENT()
        out = self.copy_out(self.alloc if fast else None)
        for k, t in self.handed:
            out[k] = t.detach()  # a new tensor on the graph's memory (counted by busy())
        for k, (i, sizes, strides, offset, whole) in self.aliases.items():
            t = inputs[i]
            out[k] = t if whole else t.as_strided(sizes, strides, t.storage_offset() + offset)
        if self.candidates:
            self._observe(out)
        return out

    def _observe(self, out):
        """Over the first WATCHED_REPLAYS replays: an output whose copies were released before the
        next call PROMOTE_AFTER times in a row (a backward's gradients, which autograd hands to
        .grad and zero_grad drops) is returned in place from then on, as saved tensors are."""
        from torch.multiprocessing.reductions import StorageWeakRef

        promoted = False
        for k in list(self.candidates):
            ref = self.watched.get(k)
            if ref is not None:
                self.candidates[k] = self.candidates[k] + 1 if ref.expired() else 0
            if self.candidates[k] >= PROMOTE_AFTER:
                del self.candidates[k]
                self.watched.pop(k, None)
                self.in_place.add(k)
                promoted = True
            else:
                self.watched[k] = StorageWeakRef(out[k].untyped_storage())
        self.observed += 1
        if self.observed >= WATCHED_REPLAYS:
            self.candidates.clear()
            self.watched.clear()
        if promoted:
            self._plan(out)


class _TorchCuda:
    """The few CUDA operations the runner needs (kiln.testing.CpuGraphs stands in for them on CPU)."""

    @staticmethod
    def wraps(executor):
        """Whether kiln.backend wraps this PlanExecutor in a CudaGraphRunner (option cuda_graphs)."""
        return executor.cuda

    @staticmethod
    def applies(device):
        return device.type == "cuda"

    @staticmethod
    def capturing(device):
        return torch.cuda.is_current_stream_capturing()

    @staticmethod
    def capture(executor, static_inputs, symbols, static, device):
        """One warm-up run on a side stream (as torch's docs ask), then a run of `executor` on
        `static_inputs` captured into a new CUDAGraph with its own memory pool; returns (graph,
        the run's outputs). The graph keeps no reference to the inputs."""
        with torch.cuda.device(device):
            current = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                executor(static_inputs, symbols)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = executor(static_inputs, symbols)
        return graph, outputs

    @staticmethod
    def replay(graph, device, inputs):
        """Replays `graph`, which reads the static-address inputs of this call (`inputs`) where
        they are, as the capture's were."""
        if _CUDA_CURRENT() == device.index:
            graph.replay()
        else:
            with torch.cuda.device(device):
                graph.replay()

    @staticmethod
    def order(last, device):
        """Orders this replay after the previous one's copy-out. last: (raw stream, stream) of the
        previous replay, or None. Same stream: nothing to do; another one: it waits for that one.
        Returns this replay's (raw stream, stream)."""
        raw = _current_stream(device)
        if last is not None and last[0] == raw:
            return last
        current = torch.cuda.current_stream(device)
        if last is not None:
            current.wait_stream(last[1])
        return raw, current


_DEVICE = _TorchCuda()
