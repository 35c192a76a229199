"""Guards of a compiled graph: do these run-time inputs match the metadata the artifact was
compiled for, and what are the values of the graph's size symbols?

An artifact is specialized to the TensorMeta of the graph's placeholders as serialized: dtype,
device kind, rank, sizes and strides (constants, or SymExprs over Graph.symbols for dynamic
shapes); and to the symbols' value ranges. Storage offsets are not guarded: kernels receive element
pointers already at the storage offset. Device indices are not guarded (not in the key either).

Symbols are bound from the first placeholder size/stride/int that is exactly that symbol; every
other occurrence and every compound expression is then evaluated and compared.

StaticGuard is InputGuard with a fast path for graphs without symbols (what kiln.backend uses for
each artifact). Imports torch at module level: StaticGuard's fast path reads torch.Tensor's
attributes directly.
"""

import itertools
import operator

import torch

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

    def bind(self, args):
        """Returns {symbol index: value}; raises GuardFailure naming the input and the mismatch."""
        import torch

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


_TENSORS = itertools.repeat(torch.Tensor)  # isinstance's second argument, for map()
_STRIDE = torch.Tensor.stride
_META = operator.attrgetter("shape", "dtype", "is_cuda", "is_cpu")
_MAX_ACCEPTED = 8


class StaticGuard:
    """kiln.guards.InputGuard with a fast path for graphs without symbols (every placeholder size,
    stride and int a constant, each tensor on a CPU or CUDA device kind): per call, one pass in C
    over the tensors' (sizes, dtype, device kind) and one over their strides, compared with the
    expected lists. Anything else (a mismatch, an exception, a symbolic graph) goes to
    InputGuard.bind, which decides and names the failure. Strides InputGuard accepts though they
    differ from the graph's (size-1 dimensions) are remembered (up to 8 sets), so that such inputs
    take the fast path from then on."""

    def __init__(self, graph):
        self.slow = InputGuard(graph)
        self.fast = self._plan(graph)
        self._accepted = set()

    @staticmethod
    def _plan(graph):
        if graph.symbols:
            return None
        from kiln._tables import PB_TO_DTYPE

        def constants(pbs):
            if any(pb.WhichOneof("value") == "expr" for pb in pbs):
                raise ValueError
            return tuple(pb.constant for pb in pbs)

        tensors, metas, strides, ints = [], [], [], []
        nodes = [n for n in graph.nodes if n.op == proto.Node.OP_PLACEHOLDER]
        try:
            for i, node in enumerate(nodes):
                kind = node.meta.WhichOneof("kind")
                if kind == "tensor":
                    m = node.meta.tensor
                    if not m.HasField("device") or m.device.kind not in (proto.DEVICE_KIND_CPU,
                                                                         proto.DEVICE_KIND_CUDA):
                        return None
                    cuda = m.device.kind == proto.DEVICE_KIND_CUDA
                    sizes = constants(m.sizes)
                    tensors.append(i)
                    metas.append((torch.Size(sizes), PB_TO_DTYPE.get(m.dtype), cuda, not cuda))
                    strides.append(constants(m.strides) if len(m.strides) == len(sizes) else None)
                elif kind == "sym_int":
                    if node.meta.sym_int.WhichOneof("value") == "expr":
                        return None
                    ints.append((i, node.meta.sym_int.constant))
        except ValueError:
            return None
        if not tensors:
            return None
        get = operator.itemgetter(*tensors) if len(tensors) > 1 else (lambda args, i=tensors[0]: (args[i],))
        return len(nodes), get, metas, strides, tuple(ints)

    def bind(self, args):
        """{symbol index: value} ({} here); raises kiln.guards.GuardFailure as InputGuard does."""
        fast = self.fast
        if fast is not None and len(args) == fast[0]:
            try:
                tensors = fast[1](args)
                if (all(map(isinstance, tensors, _TENSORS))
                        and list(map(_META, tensors)) == fast[2]
                        and all(type(args[i]) is int and args[i] == c for i, c in fast[4])):
                    strides = list(map(_STRIDE, tensors))
                    if strides == fast[3]:
                        return {}
                    strides = tuple(strides)
                    if strides in self._accepted:
                        return {}
                    symbols = self.slow.bind(args)
                    if len(self._accepted) < _MAX_ACCEPTED:
                        self._accepted.add(strides)
                    return symbols
            except GuardFailure:
                raise
            except Exception:
                pass
        return self.slow.bind(args)


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
