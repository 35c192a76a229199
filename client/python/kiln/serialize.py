"""torch.fx.GraphModule (aten level, as AOTAutograd produces it) -> kiln.v1.Graph.

Contract: serialize_graph writes the graph as it is: node names, ops, targets, args and kwargs
exactly as FX holds them (nothing is normalized to the op schema; the server canonicalizes),
node.meta["val"] as ValueMeta, debugging metadata, symbolic sizes over a symbol table and the
bytes of get_attr constants. What the protocol cannot represent is refused with SerializeError
naming the node and saying why; nothing is dropped silently.

Targets are spelled "aten.add.Tensor" (str of the OpOverload), "operator.getitem",
"operator.mul", "torch.sym_max", "math.sqrt".
"""

import ctypes
import math
import operator
import re
import sys

import torch
import torch.fx

from kiln import proto
from kiln._symbolic import INT64_MAX, INT64_MIN, SymbolTable, UnsupportedExpr
from kiln._tables import DEVICE_TO_PB, DTYPE_TO_PB, LAYOUT_TO_PB, MEMORY_FORMAT_TO_PB
from kiln.errors import SerializeError

DEFAULT_MAX_CONSTANT_BYTES = 64 << 20

_NODE_OPS = {
    "placeholder": proto.Node.OP_PLACEHOLDER,
    "get_attr": proto.Node.OP_GET_ATTR,
    "call_function": proto.Node.OP_CALL_FUNCTION,
    "output": proto.Node.OP_OUTPUT,
}


def serialize_graph(gm, example_inputs=None, *, kind=proto.GRAPH_KIND_UNSPECIFIED, debug_name="",
                    max_constant_bytes=DEFAULT_MAX_CONSTANT_BYTES):
    """Serializes `gm` into a kiln.proto.Graph.

    example_inputs: the graph's inputs in placeholder order (FakeTensors, tensors, ints, SymInts);
    used for a placeholder's ValueMeta when its node.meta["val"] is missing.
    kind: a kiln.proto.GRAPH_KIND_* value. debug_name: free text shown by kilnctl.
    max_constant_bytes: refuse the graph when its get_attr constants exceed this many bytes in all.
    Raises SerializeError.
    """
    return _Writer(gm, example_inputs, max_constant_bytes).write(kind, debug_name)


class _Writer:
    def __init__(self, gm, example_inputs, max_constant_bytes):
        if not isinstance(gm, torch.fx.GraphModule):
            raise TypeError(f"serialize_graph takes a torch.fx.GraphModule, not {type(gm).__name__}")
        self.gm = gm
        self.inputs = list(example_inputs) if example_inputs is not None else None
        self.max_constant_bytes = max_constant_bytes
        self.graph = proto.Graph()
        self.symbols = SymbolTable(self.graph.symbols)
        self.constants = set()  # get_attr targets already written
        self.constant_bytes = 0
        self.node = None  # the node being written, for error messages

    def fail(self, why):
        node = self.node
        raise SerializeError(f"node '{node.name}' ({node.op} {_describe(node.target)}): {why}")

    def write(self, kind, debug_name):
        self.graph.kind = kind
        self.graph.debug_name = debug_name
        for node in self.gm.graph.nodes:  # find the shape env before any symbol is recorded
            if self.symbols.shape_env is not None:
                break
            self.symbols.note_shape_env(node.meta.get("val"))
        if self.symbols.shape_env is None and self.inputs:
            self.symbols.note_shape_env(self.inputs)
        placeholder_index = 0
        for node in self.gm.graph.nodes:
            self.node = node
            if node.op not in _NODE_OPS:
                self.fail(f"{node.op} nodes are not produced by AOTAutograd and cannot be serialized")
            pb = self.graph.nodes.add(name=node.name, op=_NODE_OPS[node.op])
            val = node.meta.get("val", _MISSING)
            if node.op == "call_function":
                pb.target = self.target_name(node.target)
            else:
                pb.target = str(node.target)
            if node.op == "placeholder":
                if val is _MISSING and self.inputs is not None and placeholder_index < len(self.inputs):
                    val = self.inputs[placeholder_index]
                placeholder_index += 1
            elif node.op == "get_attr":
                tensor = self.constant(node)
                if val is _MISSING:
                    val = tensor
            for i, a in enumerate(node.args):
                self.argument(a, pb.args.add(), f"args[{i}]")
            for k, a in node.kwargs.items():
                self.argument(a, pb.kwargs.add(name=k).value, f"kwargs[{k!r}]")
            if val is not _MISSING:
                self.value_meta(val, pb.meta, 'meta["val"]')
            self.debug_info(node, pb.debug)
        return self.graph

    # -- targets ------------------------------------------------------------------------------

    def target_name(self, target):
        if isinstance(target, torch._ops.OpOverload):
            return str(target)
        if isinstance(target, torch._ops.OpOverloadPacket):
            self.fail("the target is an op overload packet; AOTAutograd graphs call a specific overload")
        if isinstance(target, torch._ops.HigherOrderOperator):
            self.fail(f"higher-order operator {target.name()} is not supported by kiln")
        name = getattr(target, "__name__", None)
        if isinstance(name, str):
            if getattr(operator, name, None) is target:
                return f"operator.{name}"
            if getattr(math, name, None) is target:
                return f"math.{name}"
            if name.startswith(("sym_", "_sym_")) and getattr(torch, name, None) is target:
                return f"torch.{name}"
        self.fail("the target is not an aten/prims op, an operator builtin, a math function or a "
                  "torch.sym_* helper; kiln only serializes those")

    # -- arguments ----------------------------------------------------------------------------

    def argument(self, value, out, where):
        if isinstance(value, torch.fx.Node):
            out.node = value.name
        elif isinstance(value, bool):
            out.bool_value = value
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                self.fail(f"{where}: integer {value} does not fit in int64")
            out.int_value = value
        elif isinstance(value, float):
            out.float_value = value
        elif isinstance(value, str):
            out.string_value = value
        elif isinstance(value, torch.dtype):
            out.dtype = self.dtype(value, where)
        elif isinstance(value, torch.device):
            self.device(value, out.device, where)
        elif isinstance(value, torch.layout):
            if value not in LAYOUT_TO_PB:
                self.fail(f"{where}: layout {value} has no kiln.v1 equivalent")
            out.layout = LAYOUT_TO_PB[value]
        elif isinstance(value, torch.memory_format):
            if value not in MEMORY_FORMAT_TO_PB:
                self.fail(f"{where}: memory format {value} has no kiln.v1 equivalent")
            out.memory_format = MEMORY_FORMAT_TO_PB[value]
        elif value is None:
            out.none.SetInParent()
        elif isinstance(value, (list, tuple)):
            out.list.SetInParent()
            out.list.is_tuple = isinstance(value, tuple)
            for i, item in enumerate(value):
                self.argument(item, out.list.items.add(), f"{where}[{i}]")
        elif isinstance(value, torch.SymInt):
            expr = self.sym_expr(value, where)
            if isinstance(expr, int):
                out.int_value = expr
            else:
                self.symbols_encode(expr, out.sym_int, where)
        elif isinstance(value, (torch.SymFloat, torch.SymBool)):
            self.fail(f"{where}: symbolic {type(value).__name__} {value} cannot be represented "
                      "(only SymInt arguments can)")
        else:
            self.fail(f"{where}: a value of type {type(value).__name__} ({_short(value)}) cannot be "
                      "represented in kiln.v1")

    def dtype(self, dtype, where):
        if dtype not in DTYPE_TO_PB:
            self.fail(f"{where}: dtype {dtype} has no kiln.v1 equivalent")
        return DTYPE_TO_PB[dtype]

    def device(self, device, out, where):
        if device.type not in DEVICE_TO_PB:
            self.fail(f"{where}: device type {device.type!r} is not supported (cpu, cuda, meta)")
        out.kind = DEVICE_TO_PB[device.type]
        out.index = -1 if device.index is None else device.index

    # -- symbolic sizes -----------------------------------------------------------------------

    def sym_expr(self, value, where):
        """A SymInt's sympy expression, or its int when it is a constant."""
        self.symbols.note_shape_env(value)
        expr = value.node.expr
        if expr.is_Integer:
            return int(expr)
        return expr

    def symbols_encode(self, expr, out, where):
        try:
            self.symbols.encode(expr, out)
        except UnsupportedExpr as e:
            self.fail(f"{where}: symbolic expression {expr} cannot be represented: {e}")

    def sym_int(self, value, out, where):
        if isinstance(value, torch.SymInt):
            value = self.sym_expr(value, where)
            if not isinstance(value, int):
                self.symbols_encode(value, out.expr, where)
                return
        if not isinstance(value, int) or not INT64_MIN <= value <= INT64_MAX:
            self.fail(f"{where}: {value!r} is not an int64 size")
        out.constant = value

    # -- metadata -----------------------------------------------------------------------------

    def value_meta(self, val, out, where):
        if val is None:
            out.none.SetInParent()
        elif isinstance(val, torch.Tensor):
            self.tensor_meta(val, out.tensor, where)
        elif isinstance(val, (bool, torch.SymBool)):
            out.scalar_dtype = proto.DTYPE_BOOL
        elif isinstance(val, (int, torch.SymInt)):
            self.sym_int(val, out.sym_int, where)
        elif isinstance(val, (float, torch.SymFloat)):
            out.scalar_dtype = proto.DTYPE_FLOAT64
        elif isinstance(val, (list, tuple)):
            out.list.SetInParent()
            for i, item in enumerate(val):
                self.value_meta(item, out.list.items.add(), f"{where}[{i}]")
        else:
            self.fail(f"{where}: a value of type {type(val).__name__} cannot be represented as ValueMeta")

    def tensor_meta(self, t, out, where):
        out.dtype = self.dtype(t.dtype, f"{where}.dtype")
        if t.layout not in LAYOUT_TO_PB:
            self.fail(f"{where}: layout {t.layout} has no kiln.v1 equivalent")
        out.layout = LAYOUT_TO_PB[t.layout]
        self.device(t.device, out.device, f"{where}.device")
        out.requires_grad = bool(t.requires_grad)
        for i, s in enumerate(t.shape):
            self.sym_int(s, out.sizes.add(), f"{where}.sizes[{i}]")
        if t.layout == torch.strided:
            for i, s in enumerate(t.stride()):
                self.sym_int(s, out.strides.add(), f"{where}.strides[{i}]")
            self.sym_int(t.storage_offset(), out.storage_offset, f"{where}.storage_offset")

    def debug_info(self, node, out):
        out.original_name = node.name
        out.stack_trace = node.meta.get("stack_trace") or ""
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            path = module_path(entry[0] if isinstance(entry, tuple) else entry)
            if path:
                out.module_path.append(path)
        seq_nr = node.meta.get("seq_nr")
        if isinstance(seq_nr, int) and INT64_MIN <= seq_nr <= INT64_MAX:
            out.seq_nr = seq_nr

    # -- constants ----------------------------------------------------------------------------

    def constant(self, node):
        target = str(node.target)
        obj = self.gm
        try:
            for part in target.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            self.fail(f"get_attr target {target!r} does not exist on the GraphModule")
        if not isinstance(obj, torch.Tensor):
            self.fail(f"get_attr target {target!r} is a {type(obj).__name__}, not a tensor constant")
        if target in self.constants:
            return obj
        if obj.device.type == "meta" or _is_fake(obj):
            self.fail(f"constant {target!r} has no data (a fake or meta tensor)")
        nbytes = obj.numel() * obj.element_size()
        total = self.constant_bytes + nbytes
        if total > self.max_constant_bytes:
            self.fail(f"constant {target!r} is {nbytes} bytes ({list(obj.shape)} {obj.dtype}); "
                      f"with the graph's other constants that makes {total} bytes, over the limit "
                      f"of {self.max_constant_bytes} bytes (max_constant_bytes)")
        if obj.layout != torch.strided:
            self.fail(f"constant {target!r} has layout {obj.layout}; only strided constants are sent")
        pb = self.graph.constants.add(name=target)
        self.tensor_meta(obj, pb.meta, f"constant {target!r}")
        pb.data = tensor_bytes(obj)
        self.constants.add(target)
        self.constant_bytes = total
        return obj


_MISSING = object()


def tensor_bytes(t):
    """The elements of `t`, contiguous in row-major order, as little-endian bytes."""
    flat = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    itemsize = flat.element_size()
    raw = flat.view(torch.uint8)
    if sys.byteorder != "little" and itemsize > 1:
        raw = raw.reshape(-1, itemsize).flip(1).contiguous().reshape(-1)
    if raw.numel() == 0:
        return b""
    return ctypes.string_at(raw.data_ptr(), raw.numel())


def module_path(text):
    """Dynamo's "L['self'].layers[0]._modules['attn']" -> "layers.0.attn"."""
    s = str(text)
    s = re.sub(r"^L\[['\"][^'\"]+['\"]\]", "", s)
    s = re.sub(r"\._modules\[['\"]([^'\"]+)['\"]\]", r".\1", s)
    s = re.sub(r"\[['\"]([^'\"]+)['\"]\]", r".\1", s)
    s = re.sub(r"\[(\d+)\]", r".\1", s)
    return s.lstrip(".")


def _is_fake(t):
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover
        return False
    return is_fake(t)


def _describe(target):
    if isinstance(target, (str, torch._ops.OpOverload)):
        return str(target)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name:
        return f"{module}.{name}" if module else name
    return _short(target)


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
