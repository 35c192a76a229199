"""The kiln runtime library (runtime/kiln_runtime.h, a C ABI) through ctypes.

Where the library comes from, first match wins:
  1. KILN_RUNTIME_LIB: a prebuilt libkiln_runtime.so;
  2. built at first use with the runtime's own ``runtime/build.sh`` (plain g++) into
     ``<kiln cache dir>/runtime/<hash of the sources>/libkiln_runtime.so``, under a file lock, from
     the sources shipped in this package (``kiln/_runtime/runtime/``, copied there when the wheel is
     built) or, for an editable install from a checkout, the repository's ``runtime/``.
A source change gives a new hash, so a stale library is never used. Errors raise RuntimeUnavailable
(the graph then runs eagerly) saying what is missing.
"""

import ctypes
import fcntl
import hashlib
import os
import pathlib
import subprocess
import threading

ABI_VERSION = 1


class RuntimeUnavailable(NotImplementedError):
    """The runtime library cannot be found, built or loaded."""


class RuntimeCallError(RuntimeError):
    """A runtime call returned an error code."""


class _Step(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("buffers", ctypes.POINTER(ctypes.c_void_p)),
                ("scalars", ctypes.POINTER(ctypes.c_int64))]


def source_dir():
    """The directory holding runtime/build.sh and runtime/*.cc, or None."""
    here = pathlib.Path(__file__).resolve().parent
    for root in (here / "_runtime", here.parents[2]):
        if (root / "runtime" / "build.sh").is_file() and (root / "runtime" / "kiln_runtime.h").is_file():
            return root
    return None


def source_hash(root):
    h = hashlib.sha256()
    rt = pathlib.Path(root) / "runtime"
    for path in sorted(rt.iterdir()):
        if path.is_file() and (path.suffix in (".cc", ".h") or path.name == "build.sh"):
            h.update(path.name.encode() + b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:16]


def build(cache_dir):
    """Builds the library into the cache dir if it is not there; returns its path."""
    root = source_dir()
    if root is None:
        raise RuntimeUnavailable("the kiln runtime sources are not shipped with this kiln package and "
                                 "KILN_RUNTIME_LIB is not set; build runtime/build.sh and point "
                                 "KILN_RUNTIME_LIB at the library")
    out_dir = os.path.join(cache_dir, "runtime", source_hash(root))
    lib = os.path.join(out_dir, "libkiln_runtime.so")
    if os.path.isfile(lib):
        return lib
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(lib):
            return lib
        tmp = f"{lib}.tmp.{os.getpid()}"
        try:
            proc = subprocess.run(["sh", str(pathlib.Path(root) / "runtime" / "build.sh"), tmp],
                                  capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeUnavailable(f"building the kiln runtime failed: {e}") from None
        if proc.returncode != 0:
            raise RuntimeUnavailable(f"building the kiln runtime with {root}/runtime/build.sh failed "
                                     f"(status {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, lib)
    return lib


class Module:
    def __init__(self, runtime, handle):
        self._rt, self._handle = runtime, handle
        self._kernels = {}

    def add_kernel(self, symbol):
        if symbol not in self._kernels:
            index = ctypes.c_int32()
            self._rt._check(self._rt.lib.kiln_module_add_kernel(self._handle, symbol.encode(),
                                                                ctypes.byref(index)),
                            f"kernel {symbol!r}")
            self._kernels[symbol] = index.value
        return self._kernels[symbol]

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            try:
                self._rt.lib.kiln_module_unload(handle)
            except Exception:  # pragma: no cover  (interpreter shutdown)
                pass


class Runtime:
    def __init__(self, path):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise RuntimeUnavailable(f"cannot load the kiln runtime {path}: {e}") from None
        self.path = path
        self.lib = lib
        lib.kiln_runtime_abi_version.restype = ctypes.c_int
        lib.kiln_last_error.restype = ctypes.c_char_p
        lib.kiln_module_load.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
        lib.kiln_module_add_kernel.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)]
        lib.kiln_run_steps.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Step), ctypes.c_int32]
        lib.kiln_module_unload.argtypes = [ctypes.c_void_p]
        version = lib.kiln_runtime_abi_version()
        if version != ABI_VERSION:
            raise RuntimeUnavailable(f"the kiln runtime {path} has ABI version {version}; this client "
                                     f"speaks {ABI_VERSION}")

    def _check(self, code, what):
        if code != 0:
            message = self.lib.kiln_last_error() or b""
            raise RuntimeCallError(f"kiln runtime: {what}: error {code}: {message.decode(errors='replace')}")

    def load(self, data):
        handle = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self._check(self.lib.kiln_module_load(buf, len(data), ctypes.byref(handle)), "loading a binary")
        return Module(self, handle)

    def prepare(self, calls):
        """calls: [(module, kernel index, number of buffers, number of scalars)]: a Batch that runs
        them with new buffer pointers and scalars per call, without building ctypes objects."""
        return Batch(self, calls)

    def run(self, calls):
        """calls: [(module, kernel index, [buffer pointers], [int64 scalars])]; consecutive calls
        of one module go to kiln_run_steps together."""
        i = 0
        while i < len(calls):
            j = i
            while j < len(calls) and calls[j][0] is calls[i][0]:
                j += 1
            group = calls[i:j]
            steps = (_Step * len(group))()
            keep = []
            for s, (_, kernel, buffers, scalars) in zip(steps, group):
                b = (ctypes.c_void_p * max(len(buffers), 1))(*buffers)
                c = (ctypes.c_int64 * max(len(scalars), 1))(*scalars)
                keep.append((b, c))
                s.kernel, s.reserved = kernel, 0
                s.buffers = ctypes.cast(b, ctypes.POINTER(ctypes.c_void_p))
                s.scalars = ctypes.cast(c, ctypes.POINTER(ctypes.c_int64))
            self._check(self.lib.kiln_run_steps(group[0][0]._handle, steps, len(group)), "running kernels")
            i = j


class Batch:
    """Consecutive kernel calls prepared once (Runtime.prepare): the step tables point into one
    flat pointer array and one flat scalar array that each run() overwrites, so a run costs a
    slice assignment and one kiln_run_steps per module. Not for concurrent use: callers keep one
    per thread."""

    def __init__(self, runtime, calls):
        self._rt = runtime
        self._run_steps = runtime.lib.kiln_run_steps
        nb = sum(c[2] for c in calls)
        ns = sum(c[3] for c in calls)
        self._nb, self._ns = nb, ns
        self._ptrs = (ctypes.c_void_p * max(nb, 1))()
        self._scalars = (ctypes.c_int64 * max(ns, 1))()
        pbase, sbase = ctypes.addressof(self._ptrs), ctypes.addressof(self._scalars)
        ptr_t, int_t = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)
        self._groups = []  # (module, steps, count); modules kept alive here
        b = s = 0
        i = 0
        while i < len(calls):
            j = i
            while j < len(calls) and calls[j][0] is calls[i][0]:
                j += 1
            steps = (_Step * (j - i))()
            for step, (_, kernel, num_buffers, num_scalars) in zip(steps, calls[i:j]):
                step.kernel, step.reserved = kernel, 0
                step.buffers = ctypes.cast(pbase + 8 * b, ptr_t)
                step.scalars = ctypes.cast(sbase + 8 * s, int_t)
                b += num_buffers
                s += num_scalars
            self._groups.append((calls[i][0], steps, j - i))
            i = j

    def run(self, buffers, scalars=()):
        """buffers: every call's buffer pointers in order (ints); scalars likewise."""
        if self._nb:
            self._ptrs[:self._nb] = buffers
        if self._ns:
            self._scalars[:self._ns] = scalars
        for module, steps, count in self._groups:
            code = self._run_steps(module._handle, steps, count)
            if code != 0:
                self._rt._check(code, "running kernels")


_LOCK = threading.Lock()
_LOADED = {}


def load_runtime(cache_dir):
    """The process's Runtime (loaded once per library path)."""
    path = os.environ.get("KILN_RUNTIME_LIB") or None
    with _LOCK:
        if path is None:
            path = build(cache_dir)
        if path not in _LOADED:
            _LOADED[path] = Runtime(path)
        return _LOADED[path]
