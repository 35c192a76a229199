"""The kiln runtime library (runtime/kiln_runtime.h, a C ABI) through ctypes.

Where the library comes from, first match wins:
  1. KILN_RUNTIME_LIB: a prebuilt libkiln_runtime.so;
  2. built at first use with the runtime's own ``runtime/build.sh`` (plain g++) into
     ``<kiln cache dir>/runtime/<hash of the sources>/libkiln_runtime.so``, under a file lock, from
     the sources shipped in this package (``kiln/_runtime/runtime/``, copied there when the wheel is
     built) or, for an editable install from a checkout, the repository's ``runtime/``.
A source change gives a new hash, so a stale library is never used. Errors raise RuntimeUnavailable
(the graph then runs eagerly) saying what is missing.

CUDA (runtime/kiln_cuda.h, in the same library): ``Runtime.cuda_init()``, ``Runtime.cuda_load(data,
device)`` -> CudaModule (a cubin or PTX loaded in the context current on the calling thread, else
the primary context of `device`), ``Runtime.cuda_run(launches, stream)``. The driver (libcuda) is
opened by the library at first use; without it (or without a device) these raise
RuntimeUnavailable with the runtime's message; any other failing call raises RuntimeCallError with
the runtime's message (it names the driver call and the CUresult).

cuBLASLt (runtime/kiln_cublas.h, same library): ``Runtime.cublas_init()`` opens cuBLASLt once
(the copy torch loaded first) and returns its version, or raises RuntimeUnavailable saying what was
tried; ``Runtime.gemm_call()`` returns a GemmCall that runs the LibrarySteps "cublasLt.matmul" of
CUDA plans on a stream (KILN_ERROR_UNSUPPORTED raises GemmUnsupported: run the step another way).

Launch tables (what kiln.executor uses every call): ``Runtime.step_table(entries)`` (CPU,
kiln_step) and ``Runtime.cuda_launch_table(entries)`` (CUDA, kiln_cuda_launch) build the ctypes
tables of a run of consecutive kernel steps once; `table.buffers` is one flat array of every
step's buffer pointers in order, which the caller fills per call (slice assignment of ints), and
`table.run()` / `table.run(stream)` makes one runtime call per run of consecutive steps of one
module. A table must not be filled or run by two threads at once; the runtime reads it only during
the call (kiln_cuda_run_launches copies the kernel parameters at launch).
"""

import ctypes
import fcntl
import hashlib
import os
import pathlib
import subprocess
import threading

ABI_VERSION = 1
KILN_ERROR_UNAVAILABLE = 5  # runtime/kiln_cuda.h: no NVIDIA driver (libcuda) or no device
KILN_ERROR_UNSUPPORTED = 8  # runtime/kiln_cublas.h: cuBLASLt cannot run this GEMM as laid out
GEMM_NUM_PARAMS = 18  # runtime/kiln_cublas.h KILN_GEMM_NUM_PARAMS


class RuntimeUnavailable(NotImplementedError):
    """The runtime library cannot be found, built or loaded."""


class RuntimeCallError(RuntimeError):
    """A runtime call returned an error code."""


class GemmUnsupported(RuntimeCallError):
    """cuBLASLt has no algorithm for a GEMM as laid out (the caller runs it with torch)."""


class _Step(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("buffers", ctypes.POINTER(ctypes.c_void_p)),
                ("scalars", ctypes.POINTER(ctypes.c_int64))]


class _CudaLaunch(ctypes.Structure):  # kiln_cuda_launch
    _fields_ = [("kernel", ctypes.c_int32), ("grid_x", ctypes.c_uint32), ("block_x", ctypes.c_uint32),
                ("shared_bytes", ctypes.c_uint32), ("num_buffers", ctypes.c_int32),
                ("num_scalars", ctypes.c_int32), ("buffers", ctypes.POINTER(ctypes.c_void_p)),
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
    """A shared object loaded by kiln_module_load (unloaded when collected)."""

    # The runtime functions for this kind of module, and the Runtime method that checks their codes.
    _ADD_KERNEL, _UNLOAD, _CHECK = "kiln_module_add_kernel", "kiln_module_unload", "_check"

    def __init__(self, runtime, handle):
        self._rt, self._handle = runtime, handle
        self._kernels = {}

    def add_kernel(self, symbol):
        """The kernel index of `symbol` (resolved once)."""
        if symbol not in self._kernels:
            index = ctypes.c_int32()
            code = getattr(self._rt.lib, self._ADD_KERNEL)(self._handle, symbol.encode(), ctypes.byref(index))
            getattr(self._rt, self._CHECK)(code, f"kernel {symbol!r}")
            self._kernels[symbol] = index.value
        return self._kernels[symbol]

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            try:
                getattr(self._rt.lib, self._UNLOAD)(handle)
            except Exception:  # pragma: no cover  (interpreter shutdown)
                pass


class CudaModule(Module):
    """A cubin/PTX loaded by kiln_cuda_module_load on one device (unloaded when collected)."""

    _ADD_KERNEL, _UNLOAD, _CHECK = "kiln_cuda_module_add_kernel", "kiln_cuda_module_unload", "_cuda_check"

    def __init__(self, runtime, handle, device):
        super().__init__(runtime, handle)
        self.device = device


def _void_p_at(array, index):
    """A `void* const*` into a c_void_p array at `index` (the array must outlive it)."""
    return ctypes.cast(ctypes.addressof(array) + index * ctypes.sizeof(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_void_p))


def _int64_at(array, index):
    return ctypes.cast(ctypes.addressof(array) + index * ctypes.sizeof(ctypes.c_int64),
                       ctypes.POINTER(ctypes.c_int64))


def _module_runs(modules):
    """[(start, count)] of the runs of consecutive entries with the same module."""
    runs, i = [], 0
    while i < len(modules):
        j = i
        while j < len(modules) and modules[j] is modules[i]:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs


class _Table:
    """Shared by StepTable and CudaLaunchTable: the flat buffer and scalar arrays."""

    def __init__(self, num_buffers, scalars):
        total = sum(num_buffers)
        self.size = total
        self.buffers = (ctypes.c_void_p * max(total, 1))()
        flat = [int(x) for group in scalars for x in group]
        self._scalars = (ctypes.c_int64 * max(len(flat), 1))(*flat)
        self._buffer_at, self._scalar_at = [], []
        b = c = 0
        for nb, sc in zip(num_buffers, scalars):
            self._buffer_at.append(_void_p_at(self.buffers, b))
            self._scalar_at.append(_int64_at(self._scalars, c))
            b += nb
            c += len(sc)


class StepTable(_Table):
    """kiln_step tables of consecutive CPU kernel steps: entries [(module, kernel index,
    number of buffers, [int64 scalars])]."""

    def __init__(self, runtime, entries):
        entries = list(entries)
        super().__init__([e[2] for e in entries], [list(e[3]) for e in entries])
        self._rt = runtime
        self._modules = [e[0] for e in entries]  # keeps them loaded while the table lives
        self._steps = (_Step * max(len(entries), 1))()
        for k, (step, (_, kernel, _, _)) in enumerate(zip(self._steps, entries)):
            step.kernel, step.reserved = kernel, 0
            step.buffers, step.scalars = self._buffer_at[k], self._scalar_at[k]
        fn = runtime.lib.kiln_run_steps
        size = ctypes.sizeof(_Step)
        self._calls = tuple(
            (fn, self._modules[start]._handle,
             ctypes.cast(ctypes.addressof(self._steps) + start * size, ctypes.POINTER(_Step)), count)
            for start, count in _module_runs(self._modules))

    def run(self):
        for fn, handle, steps, count in self._calls:
            code = fn(handle, steps, count)
            if code:
                self._rt._check(code, "running kernels")


class CudaLaunchTable(_Table):
    """kiln_cuda_launch tables of consecutive CUDA kernel steps: entries [(module, kernel index,
    grid_x, block_x, shared_bytes, number of buffers, [int64 scalars])]."""

    def __init__(self, runtime, entries):
        entries = list(entries)
        super().__init__([e[5] for e in entries], [list(e[6]) for e in entries])
        runtime._bind_cuda()
        self._rt = runtime
        self._modules = [e[0] for e in entries]
        self._launches = (_CudaLaunch * max(len(entries), 1))()
        for k, (entry, (_, kernel, grid, block, shared, nb, sc)) in enumerate(zip(self._launches, entries)):
            entry.kernel, entry.grid_x, entry.block_x, entry.shared_bytes = kernel, grid, block, shared
            entry.num_buffers, entry.num_scalars = nb, len(sc)
            entry.buffers, entry.scalars = self._buffer_at[k], self._scalar_at[k]
        fn = runtime.lib.kiln_cuda_run_launches
        size = ctypes.sizeof(_CudaLaunch)
        self._calls = tuple(
            (fn, self._modules[start]._handle,
             ctypes.cast(ctypes.addressof(self._launches) + start * size, ctypes.POINTER(_CudaLaunch)), count)
            for start, count in _module_runs(self._modules))

    def run(self, stream):
        """stream: a CUstream as an int (0 or None: the legacy default stream); no synchronize."""
        stream = stream or None
        for fn, handle, launches, count in self._calls:
            code = fn(handle, launches, count, stream)
            if code:
                self._rt._cuda_check(code, "launching kernels")


class GemmCall:
    """One LibrarySteps "cublasLt.matmul" on one device: the params are bound once, `buffers` (D, A,
    B, C, workspace data pointers; 0 for none) are filled per call, then `run(stream)`. Like a
    launch table, one thread at a time."""

    def __init__(self, runtime, device, params, alpha, beta):
        self._rt = runtime
        self._fn = runtime.lib.kiln_cublas_matmul
        self._device = int(device)
        self._params = (ctypes.c_int64 * GEMM_NUM_PARAMS)(*params)
        self._alpha, self._beta = float(alpha), float(beta)
        self.buffers = (ctypes.c_void_p * 5)()

    def run(self, stream):
        code = self._fn(self._device, self._params, GEMM_NUM_PARAMS, self._alpha, self._beta, self.buffers,
                        stream or None)
        if code:
            message = (self._rt.lib.kiln_cublas_last_error() or b"").decode(errors="replace")
            error = (GemmUnsupported if code == KILN_ERROR_UNSUPPORTED else
                     RuntimeUnavailable if code == KILN_ERROR_UNAVAILABLE else RuntimeCallError)
            raise error(f"kiln cuBLASLt runtime: error {code}: {message}")


class Runtime:
    def __init__(self, path):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise RuntimeUnavailable(f"cannot load the kiln runtime {path}: {e}") from None
        self.path = path
        self.lib = lib
        self._cuda_bound = False
        self._cublas = None  # cuBLASLt version, or the RuntimeUnavailable opening it raised
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

    # -- CUDA (kiln_cuda.h) ----------------------------------------------------------------------

    def _bind_cuda(self):
        if self._cuda_bound:
            return
        lib = self.lib
        try:
            lib.kiln_cuda_last_error.restype = ctypes.c_char_p
            lib.kiln_cuda_init.restype = ctypes.c_int
            lib.kiln_cuda_module_load.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                  ctypes.POINTER(ctypes.c_void_p)]
            lib.kiln_cuda_module_add_kernel.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                        ctypes.POINTER(ctypes.c_int32)]
            lib.kiln_cuda_run_launches.argtypes = [ctypes.c_void_p, ctypes.POINTER(_CudaLaunch),
                                                   ctypes.c_int32, ctypes.c_void_p]
            lib.kiln_cuda_stream_synchronize.argtypes = [ctypes.c_void_p]
            lib.kiln_cuda_module_unload.argtypes = [ctypes.c_void_p]
        except AttributeError as e:
            raise RuntimeUnavailable(f"the kiln runtime {self.path} has no CUDA support "
                                     f"(kiln_cuda.h): {e}") from None
        self._cuda_bound = True

    def cublas_init(self):
        """Opens cuBLASLt (once); returns cublasLtGetVersion() or raises RuntimeUnavailable."""
        if self._cublas is None:
            lib = self.lib
            try:
                lib.kiln_cublas_last_error.restype = ctypes.c_char_p
                lib.kiln_cublas_init.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
                lib.kiln_cublas_matmul.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int32,
                                                   ctypes.c_double, ctypes.c_double,
                                                   ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
            except AttributeError as e:
                self._cublas = RuntimeUnavailable(f"the kiln runtime {self.path} has no cuBLASLt support "
                                                  f"(kiln_cublas.h): {e}")
            else:
                version = ctypes.c_size_t()
                if lib.kiln_cublas_init(ctypes.byref(version)):
                    message = (lib.kiln_cublas_last_error() or b"").decode(errors="replace")
                    self._cublas = RuntimeUnavailable(f"kiln cuBLASLt runtime: {message}")
                else:
                    self._cublas = version.value
        if isinstance(self._cublas, Exception):
            raise _copy_error(self._cublas)
        return self._cublas

    def gemm_call(self, device, params, alpha, beta):
        """A GemmCall (see its docstring); cublas_init() must have succeeded."""
        self.cublas_init()
        return GemmCall(self, device, params, alpha, beta)

    def _cuda_check(self, code, what):
        if code != 0:
            message = (self.lib.kiln_cuda_last_error() or b"").decode(errors="replace")
            error = RuntimeUnavailable if code == KILN_ERROR_UNAVAILABLE else RuntimeCallError
            raise error(f"kiln CUDA runtime: {what}: error {code}: {message}")

    def cuda_init(self):
        """Opens the NVIDIA driver (idempotent); RuntimeUnavailable without one."""
        self._bind_cuda()
        self._cuda_check(self.lib.kiln_cuda_init(), "initializing CUDA")

    def cuda_load(self, data, device):
        """Loads a cubin or PTX; device: the CUDA device index (used when no context is current)."""
        self._bind_cuda()
        handle = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self._cuda_check(self.lib.kiln_cuda_module_load(buf, len(data), int(device), ctypes.byref(handle)),
                         f"loading a CUDA binary on device {device}")
        return CudaModule(self, handle, device)

    def cuda_launch_table(self, entries):
        """A CudaLaunchTable (see the module docstring); entries: [(module, kernel index, grid_x,
        block_x, shared_bytes, number of buffers, [int64 scalars])]."""
        return CudaLaunchTable(self, entries)

    def cuda_run(self, launches, stream):
        """launches: [(module, kernel index, grid_x, block_x, shared_bytes, [buffer pointers],
        [int64 scalars])]; stream: a CUstream as an int (0: the legacy default stream).
        Consecutive launches of one module go to kiln_cuda_run_launches together; returns without
        synchronizing. (One-off: builds a table; the executor keeps its tables.)"""
        table = self.cuda_launch_table([(m, k, g, b, sh, len(bufs), sc) for m, k, g, b, sh, bufs, sc in launches])
        table.buffers[:table.size] = [p for launch in launches for p in launch[5]]
        table.run(stream)

    def cuda_synchronize(self, stream):
        self._bind_cuda()
        self._cuda_check(self.lib.kiln_cuda_stream_synchronize(ctypes.c_void_p(stream or None)),
                         "synchronizing a stream")

    # -- errors ---------------------------------------------------------------------------------

    def _check(self, code, what):
        if code != 0:
            message = self.lib.kiln_last_error() or b""
            raise RuntimeCallError(f"kiln runtime: {what}: error {code}: {message.decode(errors='replace')}")

    def load(self, data):
        handle = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self._check(self.lib.kiln_module_load(buf, len(data), ctypes.byref(handle)), "loading a binary")
        return Module(self, handle)

    def step_table(self, entries):
        """A StepTable (see the module docstring); entries: [(module, kernel index, number of
        buffers, [int64 scalars])]."""
        return StepTable(self, entries)

    def run(self, calls):
        """calls: [(module, kernel index, [buffer pointers], [int64 scalars])]; consecutive calls
        of one module go to kiln_run_steps together. (One-off: builds a table.)"""
        table = self.step_table([(m, k, len(bufs), sc) for m, k, bufs, sc in calls])
        table.buffers[:table.size] = [p for call in calls for p in call[2]]
        table.run()


def _copy_error(error):
    return type(error)(*error.args)


_LOCK = threading.Lock()
_LOADED = {}
_BUILT = {}  # cache dir -> build()'s library path, so that a process hashes the sources once


def load_runtime(cache_dir):
    """The process's Runtime (loaded once per library path; build() runs once per cache dir: it
    hashes the runtime's sources, ~2.5 ms, which every loaded plan would otherwise pay)."""
    path = os.environ.get("KILN_RUNTIME_LIB") or None
    with _LOCK:
        if path is None:
            path = _BUILT.get(cache_dir)
            if path is None or not os.path.isfile(path):
                path = _BUILT[cache_dir] = build(cache_dir)
        if path not in _LOADED:
            _LOADED[path] = Runtime(path)
        return _LOADED[path]
