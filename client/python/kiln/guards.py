"""Guards of a compiled graph: do these run-time inputs match the metadata the artifact was
compiled for, and what are the values of the graph's size symbols?

An artifact is specialized to the TensorMeta of the graph's placeholders as serialized: dtype,
device kind, rank, sizes and strides (constants, or SymExprs over Graph.symbols for dynamic
shapes); and to the symbols' value ranges. Storage offsets are not guarded: kernels receive element
pointers already at the storage offset. Device indices are not guarded (not in the key either).

Symbols are bound from the first placeholder size/stride/int that is exactly that symbol; every
other occurrence and every compound expression is then evaluated and compared.
Does not import torch at module level.
"""

from kiln import proto

_SYM = proto.SymExpr


class GuardFailure(Exception):
    """The inputs do not match; the message says which input and how."""


class UnboundSymbol(Exception):
    pass


def eval_expr(pb, symbols):
    """Evaluates a kiln.v1.SymExpr with Python integer semantics (floor division toward -inf)."""
    op = pb.op
    if op == _SYM.OP_CONSTANT:
        return pb.constant
    if op == _SYM.OP_SYMBOL:
        value = symbols.get(pb.symbol)
        if value is None:
            raise UnboundSymbol(f"symbol {pb.symbol} has no value")
        return value
    args = [eval_expr(a, symbols) for a in pb.args]
    if op == _SYM.OP_ADD:
        return sum(args)
    if op == _SYM.OP_MUL:
        out = 1
        for a in args:
            out *= a
        return out
    if op == _SYM.OP_NEG:
        return -args[0]
    if op == _SYM.OP_FLOOR_DIV:
        return args[0] // args[1]
    if op == _SYM.OP_CEIL_DIV:
        return -((-args[0]) // args[1])
    if op == _SYM.OP_MOD:
        return args[0] % args[1]
    if op == _SYM.OP_MAX:
        return max(args)
    if op == _SYM.OP_MIN:
        return min(args)
    raise ValueError(f"unknown SymExpr op {op}")


def eval_symint(pb, symbols):
    """kiln.v1.SymInt -> int."""
    if pb.WhichOneof("value") == "expr":
        return eval_expr(pb.expr, symbols)
    return pb.constant


def placeholders(graph):
    return [n for n in graph.nodes if n.op == proto.Node.OP_PLACEHOLDER]


def is_dynamic(graph):
    return len(graph.symbols) > 0


def _device_kind(device):
    return {"cpu": proto.DEVICE_KIND_CPU, "cuda": proto.DEVICE_KIND_CUDA,
            "meta": proto.DEVICE_KIND_META}.get(device.type, -1)


class InputGuard:
    """Checks run-time inputs against a graph's placeholders; bind() returns the symbol values."""

    def __init__(self, graph):
        from kiln._tables import PB_TO_DTYPE

        self.graph = graph
        self.nodes = placeholders(graph)
        self.symbols = list(graph.symbols)
        self._dtypes = PB_TO_DTYPE
        self._static = self._static_checks()

    def _static_checks(self):
        """For a graph without symbols: per input (dtype, device type or None, sizes, strides with
        None where not checked), so that bind() compares plain tuples; None otherwise."""
        from kiln._tables import PB_TO_DEVICE

        if self.symbols:
            return None
        checks = []
        for node in self.nodes:
            if node.meta.WhichOneof("kind") != "tensor":
                return None
            m = node.meta.tensor
            sizes = tuple(x.constant for x in m.sizes)
            strides = None
            if len(m.strides) == len(m.sizes):
                strides = tuple(None if size == 1 else x.constant for size, x in zip(sizes, m.strides))
            device = PB_TO_DEVICE.get(m.device.kind, "?") if m.HasField("device") else None
            checks.append((self._dtypes.get(m.dtype), device, sizes, strides))
        return checks

    def _passes_static(self, args, torch):
        if len(args) != len(self._static):
            return False
        for (dtype, device, sizes, strides), arg in zip(self._static, args):
            if not isinstance(arg, torch.Tensor) or arg.dtype != dtype or arg.shape != sizes or \
                    arg.layout != torch.strided or (device is not None and arg.device.type != device):
                return False
            if strides is not None:
                for want, got in zip(strides, arg.stride()):
                    if want is not None and want != got:
                        return False
        return True

    def bind(self, args):
        """Returns {symbol index: value}; raises GuardFailure naming the input and the mismatch."""
        import torch

        if self._static is not None and self._passes_static(args, torch):
            return {}  # the checks below would pass and bind nothing

        if len(args) != len(self.nodes):
            raise GuardFailure(f"the graph takes {len(self.nodes)} inputs, got {len(args)}")
        symbols = {}
        deferred = []  # (where, SymInt pb, actual)

        def check(where, pb, actual):
            if pb.WhichOneof("value") == "expr":
                e = pb.expr
                if e.op == _SYM.OP_SYMBOL:
                    bound = symbols.get(e.symbol)
                    if bound is None:
                        symbols[e.symbol] = actual
                    elif bound != actual:
                        raise GuardFailure(f"{where} is {actual}, but symbol "
                                           f"{self._sym_name(e.symbol)} is {bound}")
                    return
                deferred.append((where, pb, actual))
            elif pb.constant != actual:
                raise GuardFailure(f"{where} is {actual}, the artifact was compiled for {pb.constant}")

        for i, (node, arg) in enumerate(zip(self.nodes, args)):
            meta = node.meta
            kind = meta.WhichOneof("kind")
            where = f"input {i} ({node.name})"
            if kind == "tensor":
                m = meta.tensor
                if not isinstance(arg, torch.Tensor):
                    raise GuardFailure(f"{where} is a {type(arg).__name__}, not a tensor")
                if self._dtypes.get(m.dtype) != arg.dtype:
                    raise GuardFailure(f"{where} has dtype {arg.dtype}, the artifact was compiled "
                                       f"for {self._dtypes.get(m.dtype)}")
                if m.HasField("device") and _device_kind(arg.device) != m.device.kind:
                    raise GuardFailure(f"{where} is on {arg.device}, the artifact was compiled for "
                                       f"{proto.DeviceKind.Name(m.device.kind)}")
                if arg.dim() != len(m.sizes):
                    raise GuardFailure(f"{where} has {arg.dim()} dims, the artifact was compiled "
                                       f"for {len(m.sizes)}")
                if arg.layout != torch.strided:
                    raise GuardFailure(f"{where} has layout {arg.layout}")
                for d, (pb, actual) in enumerate(zip(m.sizes, arg.shape)):
                    check(f"{where}.size({d})", pb, int(actual))
                if len(m.strides) == len(m.sizes):
                    for d, (pb, actual) in enumerate(zip(m.strides, arg.stride())):
                        if arg.shape[d] == 1 and pb.WhichOneof("value") != "expr":
                            continue  # the stride of a size-1 dim is never used
                        check(f"{where}.stride({d})", pb, int(actual))
            elif kind == "sym_int":
                if isinstance(arg, bool) or not isinstance(arg, int):
                    try:
                        arg = int(arg)
                    except (TypeError, ValueError):
                        raise GuardFailure(f"{where} is a {type(arg).__name__}, not an int") from None
                check(where, meta.sym_int, arg)
        for where, pb, actual in deferred:
            try:
                expected = eval_symint(pb, symbols)
            except UnboundSymbol:
                raise GuardFailure(f"{where}: its size expression uses a symbol that no input "
                                   "provides directly") from None
            if expected != actual:
                raise GuardFailure(f"{where} is {actual}, the artifact expects {expected}")
        for index, sym in enumerate(self.symbols):
            value = symbols.get(index)
            if value is None or not (sym.min_value or sym.max_value):
                continue
            if not sym.min_value <= value <= sym.max_value:
                raise GuardFailure(f"symbol {self._sym_name(index)} = {value} is outside the range "
                                   f"[{sym.min_value}, {sym.max_value}] the artifact was compiled for")
        return symbols

    def _sym_name(self, index):
        if 0 <= index < len(self.symbols) and self.symbols[index].name:
            return self.symbols[index].name
        return f"#{index}"


def signature(args):
    """A hashable summary of run-time inputs' metadata (for per-specialization lookups)."""
    import torch

    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append((str(a.dtype), a.device.type, tuple(a.shape), tuple(a.stride())))
        elif isinstance(a, (int, float, bool)):
            out.append((type(a).__name__, a))
        else:
            out.append(type(a).__name__)
    return tuple(out)
