"""Option ``aot_cache`` (on by default; KILN_AOT_CACHE=0 turns it off): kiln's graphs in
AOTAutograd's cache, so that a new process skips AOTAutograd (the joint trace and the min-cut
partitioner) for a graph it has seen, as Inductor's warm start does. Dynamo still traces.

How: kiln's forward/backward/inference compilers return a ``KilnOutputCode`` (torch's
``torch._inductor.output_code.OutputCode`` interface, as torch's regional_inductor does) and the
AOTAutograd call runs under ``torch._functorch.config`` force_autograd_cache,
bundled_autograd_cache and force_non_lazy_backward_lowering: AOTAutograd looks the Dynamo graph up
in its on-disk cache (torch's cache dir, TORCHINDUCTOR_CACHE_DIR) before tracing, and stores the
bundled result (its runtime metadata and our objects, pickled) after compiling. A KilnOutputCode
pickles to its aten graph (torch.fx's GraphPickler); when AOTAutograd loads it, ``post_compile``
makes a CompiledGraph of it with the options of the kiln call that is loading it (so the target and
options are the current ones, not the saved ones) and asks kilnd for its plan: a kilnd cache hit,
or a compile when the artifact is gone. Anything that fails there makes AOTAutograd bypass its cache
and compile as without this option.

Checked with torch 2.13 (the development machine's) and 2.11 (the H200 machine's, on CUDA):
`available()` says whether this torch has the pieces; where it does not, the option does nothing.
"""

import contextlib
import contextvars
import copy
import functools
import pickle

_CONFIG = {"force_autograd_cache": True, "bundled_autograd_cache": True,
           "force_non_lazy_backward_lowering": True}

# The node metadata a pickled graph keeps: what kiln's serializer reads (kiln.serialize).
_META_KEYS = frozenset({"val", "tensor_meta", "stack_trace", "nn_module_stack", "seq_nr"})

# The kiln call (its _Session) that is running AOTAutograd now: what a loaded graph is compiled for.
_SESSION = contextvars.ContextVar("kiln_aot_cache_session", default=None)


@functools.lru_cache(maxsize=None)
def available():
    """Whether this torch has what the option needs (OutputCode and the three config flags)."""
    try:
        import torch._functorch.config as config
        from torch._inductor.output_code import OutputCode  # noqa: F401
    except Exception:
        return False
    return all(hasattr(config, name) for name in _CONFIG)


@contextlib.contextmanager
def loading(session):
    """Around loading kiln graphs outside kiln's backend (kiln.compile's packages): `session`
    (its options) is what the loaded graphs are compiled for."""
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)


@contextlib.contextmanager
def caching(session):
    """Around one AOTAutograd call of kiln's backend: the cache flags on, `session` current."""
    import torch

    with loading(session), torch._functorch.config.patch(_CONFIG):
        yield


def output_code(graph):
    """`graph` (a prepared CompiledGraph) as what AOTAutograd caches."""
    return _output_code_class()(graph)


@functools.lru_cache(maxsize=None)
def _output_code_class():
    from torch._inductor.output_code import OutputCode

    class KilnOutputCode(OutputCode):
        """A kiln CompiledGraph, boxed calling convention; pickles to its aten graph."""

        def __init__(self, graph):
            super().__init__()
            self._boxed_call = True
            self._graph = graph
            self._kind = graph.kind
            self._serialized = None
            self._graph_bytes = None

        def __call__(self, inputs):
            return self._graph(inputs)

        def prepare_for_serialization(self):
            if self._serialized is None and self._graph is not None:
                from torch.fx._graph_pickler import GraphPickler, Options

                gm = self._graph.gm
                # Only the metadata kiln's serializer reads; nn_module_stack's module classes (a
                # model's local classes do not pickle) become their names for the time of dumps.
                stacks = [(n, n.meta["nn_module_stack"]) for n in gm.graph.nodes
                          if isinstance(n.meta.get("nn_module_stack"), dict)]
                try:
                    for n, stack in stacks:
                        n.meta["nn_module_stack"] = {
                            k: (v[0], getattr(v[1], "__qualname__", str(v[1]))) if isinstance(v, tuple) and len(v) == 2
                            else str(v) for k, v in stack.items()}
                    self._serialized = GraphPickler.dumps(
                        gm, Options(ops_filter=None, node_metadata_key_filter=_META_KEYS.__contains__))
                    if self._graph.graph_proto is not None:  # what kiln sent: loads without the gm
                        self._graph_bytes = self._graph.graph_proto.SerializeToString()
                except Exception as e:  # AOTAutograd then skips storing this entry, nothing else
                    raise pickle.PicklingError(f"kiln: cannot pickle the graph: {type(e).__name__}: {e}") from e
                finally:
                    for n, stack in stacks:
                        n.meta["nn_module_stack"] = stack

        def post_compile(self, example_inputs, constants, graph_kwargs):
            if self._graph is not None:
                return
            from torch._guards import detect_fake_mode
            from torch._subclasses.fake_tensor import FakeTensorMode

            from kiln import proto, requests

            session = _SESSION.get()
            if session is None or self._serialized is None:
                raise RuntimeError("kiln: a cached kiln graph loaded outside kiln's backend")
            graph = _loaded_graph_class()(session, self._kind, self._serialized,
                                          detect_fake_mode(example_inputs) or FakeTensorMode())
            if self._graph_bytes is not None:
                # The graph kiln sent, for this process's target and options; the aten graph is
                # unpickled only if something needs it (an eager fallback, constants, a new
                # specialization): unpickling is most of a load's time.
                sent = proto.Graph.FromString(self._graph_bytes)
                graph._symbolic = bool(sent.symbols)  # CompiledGraph.prepare's
                opts = session.opts
                request = requests.request_for_graph(opts, sent, requests.target_for_graph(sent, opts), opts.timeout)
                graph.prepare_request(request, _LazyModule(graph))
                if session.on_graph_loaded is not None:  # kiln.compile's warm-ups (kiln.prewarm)
                    session.on_graph_loaded(graph)
            else:
                graph.example_inputs = [n.meta.get("val") for n in graph.gm.graph.nodes if n.op == "placeholder"]
                graph.prepare()
            self._graph = graph

        def set_triton_bundle(self, triton_bundle):
            pass

        def __getstate__(self):
            self.prepare_for_serialization()
            state = dict(self.__dict__)
            state["_graph"] = None  # rebuilt by post_compile
            return state

        def __deepcopy__(self, memo):
            return copy.copy(self)  # AOTAutograd copies before pickling: share the live graph

    KilnOutputCode.__module__ = __name__
    KilnOutputCode.__qualname__ = "KilnOutputCode"
    return KilnOutputCode


class _LazyModule:
    """Stands for a loaded graph's GraphModule where CompiledGraph takes one: unpickles it on first
    use (attributes of it, e.g. a constant)."""

    def __init__(self, graph):
        self._graph = graph

    def __getattr__(self, name):
        return getattr(self._graph.gm, name)


@functools.lru_cache(maxsize=None)
def _loaded_graph_class():
    from torch.fx._graph_pickler import GraphPickler

    from kiln import backend

    class LoadedGraph(backend.CompiledGraph):
        """A CompiledGraph loaded from AOTAutograd's cache: its `gm` is unpickled on first use."""

        def __init__(self, session, kind, pickled, fake_mode):
            self._pickled, self._fake_mode, self._gm = pickled, fake_mode, None
            super().__init__(session, None, [], kind)

        @property
        def gm(self):
            if self._gm is None and self._pickled is not None:
                gm = GraphPickler.loads(self._pickled, self._fake_mode)
                gm.recompile()
                self._gm, self._pickled = gm, None
            return self._gm

        @gm.setter
        def gm(self, value):
            if value is not None:
                self._gm = value

    return LoadedGraph


def __getattr__(name):
    """kiln.aot_cache.KilnOutputCode, made on first use (pickle finds the class by this name)."""
    if name == "KilnOutputCode" and available():
        return _output_code_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
