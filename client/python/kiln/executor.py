"""Runs a kiln.v1.Artifact's plan on real tensors.

Contract (how this client reads a Plan; kilnd writes plans to match):
  * Values are numbered; each has a TensorMeta (sizes/strides/storage_offset as SymInts over the
    request graph's symbols, which the caller binds from the inputs, see kiln.guards) and a storage:
      INPUT      graph input `index` (the caller's tensor, as is)
      OUTPUT     allocated here with torch.empty_strided(meta sizes, meta strides) on the inputs'
                 device (torch's caching allocator on CUDA)
      WORKSPACE  a view of the one workspace buffer (`workspace_bytes` uint8, from torch's
                 allocator, per call) with the meta sizes/strides and storage offset 0 at `offset`
                 bytes (meta.storage_offset is the graph's, informational); the byte offset must be
                 a multiple of the element size
      VIEW       base.as_strided(meta sizes, meta strides, base.storage_offset() + `offset`), with
                 `offset` in elements relative to the base's storage offset (meta.storage_offset is
                 informational); `index` = the base value
      CONSTANT   Graph.constants[`index`] of the request, held by the client
      STEP       whatever the AtenStep that lists it in `outputs` returns
  * Steps run in order. AtenStep: `target` resolved like kiln.deserialize does
    ("aten.add.Tensor" -> torch.ops.aten.add.Tensor); an argument whose `node` is "v<i>" is value
    i; SymInt arguments are evaluated with the bound symbols. Its result (a tensor, or a tuple whose
    items map to `outputs` in order; -1 skips an item) becomes a STEP value, or is copied into a value
    that already has storage (OUTPUT, WORKSPACE, VIEW, INPUT). `fallback=True` steps are counted as
    op fallbacks when the plan is loaded.
  * KernelStep, CPU artifacts (Artifact.target CPU): `symbol` of Artifact.binaries[`binary`] (a
    KIND_SHARED_OBJECT), called through the runtime library (kiln.runtime, kiln_runtime.h) with
    buffers = the data pointers of `args` values and scalars = the values of the graph symbols
    whose indices are listed in `scalar_args`. Consecutive kernel steps go to the runtime in one
    call.
  * KernelStep, CUDA artifacts (Artifact.target CUDA): binaries[`binary`] is a KIND_CUBIN or
    KIND_PTX, loaded through kiln_cuda.h (Runtime.cuda_load) on the CUDA device of the inputs,
    with that device's torch context current (once per device, at load for the device the graph
    was compiled for, at the first call on any other), `symbol` resolved in it. A launch has
    gridDim = (grid[0], 1, 1), blockDim = (block[0], 1, 1) and `shared_bytes` of dynamic shared
    memory: grid and block must be given, grid[0] in 1..2^31-1, block[0] in 1..1024, any further
    dimension 1 (the runtime checks block[0] against the kernel's limit). Buffers as for CPU
    (tensor.data_ptr() of `args` values, which must be CUDA tensors), scalars likewise.
    Consecutive kernel steps are launched with one kiln_cuda_run_launches call per binary, on
    torch.cuda.current_stream(device) of the inputs' device, without synchronizing (the stream
    orders them with the aten steps, which torch runs on the same stream). A binary kind that
    does not match the target's device is a PlanError; without an NVIDIA driver the load raises
    kiln.runtime.RuntimeUnavailable (so the graph runs eagerly).
  * Plan.outputs lists value indices in graph output order; -1 marks a graph output that is not a
    tensor (None, as AOTAutograd backward graphs return; or an int/SymInt, evaluated from the
    graph's output metadata). This matches server/lower/plan_builder.h.
  * LibraryStep "cublasLt.matmul" (CUDA plans; encoding in server/lower/gemm_step.h and the proto):
    a GEMM D = alpha * A @ B (+ bias | + beta * C) over strided views of its values. On a CUDA
    device it runs through the runtime's cuBLASLt (kiln_cublas.h) on the same stream as the
    kernels, with TF32 for f32 when torch allows it (torch.get_float32_matmul_precision() is not
    "highest"); where cuBLASLt cannot be loaded (a warning, once) or has no algorithm for a GEMM,
    and on CPU tensors, torch runs it (as_strided views, torch.mm/addmm/bmm/baddbmm into D). The
    operands' extents are checked against their values' metadata when the program is built.
A plan that breaks these rules raises PlanError at load, or at run time when it depends on sizes.

How a call runs (the per-call cost is the point): the first call on a device (for symbolic plans:
with a binding of the symbols) builds a _Program, which resolves every size, stride, offset,
storage decision, constant argument and op callable once and keeps the kernel launch tables
(kiln.runtime StepTable / CudaLaunchTable, one per run of consecutive kernel steps). A call then
runs a flat list of closures: per call it allocates the outputs and the workspace (torch's caching
allocator), writes the kernels' data pointers into the tables, makes one runtime call per run of
kernel steps (the CUDA stream is looked up once per call) and calls the aten ops with prebuilt
argument lists. Values in the workspace (and views of them) that only kernel steps and cuBLASLt
GEMMs read get no tensor at all: their pointer is the call's workspace pointer (taken once, when
the workspace is allocated) plus a byte offset computed with the program, which also checked that
they lie inside the workspace. Values that aten steps read or write, graph outputs and GEMM
operands that torch computes get tensors (views of the workspace as before, a view of a view made
straight from the workspace).
"""

import functools
import itertools
import logging
import operator
import threading

import torch

from kiln import proto
from kiln._tables import PB_TO_DEVICE, PB_TO_DTYPE, PB_TO_LAYOUT, PB_TO_MEMORY_FORMAT
from kiln.deserialize import resolve_target
from kiln.errors import SerializeError
from kiln.guards import eval_expr, eval_symint
from kiln.runtime import GemmUnsupported, RuntimeUnavailable

log = logging.getLogger("kiln")

_PV = proto.PlanValue
_SO = proto.Binary.KIND_SHARED_OBJECT
_CUDA_KINDS = (proto.Binary.KIND_CUBIN, proto.Binary.KIND_PTX)
_MAX_GRID_X = (1 << 31) - 1
_MAX_BLOCK_X = 1024
_GEMM = "cublasLt.matmul"
_GEMM_PARAMS = 18  # server/lower/gemm_step.h kGemmParamCount
_GEMM_DTYPES = (proto.DTYPE_FLOAT32, proto.DTYPE_FLOAT16, proto.DTYPE_BFLOAT16)
_warned = set()
_warned_lock = threading.Lock()


def _warn_once(key, message):
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("kiln: %s", message)


class PlanError(RuntimeError):
    """The plan is malformed or does not match the tensors it runs on."""


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


class PlanExecutor:
    """Loads a plan once (validates it, resolves targets, loads binaries) and runs it per call."""

    def __init__(self, artifact, graph, constants=None, runtime_loader=None, device=None):
        """artifact: kiln.proto.Artifact. graph: the request's kiln.proto.Graph (symbols, constants,
        output metadata). constants: {constant name: tensor} held by the client (default: rebuilt
        from Graph.constants). runtime_loader: a callable returning a kiln.runtime.Runtime; called
        only when the plan has kernel steps. device: the torch.device the graph's inputs are on;
        for a CUDA artifact its binaries are loaded there now (else at the first call)."""
        self.artifact = artifact
        self.cuda = artifact.target.device == proto.DEVICE_KIND_CUDA
        self.plan = plan = artifact.plan
        self.graph = graph
        self.values = list(plan.values)
        n = len(self.values)
        self.num_inputs = plan.num_inputs
        self.op_fallbacks = 0
        self._dtypes = []
        for i, v in enumerate(self.values):
            if v.meta.dtype not in PB_TO_DTYPE:
                raise PlanError(f"value v{i}: unknown dtype {v.meta.dtype}")
            self._dtypes.append(PB_TO_DTYPE[v.meta.dtype])
            kind = v.storage
            if kind == _PV.STORAGE_INPUT:
                if not 0 <= v.index < plan.num_inputs:
                    raise PlanError(f"value v{i}: input {v.index} of a plan with {plan.num_inputs} inputs")
            elif kind == _PV.STORAGE_VIEW:
                if not 0 <= v.index < n or v.index == i:
                    raise PlanError(f"value v{i}: a view of v{v.index}, which does not exist")
            elif kind == _PV.STORAGE_CONSTANT:
                if not 0 <= v.index < len(graph.constants):
                    raise PlanError(f"value v{i}: constant {v.index} of {len(graph.constants)}")
            elif kind == _PV.STORAGE_WORKSPACE:
                size = _itemsize(self._dtypes[i])
                if v.offset < 0 or v.offset % size:
                    raise PlanError(f"value v{i}: workspace offset {v.offset} is not a non-negative "
                                    f"multiple of {size} bytes")
            elif kind not in (_PV.STORAGE_OUTPUT, _PV.STORAGE_STEP):
                raise PlanError(f"value v{i}: storage {kind} is not known to this client")
        for i in range(n):  # views must not form cycles
            seen, j = set(), i
            while self.values[j].storage == _PV.STORAGE_VIEW:
                if j in seen:
                    raise PlanError(f"value v{i}: its views form a cycle")
                seen.add(j)
                j = self.values[j].index
        self._root = [self._root_of(i) for i in range(n)]
        # Constants.
        self._constants = []
        for c in graph.constants:
            tensor = (constants or {}).get(c.name)
            if tensor is None:
                from kiln.deserialize import constant_tensor

                tensor = constant_tensor(c)
            self._constants.append(tensor.detach())
        # Steps.
        # ("aten", op, args, kwargs, outputs, node) | ("kernels", [(module, k, args, scalars)])
        # | ("cuda", [CudaLaunchSpec])
        self._steps = []
        self._kernel_consumers = set()
        self.kernel_steps = sum(1 for s in plan.steps if s.WhichOneof("kind") == "kernel")
        self.library_steps = sum(1 for s in plan.steps if s.WhichOneof("kind") == "library")
        self._runtime = None
        self._modules = {}
        self._cuda_modules_by_device = {}  # device index -> {binary index: kiln.runtime.CudaModule}
        self._cuda_lock = threading.Lock()
        self._programs = {}  # device, or (device, symbol values) -> _Program
        self._programs_lock = threading.Lock()
        if self.kernel_steps:
            if runtime_loader is None:
                raise NotImplementedError("the plan has kernel steps and no runtime library is available")
            self._runtime = runtime_loader()
            if self.cuda:
                self._runtime.cuda_init()  # RuntimeUnavailable without an NVIDIA driver
        elif self.library_steps and self.cuda and runtime_loader is not None:
            try:  # for cuBLASLt; without the runtime, torch runs the GEMMs
                self._runtime = runtime_loader()
            except RuntimeUnavailable as e:
                _warn_once("runtime", f"GEMM steps run with torch: {e}")
        batch_kind = "cuda" if self.cuda else "kernels"
        for index, step in enumerate(plan.steps):
            kind = step.WhichOneof("kind")
            if kind == "aten":
                self._steps.append(self._load_aten(index, step.aten))
            elif kind == "kernel":
                if self.cuda:
                    entry = self._load_cuda_kernel(index, step.kernel)
                else:
                    entry = self._load_kernel(index, step.kernel)
                if self._steps and self._steps[-1][0] == batch_kind:
                    self._steps[-1][1].append(entry)
                else:
                    self._steps.append((batch_kind, [entry]))
            elif kind == "library":
                self._steps.append(("library", self._load_library(index, step.library)))
            else:
                raise PlanError(f"step {index}: empty or unknown step kind")
        for o in plan.outputs:
            if not -1 <= o < n:
                raise PlanError(f"plan output v{o} does not exist")
        out_nodes = [node for node in graph.nodes if node.op == proto.Node.OP_OUTPUT]
        self._output_metas = []
        if out_nodes and out_nodes[0].args and out_nodes[0].args[0].HasField("list"):
            by_name = {node.name: node for node in graph.nodes}
            for a in out_nodes[0].args[0].list.items:
                node = by_name.get(a.node) if a.WhichOneof("value") == "node" else None
                self._output_metas.append((a, node.meta if node is not None else None))
        if self.cuda and self.kernel_steps and device is not None and device.type == "cuda":
            self.cuda_modules(device)  # load errors surface now, while the graph can still run eagerly

    def _root_of(self, i):
        while self.values[i].storage == _PV.STORAGE_VIEW:
            i = self.values[i].index
        return i

    # -- loading ------------------------------------------------------------------------------

    def _value_ref(self, text, where):
        if not text.startswith("v") or not text[1:].isdigit() or int(text[1:]) >= len(self.values):
            raise PlanError(f"{where}: argument refers to {text!r}, which is not a plan value v<i>")
        return int(text[1:])

    def _load_arg(self, a, where):
        """Argument -> a loader tree: ("v", i) | ("sym", expr) | ("list", items, is_tuple) | constant."""
        kind = a.WhichOneof("value")
        if kind == "node":
            return ("v", self._value_ref(a.node, where))
        if kind in ("int_value", "float_value", "bool_value", "string_value"):
            return ("c", getattr(a, kind))
        if kind == "dtype":
            if a.dtype not in PB_TO_DTYPE:
                raise PlanError(f"{where}: unknown dtype {a.dtype}")
            return ("c", PB_TO_DTYPE[a.dtype])
        if kind == "device":
            return ("device", PB_TO_DEVICE.get(a.device.kind, "cpu"), a.device.index)
        if kind == "layout":
            return ("c", PB_TO_LAYOUT[a.layout])
        if kind == "memory_format":
            return ("c", PB_TO_MEMORY_FORMAT[a.memory_format])
        if kind == "none":
            return ("c", None)
        if kind == "list":
            return ("list", [self._load_arg(x, where) for x in a.list.items], a.list.is_tuple)
        if kind == "sym_int":
            return ("sym", a.sym_int)
        raise PlanError(f"{where}: argument has no value")

    def _load_aten(self, index, step):
        where = f"step {index} (aten {step.target}{', node ' + step.node if step.node else ''})"
        try:
            op = resolve_target(step.target)
        except SerializeError as e:
            raise PlanError(f"{where}: {e}") from None
        args = [self._load_arg(a, where) for a in step.args]
        kwargs = {k.name: self._load_arg(k.value, where) for k in step.kwargs}
        for o in step.outputs:
            if not -1 <= o < len(self.values):
                raise PlanError(f"{where}: output v{o} does not exist")
        if step.fallback:
            self.op_fallbacks += 1
        return ("aten", op, args, kwargs, list(step.outputs), where)

    def _load_kernel(self, index, step):
        where = f"step {index} (kernel {step.symbol})"
        if not 0 <= step.binary < len(self.artifact.binaries):
            raise PlanError(f"{where}: binary {step.binary} does not exist")
        binary = self.artifact.binaries[step.binary]
        if binary.kind != _SO:
            raise PlanError(f"{where}: binary {step.binary} is a {_kind_name(binary.kind)} in an "
                            "artifact for a CPU target (KIND_SHARED_OBJECT expected)")
        module = self._modules.get(step.binary)
        if module is None:
            module = self._runtime.load(binary.data)
            self._modules[step.binary] = module
        kernel = module.add_kernel(step.symbol)
        self._check_kernel_args(where, step)
        return (module, kernel, list(step.args), list(step.scalar_args))

    def _check_kernel_args(self, where, step):
        """A kernel step's values and symbols exist; its values are read by a kernel."""
        for a in step.args:
            if not 0 <= a < len(self.values):
                raise PlanError(f"{where}: argument v{a} does not exist")
            self._kernel_consumers.add(a)
            seen = 0  # the roots of views read by kernels too: _view_pointer reads their pointers
            while self.values[a].storage == _PV.STORAGE_VIEW and seen < len(self.values):
                a, seen = self.values[a].index, seen + 1
                if not 0 <= a < len(self.values):
                    break
                self._kernel_consumers.add(a)
        for s in step.scalar_args:
            if not 0 <= s < len(self.graph.symbols):
                raise PlanError(f"{where}: scalar argument {s} is not a symbol of the graph")

    def _load_cuda_kernel(self, index, step):
        where = f"step {index} (kernel {step.symbol})"
        if not 0 <= step.binary < len(self.artifact.binaries):
            raise PlanError(f"{where}: binary {step.binary} does not exist")
        kind = self.artifact.binaries[step.binary].kind
        if kind not in _CUDA_KINDS:
            raise PlanError(f"{where}: binary {step.binary} is a {_kind_name(kind)} in an artifact for "
                            "a CUDA target (KIND_CUBIN or KIND_PTX expected)")
        if not step.symbol:
            raise PlanError(f"{where}: no symbol")
        for name, dims, limit in (("grid", step.grid, _MAX_GRID_X), ("block", step.block, _MAX_BLOCK_X)):
            if not dims:
                raise PlanError(f"{where}: a CUDA kernel step without {name} dimensions")
            if not 1 <= dims[0] <= limit:
                raise PlanError(f"{where}: {name}[0] = {dims[0]} is outside 1..{limit}")
            if any(d != 1 for d in dims[1:]):
                raise PlanError(f"{where}: {name} {list(dims)}: only the x dimension may exceed 1")
        if not 0 <= step.shared_bytes < (1 << 32):
            raise PlanError(f"{where}: shared_bytes = {step.shared_bytes}")
        self._check_kernel_args(where, step)
        return CudaLaunchSpec(step.binary, step.symbol, tuple(step.args), tuple(step.scalar_args),
                              int(step.grid[0]), int(step.block[0]), int(step.shared_bytes))

    def _load_library(self, index, step):
        where = f"step {index} (library {step.function})"
        if step.function != _GEMM:
            raise PlanError(f"{where}: unknown library function (this client runs {_GEMM!r})")
        if len(step.int_params) != _GEMM_PARAMS or len(step.float_params) != 2 or len(step.args) != 5:
            raise PlanError(f"{where}: {len(step.int_params)} int_params, {len(step.float_params)} "
                            f"float_params, {len(step.args)} args (expected {_GEMM_PARAMS}, 2, 5)")
        p = tuple(step.int_params)
        if min(p[:4]) < 1 or p[4] not in _GEMM_DTYPES or not 0 <= p[13] <= 2 or p[17] < 0:
            raise PlanError(f"{where}: bad sizes, dtype, c_kind or workspace in {list(p)}")
        args = tuple(step.args)
        for slot, a in enumerate(args):
            optional = slot == 3 and p[13] == 0 or slot == 4 and p[17] == 0
            if a == -1 and optional:
                continue
            if optional or not 0 <= a < len(self.values):
                raise PlanError(f"{where}: argument {slot} is v{a}, which does not match the params")
        return (where, args, p, float(step.float_params[0]), float(step.float_params[1]))

    def _cublas(self):
        """The runtime when it can run GEMMs with cuBLASLt, else None (warned once)."""
        if self._runtime is None:
            return None
        try:
            self._runtime.cublas_init()
        except RuntimeUnavailable as e:
            _warn_once("cublas", f"GEMM steps run with torch: {e}")
            return None
        return self._runtime

    def cuda_modules(self, device):
        """{binary index: CudaModule} on `device` (a torch.device or index), loading the artifact's
        CUDA binaries there and resolving every kernel symbol the first time."""
        index = device if isinstance(device, int) else device.index
        if index is None:
            index = torch.cuda.current_device()
        modules = self._cuda_modules_by_device.get(index)
        if modules is not None:
            return modules
        with self._cuda_lock:
            modules = self._cuda_modules_by_device.get(index)
            if modules is not None:
                return modules
            modules = {}
            with _device_guard(index):  # torch's context of that device is the current one
                for entries in (e for kind, e, *_ in self._steps if kind == "cuda"):
                    for spec in entries:
                        module = modules.get(spec.binary)
                        if module is None:
                            module = self._runtime.cuda_load(self.artifact.binaries[spec.binary].data, index)
                            modules[spec.binary] = module
                        module.add_kernel(spec.symbol)
            self._cuda_modules_by_device[index] = modules
            return modules

    # -- running ------------------------------------------------------------------------------

    def __call__(self, inputs, symbols=None):
        """Runs the plan. inputs: the graph's inputs (tensors and ints) in placeholder order.
        symbols: {symbol index: value} (kiln.guards.InputGuard.bind). Returns the outputs as a list."""
        device = None
        for t in inputs:
            if isinstance(t, torch.Tensor):
                device = t.device
                break
        key = (device, tuple(sorted(symbols.items()))) if symbols else device
        program = self._programs.get(key)
        if program is None:
            program = self._program(key, device, symbols or {})
        return program(inputs)

    def _program(self, key, device, symbols):
        """The _Program of (device, symbol values), built once (at most _MAX_PROGRAMS kept)."""
        with self._programs_lock:
            program = self._programs.get(key)
            if program is None:
                program = _Program(self, device, symbols)
                if len(self._programs) < _MAX_PROGRAMS:
                    self._programs[key] = program
            return program

    def _non_tensor_output(self, i, symbols):
        if i >= len(self._output_metas):
            return None
        arg, meta = self._output_metas[i]
        if arg.WhichOneof("value") == "int_value":
            return arg.int_value
        if meta is not None and meta.WhichOneof("kind") == "sym_int":
            return eval_symint(meta.sym_int, symbols)
        return None


def _torch_gemm(views, batch, c_kind, alpha, beta):
    """env -> None: the GEMM of a library step computed by torch into D (views: from _gemm_views)."""
    (d, d_sizes, d_strides), (a, a_sizes, a_strides), (b, b_sizes, b_strides) = views[:3]
    c = views[3] if len(views) == 4 else None
    batched = batch > 1

    def run(env):
        dt, at, bt = env[d], env[a], env[b]
        out = dt.as_strided(d_sizes, d_strides, dt.storage_offset())
        x = at.as_strided(a_sizes, a_strides, at.storage_offset())
        y = bt.as_strided(b_sizes, b_strides, bt.storage_offset())
        if c is None:
            if alpha == 1.0:
                (torch.bmm if batched else torch.mm)(x, y, out=out)
            else:  # beta = 0: the first operand is ignored
                (torch.baddbmm if batched else torch.addmm)(out, x, y, beta=0, alpha=alpha, out=out)
            return
        ct = env[c[0]]
        z = ct.as_strided(c[1], c[2], ct.storage_offset())
        (torch.baddbmm if batched else torch.addmm)(z, x, y, beta=beta, alpha=alpha, out=out)

    return run


class CudaLaunchSpec(tuple):
    """One CUDA kernel step, validated: (binary, symbol, args, scalar_args, grid_x, block_x,
    shared_bytes)."""

    __slots__ = ()

    def __new__(cls, binary, symbol, args, scalars, grid_x, block_x, shared_bytes):
        return tuple.__new__(cls, (binary, symbol, args, scalars, grid_x, block_x, shared_bytes))

    binary = property(lambda self: self[0])
    symbol = property(lambda self: self[1])
    args = property(lambda self: self[2])
    scalars = property(lambda self: self[3])
    grid_x = property(lambda self: self[4])
    block_x = property(lambda self: self[5])
    shared_bytes = property(lambda self: self[6])


def _kind_name(kind):
    try:
        return proto.Binary.Kind.Name(kind)
    except ValueError:
        return f"binary kind {kind}"


def _device_guard(index):
    """Makes `index` torch's current CUDA device (and its primary context current) for a block."""
    return torch.cuda.device(index)


def _current_stream(device):
    """The CUstream (an int) torch enqueues work for `device` on."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


# -- the per-call program ---------------------------------------------------------------------

_MAX_PROGRAMS = 64  # programs kept per plan (one per device for static plans)
_Tensor = torch.Tensor
_data_ptr = torch.Tensor.data_ptr
# The storages a view's pointer may be computed from (_Program._view_pointer).
_VIEW_POINTER_ROOTS = (_PV.STORAGE_INPUT, _PV.STORAGE_OUTPUT, _PV.STORAGE_CONSTANT, _PV.STORAGE_STEP)
_IS_CUDA = operator.attrgetter("is_cuda")
_TENSORS = itertools.repeat(torch.Tensor)  # isinstance's second argument, for map()
_OpOverload = getattr(torch._ops, "OpOverload", None)
_MISSING = object()


def _is_cuda_device(device):
    """Whether tensors on `device` (a torch.device) are CUDA tensors (is_cuda): the build-time
    check of the workspace, whose values kernels read by pointer."""
    return device.type == "cuda"


def _getter(indices):
    """env -> the tuple (env[i] for i in indices)."""
    if len(indices) == 1:
        i = indices[0]
        return lambda env: (env[i],)
    return operator.itemgetter(*indices)


def _raiser(make_error):
    """An instruction that raises make_error() (a fresh exception per call)."""

    def fail(env):
        raise make_error()

    return fail


def _again(error):
    """A factory of copies of `error` (raising one instance on every call would grow its traceback)."""
    return lambda: type(error)(*error.args)


def _plan_error(message):
    return lambda: PlanError(message)


def _callable_of(op):
    """What calling an AtenStep's op amounts to: OpOverload.__call__ is `self._op(*args, **kwargs)`."""
    if _OpOverload is not None and type(op) is _OpOverload and callable(getattr(op, "_op", None)):
        return op._op
    return op


class _Program:
    """One plan's run, specialized to a device and a binding of the graph's symbols (a static plan
    has one program per device). Everything that does not depend on the call is resolved when it
    is built (at the first call with that key): sizes, strides and offsets of every value as tuples,
    storage decisions, the devices, the aten steps' argument lists with constants in place, the ops'
    callables, the kernel launch tables. A call then runs `code`, a flat list of closures over
    prebound indices, on `env`: the values' tensors (env[i] is value i), then per-call slots.

    The plan's semantics are lazy (a value gets its tensor when it is first read, in the order the
    steps read their arguments, so that e.g. the workspace is allocated only by its first use);
    the builder simulates those reads once and places each value's materialization right before
    the first instruction that reads it, which keeps the order of allocations and errors."""

    def __init__(self, ex, device, symbols):
        self.ex, self.device, self.symbols = ex, device, symbols
        values = ex.values
        n = len(values)
        self.WS, self.TABLES, self.STREAM, self.NONES, self.WSPTR = n, n + 1, n + 2, n + 3, n + 4
        self.num_slots = n + 5  # + one per workspace dtype (the workspace viewed as that dtype)
        self._ws_slots = {}
        self._ws_device = None
        self._ws_alloc = None  # env -> the call's workspace (allocated by the first use)
        self._ws_allocated = False  # whether `code` has allocated the workspace at this point
        self._ws_places = {}
        self.metas = [self._meta(i) for i in range(n)]
        # GEMM steps run with cuBLASLt (pointers) on a CUDA device, else with torch (tensors).
        self.gemm_runtime = (ex._cublas() if ex.library_steps and ex.cuda and device is not None
                             and device.type == "cuda" else None)
        self.tensor_reads = self._tensor_reads()
        self.code = []
        self.ready = set()  # values that have their tensor at this point of `code`
        self.maybe_none = set()  # STEP values of aten steps (None where the op returned None)
        self.read_inputs = []  # INPUT values that are read: checked to be tensors per call
        self.table_builders = []  # per kernel batch: a function that builds its launch table
        # Inputs: values 0..num_inputs-1 are the inputs in order (plan_builder.h), else a map.
        k = ex.num_inputs
        input_values = [(i, v.index) for i, v in enumerate(values) if v.storage == _PV.STORAGE_INPUT]
        self.num_inputs = k
        self.input_map = None if input_values == [(i, i) for i in range(k)] else input_values
        for entry in ex._steps:
            if entry[0] == "aten":
                self._emit_aten(*entry[1:])
            elif entry[0] == "cuda":
                self._emit_cuda(entry[1])
            elif entry[0] == "library":
                self._emit_gemm(entry[1])
            else:
                self._emit_kernels(entry[1])
        self._emit_outputs()
        self.tail = [None] * (self.num_slots - k)
        self.check_inputs = _getter(self.read_inputs) if self.read_inputs else None
        self.pool = [self._new_tables()] if self.table_builders else None
        self.code = tuple(self.code)

    # -- per call ---------------------------------------------------------------------------------

    def __call__(self, inputs):
        if len(inputs) < self.num_inputs:
            raise PlanError(f"the plan takes {self.num_inputs} inputs, got {len(inputs)}")
        if self.input_map is None:
            env = [*inputs[:self.num_inputs], *self.tail]
        else:
            env = [None] * self.num_slots
            for i, j in self.input_map:
                env[i] = inputs[j]
        if self.check_inputs is not None and not all(map(isinstance, self.check_inputs(env), _TENSORS)):
            for i in self.read_inputs:
                if not isinstance(env[i], _Tensor):
                    raise PlanError(f"value v{i}: graph input {self.ex.values[i].index} is not a tensor")
        pool = self.pool
        if pool is not None:
            try:  # a call's own tables: a table is filled and run by one thread at a time
                env[self.TABLES] = pool.pop()
            except IndexError:
                env[self.TABLES] = self._new_tables()
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # torch.no_grad(), without its Python frames
        try:
            for instruction in self.code:
                instruction(env)
            return self.finish(env)
        finally:
            torch._C._set_grad_enabled(grad)
            if pool is not None:
                pool.append(env[self.TABLES])

    def _new_tables(self):
        return [build() for build in self.table_builders]

    # -- building -------------------------------------------------------------------------------

    def _meta(self, i):
        """(sizes, strides) of value i as tuples, or the exception evaluating them raised."""
        m = self.ex.values[i].meta
        try:
            sizes = tuple(eval_symint(s, self.symbols) for s in m.sizes)
            strides = tuple(eval_symint(s, self.symbols) for s in m.strides)
        except Exception as e:  # an unbound symbol: raised where the value is used, as before
            return e
        if len(strides) != len(sizes):
            strides = tuple(torch.empty(sizes, device="meta").stride()) if sizes else ()
        return sizes, strides

    def _device_of(self, i):
        m = self.ex.values[i].meta
        kind = PB_TO_DEVICE.get(m.device.kind, "cpu") if m.HasField("device") else None
        device = self.device
        if kind in (None, "meta"):
            return device or torch.device("cpu")
        if device is not None and device.type == kind:
            return device
        return torch.device(kind)

    def _none_used(self, env, i):
        raise PlanError(f"value v{i} is used, but {(env[self.NONES] or {}).get(i, 'its step')} returned None for it")

    def _need(self, i, code=None):
        """Emits (into `code`, default self.code) what gives value i its tensor, once."""
        if i in self.ready:
            return
        code = self.code if code is None else code
        ex = self.ex
        v = ex.values[i]
        kind = v.storage
        meta = self.metas[i]
        if kind == _PV.STORAGE_INPUT:  # in env from the start; checked to be a tensor per call
            self.read_inputs.append(i)
            self.ready.add(i)
            return
        if kind == _PV.STORAGE_STEP:
            code.append(_raiser(_plan_error(f"value v{i} is used before the step that produces it ran")))
            self.ready.add(i)
            return
        if kind != _PV.STORAGE_CONSTANT and isinstance(meta, Exception):
            if kind == _PV.STORAGE_VIEW:
                self._need(v.index, code)
            code.append(_raiser(_again(meta)))
            self.ready.add(i)
            return
        dtype = ex._dtypes[i]
        if kind == _PV.STORAGE_OUTPUT:
            alloc = functools.partial(torch.empty_strided, meta[0], meta[1], dtype=dtype,
                                      device=self._device_of(i))

            def instruction(env):
                env[i] = alloc()
        elif kind == _PV.STORAGE_WORKSPACE:
            instruction = self._workspace_view(i, dtype, meta)
        elif kind == _PV.STORAGE_VIEW and self._ws_place(i) is not None:
            instruction = self._ws_tensor(i)  # straight from the workspace, as its base chain would be
        elif kind == _PV.STORAGE_VIEW:
            base, offset = v.index, v.offset
            self._need(base, code)
            sizes, strides = meta
            if base in self.maybe_none:
                def instruction(env):
                    b = env[base]
                    if b is None:
                        self._none_used(env, base)
                    env[i] = b.as_strided(sizes, strides, b.storage_offset() + offset)
            else:
                def instruction(env):
                    b = env[base]
                    env[i] = b.as_strided(sizes, strides, b.storage_offset() + offset)
        elif kind == _PV.STORAGE_CONSTANT:
            constants, index, device = ex._constants, v.index, self._device_of(i)

            def instruction(env):
                t = constants[index]
                if t.device != device:
                    t = t.to(device)
                    constants[index] = t  # move once
                env[i] = t
        else:
            raise PlanError(f"value v{i}: storage {kind} is not known to this client")
        code.append(instruction)
        self.ready.add(i)

    def _workspace_view(self, i, dtype, meta):
        ws_bytes = self.ex.plan.workspace_bytes
        sizes, strides = meta
        size = _itemsize(dtype)
        offset = self.ex.values[i].offset
        extent = sum((s - 1) * st for s, st in zip(sizes, strides)) + 1 if all(sizes) else 0
        if offset + extent * size > ws_bytes:
            return _raiser(_plan_error(f"value v{i}: {extent * size} bytes at workspace offset {offset} "
                                       f"overflow the {ws_bytes}-byte workspace"))
        return self._ws_tensor(i, (i, dtype, size, offset // size, sizes, strides))

    def _workspace(self, root):
        """env -> the call's workspace (a uint8 tensor in env[WS], its data pointer in env[WSPTR]),
        allocated by the first call of it, on the device of `root`, the first workspace value used."""
        if self._ws_alloc is None:
            ws_bytes, WS, WSPTR = self.ex.plan.workspace_bytes, self.WS, self.WSPTR
            ws_device = self._ws_device = self._device_of(root)

            def workspace(env):
                ws = env[WS]
                if ws is None:
                    ws = env[WS] = torch.empty(ws_bytes, dtype=torch.uint8, device=ws_device)
                    env[WSPTR] = ws.data_ptr()
                return ws

            self._ws_alloc = workspace
        return self._ws_alloc

    def _ws_tensor(self, i, place=None):
        """The instruction that makes value i's tensor: the workspace viewed as its root's dtype,
        as_strided to i's place (a WORKSPACE value, or a view of one: _ws_place)."""
        root, dtype, size, element, sizes, strides = place or self._ws_place(i)
        workspace = self._workspace(root)
        if self.ex.plan.workspace_bytes % size:  # cannot be viewed as `dtype` as a whole
            ws_device = self._ws_device

            def instruction(env):
                t = torch.empty(0, dtype=dtype, device=ws_device)
                t.set_(workspace(env).untyped_storage(), element, sizes, strides)
                env[i] = t

            return instruction
        slot = self._ws_slots.get(dtype)
        if slot is None:
            slot = self._ws_slots[dtype] = self.num_slots
            self.num_slots += 1

        def instruction(env):
            base = env[slot]
            if base is None:
                base = env[slot] = workspace(env).view(dtype)
            env[i] = base.as_strided(sizes, strides, element)

        return instruction

    def _ws_place(self, i):
        """(root, root's dtype, its size, storage offset in elements of that dtype, sizes, strides)
        of value i when it lies in the workspace: a WORKSPACE value or a chain of views of one,
        every value of the chain with its metadata, non-negative strides and its elements inside
        the workspace. Else None (such a value takes the chain of instructions, which raise)."""
        place = self._ws_places.get(i, _MISSING)
        if place is not _MISSING:
            return place
        values, chain, j = self.ex.values, [], i
        while values[j].storage == _PV.STORAGE_VIEW:
            chain.append(j)
            j = values[j].index
        place = None
        if values[j].storage == _PV.STORAGE_WORKSPACE:
            root, dtype = j, self.ex._dtypes[j]
            size, ws_bytes = _itemsize(dtype), self.ex.plan.workspace_bytes
            element = values[root].offset // size
            fits = True
            for j in [root, *reversed(chain)]:
                if j != root:
                    element += values[j].offset
                meta = self.metas[j]
                if isinstance(meta, Exception) or element < 0 or any(st < 0 for st in meta[1]):
                    fits = False
                    break
                if all(meta[0]):
                    extent = sum((s - 1) * st for s, st in zip(*meta)) + 1
                    if (element + extent) * size > ws_bytes:
                        fits = False
                        break
            if fits:
                place = (root, dtype, size, element, *self.metas[i])
        self._ws_places[i] = place
        return place

    def _tensor_reads(self):
        """The values that need a tensor wherever they are read: those aten steps read or write,
        the graph's outputs, GEMM operands when torch runs the GEMMs. Kernel steps and cuBLASLt
        GEMMs read only data pointers."""
        ex = self.ex
        reads = {o for o in ex.plan.outputs if o >= 0}

        def walk(tree):
            if tree[0] == "v":
                reads.add(tree[1])
            elif tree[0] == "list":
                for x in tree[1]:
                    walk(x)

        for entry in ex._steps:
            if entry[0] == "aten":
                for tree in itertools.chain(entry[2], entry[3].values()):
                    walk(tree)
                reads.update(o for o in entry[4] if o >= 0 and ex.values[o].storage != _PV.STORAGE_STEP)
            elif entry[0] == "library" and self.gemm_runtime is None:
                reads.update(a for a in entry[1][1][:4] if a >= 0)
        return reads

    def _pointer(self, i, cuda=False):
        """The byte offset of value i's data in the workspace when kernels and GEMMs may take its
        pointer as the call's workspace pointer (env[WSPTR]) plus that offset, with no tensor made
        per call: a workspace value (or a view of one) that nothing reads as a tensor, that has
        elements (an empty tensor's data_ptr() is 0), and (cuda) whose workspace is on a CUDA
        device. Emits the workspace's allocation before the reading instruction. Else None."""
        if i in self.tensor_reads:
            return None
        place = self._ws_place(i)
        if place is None or not all(place[4]):
            return None
        root, _, size, element, _, _ = place
        self._workspace(root)
        if cuda and not _is_cuda_device(self._ws_device):
            return None  # the tensor path: the per-call check names the value
        if not self._ws_allocated:
            self.code.append(self._ws_alloc)
            self._ws_allocated = True
        return element * size

    def _view_pointer(self, i):
        """(root, byte offset) when a kernel may take view i's pointer as its root's data_ptr() plus
        that offset, with no tensor made per call (what `as_strided` would give, without making
        it): i is a chain of views, every link with its metadata, non-negative offsets and strides
        and elements, down to an input, output, constant or aten result (a workspace root is
        _pointer's), and its elements lie inside its root's. Emits the root's instructions.
        Else None."""
        ex, values = self.ex, self.ex.values
        chain, j, element = [], i, 0
        while values[j].storage == _PV.STORAGE_VIEW and len(chain) < len(values):
            chain.append(j)
            element += values[j].offset
            j = values[j].index
            if not 0 <= j < len(values):
                return None
        if not chain or values[j].storage not in _VIEW_POINTER_ROOTS:
            return None
        metas = [self.metas[k] for k in (j, *chain)]
        if any(isinstance(m, Exception) or not all(m[0]) or any(st < 0 for st in m[1]) for m in metas):
            return None
        if any(values[k].offset < 0 for k in chain):
            return None
        root_extent = sum((sz - 1) * st for sz, st in zip(*metas[0])) + 1
        extent = sum((sz - 1) * st for sz, st in zip(*metas[1])) + 1
        if element + extent > root_extent:
            return None
        self._need(j)
        return (j, element * _itemsize(ex._dtypes[j]))

    def _view_tensor(self, i, root, byte_offset):
        """The instruction that gives view i its tensor straight from its root (what the chain of
        views would give), for a value otherwise read by pointer (_view_pointer)."""
        sizes, strides = self.metas[i]
        element = byte_offset // _itemsize(self.ex._dtypes[root])

        def instruction(env):
            r = env[root]
            env[i] = r.as_strided(sizes, strides, r.storage_offset() + element)

        return instruction

    def _buffer_fill(self, args, offsets):
        """env -> the data pointers of `args` (a sequence of ints, in order): env[WSPTR] + offset
        where `offsets` has an int (workspace values, see _pointer), env[root].data_ptr() + offset
        where it has (root, offset) (views, see _view_pointer), else the value's tensor's
        data_ptr() (at least one is not a tensor's); a None or non-tensor among those raises what
        explains it."""
        tensor_args = [a for a, off in zip(args, offsets) if off is None]
        roots = [off[0] for off in offsets if isinstance(off, tuple)]
        root_offs = tuple(off[1] for off in offsets if isinstance(off, tuple))
        offs = tuple(off for off in offsets if isinstance(off, int))
        WSPTR = self.WSPTR
        if not tensor_args and not roots:
            return lambda env: list(map(env[WSPTR].__add__, offs))
        get, explain = self._pointer_filler(tensor_args + roots)
        order, counts = [], [0, len(tensor_args), len(tensor_args) + len(roots)]
        for off in offsets:
            kind = 0 if off is None else 1 if isinstance(off, tuple) else 2
            order.append(counts[kind])
            counts[kind] += 1
        arrange = operator.itemgetter(*order)  # tensors', roots' + offsets, workspace pointers -> in order
        t = len(tensor_args)
        add = operator.add

        def fill(env):
            try:
                ptrs = list(map(_data_ptr, get(env)))
            except TypeError as e:
                explain(env, e)
            if root_offs:
                ptrs[t:] = map(add, ptrs[t:], root_offs)
            if offs:
                ptrs += map(env[WSPTR].__add__, offs)
            return arrange(ptrs)

        return fill

    def _arg(self, tree):
        """A loader tree -> ("c", constant) | ("v", value index) | ("f", env -> argument)."""
        tag = tree[0]
        if tag == "c":
            return tree
        if tag == "v":
            self._need(tree[1])
            return tree
        if tag == "sym":
            try:
                return ("c", eval_expr(tree[1], self.symbols))
            except Exception as e:
                return ("f", _raiser(_again(e)))
        if tag == "device":
            device = self.device
            if device is not None and device.type == tree[1]:
                return ("c", device)
            return ("c", torch.device(tree[1], tree[2]) if tree[2] >= 0 else torch.device(tree[1]))
        if tag == "list":
            items = [self._arg(x) for x in tree[1]]
            if all(item[0] == "c" for item in items):
                out = [item[1] for item in items]
                return ("c", tuple(out) if tree[2] else out)
            return ("f", self._list_builder(items, tree[2]))
        raise PlanError(f"bad argument tree {tag}")

    def _filler(self, items):
        """env -> the list of `items` (constants prebound, values read from env, nested builders
        called), or None when every item is a constant (then `template` is the list itself).
        Returns (fill, template)."""
        template = [item[1] if item[0] == "c" else None for item in items]
        values = [(p, item[1]) for p, item in enumerate(items) if item[0] == "v"]
        calls = [(p, item[1]) for p, item in enumerate(items) if item[0] == "f"]
        if not values and not calls:
            return None, template
        none_used = self._none_used

        def fill(env):
            out = template.copy()
            for p, i in values:
                x = env[i]
                if x is None:
                    none_used(env, i)
                out[p] = x
            for p, f in calls:
                out[p] = f(env)
            return out

        return fill, template

    def _list_builder(self, items, is_tuple):
        fill, _ = self._filler(items)  # not all constants: _arg folds those
        if is_tuple:
            return lambda env: tuple(fill(env))
        return fill

    def _invoker(self, op, args, kwargs):
        """env -> the op's result, with the arguments' constants prebound."""
        call = _callable_of(op)
        fill, template = self._filler([self._arg(a) for a in args])
        kw_items = [(k, self._arg(a)) for k, a in kwargs.items()]
        kw_const = {k: a[1] for k, a in kw_items if a[0] == "c"}
        kw_dynamic = [(k, a) for k, a in kw_items if a[0] != "c"]
        none_used = self._none_used
        if kw_dynamic:
            fill_args = fill or (lambda env: template)

            def invoke(env):
                a = fill_args(env)  # positional arguments first, as torch would see them
                kw = dict(kw_const)
                for k, (tag, x) in kw_dynamic:
                    if tag == "f":
                        kw[k] = x(env)
                    elif env[x] is None:
                        none_used(env, x)
                    else:
                        kw[k] = env[x]
                return call(*a, **kw)
        elif fill is None:
            template = tuple(template)

            def invoke(env):
                return call(*template, **kw_const)
        elif kw_const:
            def invoke(env):
                return call(*fill(env), **kw_const)
        else:
            def invoke(env):
                return call(*fill(env))
        return invoke

    def _store(self, o, where):
        """(env, item of the op's result) -> None: the result becomes value o, or is copied into it."""
        ex = self.ex
        if ex.values[o].storage != _PV.STORAGE_STEP:
            post = []  # the destination gets its tensor after the op ran, as before
            self._need(o, post)
            post = tuple(post)

            def store(env, r):
                if not isinstance(r, _Tensor):
                    raise PlanError(f"{where}: output v{o} is a {type(r).__name__}, not a tensor")
                for instruction in post:
                    instruction(env)
                env[o].copy_(r)

            return store
        NONES, meta, dtype = self.NONES, self.metas[o], ex._dtypes[o]
        fix = o in ex._kernel_consumers
        if isinstance(meta, Exception):
            sizes = strides = None
        else:
            sizes, strides = meta

        def store(env, r):
            if r is None:
                # Some ops return None for tuple items they did not compute (e.g. the debug mask of
                # _scaled_dot_product_cudnn_attention), though the capture's metadata said tensor.
                # Fine unless a later step or the graph's outputs read that value.
                nones = env[NONES]
                if nones is None:
                    nones = env[NONES] = {}
                nones[o] = where
                return
            if not isinstance(r, _Tensor):
                raise PlanError(f"{where}: output v{o} is a {type(r).__name__}, not a tensor")
            if sizes is None:
                raise _again(meta)()
            if r.shape != sizes or r.dtype is not dtype:
                raise PlanError(f"{where}: output v{o} is {r.dtype}{list(r.shape)}, the plan "
                                f"says {dtype}{list(sizes)}")
            if fix and r.stride() != strides and r.numel() > 1:
                fixed = torch.empty_strided(sizes, strides, dtype=r.dtype, device=r.device)
                fixed.copy_(r)
                r = fixed
            env[o] = r

        return store

    def _emit_aten(self, op, args, kwargs, outputs, where):
        invoke = self._invoker(op, args, kwargs)
        stores = [(k, self._store(o, where)) for k, o in enumerate(outputs) if o >= 0]
        for o in outputs:
            if o >= 0 and self.ex.values[o].storage == _PV.STORAGE_STEP:
                self.ready.add(o)
                self.maybe_none.add(o)
        count = len(outputs)
        if count == 1:
            store = stores[0][1] if stores else None

            def instruction(env):
                r = invoke(env)
                if isinstance(r, (tuple, list)):
                    if not r:
                        raise PlanError(f"{where}: returned 0 values for 1 outputs")
                    r = r[0]
                if store is not None:
                    store(env, r)
        else:
            def instruction(env):
                r = invoke(env)
                if not isinstance(r, (tuple, list)):
                    raise PlanError(f"{where}: returned one value for {count} outputs")
                if len(r) < count:
                    raise PlanError(f"{where}: returned {len(r)} values for {count} outputs")
                for k, store in stores:
                    store(env, r[k])
        self.code.append(instruction)

    def _scalars(self, scalars):
        out = []
        for s in scalars:
            if s not in self.symbols:
                return None, _raiser(_plan_error(f"kernel scalar argument: symbol {s} has no value"))
            out.append(self.symbols[s])
        return out, None

    def _pointer_filler(self, args):
        """(env -> the tensors of `args`, (env, error) -> raises: a PlanError when one of them is a
        STEP value its aten step returned None for, else `error`)."""
        get = _getter(args)
        none_used, NONES = self._none_used, self.NONES

        def explain(env, error):
            for a in args:
                if env[a] is None and a in (env[NONES] or {}):
                    none_used(env, a)
            raise error

        return get, explain

    def _emit_kernels(self, batch):
        entries, args, offsets = [], [], []
        for module, kernel, step_args, scalars in batch:
            for a in step_args:
                off = self._pointer(a)
                if off is None:
                    off = self._view_pointer(a)
                if off is None:
                    self._need(a)
                offsets.append(off)
            values, fail = self._scalars(scalars)
            if fail is not None:
                self.code.append(fail)
                return
            args.extend(step_args)
            entries.append((module, kernel, len(step_args), values))
        runtime, b, TABLES = self.ex._runtime, len(self.table_builders), self.TABLES
        self.table_builders.append(lambda: runtime.step_table(entries))
        if not args:
            def instruction(env):
                env[TABLES][b].run()

            self.code.append(instruction)
            return
        count = len(args)
        if any(off is not None for off in offsets):
            fill = self._buffer_fill(args, offsets)

            def instruction(env):
                table = env[TABLES][b]
                table.buffers[:count] = fill(env)
                table.run()
        else:
            get, explain = self._pointer_filler(args)

            def instruction(env):
                table = env[TABLES][b]
                try:
                    table.buffers[:count] = list(map(_data_ptr, get(env)))
                except TypeError as e:  # a None (or a non-tensor) among them
                    explain(env, e)
                table.run()

        self.code.append(instruction)

    def _emit_cuda(self, batch):
        device = self.device
        if device is None or device.type != "cuda":
            self.code.append(_raiser(_plan_error(f"a plan compiled for CUDA runs on {device or 'no'} tensors")))
            return
        modules = self.ex.cuda_modules(device)
        entries, args, offsets, check = [], [], [], []
        for spec in batch:
            module = modules[spec.binary]
            values, fail = self._scalars(spec.scalars)
            for a in spec.args:
                off = self._pointer(a, cuda=True)  # on the device: no per-call check
                if off is None:
                    off = self._view_pointer(a)
                    if off is not None and off[0] not in check and not self._on_device(off[0]):
                        check.append(off[0])  # the root is what is checked then
                if off is None:
                    self._need(a)
                    if a not in check and not self._on_device(a):
                        check.append(a)
                offsets.append(off)
            if fail is not None:
                self.code.append(fail)
                return
            args.extend(spec.args)
            entries.append((module, module.add_kernel(spec.symbol), spec.grid_x, spec.block_x,
                            spec.shared_bytes, len(spec.args), values))
        runtime, b, TABLES, STREAM = self.ex._runtime, len(self.table_builders), self.TABLES, self.STREAM
        self.table_builders.append(lambda: runtime.cuda_launch_table(entries))
        count = len(args)
        fill = get = None
        if any(off is not None for off in offsets):
            fill = self._buffer_fill(args, offsets)
        elif count:
            get, explain = self._pointer_filler(args)
        symbols = {}
        for spec in batch:
            for a in spec.args:
                symbols.setdefault(a, spec.symbol)
                symbols.setdefault(self.ex._root[a], spec.symbol)
        on_cuda = _getter(check) if check else None

        def off_device(env):
            for a in check:
                t = env[a]
                if not _IS_CUDA(t):
                    raise PlanError(f"kernel {symbols[a]}: argument v{a} is on {t.device}, not on {device}")

        def instruction(env):
            table = env[TABLES][b]
            if fill is not None:
                table.buffers[:count] = fill(env)
            elif get is not None:
                try:
                    table.buffers[:count] = list(map(_data_ptr, get(env)))
                except TypeError as e:
                    explain(env, e)
            if on_cuda is not None and not all(map(_IS_CUDA, on_cuda(env))):
                off_device(env)
            stream = env[STREAM]
            if stream is None:
                stream = env[STREAM] = _current_stream(device)
            table.run(stream)

        self.code.append(instruction)

    def _gemm_views(self, spec):
        """[(value, sizes, strides)] of the GEMM's D, A, B and C (if any) as the step sees them, or a
        PlanError when a view reaches past its value (or a dtype differs)."""
        where, args, p, _, _ = spec
        batch, m, n, k, dtype = p[:5]
        shapes = [((m, n), (p[12], 1)), ((m, k), (p[6], p[7])), ((k, n), (p[9], p[10]))]
        strides_b = [p[11], p[5], p[8]]
        if p[13] == 1:
            shapes.append(((n,), (1,)))
            strides_b.append(None)
        elif p[13] == 2:
            shapes.append(((m, n), (p[15], 1)))
            strides_b.append(p[14])
        views = []
        for slot, (sizes, strides) in enumerate(shapes):
            v = args[slot]
            if self.ex.values[v].meta.dtype != dtype:
                raise PlanError(f"{where}: v{v} is not of the step's dtype")
            if batch > 1 and strides_b[slot] is not None:
                sizes, strides = (batch, *sizes), (strides_b[slot], *strides)
            meta = self.metas[v]
            if isinstance(meta, Exception):
                raise _again(meta)()
            reach = sum((s - 1) * st for s, st in zip(sizes, strides))
            extent = sum((s - 1) * st for s, st in zip(*meta)) if all(meta[0]) else -1
            if min(strides) < 0 or reach > extent or any(st < 0 for st in meta[1]):
                raise PlanError(f"{where}: operand {slot} (v{v}) reaches element {reach}, past its value "
                                f"(sizes {list(meta[0])}, strides {list(meta[1])})")
            views.append((v, sizes, strides))
        return views

    def _emit_gemm(self, spec):
        where, args, p, alpha, beta = spec
        try:
            views = self._gemm_views(spec)
        except Exception as e:
            self.code.append(_raiser(_again(e)))
            return
        run_torch = _torch_gemm(views, p[0], p[13], alpha, beta)
        device, runtime = self.device, self.gemm_runtime
        if runtime is None:
            for v, _, _ in views:
                self._need(v)
            self.code.append(run_torch)
            return
        operands = [v for v, _, _ in views]
        materialize = []  # what gives the operands read by pointer their tensors, for torch
        pointers = []
        for v in operands:
            off = self._pointer(v, cuda=True)
            if off is not None:
                materialize.append(self._ws_tensor(v))
            elif self.ex.values[self.ex._root[v]].storage != _PV.STORAGE_STEP:
                off = self._view_pointer(v)  # e.g. a transposed weight: its input's pointer
                if off is not None:
                    materialize.append(self._view_tensor(v, *off))
            if off is None:
                self._need(v)
            pointers.append(off)
        ws = args[4]
        if ws >= 0:
            meta = self.metas[ws]
            if isinstance(meta, Exception) or self.ex._dtypes[ws] != torch.uint8 or meta[0] != (p[17],):
                self.code.append(_raiser(_plan_error(f"{where}: workspace v{ws} is not {p[17]} bytes of uint8")))
                return
            off = self._pointer(ws, cuda=True)
            if off is None:
                self._need(ws)
            operands.append(ws)
            pointers.append(off)
        params = list(p)
        if p[4] == proto.DTYPE_FLOAT32 and torch.get_float32_matmul_precision() != "highest":
            params[16] |= 1  # TF32, as torch would use it
        index = device.index if device.index is not None else torch.cuda.current_device()
        b, TABLES, STREAM = len(self.table_builders), self.TABLES, self.STREAM
        self.table_builders.append(lambda: runtime.gemm_call(index, params, alpha, beta))
        slots = [0, 1, 2] + ([3] if len(views) == 4 else []) + ([4] if ws >= 0 else [])
        # Per call: the tensors' pointers (operands, and roots of views read by pointer, plus
        # their offsets: _view_pointer), then the workspace's.
        tensor_slots = tuple((s, 0) for s, off in zip(slots, pointers) if off is None)
        tensor_slots += tuple((s, off[1]) for s, off in zip(slots, pointers) if isinstance(off, tuple))
        tensor_values = [v for v, off in zip(operands, pointers) if off is None]
        tensor_values += [off[0] for off in pointers if isinstance(off, tuple)]
        get = _getter(tensor_values) if tensor_slots else None
        ws_slots = tuple((s, off) for s, off in zip(slots, pointers) if isinstance(off, int))
        WSPTR = self.WSPTR

        def instruction(env):
            call = env[TABLES][b]
            buffers = call.buffers
            if get is not None:
                tensors = get(env)
                if not all(map(_IS_CUDA, tensors)):
                    raise PlanError(f"{where}: an operand is not on {device}")
                for (slot, off), t in zip(tensor_slots, tensors):
                    buffers[slot] = t.data_ptr() + off
            if ws_slots:
                ws = env[WSPTR]
                for slot, off in ws_slots:
                    buffers[slot] = ws + off
            stream = env[STREAM]
            if stream is None:
                stream = env[STREAM] = _current_stream(device)
            try:
                call.run(stream)
            except GemmUnsupported as e:
                _warn_once(("unsupported", where), f"{where} runs with torch: {e}")
                for make in materialize:
                    make(env)
                run_torch(env)

        self.code.append(instruction)

    def _on_device(self, i):
        """Whether value i is known to live on the program's device: allocated here (OUTPUT,
        WORKSPACE, CONSTANT, or a view of one) on it. INPUT and STEP values are checked per call."""
        root = self.ex._root[i]
        kind = self.ex.values[root].storage
        if kind in (_PV.STORAGE_INPUT, _PV.STORAGE_STEP):
            return False
        return self._device_of(root) == self.device and (root == i or self._device_of(i) == self.device)

    def _emit_outputs(self):
        ex = self.ex
        template, positions = [], []
        for k, o in enumerate(ex.plan.outputs):
            if o >= 0:
                self._need(o)
                template.append(None)
                positions.append((k, o))
                continue
            try:
                template.append(ex._non_tensor_output(k, self.symbols))
            except Exception as e:
                self.code.append(_raiser(_again(e)))
                template.append(None)
        checks = tuple(o for _, o in positions if o in self.maybe_none)
        none_used = self._none_used
        if len(positions) == len(template) and positions:
            get = _getter([o for _, o in positions])

            def finish(env):
                for o in checks:
                    if env[o] is None:
                        none_used(env, o)
                return list(get(env))
        else:
            def finish(env):
                for o in checks:
                    if env[o] is None:
                        none_used(env, o)
                out = template.copy()
                for k, o in positions:
                    out[k] = env[o]
                return out

        self.finish = finish
