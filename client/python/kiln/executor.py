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
  * KernelStep: `symbol` of Artifact.binaries[`binary`] (a CPU shared object), called through the
    runtime library (kiln.runtime) with buffers = the data pointers of `args` values and scalars =
    the values of the graph symbols whose indices are listed in `scalar_args`. Consecutive kernel
    steps go to the runtime in one call.
  * Plan.outputs lists value indices in graph output order; -1 marks a graph output that is not a
    tensor (None, as AOTAutograd backward graphs return; or an int/SymInt, evaluated from the
    graph's output metadata). This matches server/lower/plan_builder.h.
  * LibraryStep, CUDA binaries: not supported yet (NotImplementedError at load, so the graph runs
    eagerly).
A plan that breaks these rules raises PlanError at load, or at run time when it depends on sizes.
"""

import logging
import threading

import torch

from kiln import proto
from kiln._tables import PB_TO_DEVICE, PB_TO_DTYPE, PB_TO_LAYOUT, PB_TO_MEMORY_FORMAT
from kiln.deserialize import resolve_target
from kiln.errors import SerializeError
from kiln.guards import eval_expr, eval_symint

log = logging.getLogger("kiln")

_PV = proto.PlanValue


class PlanError(RuntimeError):
    """The plan is malformed or does not match the tensors it runs on."""


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()


class PlanExecutor:
    """Loads a plan once (validates it, resolves targets, loads binaries) and runs it per call."""

    def __init__(self, artifact, graph, constants=None, runtime_loader=None):
        """artifact: kiln.proto.Artifact. graph: the request's kiln.proto.Graph (symbols, constants,
        output metadata). constants: {constant name: tensor} held by the client (default: rebuilt
        from Graph.constants). runtime_loader: a callable returning a kiln.runtime.Runtime; called
        only when the plan has kernel steps."""
        self.artifact = artifact
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
        self._steps = []  # ("aten", op, args, kwargs, outputs, node) | ("kernels", [(k, args, scalars)])
        self._local = threading.local()  # per thread: prepared kiln.runtime.Batch per kernel run
        self._kernel_consumers = set()
        has_kernels = any(s.WhichOneof("kind") == "kernel" for s in plan.steps)
        self._runtime = None
        self._modules = {}
        if has_kernels:
            if runtime_loader is None:
                raise NotImplementedError("the plan has kernel steps and no runtime library is available")
            self._runtime = runtime_loader()
        for index, step in enumerate(plan.steps):
            kind = step.WhichOneof("kind")
            if kind == "aten":
                self._steps.append(self._load_aten(index, step.aten))
            elif kind == "kernel":
                entry = self._load_kernel(index, step.kernel)
                if self._steps and self._steps[-1][0] == "kernels":
                    self._steps[-1][1].append(entry)
                else:
                    self._steps.append(("kernels", [entry]))
            elif kind == "library":
                raise NotImplementedError(f"step {index}: library step {step.library.function!r} is "
                                          "not supported by this client yet")
            else:
                raise PlanError(f"step {index}: empty or unknown step kind")
        for o in plan.outputs:
            if not -1 <= o < n:
                raise PlanError(f"plan output v{o} does not exist")
        out_nodes = [node for node in graph.nodes if node.op == proto.Node.OP_OUTPUT]
        # Sizes and strides that need no symbols, evaluated once: (sizes, strides) or None.
        self._static_meta = [self._const_meta(v.meta) for v in self.values]
        self._device_kind = [PB_TO_DEVICE.get(v.meta.device.kind, "cpu") if v.meta.HasField("device")
                             else None for v in self.values]
        self._output_metas = []
        if out_nodes and out_nodes[0].args and out_nodes[0].args[0].HasField("list"):
            by_name = {node.name: node for node in graph.nodes}
            for a in out_nodes[0].args[0].list.items:
                node = by_name.get(a.node) if a.WhichOneof("value") == "node" else None
                self._output_metas.append((a, node.meta if node is not None else None))

    @staticmethod
    def _const_meta(m):
        if any(x.WhichOneof("value") == "expr" for x in list(m.sizes) + list(m.strides)):
            return None
        sizes = [x.constant for x in m.sizes]
        strides = [x.constant for x in m.strides]
        if len(strides) != len(sizes):
            return None
        return sizes, strides

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
        if binary.kind != proto.Binary.KIND_SHARED_OBJECT:
            raise NotImplementedError(f"{where}: binaries of kind {proto.Binary.Kind.Name(binary.kind)} "
                                      "are not supported by this client yet")
        module = self._modules.get(step.binary)
        if module is None:
            module = self._runtime.load(binary.data)
            self._modules[step.binary] = module
        kernel = module.add_kernel(step.symbol)
        for a in step.args:
            if not 0 <= a < len(self.values):
                raise PlanError(f"{where}: argument v{a} does not exist")
            self._kernel_consumers.add(a)
        for s in step.scalar_args:
            if not 0 <= s < len(self.graph.symbols):
                raise PlanError(f"{where}: scalar argument {s} is not a symbol of the graph")
        return (module, kernel, list(step.args), list(step.scalar_args))

    # -- running ------------------------------------------------------------------------------

    def __call__(self, inputs, symbols=None):
        """Runs the plan. inputs: the graph's inputs (tensors and ints) in placeholder order.
        symbols: {symbol index: value} (kiln.guards.InputGuard.bind). Returns the outputs as a list."""
        symbols = symbols or {}
        run = _Run(self, inputs, symbols)
        with torch.no_grad():
            for entry in self._steps:
                if entry[0] == "aten":
                    run.aten(*entry[1:])
                else:
                    run.kernels(entry[1])
            outputs = []
            for i, o in enumerate(self.plan.outputs):
                outputs.append(run.get(o) if o >= 0 else self._non_tensor_output(i, symbols))
        return outputs

    def _non_tensor_output(self, i, symbols):
        if i >= len(self._output_metas):
            return None
        arg, meta = self._output_metas[i]
        if arg.WhichOneof("value") == "int_value":
            return arg.int_value
        if meta is not None and meta.WhichOneof("kind") == "sym_int":
            return eval_symint(meta.sym_int, symbols)
        return None


class _Run:
    """The state of one call of a plan."""

    def __init__(self, ex, inputs, symbols):
        self.ex = ex
        self.inputs = inputs
        self.symbols = symbols
        self.env = [None] * len(ex.values)
        self.device = None
        for t in inputs:
            if isinstance(t, torch.Tensor):
                self.device = t.device
                break
        self.workspace = None

    def size(self, pb):
        return eval_symint(pb, self.symbols)

    def meta_of(self, i):
        static = self.ex._static_meta[i]
        if static is not None:
            return static[0], static[1], 0  # (storage offsets are not used for allocation)
        m = self.ex.values[i].meta
        sizes = [self.size(s) for s in m.sizes]
        strides = [self.size(s) for s in m.strides]
        if len(strides) != len(sizes):
            strides = list(torch.empty(sizes, device="meta").stride()) if sizes else []
        return sizes, strides, (self.size(m.storage_offset) if m.HasField("storage_offset") else 0)

    def device_of(self, i):
        kind = self.ex._device_kind[i]
        if kind in (None, "meta"):
            return self.device or torch.device("cpu")
        if self.device is not None and self.device.type == kind:
            return self.device
        return torch.device(kind)

    def get(self, i):
        t = self.env[i]
        if t is not None:
            return t
        v = self.ex.values[i]
        dtype = self.ex._dtypes[i]
        kind = v.storage
        if kind == _PV.STORAGE_INPUT:
            t = self.inputs[v.index]
            if not isinstance(t, torch.Tensor):
                raise PlanError(f"value v{i}: graph input {v.index} is not a tensor")
        elif kind == _PV.STORAGE_OUTPUT:
            sizes, strides, _ = self.meta_of(i)
            t = torch.empty_strided(sizes, strides, dtype=dtype, device=self.device_of(i))
        elif kind == _PV.STORAGE_WORKSPACE:
            t = self._workspace_view(i, dtype)
        elif kind == _PV.STORAGE_VIEW:
            base = self.get(v.index)
            sizes, strides, _ = self.meta_of(i)
            t = base.as_strided(sizes, strides, base.storage_offset() + v.offset)
        elif kind == _PV.STORAGE_CONSTANT:
            t = self.ex._constants[v.index]
            device = self.device_of(i)
            if t.device != device:
                t = t.to(device)
                self.ex._constants[v.index] = t  # move once
        else:  # STEP
            raise PlanError(f"value v{i} is used before the step that produces it ran")
        self.env[i] = t
        return t

    def _workspace_view(self, i, dtype):
        ws_bytes = self.ex.plan.workspace_bytes
        if self.workspace is None:
            self.workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=self.device_of(i))
        v = self.ex.values[i]
        sizes, strides, _ = self.meta_of(i)  # storage offset 0 at `offset`: meta's is the graph's
        size = _itemsize(dtype)
        extent = sum((s - 1) * st for s, st in zip(sizes, strides)) + 1 if all(sizes) else 0
        if v.offset + extent * size > ws_bytes:
            raise PlanError(f"value v{i}: {extent * size} bytes at workspace offset {v.offset} "
                            f"overflow the {ws_bytes}-byte workspace")
        t = torch.empty(0, dtype=dtype, device=self.workspace.device)
        t.set_(self.workspace.untyped_storage(), v.offset // size, sizes, strides)
        return t

    def arg(self, tree):
        tag = tree[0]
        if tag == "c":
            return tree[1]
        if tag == "v":
            return self.get(tree[1])
        if tag == "sym":
            return eval_expr(tree[1], self.symbols)
        if tag == "list":
            items = [self.arg(x) for x in tree[1]]
            return tuple(items) if tree[2] else items
        if tag == "device":
            if self.device is not None and self.device.type == tree[1]:
                return self.device
            return torch.device(tree[1], tree[2]) if tree[2] >= 0 else torch.device(tree[1])
        raise PlanError(f"bad argument tree {tag}")

    def aten(self, op, args, kwargs, outputs, where):
        result = op(*[self.arg(a) for a in args], **{k: self.arg(a) for k, a in kwargs.items()})
        if len(outputs) == 1 and not isinstance(result, (tuple, list)):
            results = [result]
        elif isinstance(result, (tuple, list)):
            results = list(result)
            if len(results) < len(outputs):
                raise PlanError(f"{where}: returned {len(results)} values for {len(outputs)} outputs")
        else:
            raise PlanError(f"{where}: returned one value for {len(outputs)} outputs")
        for o, r in zip(outputs, results):
            if o < 0:
                continue
            v = self.ex.values[o]
            if not isinstance(r, torch.Tensor):
                raise PlanError(f"{where}: output v{o} is a {type(r).__name__}, not a tensor")
            if v.storage == _PV.STORAGE_STEP:
                sizes, strides, _ = self.meta_of(o)
                if list(r.shape) != sizes or r.dtype != self.ex._dtypes[o]:
                    raise PlanError(f"{where}: output v{o} is {r.dtype}{list(r.shape)}, the plan "
                                    f"says {self.ex._dtypes[o]}{sizes}")
                if o in self.ex._kernel_consumers and list(r.stride()) != strides and r.numel() > 1:
                    fixed = torch.empty_strided(sizes, strides, dtype=r.dtype, device=r.device)
                    fixed.copy_(r)
                    r = fixed
                self.env[o] = r
            else:
                self.get(o).copy_(r)

    def kernels(self, batch):
        local = self.ex._local
        prepared = getattr(local, "batches", None)
        if prepared is None:
            prepared = local.batches = {}
        run = prepared.get(id(batch))
        if run is None:
            run = prepared[id(batch)] = self.ex._runtime.prepare(
                [(module, kernel, len(args), len(scalars)) for module, kernel, args, scalars in batch])
        get, symbols = self.get, self.symbols
        buffers = [get(a).data_ptr() for _, _, args, _ in batch for a in args]
        values = []
        for _, _, _, scalars in batch:
            for s in scalars:
                if s not in symbols:
                    raise PlanError(f"kernel scalar argument: symbol {s} has no value")
                values.append(symbols[s])
        run.run(buffers, values)
