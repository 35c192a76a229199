"""kiln.v1.Graph -> runnable torch.fx.GraphModule (the inverse of kiln.serialize).

Contract: deserialize_graph rebuilds the nodes in order with their names, resolves targets through
torch.ops.<ns>.<op>.<overload>, the operator and math modules and torch.sym_*, restores constants
as buffers of the module (with their recorded strides and device), and, unless
restore_meta=False, restores node.meta["val"] as FakeTensors/SymInts over a fresh ShapeEnv that
holds the graph's symbols (same names, hints and ranges), plus stack_trace, nn_module_stack and
seq_nr. Serializing the result gives the same message. What the protocol does not carry cannot
come back: a float/bool result's meta["val"] is restored as 0.0 / False (ValueMeta keeps only the
type), a multi-output meta["val"] as a list, and nn_module_stack entries without module classes.

Malformed input raises SerializeError naming the node.
"""

import math
import operator
import sys

import sympy
import torch
import torch.fx

from kiln import proto
from kiln._symbolic import INT64_MAX, INT64_MIN, _var_to_val, decode
from kiln._tables import PB_TO_DEVICE, PB_TO_DTYPE, PB_TO_LAYOUT, PB_TO_MEMORY_FORMAT
from kiln.errors import SerializeError

_OPS = {
    proto.Node.OP_PLACEHOLDER: "placeholder",
    proto.Node.OP_GET_ATTR: "get_attr",
    proto.Node.OP_CALL_FUNCTION: "call_function",
    proto.Node.OP_OUTPUT: "output",
}


def deserialize_graph(pb_graph, *, restore_meta=True):
    """Rebuilds a runnable torch.fx.GraphModule from a kiln.proto.Graph. Raises SerializeError."""
    root = torch.nn.Module()
    for c in pb_graph.constants:
        _set_buffer(root, c.name, constant_tensor(c))
    meta = _MetaBuilder(pb_graph.symbols) if restore_meta else None
    graph = torch.fx.Graph()
    env = {}
    for pb in pb_graph.nodes:
        where = f"node '{pb.name}' ({proto.Node.Op.Name(pb.op)} {pb.target})"
        if pb.op not in _OPS:
            raise SerializeError(f"{where}: op cannot be rebuilt as an FX node")
        if pb.name in env:
            raise SerializeError(f"{where}: a node of this name already exists")
        try:
            target = resolve_target(pb.target) if pb.op == proto.Node.OP_CALL_FUNCTION else pb.target
            args = tuple(_argument(a, env, meta) for a in pb.args)
            kwargs = {k.name: _argument(k.value, env, meta) for k in pb.kwargs}
            node = graph.create_node(_OPS[pb.op], target, args, kwargs, name=pb.name)
            if meta is not None and pb.HasField("meta"):
                node.meta["val"] = meta.value(pb.meta)
        except SerializeError as e:
            raise SerializeError(f"{where}: {e}") from None
        _restore_debug(pb.debug, node)
        env[pb.name] = node
    return torch.fx.GraphModule(root, graph)


def resolve_target(spelling):
    """"aten.add.Tensor" -> torch.ops.aten.add.Tensor; "operator.getitem" -> operator.getitem."""
    head, _, rest = spelling.partition(".")
    modules = {"operator": operator, "math": math}
    if head in modules and rest and "." not in rest:
        found = getattr(modules[head], rest, None)
    elif head == "torch" and rest.startswith(("sym_", "_sym_")):
        found = getattr(torch, rest, None)
    else:
        parts = spelling.split(".")
        found = None
        if len(parts) == 3 and all(parts):
            try:
                found = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
            except (AttributeError, RuntimeError):
                found = None
    if not callable(found):
        raise SerializeError(f"target {spelling!r} does not name an op known to this torch")
    return found


def constant_tensor(c):
    """TensorConstant -> tensor with the recorded sizes, strides, offset and device."""
    m = c.meta
    if m.dtype not in PB_TO_DTYPE:
        raise SerializeError(f"constant {c.name!r}: unknown dtype {m.dtype}")
    dtype = PB_TO_DTYPE[m.dtype]
    sizes, strides = [_const_size(s, c.name) for s in m.sizes], [_const_size(s, c.name) for s in m.strides]
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(sizes)
    if len(c.data) != numel * itemsize:
        raise SerializeError(f"constant {c.name!r}: {len(c.data)} bytes of data for {numel} "
                             f"elements of {dtype}")
    raw = torch.frombuffer(bytearray(c.data), dtype=torch.uint8) if c.data else torch.empty(0, dtype=torch.uint8)
    if sys.byteorder != "little" and itemsize > 1:
        raw = raw.reshape(-1, itemsize // (2 if dtype.is_complex else 1)).flip(1).reshape(-1)
    flat = raw.view(dtype).reshape(sizes)
    if len(strides) != len(sizes):
        strides = list(torch.empty(sizes, dtype=dtype, device="meta").stride())
    offset = _const_size(m.storage_offset, c.name)
    extent = offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1 if numel else offset
    out = torch.empty(extent, dtype=dtype).as_strided(sizes, strides, offset)
    out.copy_(flat)
    if m.HasField("device"):
        device = _device(m.device)
        try:
            out = out.to(device)
        except (RuntimeError, AssertionError) as e:  # e.g. a cuda constant where torch has no CUDA
            raise SerializeError(f"constant {c.name!r} cannot be placed on {device}: {e}") from None
    return out.requires_grad_(m.requires_grad)


def _const_size(s, name):
    if s.WhichOneof("value") == "expr":
        raise SerializeError(f"constant {name!r} has a symbolic size")
    return s.constant


def _device(pb):
    if pb.kind not in PB_TO_DEVICE:
        raise SerializeError(f"unknown device kind {pb.kind}")
    kind = PB_TO_DEVICE[pb.kind]
    return torch.device(kind, pb.index) if pb.index >= 0 else torch.device(kind)


def _set_buffer(root, path, tensor):
    *parents, leaf = path.split(".")
    module = root
    for p in parents:
        if not hasattr(module, p):
            module.add_module(p, torch.nn.Module())
        module = getattr(module, p)
    module.register_buffer(leaf, tensor)


def _argument(a, env, meta):
    kind = a.WhichOneof("value")
    if kind == "node":
        if a.node not in env:
            raise SerializeError(f"argument refers to {a.node!r}, which is not an earlier node")
        return env[a.node]
    if kind in ("int_value", "float_value", "bool_value", "string_value"):
        return getattr(a, kind)
    if kind == "dtype":
        if a.dtype not in PB_TO_DTYPE:
            raise SerializeError(f"unknown dtype {a.dtype}")
        return PB_TO_DTYPE[a.dtype]
    if kind == "device":
        return _device(a.device)
    if kind == "layout":
        return PB_TO_LAYOUT[a.layout]
    if kind == "memory_format":
        return PB_TO_MEMORY_FORMAT[a.memory_format]
    if kind == "none":
        return None
    if kind == "list":
        items = [_argument(i, env, meta) for i in a.list.items]
        return tuple(items) if a.list.is_tuple else items
    if kind == "sym_int":
        if meta is None:
            raise SerializeError("a symbolic argument needs restore_meta=True")
        return meta.sym_int_from_expr(a.sym_int)
    raise SerializeError(f"argument has no value (or one this client does not know: {kind})")


def _restore_debug(debug, node):
    if debug.stack_trace:
        node.meta["stack_trace"] = debug.stack_trace
    if debug.module_path:
        node.meta["nn_module_stack"] = {p: (p, "") for p in debug.module_path}
    if debug.seq_nr:
        node.meta["seq_nr"] = debug.seq_nr


class _MetaBuilder:
    """Turns ValueMeta back into FakeTensors / SymInts over one ShapeEnv per graph."""

    def __init__(self, pb_symbols):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.shape_env = ShapeEnv() if len(pb_symbols) else None
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        self.symbols, self.hints = [], {}
        for i, s in enumerate(pb_symbols):
            name = s.name or f"kiln_s{i}"
            backed = name.startswith("s")  # torch names backed size symbols s<N>, unbacked u<N>
            sym = sympy.Symbol(name, integer=True, positive=True) if backed else sympy.Symbol(name, integer=True)
            self.symbols.append(sym)
            if backed:
                _var_to_val(self.shape_env)[sym] = sympy.Integer(s.hint)
                self.hints[sym] = sympy.Integer(s.hint)
            if s.min_value or s.max_value:
                self.shape_env.var_to_range[sym] = _value_range(s.min_value, s.max_value)

    def value(self, vm):
        kind = vm.WhichOneof("kind")
        if kind == "tensor":
            return self.tensor(vm.tensor)
        if kind == "list":
            return [self.value(item) for item in vm.list.items]
        if kind == "sym_int":
            return self.sym_int(vm.sym_int)
        if kind == "none":
            return None
        if kind == "scalar_dtype":
            return False if vm.scalar_dtype == proto.DTYPE_BOOL else 0.0
        raise SerializeError(f"ValueMeta has no value (or one this client does not know: {kind})")

    def sym_int(self, pb):
        if pb.WhichOneof("value") == "expr":
            return self.sym_int_from_expr(pb.expr)
        return pb.constant

    def sym_int_from_expr(self, pb_expr):
        if self.shape_env is None:
            raise SerializeError("symbolic size in a graph without symbols")
        try:
            expr = decode(pb_expr, self.symbols)
        except ValueError as e:
            raise SerializeError(f"bad symbolic expression: {e}") from None
        if expr.is_Integer:
            return int(expr)
        hint = expr.xreplace(self.hints)
        hint = int(hint) if hint.is_Integer else None
        return self.shape_env.create_symintnode(expr, hint=hint)

    def tensor(self, m):
        if m.dtype not in PB_TO_DTYPE:
            raise SerializeError(f"unknown dtype {m.dtype}")
        if m.layout not in (proto.LAYOUT_UNSPECIFIED, proto.LAYOUT_STRIDED):
            raise SerializeError(f"cannot restore a tensor of layout {proto.Layout.Name(m.layout)}")
        sizes = [self.sym_int(s) for s in m.sizes]
        strides = [self.sym_int(s) for s in m.strides]
        offset = self.sym_int(m.storage_offset)
        kw = dict(dtype=PB_TO_DTYPE[m.dtype], device=_device(m.device))
        with self.fake_mode:
            if offset == 0:
                t = torch.empty_strided(sizes, strides, **kw)
            else:
                extent = offset + sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
                t = torch.empty(extent, **kw).as_strided(sizes, strides, offset)
            if m.requires_grad:
                t.requires_grad_(True)
        return t


def _value_range(lo, hi):
    from torch.utils._sympy.value_ranges import ValueRanges

    try:
        from torch.utils._sympy.numbers import int_oo
    except ImportError:  # torch < 2.4
        int_oo = sympy.oo
    lower = -int_oo if lo == INT64_MIN else sympy.Integer(lo)
    upper = int_oo if hi == INT64_MAX else sympy.Integer(hi)
    return ValueRanges(lower, upper)
