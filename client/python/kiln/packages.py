"""kiln.compile (experimental; this module is kiln.packages): a whole-graph ``torch.compile(backend="kiln", fullgraph=True)``
whose Dynamo capture kilnd keeps too, so that a new process, on any machine sharing the kilnd,
skips Dynamo's trace, AOTAutograd and the compile.

    model = kiln.compile(model)        # a torch.nn.Module or a function; options= as the backend's
    loss = model(x).sum()              # first call with these inputs: kilnd's package, else capture

What a call does. The first call with a new kind of input (shapes, dtypes, devices, grad mode,
autocast, the module's train/eval flags...) computes a package key from them, the model's structure
and the versions involved, and asks kilnd for that package (GetPackage). On a hit the package (torch's
AOT-compiled function: Dynamo's bytecode, its guards and AOTAutograd's bundled result holding
kiln's graphs) is loaded: each kiln graph in it is sent to kilnd again, re-targeted to this
process's options, and normally hits kilnd's cache. On a miss torch captures the function whole
(``torch.compile(...).aot_compile``), kiln compiles its graphs as the backend does (with option
aot_cache on), and the package goes to kilnd (PutPackage) for the next process. Later calls check
the loaded package's guards (and the global state the package was captured under) and run it; a
call that fails them gets a package of its own (up to max_graphs_per_function kinds).

When the package cannot be used it says so once (KilnWarning) and the function runs through
``torch.compile(fn, backend="kiln")`` instead: a graph break (this needs fullgraph), a torch
without ``aot_compile``, a capture that does not serialize, kilnd unreachable. A package whose
traced source files changed since it was stored is not used (it is captured again and replaced).

Trust: a package is a pickle that the loading process unpickles, so whoever can reach kilnd's port
can make processes that use kiln.compile run code (kilnd is meant for a trusted network already:
its admin RPCs are on the same port). kilnd stores packages only up to --max_package_bytes;
--max_package_bytes=0 turns them off.

Guards that torch's AOT compile cannot serialize (object identities, globals) are not in the
package; kiln adds the global state it knows matters (grad mode, inference mode, autocast, default
dtype, deterministic algorithms, TF32 flags) to the key and checks it on every call.
"""

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import inspect
import logging
import sys
import threading
import time
import warnings

from kiln import aot_cache
from kiln import counters as stats_mod
from kiln.backend import _short
from kiln.errors import KilnWarning

log = logging.getLogger("kiln")

PACKAGE_FORMAT = "kiln.compile/1"
_LOAD_LOCK = threading.Lock()


def compile(model_or_fn, *, options=None):  # noqa: A001  (kiln.compile, as torch.compile)
    """A callable that runs `model_or_fn` (an nn.Module or a function) through kiln with its Dynamo
    capture kept in kilnd; see the module docstring. `options`: as torch.compile(backend="kiln",
    options=...) takes (kiln.options)."""
    from kiln import options as options_mod

    opts = options_mod.resolve(options)
    return CompiledFunction(model_or_fn, opts)


def available():
    """Whether this torch can capture and load packages (torch.compile(...).aot_compile and the
    pieces of kiln.aot_cache)."""
    try:
        from torch._dynamo.aot_compile import AOTCompiledFunction  # noqa: F401
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable  # noqa: F401
    except Exception:
        return False
    return aot_cache.available()


@dataclasses.dataclass
class _Variant:
    key: str
    fn: object  # torch's AOTCompiledFunction
    state: tuple
    source: str  # "kilnd" (loaded) or "captured"


class CompiledFunction:
    """What kiln.compile returns. Calls run a loaded or captured package, or torch.compile's path
    once packages turned out unusable for this function (`fallback_reason` says why)."""

    def __init__(self, target, opts):
        import torch

        self._user_opts = opts
        self._opts = dataclasses.replace(opts, aot_cache=True)
        self._module = target if isinstance(target, torch.nn.Module) else None
        self._fn = type(target).forward if self._module is not None else target
        if not callable(self._fn):
            raise TypeError(f"kiln.compile: expected an nn.Module or a function, got {type(target).__name__}")
        self._target = target
        self.name = getattr(self._fn, "__qualname__", None) or repr(self._fn)
        if self._module is not None:
            self.name = f"{type(target).__qualname__}.forward"
        self._variants = []
        self._fallback = None
        self.fallback_reason = None
        self._lock = threading.Lock()
        functools.update_wrapper(self, self._fn, updated=())

    # -- calls --------------------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if self._fallback is not None:
            return self._fallback(*args, **kwargs)
        call_args = (self._module, *args) if self._module is not None else args
        state = _global_state()
        for v in self._variants:
            if v.state == state and v.fn.guard_check(*call_args, **kwargs):
                return v.fn.fn(*call_args, **kwargs)
        with self._lock:
            if self._fallback is None:
                variant = self._new_variant(call_args, kwargs, state)
                if variant is not None:
                    out = variant.fn.fn(*call_args, **kwargs)
                    if self._opts.prewarm:
                        from kiln import prewarm

                        start = time.perf_counter()
                        prewarm.wait(timeout=60)  # no warm-up outlives this call (kiln.prewarm)
                        stats_mod.add_to("client_time_s", "prewarm_wait", time.perf_counter() - start)
                    return out
        return self._fallback(*args, **kwargs)

    def _new_variant(self, call_args, kwargs, state):
        """A package for these inputs (kilnd's, else captured and stored), or None after switching
        to the fallback."""
        if len(self._variants) >= self._opts.max_graphs_per_function:
            return self._use_fallback(
                "max_graphs", f"{self.name} needed more than {self._opts.max_graphs_per_function} "
                "packages (option max_graphs_per_function)")
        if not available():
            return self._use_fallback("unavailable", "this torch has no torch.compile(...).aot_compile "
                                      "or AOTAutograd cache hooks kiln needs")
        try:
            key = package_key(self._opts, self._module, self._fn, call_args, kwargs, state)
        except Exception as e:
            return self._use_fallback("key", f"cannot describe the inputs of {self.name} "
                                      f"({type(e).__name__}: {e})")
        client = self._client()
        if client is not None and self._opts.prewarm and self._module is not None:
            from kiln import prewarm

            prewarm.start_library_init(self._module)  # cuDNN loads while the package is fetched
        variant = self._load(client, key, call_args, kwargs, state) if client is not None else None
        if variant is None:
            variant = self._capture(client, key, call_args, kwargs, state)
        if variant is not None:
            self._variants.append(variant)
        return variant

    def _use_fallback(self, cause, message):
        import torch

        self.fallback_reason = message
        stats_mod.add_to("package_fallbacks", cause)
        warnings.warn(f"kiln.compile: {message}; {self.name} runs through torch.compile(backend=\"kiln\") "
                      "instead (Dynamo traces in every process).", KilnWarning, stacklevel=4)
        from kiln.backend import kiln_backend

        backend = functools.partial(kiln_backend, options=self._user_opts)
        self._fallback = torch.compile(self._target, backend=backend)
        return None

    # -- kilnd --------------------------------------------------------------------------------

    def _client(self):
        from kiln import backend, server as server_mod

        try:
            address = backend._server_address(self._opts)
        except Exception as e:
            log.info("kiln.compile: no kilnd (%s): packages are neither loaded nor stored", e)
            return None
        return server_mod.CONNECTIONS.client(address) if address is not None else None

    def _load(self, client, key, call_args, kwargs, state):
        start = time.perf_counter()
        try:
            reply = client.get_package(key)
        except Exception as e:
            log.info("kiln.compile: GetPackage failed for %s: %s", self.name, _rpc_text(e))
            stats_mod.add_to("packages", "errors")
            return None
        if not reply.found:
            stats_mod.add_to("packages", "misses")
            return None
        try:
            fn = self._deserialize(reply.data)
            stale = stale_sources(fn)
            if stale:
                log.info("kiln.compile: the package of %s is stale (%s changed): capturing again",
                         self.name, stale)
                stats_mod.add_to("packages", "stale")
                return None
            if not fn.guard_check(*call_args, **kwargs):
                log.info("kiln.compile: the package of %s fails its guards here: capturing again", self.name)
                stats_mod.add_to("packages", "guard_misses")
                return None
        except Exception as e:
            warnings.warn(f"kiln.compile: the package of {self.name} in kilnd did not load "
                          f"({type(e).__name__}: {_short(e)}); capturing again", KilnWarning, stacklevel=5)
            stats_mod.add_to("packages", "errors")
            return None
        stats_mod.add_to("packages", "loaded")
        stats_mod.add_to("client_time_s", "package_load", time.perf_counter() - start)
        log.info("kiln.compile: %s loaded from kilnd in %.3f s (%d bytes)", self.name,
                 time.perf_counter() - start, len(reply.data))
        return _Variant(key, fn, state, "kilnd")

    def _deserialize(self, data):
        from torch._dynamo.aot_compile import AOTCompiledFunction

        from kiln import backend

        session = backend._Session(self._opts, backend._FunctionInfo.named(self.name))
        if self._opts.prewarm:
            from kiln import prewarm

            session.on_graph_loaded = prewarm.start_for_graph
        # One load at a time: the two hooks below swap torch attributes.
        with _LOAD_LOCK, aot_cache.loading(session), _one_fake_mode_for_guard_tensors(), \
                _guard_descriptions_without_source_lines():
            fn = AOTCompiledFunction.deserialize(data, f_globals=self._fn.__globals__)
        fn.disable_guard_check()  # __call__ checks them before choosing a package
        return fn

    def _capture(self, client, key, call_args, kwargs, state):
        import torch

        backend = _package_backend(self._opts)
        # Static shapes: kilnd compiles static graphs, and a package per kind of input is the point
        # (Dynamo would otherwise mark a dimension dynamic on the second capture of the same code).
        # Older torch (2.11) attaches .aot_compile only under config.enable_aot_compile, off there.
        flag = {"enable_aot_compile": True} if hasattr(torch._dynamo.config, "enable_aot_compile") else {}
        with torch._dynamo.config.patch(flag):
            compiled = torch.compile(self._fn, backend=backend, fullgraph=True, dynamic=False)
        if not hasattr(compiled, "aot_compile"):
            return self._use_fallback("unavailable", "this torch's torch.compile has no aot_compile")
        try:
            with _grads_set_aside(self._module, call_args):
                fn = compiled.aot_compile((call_args, kwargs))
        except Exception as e:
            hint = ""
            if "<locals>" in str(e):
                hint = ("; a class or function defined inside a function cannot be named in a "
                        "package: define it at module level")
            return self._use_fallback("capture", f"{self.name} could not be captured whole "
                                      f"({type(e).__name__}: {_short(e)}){hint}")
        fn.disable_guard_check()
        stats_mod.add_to("packages", "captured")
        if client is not None:
            self._store(client, key, fn)
        return _Variant(key, fn, state, "captured")

    def _target_text(self, fn):
        """What kilnctl shows as the package's target ("cuda:sm_90", "cpu:x86-64-v3")."""
        import torch

        from kiln import proto, requests

        device = getattr(getattr(fn, "_artifacts", None), "device_type", "") or "cpu"
        index = torch.cuda.current_device() if device == "cuda" else None
        t = requests._device_target(torch.device(device, index) if index is not None else torch.device(device),
                                    self._opts)
        return f"cuda:{t.cuda_arch}" if t.device == proto.DEVICE_KIND_CUDA else f"cpu:{t.cpu_isa}"

    def _store(self, client, key, fn):
        import torch
        from torch._dynamo.aot_compile import AOTCompiledFunction

        try:
            data = AOTCompiledFunction.serialize(fn).serialized_data
        except Exception as e:
            warnings.warn(f"kiln.compile: the capture of {self.name} does not serialize "
                          f"({type(e).__name__}: {_short(e)}); it runs, but the next process "
                          "traces it again", KilnWarning, stacklevel=6)
            stats_mod.add_to("packages", "errors")
            return
        try:
            client.put_package(key, data, target=self._target_text(fn), debug_name=self.name,
                               summary=f"torch {torch.__version__}")
            stats_mod.add_to("packages", "stored")
        except Exception as e:
            warnings.warn(f"kiln.compile: kilnd did not store the package of {self.name} "
                          f"({_rpc_text(e)}); the next process traces it again", KilnWarning, stacklevel=6)
            stats_mod.add_to("packages", "errors")


@contextlib.contextmanager
def _torch_hook(owner, name, params, replacement):
    """`owner.name` (a module function or a class attribute of torch) is `replacement` inside the
    block, when torch's has exactly the parameters `params`; otherwise torch's stays."""
    original = vars(owner).get(name)
    func = original.__func__ if isinstance(original, classmethod) else original
    try:
        matches = func is not None and list(inspect.signature(func).parameters) == params
    except (TypeError, ValueError):
        matches = False
    if not matches:
        yield
        return
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _one_fake_mode_for_guard_tensors():
    """While a package loads: the tensors in its guard state become fake tensors of one
    FakeTensorMode, as they were when Dynamo made the guards. torch's unpickler makes a
    FakeTensorMode per tensor (torch 2.11-2.13), and those objects were most of the unpickling and
    of the garbage collections during a load (ResNet-50: 268 of them; the guard state loaded in
    0.02 s instead of 0.21-0.28 s on the development VM). Left as torch's where the hook differs."""
    import torch
    from torch._dynamo.guards import GuardsStatePickler

    fake_mode = torch._subclasses.FakeTensorMode()
    converter = torch._subclasses.fake_tensor.FakeTensorConverter()

    def _unpickle_tensor(cls, meta_tensor, device, pytype, dispatch_keys_raw, grad):
        ret = converter.from_meta_and_device(fake_mode, meta_tensor, device, pytype,
                                             torch._C.DispatchKeySet.from_raw_repr(dispatch_keys_raw))
        ret.grad = grad
        return ret

    return _torch_hook(GuardsStatePickler, "_unpickle_tensor",
                       ["cls", "meta_tensor", "device", "pytype", "dispatch_keys_raw", "grad"],
                       classmethod(_unpickle_tensor))


def _guard_descriptions_without_source_lines():
    """While a package loads: each guard's description (torch's "verbose code part", shown when a
    guard fails) without the user source line it came from. torch formats that line for every
    guard it builds (reading and shortening file names through linecache), 1,800 times for
    ResNet-50 (about 0.05 s of its load on the development VM); kiln.compile checks guards itself
    and a failed check only chooses another package. Left as torch's where the function differs."""
    from torch._dynamo import guards

    def get_verbose_code_part(code_part, guard):
        return code_part

    return _torch_hook(guards, "get_verbose_code_part", ["code_part", "guard"], get_verbose_code_part)


def _package_backend(opts):
    """kiln's backend for a capture: its AOTAutograd result wrapped as torch's serializable callable
    (torch 2.13 does that itself for results with `serialize`; 2.11 only for its own backends)."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable, SerializableCallable

    from kiln.backend import kiln_backend

    def backend(gm, example_inputs):
        out = kiln_backend(gm, example_inputs, options=opts)
        if not isinstance(out, SerializableCallable) and getattr(out, "serialize", None) is not None:
            out = BundledAOTAutogradSerializableCallable(out)
        return out

    return backend


@contextlib.contextmanager
def _grads_set_aside(module, call_args):
    """Parameters' and inputs' .grad set to None for the capture, then put back: torch's guard
    state pickles a tensor's .grad as a placeholder that fails to unpickle ("assigned grad expected
    to be a Tensor or None"), so a capture made after a backward would not load (torch 2.13)."""
    import torch

    tensors = list(module.parameters()) if module is not None else []
    tensors += [a for a in call_args if isinstance(a, torch.Tensor)]
    saved = [(t, t.grad) for t in tensors if t.grad is not None]
    for t, _ in saved:
        t.grad = None
    try:
        yield
    finally:
        for t, grad in saved:
            t.grad = grad


# -- the key ----------------------------------------------------------------------------------


def _global_state():
    """What torch's AOT compile leaves out of the guards and that changes the capture."""
    import torch

    autocast = tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda"))
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled(), autocast,
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def _describe(value):
    import torch

    if isinstance(value, torch.Tensor):
        device = value.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
        return ("T", tuple(value.shape), tuple(value.stride()), str(value.dtype), str(device), name,
                value.requires_grad)
    if isinstance(value, (bool, int, float, str, type(None))):
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((str(k), _describe(v)) for k, v in value.items()))
    return ("obj", type(value).__module__, type(value).__qualname__)


def _code_text(code):
    """The parts of a code object that say what it does (marshal's bytes are not stable: they
    depend on reference counts)."""
    consts = tuple(_code_text(c) if inspect.iscode(c) else repr(c) for c in code.co_consts)
    return repr((code.co_name, code.co_code, consts, code.co_names, code.co_varnames,
                 code.co_freevars, code.co_cellvars, code.co_argcount, code.co_kwonlyargcount))


def _code_digest(fn):
    code = getattr(fn, "__code__", None)
    return hashlib.sha256(_code_text(code).encode()).hexdigest() if code is not None else repr(fn)


def package_key(opts, module, fn, call_args, kwargs, state):
    """The hex SHA-256 naming a package: everything the capture depends on that guards do not
    check once loaded, and what keeps different captures of one function apart."""
    import torch

    import kiln

    parts = [PACKAGE_FORMAT, kiln.__version__, torch.__version__, sys.version,
             getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""), _code_digest(fn),
             repr(state), repr(_describe(list(call_args[1:] if module is not None else call_args))),
             repr(_describe(kwargs)),
             repr((opts.cpu_isa, opts.deterministic, opts.disable_fusion, opts.cuda_graphs))]
    if module is not None:
        parts.append(repr([(name, type(m).__module__, type(m).__qualname__, m.training)
                           for name, m in module.named_modules()]))
        parts.append(repr([(name, _describe(t)) for name, t in module.named_parameters()]))
        parts.append(repr([(name, _describe(t)) for name, t in module.named_buffers()]))
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "backslashreplace")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def stale_sources(fn):
    """Names of the traced source regions of a loaded package that differ from this process's
    source files ("" when all match)."""
    from torch._dynamo.package import _hash_source

    changed = []
    info = fn.source_info()
    for src in getattr(info, "inlined_sources", ()):
        try:
            module = sys.modules.get(src.module) or importlib.import_module(src.module)
            lines = inspect.getsourcelines(module)[0][src.firstlineno - 1:src.lastlineno - 1]
            same = _hash_source("".join(lines)) == src.checksum
        except Exception:
            same = False
        if not same:
            changed.append(f"{src.module}:{src.firstlineno}")
    return ", ".join(sorted(changed))


def _rpc_text(e):
    code = getattr(e, "code", None)
    if callable(code):
        try:
            return f"{code().name}: {e.details()}"
        except Exception:
            pass
    return f"{type(e).__name__}: {_short(e)}"
