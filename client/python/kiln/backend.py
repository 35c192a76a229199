"""The torch.compile backend: ``torch.compile(model, backend="kiln", options={...})``.

Registered through the ``torch_dynamo_backends`` entry point (``kiln = "kiln.backend:kiln_backend"``).
Dynamo hands each captured frame to ``kiln_backend``, which runs AOTAutograd with the min-cut
partitioner; every forward, backward and inference graph is serialized and sent to kilnd
(``Compile``, or ``Lookup`` in cache-only mode); the target is CUDA (``sm_XY`` of the inputs'
device) when the inputs are on a CUDA device, else the CPU ISA. A reply with an artifact gives a
plan that ``kiln.executor`` runs (CPU shared objects, or CUDA cubins/PTX launched on torch's
current stream of the inputs' device; with option ``cuda_graphs``, replayed as CUDA graphs, see
kiln.cuda_graphs); anything else makes that graph run eagerly with torch, with one warning per
cause (``KILN_FALLBACK=error`` raises ``kiln.KilnError`` instead). Training never fails because of
kiln: kiln's own exceptions while preparing a graph are fallbacks too.

Guards: each artifact is specialized to its inputs' metadata (kiln.guards); inputs that do not
match send a new compile request for that specialization. Dynamo recompiles (new shapes) and these
re-specializations count toward ``max_graphs_per_function`` per Dynamo frame (default 8, like
Dynamo's cache_size_limit); past it the function runs eagerly, with a warning.

Symbolic shapes: a graph with symbolic sizes is sent as it is; when kilnd does not compile it
(UNIMPLEMENTED; in cache-only mode, a miss), it is compiled per input shape at run time instead
(CompiledGraph.dynamic): each new shape gets a static specialization (kiln.specialize) and a plan,
up to ``max_graphs_per_function`` shapes per graph; shapes past that run eagerly, with a warning.

Backward prefetch: AOTAutograd calls the backward compiler lazily, at the first ``backward()``.
With option ``prefetch_backward`` (default on) the backward graph's request, built exactly as the
backward compiler will build it, is sent to ``Compile`` from a background thread as soon as the
partitioner has made it, so that kilnd compiles it alongside the forward; the backward compiler's
own request then joins that compile or hits the cache (kilnd's single flight). The prefetch is
fire-and-forget: its failures are logged at debug level and change nothing else; it is not a graph
or a request in kiln.stats() (it is counted in ``backward_prefetches``). For a symbolic training
graph, each new shape of the forward sends the backward's specialization for that shape ahead the
same way (_Session.prefetch_backward_shape).
See kiln.options for every option and environment variable.
"""

import hashlib
import logging
import os
import sys
import threading
import time
import warnings

import grpc
import torch

from kiln import aot_cache
from kiln import debug as debug_mod
from kiln import layouts
from kiln import options as options_mod
from kiln import proto
from kiln import server as server_mod
from kiln import specialize as specialize_mod
from kiln import counters as stats_mod
from kiln.errors import KilnError, KilnWarning
from kiln.guards import GuardFailure, StaticGuard
from kiln.partition import _rows_recomputable, _without_detaches
from kiln.requests import (_KIND_NAMES, _compile_request, detect_cpu_isa, graph_device,  # noqa: F401
                           request_for_graph, target_for, target_for_graph)
from kiln.runtime import RuntimeUnavailable

log = logging.getLogger("kiln")

_TRANSIENT = {"unavailable", "deadline_exceeded", "resource_exhausted", "server_start"}
_MAX_RETRIES = 5

_STATE_LOCK = threading.Lock()
_FUNCTION_GRAPHS = {}  # function key -> graphs compiled (Dynamo recompiles + re-specializations)
_LIMIT_WARNED = set()  # function keys whose cap was announced
_WARNED = set()  # fallback causes already warned about
_DOWN_UNTIL = {}  # address -> monotonic time before which it is not tried again
_EMBEDDED_READY = {}  # cache dir -> address known to be serving


def reset():
    """Forgets per-function graph counts and which warnings were given (torch._dynamo.reset()
    calls this through the backend's `reset` attribute; tests call it directly)."""
    with _STATE_LOCK:
        _FUNCTION_GRAPHS.clear()
        _LIMIT_WARNED.clear()
        _WARNED.clear()
        _DOWN_UNTIL.clear()
        _EMBEDDED_READY.clear()
    server_mod.CONNECTIONS.close_all()


# -- the backend ------------------------------------------------------------------------------


def kiln_backend(gm, example_inputs, options=None, mode=None, **unused):
    """The Dynamo backend. options: see kiln.options (they override the KILN_* environment)."""
    opts = options_mod.resolve(options)
    fn = _FunctionInfo(gm)
    if not fn.admit(opts):
        return _eager_dynamo_graph(gm, fn, opts)

    session = _Session(opts, fn)
    aot = make_aot(session.compiler, prefetch_backward=session.prefetch_backward)
    try:
        if session.aot_cached:
            with aot_cache.caching(session):
                return aot(gm, example_inputs)
        return aot(gm, example_inputs)
    except Exception as e:
        if _is_dynamo_control_flow(e) or isinstance(e, KilnError) or opts.fallback == "error":
            raise
        stats_mod.graph_fallback("aot_failed")
        _fallback(opts, "aot_failed", f"{fn.name} runs eagerly: AOTAutograd failed on it "
                  f"({type(e).__name__}: {_short(e)}). Nothing to do; report it if it persists.")
        return gm.forward


kiln_backend.reset = reset


def make_aot(compiler_for_kind, prefetch_backward=None):
    """The AOTAutograd backend kiln uses (kiln.precompile too, so that both capture the same
    graphs): min-cut partitioner, no extra decompositions; compiler_for_kind(GRAPH_KIND_*) gives
    the compiler of each graph kind. The joint graph loses its detach nodes before min-cut sees
    it (_without_detaches). prefetch_backward(bw_module), if given, is called with each
    training graph's backward graph as soon as the partitioner returns it (before the forward is
    compiled); what it raises is logged at debug level and ignored.

    A graph that updates an input which needs no gradient (batch norm's running statistics) ends
    with `aten.copy_(input, new value)` nodes (keep_inference_input_mutations, as with Inductor),
    and the plan runs them together (a torch._foreach_copy_ per dtype), where AOTAutograd would
    copy each one after the graph ran (159 copy_ calls a ResNet-50 training step). The
    cuda_graphs option captures them with the rest of the graph."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    partition_fn = _without_detaches(_rows_recomputable(min_cut_rematerialization_partition))
    if prefetch_backward is not None:
        partition_fn = _partition_then(partition_fn, prefetch_backward)
    return aot_autograd(fw_compiler=compiler_for_kind(proto.GRAPH_KIND_FORWARD),
                        bw_compiler=compiler_for_kind(proto.GRAPH_KIND_BACKWARD),
                        inference_compiler=compiler_for_kind(proto.GRAPH_KIND_INFERENCE),
                        partition_fn=partition_fn, keep_inference_input_mutations=True)


def _partition_then(partition_fn, on_backward):
    """partition_fn, calling on_backward(bw_module) after it. Not for the partitions of
    higher-order operators' subgraphs (invoke_subgraph), which AOTAutograd runs through the same
    function with no joint inputs: their backward graphs are not given to the backward compiler."""

    def partition(joint_module, joint_inputs, **kwargs):
        fw_module, bw_module = partition_fn(joint_module, joint_inputs, **kwargs)
        if joint_inputs:
            try:
                on_backward(bw_module)
            except Exception as e:
                log.debug("kiln: backward prefetch skipped (%s: %s)", type(e).__name__, _short(e))
        return fw_module, bw_module

    return partition


def _is_dynamo_control_flow(e):
    from torch._dynamo import exc

    restart = getattr(exc, "RestartAnalysis", None)
    return restart is not None and isinstance(e, restart)


def _eager_dynamo_graph(gm, fn, opts):
    stats_mod.graph_fallback("graph_limit")
    message = (f"{fn.name} has had {opts.max_graphs_per_function} graphs compiled "
               f"(max_graphs_per_function={opts.max_graphs_per_function}); this new specialization "
               "runs eagerly. Mark the changing dimensions dynamic (torch._dynamo.mark_dynamic) or "
               "raise the limit with options={'max_graphs_per_function': N}.")
    if opts.fallback == "error":
        raise KilnError(message)
    with _STATE_LOCK:
        first = fn.key not in _LIMIT_WARNED
        _LIMIT_WARNED.add(fn.key)
    if first:
        warnings.warn("kiln: " + message, KilnWarning, stacklevel=3)
    log.info("kiln: %s", message)
    return gm.forward


class _FunctionInfo:
    """Which user function (Dynamo frame) a graph belongs to, for the per-function cap and messages."""

    def __init__(self, gm):
        compile_id = None
        try:
            from torch._guards import CompileContext

            compile_id = CompileContext.current_compile_id()
        except Exception:  # pragma: no cover  (older torch)
            compile_id = None
        frame_id = getattr(compile_id, "frame_id", None)
        self.key = ("frame", frame_id) if frame_id is not None else ("graph", id(gm))
        self.compile_id = str(compile_id) if compile_id is not None else ""
        self.location = _location(gm)
        where = f" ({self.location})" if self.location else ""
        self.name = f"function{where}" + (f" [dynamo compile {self.compile_id}]" if self.compile_id else "")

    @classmethod
    def named(cls, name):
        """For graphs that no Dynamo frame is compiling now (kiln.compile loading a package)."""
        info = cls.__new__(cls)
        info.key, info.compile_id, info.location, info.name = ("named", name), "", "", name
        return info

    def admit(self, opts):
        with _STATE_LOCK:
            count = _FUNCTION_GRAPHS.get(self.key, 0)
            if count >= opts.max_graphs_per_function:
                return False
            _FUNCTION_GRAPHS[self.key] = count + 1
            return True


def _location(gm):
    """"model.py:42 in forward": the code object Dynamo is compiling (found on the call stack, in
    convert_frame's _compile), else the first node's stack trace; "" when neither is there."""
    import types

    try:
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "_compile" and "convert_frame" in frame.f_code.co_filename:
                code = frame.f_locals.get("code")
                if isinstance(code, types.CodeType):
                    torch_dir = os.path.dirname(torch.__file__)
                    if not os.path.abspath(code.co_filename).startswith(torch_dir):
                        return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno} in {code.co_name}"
                    break  # torch's wrapper around a module's forward: name the module instead
            frame = frame.f_back
    except Exception:  # pragma: no cover
        pass
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            entry = next(iter(stack.values()))
            cls = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
            name = getattr(cls, "__qualname__", None) or (str(cls) if cls else "")
            if name:
                return f"{name}.forward"
    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace")
        if not trace:
            continue
        for line in reversed(trace.strip().splitlines()):
            line = line.strip()
            if line.startswith("File "):
                try:
                    file_part, line_part, func_part = line.split(", ", 2)
                    path = file_part[len('File "'):-1]
                    return f"{os.path.basename(path)}:{line_part.split()[-1]} in {func_part.split()[-1]}"
                except ValueError:
                    return line
    return ""


# -- one Dynamo graph: its AOT graphs ------------------------------------------------------------


class _Session:
    def __init__(self, opts, fn):
        self.opts = opts
        self.fn = fn
        # Option aot_cache: AOTAutograd caches this frame's graphs (kiln.aot_cache).
        self.aot_cached = opts.aot_cache and aot_cache.available()
        self.on_graph_loaded = None  # kiln.aot_cache calls it with each graph it loaded
        self.symbolic_backward = None  # a symbolic backward graph, for its per-shape prefetches
        self.deferred_backward = None  # a backward sent once its forward's plan is known (kiln.layouts)

    def compiler(self, kind):
        def compile_fn(gm, example_inputs):
            graph = CompiledGraph(self, gm, example_inputs, kind)
            graph.keep_graph_proto = self.aot_cached
            graph.prepare()
            if kind == proto.GRAPH_KIND_FORWARD:  # the backward is compiled for these (kiln.layouts)
                layouts.report_output_strides(gm, graph.output_strides)
                self._send_deferred_backward(gm, graph.output_strides)
            return aot_cache.output_code(graph) if self.aot_cached else graph.boxed()

        return compile_fn

    def prefetch_backward(self, bw_module):
        """Sends Compile for the backward graph ahead of the backward compiler (see the module
        docstring): the request is the one CompiledGraph.prepare will build from
        bw_compiler(copy of bw_module, placeholder_list), AOTAutograd's placeholder_list being the
        placeholders' meta["val"] (re-strided only for strides a compiler reports through
        TracingContext.output_strides, which kiln does for forwards with a convolution, see
        kiln.layouts). Returns without sending in cache-only mode, with the option off, under
        compiled autograd (which never calls the backward compiler) and when AOTAutograd will
        inline saved-tensors hooks into the backward graph after partitioning. With option
        training_layouts, a backward of convolutions is kept and sent once the forward's plan gives
        its inputs' strides (_send_deferred_backward). Raises on a graph it cannot serialize
        (make_aot logs and ignores it)."""
        opts = self.opts
        if (not opts.prefetch_backward or opts.cache_only or _compiled_autograd_on()
                or _saved_tensors_hooks_inlined()):
            return
        if opts.training_layouts and any(n.target is torch.ops.aten.convolution_backward.default
                                         for n in bw_module.graph.nodes):
            # Its inputs take the strides of the forward's plan: sent once that is known.
            self.deferred_backward = specialize_mod.graph_copy(bw_module)
            return
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        example_inputs = [n.meta["val"] for n in bw_module.graph.nodes if n.op == "placeholder"]
        if specialize_mod.is_symbolic(example_inputs):
            # Kept for prefetch_backward_shape: a copy, as AOTAutograd changes bw_module later.
            self.symbolic_backward = (specialize_mod.graph_copy(bw_module), example_inputs)
        with unset_fake_temporarily():  # as the lazy backward compile runs: no fake mode
            request = _compile_request(opts, self.fn, proto.GRAPH_KIND_BACKWARD, bw_module, example_inputs)
        threading.Thread(target=_send_ahead, args=(opts, request, self.fn.name), daemon=True,
                         name="kiln-prefetch-backward").start()
        stats_mod.add("backward_prefetches")

    def _send_deferred_backward(self, fw_gm, strides):
        """The backward prefetch_backward deferred, for the inputs AOTAutograd will give it after
        forward `fw_gm`'s plan reported `strides` (kiln.layouts.backward_inputs): built here
        (fake tensors and their mode are not for other threads: a background FakeTensorProp broke
        AOTAutograd's own, on the H200), sent in a background thread. Nothing when the forward runs
        eagerly (no strides: the backward keeps the traced ones and is compiled when first needed);
        what fails is logged at debug level."""
        bw_module, self.deferred_backward = self.deferred_backward, None
        if bw_module is None or strides is None:
            return
        try:
            inputs = layouts.backward_inputs(bw_module, fw_gm, strides)
            if inputs is None:
                return
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():  # as the lazy backward compile runs: no fake mode
                request = _compile_request(self.opts, self.fn, proto.GRAPH_KIND_BACKWARD, bw_module, inputs)
        except Exception as e:
            log.debug("kiln: backward of %s not sent ahead (%s: %s)", self.fn.name, type(e).__name__, _short(e))
            return
        threading.Thread(target=_send_ahead, args=(self.opts, request, self.fn.name), daemon=True,
                         name="kiln-prefetch-backward").start()
        stats_mod.add("backward_prefetches")

    def prefetch_backward_shape(self, fw_module, args):
        """For a new shape of a symbolic forward graph (`args`: its run-time inputs): sends Compile
        for the static specialization of the symbolic backward graph at the same symbol values, in
        a background thread, so that kilnd compiles it alongside the forward's; the backward's own
        specialization then joins that compile or hits the cache. Only once prefetch_backward kept a
        symbolic backward graph; whatever fails is logged at debug level."""
        if self.symbolic_backward is None:
            return
        bw_module, bw_inputs = self.symbolic_backward
        values = specialize_mod.bind_symbols(fw_module, args)
        opts, fn = self.opts, self.fn

        def send():
            try:
                from torch._subclasses.fake_tensor import unset_fake_temporarily

                inputs = specialize_mod.bound_inputs(bw_inputs, values)
                static = specialize_mod.specialize(bw_module, inputs)
                with unset_fake_temporarily():
                    request = _compile_request(opts, fn, proto.GRAPH_KIND_BACKWARD, static.gm,
                                               static.example_inputs)
            except Exception as e:
                log.debug("kiln: backward of %s for a new shape not sent ahead (%s: %s)", fn.name,
                          type(e).__name__, _short(e))
                return
            _send_ahead(opts, request, fn.name)

        threading.Thread(target=send, daemon=True, name="kiln-prefetch-backward-shape").start()
        stats_mod.add("backward_prefetches")


def _compiled_autograd_on():
    try:
        from torch._dynamo import compiled_autograd

        return bool(torch._dynamo.config.compiled_autograd or compiled_autograd.compiled_autograd_enabled
                    or compiled_autograd.in_compiled_autograd_region)
    except Exception:  # pragma: no cover  (another torch)
        return False


def _saved_tensors_hooks_inlined():
    """Whether AOTAutograd will inline saved-tensors hooks into the backward graph after the
    partitioner (the graph sent ahead would not be the one compiled)."""
    try:
        from torch._functorch._aot_autograd import utils

        return bool(utils.saved_tensors_hooks_are_inlineable(utils.top_saved_tensors_hooks()))
    except Exception:  # pragma: no cover  (another torch)
        return False


_PREFETCH_WAIT_S = server_mod.STARTUP_TIMEOUT_S


def _send_ahead(opts, request, name):
    """Thread body: Compile(request) on the server the compile path uses, the reply ignored. It
    starts no kilnd: for the embedded one it waits (up to kilnd's startup timeout) until this
    process has found it serving. Never raises."""
    try:
        deadline = time.monotonic() + _PREFETCH_WAIT_S
        address = _known_address(opts)
        while address is None and opts.embedded and time.monotonic() < deadline:
            time.sleep(0.01)
            address = _known_address(opts)
        if address is None:
            log.debug("kiln: backward of %s not sent ahead: no kilnd known to be serving", name)
            return
        response = server_mod.CONNECTIONS.client(address).compile(request, timeout=opts.timeout)
        log.debug("kiln: backward of %s sent ahead: %s, key %s", name,
                  proto.CacheSource.Name(response.source), response.key[:16])
    except Exception as e:
        log.debug("kiln: backward of %s sent ahead: %s: %s", name, type(e).__name__, _short(e))


def _known_address(opts):
    """The address _server_address would give, without starting or checking anything: None when
    the embedded kilnd has not been found serving by this process yet, or the server is known down."""
    if opts.embedded:
        address = _EMBEDDED_READY.get(opts.resolved_cache_dir())
    else:
        address = opts.server
    if address is None:
        return None
    with _STATE_LOCK:
        until = _DOWN_UNTIL.get(address)
    if until is not None and time.monotonic() < until:
        return None
    return address


class _Spec:
    """One artifact: the inputs it was compiled for and its executor. `replay`: a CUDA-graph
    runner's replay_if_captured (kiln.cuda_graphs), which CompiledGraph tries before the guard."""

    def __init__(self, guard, executor, key):
        self.guard, self.executor, self.key = guard, executor, key
        self.replay = getattr(executor, "replay_if_captured", None)


class CompiledGraph:
    """What AOTAutograd gets back for one graph: runs the plan whose guards match, else compiles
    a new specialization, else runs the graph eagerly. Boxed calling convention (a list of args)."""

    _boxed_call = True

    def __init__(self, session, gm, example_inputs, kind):
        self.session = session
        self.opts = session.opts
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.kind = kind
        self.kind_name = _KIND_NAMES.get(kind, "graph")
        self.name = f"the {self.kind_name} graph of {session.fn.name}"
        self.specs = []
        self.eager_cause = None  # why the graph runs eagerly (None: it does not)
        self.retries = 0
        self.retry_at = 0.0
        self.request = None
        self.keep_graph_proto = False  # kiln.aot_cache: keep the kiln.v1.Graph sent (graph_proto)
        self.graph_proto = None
        self._address = None  # the server last called
        self._eager_signatures = set()
        self._lock = threading.Lock()
        self._symbolic = False  # symbolic shapes, sent as such (kilnd may have a plan for them)
        self.dynamic = False  # symbolic shapes: compiled per input metadata met (kiln.specialize)
        self._shapes_capped = False  # dynamic, and max_graphs_per_function shapes compiled
        self.output_strides = None  # a forward's: its first plan's output strides (kiln.layouts)
        stats_mod.add("graphs")

    # -- compile time ---------------------------------------------------------------------------

    def prepare(self):
        example_inputs, self.example_inputs = self.example_inputs, None  # not kept: fake tensors
        self._symbolic = specialize_mod.is_symbolic(example_inputs)
        try:
            request = self._build_request(self.gm, example_inputs)
        except Exception as e:
            self._give_up("serialize", f"{self.name} runs eagerly: kiln could not serialize it "
                          f"({type(e).__name__}: {_short(e)}). This is a kiln limitation or bug; "
                          "report it with the KILN_DEBUG=1 folder.", gm=self.gm)
            return
        if self.keep_graph_proto:
            self.graph_proto = request.graph
        self.prepare_request(request, self.gm)

    def prepare_request(self, request, gm):
        """prepare() for a request already built (gm: the graph, or what stands for it until an
        error or a constant needs it: kiln.aot_cache)."""
        self.request = request
        try:
            spec = self._compile(self.request, gm)
        except KilnError:
            raise
        except Exception as e:  # a bug in kiln itself must not break training
            self._give_up("client_error", f"{self.name} runs eagerly: kiln failed while compiling it "
                          f"({type(e).__name__}: {_short(e)}). Report it with the KILN_DEBUG=1 folder.",
                          gm=gm)
            return
        if spec is not None:
            self.specs.append(spec)
        if self.specs or self.retry_at is None:
            self.request = None  # no retry will need it (it may hold large constants)

    def _build_request(self, gm, example_inputs):
        t0 = time.perf_counter()
        request = _compile_request(self.opts, self.session.fn, self.kind, gm, example_inputs)
        stats_mod.add_to("client_time_s", "serialize", time.perf_counter() - t0)
        return request

    def _compile(self, request, gm):
        """Sends the request and loads the artifact; returns a _Spec, or None after a fallback."""
        opts = self.opts
        times = {}
        try:
            address = _server_address(opts)
        except server_mod.ServerError as e:
            self._give_up("server_start", f"{self.name} runs eagerly: {e}", gm=gm, request=request)
            return None
        if address is None:  # known to be down: do not wait on it again now
            self._give_up("unavailable", f"{self.name} runs eagerly: kilnd is unreachable "
                          f"(retrying after {opts.retry_interval:g} s).", gm=gm, request=request,
                          warn=False)
            return None
        response, client = None, None
        self._address = address
        for attempt in (0, 1):
            client = server_mod.CONNECTIONS.client(address)
            stats_mod.add("requests")
            t0 = time.perf_counter()
            try:
                if opts.cache_only:
                    response = client.lookup(request, timeout=opts.timeout)
                else:
                    response = client.compile(request, timeout=opts.timeout)
                break
            except grpc.RpcError as e:
                code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
                details = e.details() if callable(getattr(e, "details", None)) else str(e)
                if code == grpc.StatusCode.UNAVAILABLE:
                    server_mod.CONNECTIONS.drop(address, client)
                    if attempt == 0 and opts.embedded:  # the embedded kilnd may have exited: restart
                        _EMBEDDED_READY.pop(opts.resolved_cache_dir(), None)
                        try:
                            address = _server_address(opts, force_check=True)
                            if address is not None:
                                continue
                        except server_mod.ServerError as start_error:
                            details = f"{details}; restarting the embedded kilnd failed: {start_error}"
                    with _STATE_LOCK:
                        _DOWN_UNTIL[address] = time.monotonic() + opts.retry_interval
                self._rpc_failed(code, details, address, gm, request)
                return None
            finally:
                elapsed = time.perf_counter() - t0
                times["rpc"] = times.get("rpc", 0.0) + elapsed
                stats_mod.add_to("client_time_s", "rpc", elapsed)
        _server_ok(address)
        for t in response.timings:
            stats_mod.add_to("server_time_s", t.phase, t.micros / 1e6)
        if response.key:
            stats_mod.add_key(response.key)
        source = response.source
        if source == proto.CACHE_SOURCE_MISS:
            stats_mod.add("misses")
            self._give_up("cache_miss", f"{self.name} runs eagerly: cache-only mode (KILN_CACHE_ONLY) and "
                          f"kilnd at {address} has no artifact for it (key {response.key[:16]}...). Compile "
                          "it once without KILN_CACHE_ONLY, or import a bundle (kilnctl import).",
                          gm=gm, request=request, response=response)
            return None
        tier = {proto.CACHE_SOURCE_MEMORY_HIT: "memory", proto.CACHE_SOURCE_DISK_HIT: "disk",
                proto.CACHE_SOURCE_SHARED_HIT: "shared"}.get(source)
        if tier is not None:
            stats_mod.add("hits")
            stats_mod.add_to("hits_by_tier", tier)
        elif source in (proto.CACHE_SOURCE_COMPILED, proto.CACHE_SOURCE_JOINED):
            stats_mod.add("compiles")
            if source == proto.CACHE_SOURCE_JOINED:
                stats_mod.add("joined")
        if not response.HasField("artifact"):
            self._give_up("internal", f"{self.name} runs eagerly: kilnd answered "
                          f"{proto.CacheSource.Name(source)} without an artifact.", gm=gm,
                          request=request, response=response)
            return None
        t0 = time.perf_counter()
        try:
            spec = self._load(response, request, gm)
        except RuntimeUnavailable as e:
            self._give_up("runtime_unavailable", f"{self.name} runs eagerly: the kiln runtime cannot run "
                          f"its compiled kernels here ({_short(e)}).", gm=gm, request=request,
                          response=response, client=client)
            return None
        except NotImplementedError as e:
            self._give_up("unsupported_plan", f"{self.name} runs eagerly: this kiln client cannot run "
                          f"its plan yet ({_short(e)}).", gm=gm, request=request, response=response,
                          client=client)
            return None
        except Exception as e:
            self._give_up("bad_artifact", f"{self.name} runs eagerly: the artifact from kilnd (key "
                          f"{response.key[:16]}...) cannot be loaded ({type(e).__name__}: {_short(e)}). "
                          "Report it with the KILN_DEBUG=1 folder.", gm=gm, request=request,
                          response=response, client=client)
            return None
        finally:
            times["load"] = time.perf_counter() - t0
            stats_mod.add_to("client_time_s", "load", times["load"])
        stats_mod.add("op_fallbacks", spec.executor.op_fallbacks)
        if spec.executor.library_steps:
            stats_mod.add("library_steps", spec.executor.library_steps)
        if spec.executor.kernel_steps:
            stats_mod.add("kernel_steps", spec.executor.kernel_steps)
            stats_mod.add_to("kernel_steps_by_device", "cuda" if spec.executor.cuda else "cpu",
                             spec.executor.kernel_steps)
        if opts.debug:
            self._dump(gm=gm, request=request, response=response, client=client,
                       outcome=f"runs the plan of key {response.key} "
                               f"({proto.CacheSource.Name(source)})", times=times)
        return spec

    def _load(self, response, request, gm):
        from kiln.executor import PlanExecutor

        artifact = response.artifact
        check_artifact(artifact)
        constants = {}
        for c in request.graph.constants:
            obj = gm
            for part in c.name.split("."):
                obj = getattr(obj, part)
            constants[c.name] = obj
        cache_dir = self.opts.resolved_cache_dir()

        def runtime_loader():
            from kiln.runtime import load_runtime

            return load_runtime(cache_dir)

        executor = PlanExecutor(artifact, request.graph, constants, runtime_loader=runtime_loader,
                                device=graph_device(request.graph), poison=self.opts.poison_buffers)
        if self.opts.cuda_graphs:
            from kiln import cuda_graphs

            if cuda_graphs._DEVICE.wraps(executor):
                executor = cuda_graphs.CudaGraphRunner(executor, name=self.name)
        if request.graph.free_layout_outputs and self.output_strides is None:
            self.output_strides = layouts.plan_output_strides(artifact.plan)
        return _Spec(StaticGuard(request.graph), executor, response.key)

    def _rpc_failed(self, code, details, address, gm, request):
        cause = code.name.lower() if hasattr(code, "name") else str(code)
        advice = {
            "unavailable": (f"kilnd at {address} is unreachable. Start it, fix KILN_SERVER, or unset "
                            "KILN_SERVER to use the embedded local kilnd; kiln tries again after "
                            f"{self.opts.retry_interval:g} s."),
            "deadline_exceeded": (f"kilnd did not answer within {self.opts.timeout:g} s. Raise the "
                                  "timeout (option timeout / KILN_TIMEOUT) or check the server's load."),
            "unimplemented": "kilnd cannot compile this graph; it runs with torch. Nothing to do.",
            "invalid_argument": ("kilnd refused the graph as malformed. This is a kiln bug: report it "
                                 "with the KILN_DEBUG=1 folder."),
            "internal": ("kilnd failed to compile it. Report it with the KILN_DEBUG=1 folder and the "
                         "kilnd log."),
            "resource_exhausted": "kilnd is over one of its limits; it may work on a later try.",
            "failed_precondition": ("kilnd cannot compile for this target (for CUDA: it has no NVRTC; "
                                    "see kilnd --nvrtc). Nothing to do here."),
        }.get(cause, "Report it if it persists.")
        self._give_up(cause, f"{self.name} runs eagerly: kilnd at {address} answered "
                      f"{code.name if hasattr(code, 'name') else code}: {details}. {advice}",
                      gm=gm, request=request)

    def _give_up(self, cause, message, *, gm=None, request=None, response=None, client=None,
                 warn=True):
        """Marks the graph eager for `cause`: counts it, warns once per cause, or raises. A
        symbolic graph that kilnd does not compile (or, in cache-only mode, has no plan for), or
        that kiln cannot serialize (a size operation the serializer lacks: its static graphs have
        none left), is compiled per input shape at run time instead (self.dynamic)."""
        if self._symbolic and cause in ("unimplemented", "cache_miss", "serialize") and not self.specs:
            self._symbolic, self.dynamic = False, True
            log.info("kiln: %s has symbolic shapes that kiln does not compile as such (%s): compiled "
                     "per input shape at run time", self.name, cause)
            if self.opts.debug:
                self._dump(gm=gm, request=request, response=response, client=client,
                           outcome="compiled per input shape at run time: " + message, times={})
            return
        if self.eager_cause is None:
            stats_mod.graph_fallback(cause)
        self.eager_cause = cause
        if cause in _TRANSIENT and self.retries < _MAX_RETRIES:
            self.retry_at = time.monotonic() + self.opts.retry_interval * (2 ** self.retries)
            self.retries += 1
        else:
            self.retry_at = None
        if self.opts.debug:
            self._dump(gm=gm, request=request, response=response, client=client,
                       outcome=f"runs eagerly ({cause}): {message}", times={})
        if self.opts.fallback == "error":
            raise KilnError("kiln: " + message + " (KILN_FALLBACK=error: not falling back)")
        _fallback(self.opts, cause, message, warn=warn)

    def _dump(self, gm, request, response, client, outcome, times):
        reachable = not any(c in outcome for c in ("(unavailable)", "(deadline_exceeded)", "(server_start)"))
        if response is None and request is not None and self._address is not None and reachable:
            try:  # the key, for the folder: Lookup hashes without compiling
                client = server_mod.CONNECTIONS.client(self._address)
                response = client.lookup(request, timeout=10)
            except Exception:
                response = None
        plan_text = None
        if response is not None and response.HasField("artifact"):
            plan_text = debug_mod.format_plan(response.artifact.plan, response.artifact)
        debug_mod.dump(self.opts, self.kind_name, gm=gm, request=request, response=response,
                       client=client, outcome=outcome, client_times=times, plan_text=plan_text)

    # -- run time -------------------------------------------------------------------------------

    def boxed(self):
        """A plain function for AOTAutograd (boxed: it takes the list of inputs); `kiln_graph` is
        this object. A function, because torch wraps the backward's in functools.wraps-based
        decorators that keep a function's attributes."""

        def run(args):
            return self(args)

        run._boxed_call = True
        run.kiln_graph = self
        return run

    def __call__(self, args):
        for spec in self.specs:  # CUDA-graph mode: a captured key needs no guard (replay_if_captured)
            if spec.replay is not None:
                try:
                    out = spec.replay(args)
                except Exception as e:
                    return self._plan_failed(spec, e, args)
                if out is not None:
                    stats_mod.add("plan_calls")
                    return out
        try:
            spec, symbols = self._choose(args)
        except KilnError:
            raise
        except Exception as e:  # a bug in kiln's guards or retries: never break training
            spec, symbols = None, None
            self.specs, self.retry_at = [], None
            stats_mod.graph_fallback("client_error")
            self.eager_cause = "client_error"
            message = (f"{self.name} runs eagerly from now on: kiln failed choosing how to run it "
                       f"({type(e).__name__}: {_short(e)}). Report it with the KILN_DEBUG=1 folder.")
            if self.opts.fallback == "error":
                raise KilnError("kiln: " + message) from e
            _fallback(self.opts, "client_error", message)
        if spec is None:
            return self._eager(args)
        try:
            out = spec.executor(args, symbols)
        except Exception as e:
            return self._plan_failed(spec, e, args)
        stats_mod.add("plan_calls")
        return out

    def _choose(self, args):
        """(the spec whose guards these inputs pass, the symbol values), or (None, None): eager."""
        if self.eager_cause is not None and self.retry_at is not None and self.request is not None \
                and time.monotonic() >= self.retry_at and not self.specs:
            self._retry()
        for spec in self.specs:
            try:
                return spec, spec.guard.bind(args)
            except GuardFailure:
                continue
        if self.specs or self.dynamic:  # compiled, but not for these inputs
            spec = self._respecialize(args)
            if spec is not None:
                return spec, spec.guard.bind(args)
        return None, None

    def _eager(self, args):
        stats_mod.add("eager_calls")
        return self.gm(*args)

    def _retry(self):
        with self._lock:
            if self.specs or self.retry_at is None or time.monotonic() < self.retry_at:
                return
            cause = self.eager_cause
            self.retry_at = None  # _give_up sets it again on another transient failure
            spec = self._compile(self.request, self.gm)
            if spec is not None:
                log.info("kiln: %s compiled on a retry after %s", self.name, cause)
                self.specs.append(spec)
                self.eager_cause = None
            if self.specs or self.retry_at is None:
                self.request = None

    def _plan_failed(self, spec, error, args):
        self.specs = []  # a plan that fails means a kiln bug: run this graph with torch from now on
        self.retry_at = None
        message = (f"{self.name} runs eagerly from now on: running its plan (key {spec.key[:16]}...) "
                   f"failed ({type(error).__name__}: {_short(error)}). Report it with the "
                   "KILN_DEBUG=1 folder.")
        if self.opts.fallback == "error":
            raise KilnError("kiln: " + message) from error
        stats_mod.graph_fallback("plan_error")
        self.eager_cause = "plan_error"
        _fallback(self.opts, "plan_error", message)
        return self._eager(args)

    def _respecialize(self, args):
        from kiln.guards import signature

        sig = signature(args)
        if sig in self._eager_signatures:
            return None
        with self._lock:
            for spec in self.specs:  # another thread may have compiled it meanwhile
                try:
                    spec.guard.bind(args)
                    return spec
                except GuardFailure:
                    pass
            if self.dynamic and len(self.specs) >= self.opts.max_graphs_per_function:
                self._remember_eager(sig)
                if not self._shapes_capped:  # counted and announced once per graph
                    self._shapes_capped = True
                    _shape_limit_warning(self, self.opts)
                return None
            if not self.dynamic and not self.session.fn.admit(self.opts):
                self._remember_eager(sig)
                _eager_dynamo_graph_warning(self.session.fn, self.opts)
                return None
            stats_mod.add("graphs")
            static = None
            try:
                if self.dynamic:
                    if self.kind == proto.GRAPH_KIND_FORWARD:
                        self.session.prefetch_backward_shape(self.gm, list(args))
                    static = specialize_mod.specialize(self.gm, list(args))
                    gm = static.gm
                    request = self._build_request(gm, static.example_inputs)
                else:
                    gm = specialize_mod.retrace(self.gm, args)[0]  # static: its metadata re-traced
                    request = self._build_request(gm, list(args))
            except Exception as e:
                self._remember_eager(sig)
                stats_mod.graph_fallback("serialize")
                _fallback(self.opts, "serialize", f"{self.name} runs eagerly for inputs {_short(sig)}: "
                          f"kiln could not specialize it ({type(e).__name__}: {_short(e)}).")
                return None
            log.info("kiln: %s: new input metadata, compiling a new specialization", self.name)
            saved = (self.eager_cause, self.retry_at)
            spec = self._compile(request, gm)
            if spec is None and self.dynamic and self.eager_cause == "unimplemented":
                self.dynamic = False  # kilnd cannot compile it static either: no more shapes
            self.eager_cause, self.retry_at = saved
            if spec is None:
                self._remember_eager(sig)
                return None
            if static is not None:
                spec = _Spec(static.guard(spec.guard), static.executor(spec.executor), spec.key)
            self.specs.append(spec)
            return spec

    def _remember_eager(self, sig):
        if len(self._eager_signatures) < 256:
            self._eager_signatures.add(sig)


def _eager_dynamo_graph_warning(fn, opts):
    stats_mod.graph_fallback("graph_limit")
    message = (f"{fn.name} has had {opts.max_graphs_per_function} graphs compiled "
               f"(max_graphs_per_function={opts.max_graphs_per_function}); inputs with new metadata "
               "run eagerly. Raise the limit with options={'max_graphs_per_function': N}.")
    if opts.fallback == "error":
        raise KilnError(message)
    with _STATE_LOCK:
        first = fn.key not in _LIMIT_WARNED
        _LIMIT_WARNED.add(fn.key)
    if first:
        warnings.warn("kiln: " + message, KilnWarning, stacklevel=3)


def _shape_limit_warning(graph, opts):
    stats_mod.graph_fallback("graph_limit")
    fn = graph.session.fn
    message = (f"{fn.name} has symbolic shapes and its graphs have been compiled for "
               f"{opts.max_graphs_per_function} input shapes each (max_graphs_per_function="
               f"{opts.max_graphs_per_function}); other shapes run eagerly. Raise the limit with "
               "options={'max_graphs_per_function': N}, or pad inputs to fewer distinct shapes.")
    if opts.fallback == "error":
        raise KilnError(message)
    with _STATE_LOCK:
        first = ("shapes", fn.key) not in _LIMIT_WARNED
        _LIMIT_WARNED.add(("shapes", fn.key))
    if first:
        warnings.warn("kiln: " + message, KilnWarning, stacklevel=3)


# -- servers ----------------------------------------------------------------------------------


def _server_address(opts, force_check=False):
    """The address to call, starting the embedded kilnd if needed; None while it is known down."""
    if opts.embedded:
        cache_dir = opts.resolved_cache_dir()
        address = None if force_check else _EMBEDDED_READY.get(cache_dir)
        if address is None:
            address = server_mod.ensure_embedded(opts)
            _EMBEDDED_READY[cache_dir] = address
    else:
        address = opts.server
        from kiln.rpc import parse_address

        try:
            parse_address(address)
        except ValueError as e:
            raise server_mod.ServerError(f"KILN_SERVER (option server) is not usable: {e}") from None
    with _STATE_LOCK:
        until = _DOWN_UNTIL.get(address)
    if until is not None and time.monotonic() < until and not force_check:
        return None
    return address


def _server_ok(address):
    with _STATE_LOCK:
        _DOWN_UNTIL.pop(address, None)
        for cause in ("unavailable", "deadline_exceeded", "server_start"):
            _WARNED.discard(cause)  # a later outage is announced again


def _fallback(opts, cause, message, warn=True):
    with _STATE_LOCK:
        first = cause not in _WARNED
        _WARNED.add(cause)
    if first and warn:
        warnings.warn("kiln: " + message, KilnWarning, stacklevel=4)
    log.info("kiln: %s", message)


def check_artifact(artifact):
    """Raises ValueError when the artifact's checksum (SHA-256 over its deterministic serialization
    without the checksum field, as kilnd computes it) does not match."""
    if not artifact.checksum:
        raise ValueError("the artifact has no checksum")
    copy = proto.Artifact()
    copy.CopyFrom(artifact)
    copy.ClearField("checksum")
    digest = hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()
    if digest != artifact.checksum:
        raise ValueError(f"artifact checksum mismatch (computed {digest[:16]}..., "
                         f"sent {artifact.checksum[:16]}...)")


def _short(value, limit=300):
    text = str(value).replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["kiln_backend", "reset", "target_for", "detect_cpu_isa", "CompiledGraph", "check_artifact",
           "make_aot", "graph_device"]
