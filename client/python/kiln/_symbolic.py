"""Symbolic sizes: sympy expressions (torch SymInt.node.expr) <-> kiln.v1.SymExpr.

Encoding (the decoder and the tests rely on it being this and only this):
  * Integer -> OP_CONSTANT; Symbol -> OP_SYMBOL (index into the graph's symbol table, in order of
    first appearance);
  * Add -> OP_ADD over its terms; Mul -> OP_MUL over its factors, except that a product whose
    numeric coefficient is exactly -1 becomes OP_NEG of the remaining product (-s0 -> NEG(s0),
    -s0*s1 -> NEG(MUL(s0, s1)); -3*s0 stays MUL(-3, s0));
  * Pow / PowByNatural with an integer exponent 0..MAX_POW_EXPONENT -> repeated OP_MUL (x**0 = 1);
  * FloorDiv, CleanDiv -> OP_FLOOR_DIV; CeilDiv -> OP_CEIL_DIV (torch normally rewrites it to a
    FloorDiv before we see it); Mod, PythonMod -> OP_MOD; Max, Min (torch's or sympy's) -> OP_MAX/MIN.
Anything else (rationals, floats, infinity, relations, other functions) is refused.
"""

import sympy
import torch
from torch.utils._sympy import functions as F

from kiln import proto

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
MAX_POW_EXPONENT = 8

_FLOOR_DIV = tuple(c for c in (getattr(F, "FloorDiv", None), getattr(F, "CleanDiv", None)) if c)
_CEIL_DIV = tuple(c for c in (getattr(F, "CeilDiv", None),) if c)
_MOD = tuple(c for c in (getattr(F, "Mod", None), getattr(F, "PythonMod", None), sympy.Mod) if c)
_MAX = tuple(c for c in (getattr(F, "Max", None), sympy.Max) if c)
_MIN = tuple(c for c in (getattr(F, "Min", None), sympy.Min) if c)
_POW = tuple(c for c in (getattr(F, "PowByNatural", None), sympy.Pow) if c)


class UnsupportedExpr(Exception):
    """Raised with a reason; the serializer adds the node and the whole expression."""


def _first_sym(values):
    """The first torch.SymInt/SymFloat/SymBool found in a nested value, or None."""
    if isinstance(values, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return values
    if isinstance(values, (list, tuple)):
        for v in values:
            found = _first_sym(v)
            if found is not None:
                return found
    if isinstance(values, torch.Tensor):
        for v in list(values.shape) + [values.storage_offset()]:
            if isinstance(v, torch.SymInt):
                return v
    return None


def _var_to_val(shape_env):
    # torch 2.13 renamed var_to_val (now a deprecated property) to backed_var_to_val.
    table = getattr(shape_env, "backed_var_to_val", None)
    return table if table is not None else getattr(shape_env, "var_to_val", {})


def _bound(value, default):
    try:
        if value.is_finite is False:
            return default
        number = int(value)
    except (TypeError, ValueError, AttributeError):
        return default
    return min(max(number, INT64_MIN), INT64_MAX)


class SymbolTable:
    """Collects the symbols of one graph into Graph.symbols, in order of first appearance."""

    def __init__(self, pb_symbols):
        self._pb = pb_symbols
        self._index = {}
        self.shape_env = None

    def note_shape_env(self, value):
        if self.shape_env is None:
            sym = _first_sym(value)
            if sym is not None:
                self.shape_env = getattr(sym.node, "shape_env", None)

    def index(self, symbol):
        if symbol not in self._index:
            self._index[symbol] = len(self._index)
            entry = self._pb.add(name=str(symbol))
            env = self.shape_env
            if env is not None:
                hint = _var_to_val(env).get(symbol)
                if hint is not None and hint.is_Integer:
                    entry.hint = int(hint)
                vr = getattr(env, "var_to_range", {}).get(symbol)
                if vr is not None:
                    # An unbounded side is written as INT64_MIN/INT64_MAX, so that a known lower
                    # bound with no upper bound does not read as "unknown" (0/0).
                    entry.min_value = _bound(vr.lower, INT64_MIN)
                    entry.max_value = _bound(vr.upper, INT64_MAX)
                    if entry.min_value == INT64_MIN and entry.max_value == INT64_MAX:
                        entry.min_value = entry.max_value = 0
        return self._index[symbol]

    def encode(self, expr, out):
        """Writes sympy `expr` into SymExpr `out`; raises UnsupportedExpr."""
        op = proto.SymExpr
        if isinstance(expr, sympy.Integer):
            value = int(expr)
            if not INT64_MIN <= value <= INT64_MAX:
                raise UnsupportedExpr(f"constant {value} does not fit in int64")
            out.op, out.constant = op.OP_CONSTANT, value
        elif isinstance(expr, sympy.Symbol):
            out.op, out.symbol = op.OP_SYMBOL, self.index(expr)
        elif isinstance(expr, sympy.Add):
            self._nary(op.OP_ADD, expr.args, out)
        elif isinstance(expr, sympy.Mul):
            coeff, rest = expr.as_coeff_mul()
            if coeff == -1 and rest:
                out.op = op.OP_NEG
                inner = rest[0] if len(rest) == 1 else sympy.Mul(*rest, evaluate=False)
                self.encode(inner, out.args.add())
            else:
                self._nary(op.OP_MUL, expr.args, out)
        elif isinstance(expr, _POW):
            base, exp = expr.args
            if not (exp.is_Integer and 0 <= int(exp) <= MAX_POW_EXPONENT):
                raise UnsupportedExpr(f"power with exponent {exp} (only integers 0..{MAX_POW_EXPONENT})")
            n = int(exp)
            if n == 0:
                out.op, out.constant = op.OP_CONSTANT, 1
            elif n == 1:
                self.encode(base, out)
            else:
                self._nary(op.OP_MUL, [base] * n, out)
        elif isinstance(expr, _FLOOR_DIV):
            self._nary(op.OP_FLOOR_DIV, expr.args, out)
        elif _CEIL_DIV and isinstance(expr, _CEIL_DIV):
            self._nary(op.OP_CEIL_DIV, expr.args, out)
        elif isinstance(expr, _MOD):
            self._nary(op.OP_MOD, expr.args, out)
        elif isinstance(expr, _MAX):
            self._nary(op.OP_MAX, expr.args, out)
        elif isinstance(expr, _MIN):
            self._nary(op.OP_MIN, expr.args, out)
        else:
            raise UnsupportedExpr(f"{type(expr).__name__} is not an integer operation kiln supports")

    def _nary(self, pb_op, args, out):
        out.op = pb_op
        for a in args:
            self.encode(a, out.args.add())


def decode(pb, symbols):
    """SymExpr -> sympy expression over `symbols` (a list of sympy.Symbol, by index)."""
    op = proto.SymExpr
    if pb.op == op.OP_CONSTANT:
        return sympy.Integer(pb.constant)
    if pb.op == op.OP_SYMBOL:
        if not 0 <= pb.symbol < len(symbols):
            raise ValueError(f"symbol index {pb.symbol} out of range ({len(symbols)} symbols)")
        return symbols[pb.symbol]
    args = [decode(a, symbols) for a in pb.args]
    arity = {op.OP_NEG: 1, op.OP_FLOOR_DIV: 2, op.OP_CEIL_DIV: 2, op.OP_MOD: 2}
    if pb.op in arity and len(args) != arity[pb.op]:
        raise ValueError(f"{op.Op.Name(pb.op)} takes {arity[pb.op]} args, got {len(args)}")
    if pb.op in (op.OP_ADD, op.OP_MUL, op.OP_MAX, op.OP_MIN) and len(args) < 2:
        raise ValueError(f"{op.Op.Name(pb.op)} takes two or more args, got {len(args)}")
    if pb.op == op.OP_ADD:
        return sympy.Add(*args)
    if pb.op == op.OP_MUL:
        return sympy.Mul(*args)
    if pb.op == op.OP_NEG:
        return -args[0]
    if pb.op == op.OP_FLOOR_DIV:
        return F.FloorDiv(*args)
    if pb.op == op.OP_CEIL_DIV:
        return F.CeilDiv(*args)
    if pb.op == op.OP_MOD:
        return F.PythonMod(*args)
    if pb.op == op.OP_MAX:
        return F.Max(*args)
    if pb.op == op.OP_MIN:
        return F.Min(*args)
    raise ValueError(f"unknown SymExpr op {pb.op}")
