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

Where the code is: this module has PlanExecutor (loading and checking the plan, the kernels' modules)
and _Program's core (building, the per-call loop, values' tensors, outputs); _Program's other
methods come from mixins: kiln._exec_workspace (the workspace, values read by pointer),
kiln._exec_aten (aten steps), kiln._exec_kernels (CPU kernel runs, CUDA launches, cuBLASLt GEMMs);
kiln._exec_common has what they share (PlanError, the instruction helpers).
"""

import functools
import itertools
import threading
import time

import torch

from kiln import counters as stats_mod
from kiln import proto
from kiln._exec_aten import _AtenMixin, merge_copies
from kiln._exec_common import (_PV, PlanError, _Tensor, _again, _getter, _itemsize, _plan_error, _poisoned,
                               _raiser, _warn_once)
from kiln._exec_kernels import _KernelMixin
from kiln._exec_workspace import _WorkspaceMixin
from kiln._tables import PB_TO_DEVICE, PB_TO_DTYPE, PB_TO_LAYOUT, PB_TO_MEMORY_FORMAT
from kiln.deserialize import resolve_target
from kiln.errors import SerializeError
from kiln.guards import eval_expr, eval_symint
from kiln.runtime import RuntimeUnavailable

_SO = proto.Binary.KIND_SHARED_OBJECT
_CUDA_KINDS = (proto.Binary.KIND_CUBIN, proto.Binary.KIND_PTX)
_MAX_GRID_X = (1 << 31) - 1
_MAX_BLOCK_X = 1024
_GEMM = "cublasLt.matmul"
_GEMM_PARAMS = 18  # server/lower/gemm_step.h kGemmParamCount
_GEMM_DTYPES = (proto.DTYPE_FLOAT32, proto.DTYPE_FLOAT16, proto.DTYPE_BFLOAT16)


class PlanExecutor:
    """Loads a plan once (validates it, resolves targets, loads binaries) and runs it per call."""

    def __init__(self, artifact, graph, constants=None, runtime_loader=None, device=None, poison=False):
        """artifact: kiln.proto.Artifact. graph: the request's kiln.proto.Graph (symbols, constants,
        output metadata). constants: {constant name: tensor} held by the client (default: rebuilt
        from Graph.constants). runtime_loader: a callable returning a kiln.runtime.Runtime; called
        only when the plan has kernel steps. device: the torch.device the graph's inputs are on;
        for a CUDA artifact its binaries are loaded there now (else at the first call). poison: fill
        every OUTPUT value and the workspace with NaN (integers: their largest value; the
        workspace's bytes with 0xFF, a NaN in every float width) when allocated (option
        poison_buffers): a step that reads bytes no step wrote then gives NaN, not a stale value."""
        self.poison = poison
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
        # | ("cuda", [CudaLaunchSpec]) | ("library", ...) | ("copies", [(dst, src, outputs, where)])
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
        self._steps = merge_copies(self._steps, self.values, self._root)
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
        return self._view_chain(i)[-1]

    def _view_chain(self, i):
        """[i, the value i views, the value that one views, ... its root] (plan load refuses
        views that form a cycle)."""
        chain = [i]
        while self.values[i].storage == _PV.STORAGE_VIEW:
            i = self.values[i].index
            chain.append(i)
        return chain

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
            # With the values it views, down to its root: _view_pointer reads the root's pointer.
            self._kernel_consumers.update(self._view_chain(a))
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
                start = time.perf_counter()
                program = _Program(self, device, symbols)
                stats_mod.add_to("client_time_s", "program", time.perf_counter() - start)
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


# -- the per-call program ---------------------------------------------------------------------

_MAX_PROGRAMS = 64  # programs kept per plan (one per device for static plans)
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction  # no __torch_function__ modes or subclasses
_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_FAST_EMPTY = {t: getattr(_GUARDS, f"_empty_strided_{t}", None) for t in ("cpu", "cuda")}
_CUDA_CURRENT = getattr(torch._C, "_cuda_getDevice", None)
_TENSORS = itertools.repeat(torch.Tensor)  # isinstance's second argument, for map()


class _Program(_WorkspaceMixin, _AtenMixin, _KernelMixin):
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
        # The CUDA device allocations go to (_allocator), made current for each call if it is not.
        self.cuda_device = (device if device is not None and device.type == "cuda" and device.index is not None
                            and _FAST_EMPTY["cuda"] is not None and _CUDA_CURRENT is not None else None)
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
            elif entry[0] == "copies":
                self._emit_copies(entry[1])
            else:
                self._emit_kernels(entry[1])
        self._emit_outputs()
        self.tail = [None] * (self.num_slots - k)
        self.check_inputs = _getter(self.read_inputs) if self.read_inputs else None
        self.pool = [self._new_tables()] if self.table_builders else None
        self.code = tuple(self.code)

    # -- per call ---------------------------------------------------------------------------------

    def __call__(self, inputs):
        if self.cuda_device is not None and _CUDA_CURRENT() != self.cuda_device.index:
            with _device_guard(self.cuda_device.index):  # what the fast allocations use
                return self(inputs)
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
            with _NO_TORCH_FUNCTION():  # aten steps call bindings as OpOverloads would (_exec_aten)
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
        m, symbols = self.ex.values[i].meta, self.symbols
        try:  # eval_symint, inlined: a plan has a few hundred values, built at the first call
            sizes, strides = (tuple([eval_expr(s.expr, symbols) if s.WhichOneof("value") == "expr" else s.constant
                                     for s in field]) for field in (m.sizes, m.strides))
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

    def _allocator(self, meta, dtype, device):
        """() -> a new tensor of value meta's sizes and strides. torch's own allocation functions
        for compiled code where this torch has them (Inductor's, about half the host time of
        torch.empty_strided: a ResNet-50 training step allocates ~570 tensors): on the CPU, or on
        the program's CUDA device, which __call__ makes current."""
        fast = _FAST_EMPTY.get(device.type)
        if fast is not None and (device.type == "cpu" or device == self.cuda_device):
            return functools.partial(fast, meta[0], meta[1], dtype)
        return functools.partial(torch.empty_strided, meta[0], meta[1], dtype=dtype, device=device)

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
            alloc = self._allocator(meta, dtype, self._device_of(i))
            if ex.poison:
                alloc = _poisoned(alloc)

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
