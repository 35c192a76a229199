"""Static specializations of symbolic-shape graphs: kilnd compiles static shapes only, so a graph
that Dynamo made dynamic (its automatic dynamic shapes after a second input shape,
torch._dynamo.mark_dynamic, torch.compile(dynamic=True)) is compiled once per concrete input
metadata met at run time, each a static graph, up to option max_graphs_per_function shapes
per graph (kiln.backend.CompiledGraph decides when, and keeps the specializations).

specialize(gm, args) makes that static graph: the graph re-traced with `args`' metadata (fake
tensors of static shapes), every size computation folded to its value (symbolic placeholders,
sym_size, SymInt arithmetic), the size assertions Dynamo and AOTAutograd leave in the graph checked
and dropped, and the non-tensor placeholders removed. Specialized.guard and Specialized.executor
take the original graph's arguments: the guard checks the removed arguments' values and the
remaining tensors, the executor passes on the tensors only and puts the folded sizes back among
the outputs (kilnd's plans return tensors).
"""

import operator

import sympy
import torch

# Nodes that only assert facts about sizes (their value is None): checked on the folded values,
# then dropped.
_ASSERTS = tuple(op for op in (
    getattr(torch.ops.aten, "_assert_scalar", None),
    getattr(torch.ops.aten, "sym_constrain_range", None),
    getattr(torch.ops.aten, "sym_constrain_range_for_size", None),
) if op is not None)
_SCALARS = (bool, int, float)


class SpecializeError(Exception):
    """The graph cannot be made static for these inputs (the message says why)."""


def is_symbolic(values):
    """Whether any of `values` (example inputs: fake tensors, SymInts) has a symbolic size,
    stride or value."""
    sym = (torch.SymInt, torch.SymFloat, torch.SymBool)
    for v in values:
        if isinstance(v, sym):
            return True
        if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt)
                                               for s in (*v.shape, *v.stride())):
            return True
    return False


def _targets(op):
    """The OpOverloads of `op` (an OpOverloadPacket) or `op` itself."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        return {getattr(op, name) for name in op.overloads()}
    return {op}


_ASSERT_TARGETS = set().union(*(_targets(op) for op in _ASSERTS)) if _ASSERTS else set()


def _fold(node, value):
    """Replaces every use of `node` by the Python scalar `value`."""
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)


def graph_copy(gm):
    """A GraphModule over a copy of `gm`'s graph (nodes and their meta copied; attributes shared)."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def retrace(gm, args):
    """(a copy of `gm` whose node.meta["val"] describe `args` with static shapes, the fake inputs
    it ran on, {node: what it computed}). The last, not meta["val"], holds the sizes: for a node
    that now computes a plain int, torch 2.11's FakeTensorProp leaves the symbolic trace's SymInt
    in meta["val"]. Raises what the propagation raised."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    copy = graph_copy(gm)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [_fake(mode, a) if isinstance(a, torch.Tensor) else a for a in args]
    results = {}

    class Prop(FakeTensorProp):
        def run_node(self, n):
            results[n] = out = super().run_node(n)
            return out

    Prop(copy, mode).propagate(*fakes)
    return copy, fakes, results


def specialize(gm, args):
    """A Specialized for `args` (the graph's run-time arguments: tensors and Python scalars);
    raises SpecializeError."""
    inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if inputs != len(args):
        raise SpecializeError(f"the graph has {inputs} inputs, the call passed {len(args)}")
    fixed = []  # (position, value) of the arguments that become constants
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) and not isinstance(a, _SCALARS):
            raise SpecializeError(f"input {i} is a {type(a).__name__}")
        if not isinstance(a, torch.Tensor):
            fixed.append((i, a))
    try:
        copy, fakes, results = retrace(gm, args)
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise SpecializeError(f"re-tracing with static shapes failed ({type(e).__name__}: {first})") from e
    graph = copy.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        val = results.get(node)
        if node.target in _ASSERT_TARGETS:
            _check_assert(node)
            graph.erase_node(node)
        elif isinstance(val, _SCALARS):
            _fold(node, val)
            graph.erase_node(node)
        elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise SpecializeError(f"node {node.name} ({node.target}) has a value known only at run time")
    for i, value in fixed:
        node = placeholders[i]
        _fold(node, value)
        graph.erase_node(node)
    constant_outputs = _outputs_without_scalars(graph)
    graph.lint()
    copy.recompile()
    tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    return Specialized(copy, tensors, tuple(fixed), [fakes[i] for i in tensors], constant_outputs)


def _outputs_without_scalars(graph):
    """Drops the Python scalars (folded sizes: AOTAutograd's forward returns the sizes its
    backward needs) from the graph's output list; returns [(position, value)] of them."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    results = out.args[0]
    if not isinstance(results, (list, tuple)):
        if isinstance(results, _SCALARS):
            raise SpecializeError("the graph's only output is a number")
        return ()
    scalars = tuple((k, r) for k, r in enumerate(results) if isinstance(r, _SCALARS))
    if scalars:
        out.args = (type(results)(r for r in results if not isinstance(r, _SCALARS)),)
    return scalars


def _fake(mode, t):
    """`t` as a static fake tensor of `mode` (a fake tensor of another mode too: bound_inputs')."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorConverter

    if isinstance(t, FakeTensor):
        meta = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
        return FakeTensorConverter().from_meta_and_device(mode, meta, t.device)
    return mode.from_tensor(t, static_shapes=True)


def bind_symbols(gm, args):
    """{symbol name: value} for the symbols that `gm`'s placeholders are (a SymInt input, a size
    or stride that is exactly a symbol), from the run-time `args`."""
    values = {}

    def bind(sym, value):
        if isinstance(sym, torch.SymInt) and getattr(sym.node.expr, "is_Symbol", False):
            values[str(sym.node.expr)] = int(value)

    for node, a in zip([n for n in gm.graph.nodes if n.op == "placeholder"], args):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(a, int):
            bind(val, a)
        elif isinstance(val, torch.Tensor) and isinstance(a, torch.Tensor) and val.dim() == a.dim():
            for sym, x in zip((*val.shape, *val.stride()), (*a.shape, *a.stride())):
                bind(sym, x)
    return values


def bound_inputs(example_inputs, values):
    """Static stand-ins for a graph's symbolic `example_inputs` (its placeholders' meta["val"])
    under the symbol `values` (bind_symbols, by name, of a graph traced with the same symbols: a
    backward's forward): ints, and fake tensors with the sizes and strides evaluated. Raises
    SpecializeError when a size needs a symbol that `values` lacks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def concrete(x):
        if not isinstance(x, torch.SymInt):
            return int(x)
        expr = x.node.expr
        expr = sympy.sympify(expr.xreplace({sym: sympy.Integer(values[str(sym)])
                                            for sym in expr.free_symbols if str(sym) in values}))
        if not expr.is_number:
            raise SpecializeError(f"size {x.node.expr} needs symbols that are not bound")
        return int(expr)

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    out = []
    for i, val in enumerate(example_inputs):
        if isinstance(val, torch.Tensor):
            sizes, strides = [concrete(x) for x in val.shape], [concrete(x) for x in val.stride()]
            with mode:
                out.append(torch.empty_strided(sizes, strides, dtype=val.dtype, device=val.device))
        elif isinstance(val, (torch.SymInt, int)):
            out.append(concrete(val))
        else:
            raise SpecializeError(f"input {i} is a {type(val).__name__}")
    return out


def _check_assert(node):
    args = [a for a in node.args if not isinstance(a, str)]
    if any(isinstance(a, torch.fx.Node) for a in args):
        raise SpecializeError(f"size assertion {node.name} depends on a value known only at run time")
    if node.target in _targets(getattr(torch.ops.aten, "_assert_scalar", operator.truth)):
        if not args or not args[0]:
            message = next((a for a in node.args if isinstance(a, str)), "")
            raise SpecializeError(f"size assertion {node.name} fails for these inputs ({message})")
    elif len(args) == 3:  # sym_constrain_range*(size, min, max)
        size, low, high = args
        if (low is not None and size < low) or (high is not None and size > high):
            raise SpecializeError(f"size assertion {node.name}: {size} is outside [{low}, {high}]")


class Specialized:
    """A static graph made from a symbolic one for some inputs: `gm` takes the tensors at
    `tensors` (positions among the original arguments); the arguments at `fixed` positions were
    these values."""

    def __init__(self, gm, tensors, fixed, example_inputs, constant_outputs=()):
        self.gm, self.tensors, self.fixed, self.example_inputs = gm, tensors, fixed, example_inputs
        self.num_args = len(tensors) + len(fixed)
        self.constant_outputs = constant_outputs  # [(position among the outputs, value)]

    def select(self, args):
        """The tensor arguments the static graph takes."""
        return [args[i] for i in self.tensors]

    def guard(self, inner):
        return _Guard(self, inner)

    def executor(self, inner):
        return _Executor(self, inner)


class _Guard:
    """bind(args) over the original arguments: the fixed values, then `inner` (the static graph's
    guard) on the tensors."""

    def __init__(self, spec, inner):
        self._spec, self._inner = spec, inner

    def bind(self, args):
        from kiln.guards import GuardFailure

        spec = self._spec
        if len(args) != spec.num_args:
            raise GuardFailure(f"{len(args)} inputs, the specialization takes {spec.num_args}")
        for i, value in spec.fixed:
            a = args[i]
            if type(a) is not type(value) or a != value:
                raise GuardFailure(f"input {i} is {a!r}, the specialization was made for {value!r}")
        return self._inner.bind(spec.select(args))


class _Executor:
    """The static graph's executor, called with the original arguments."""

    def __init__(self, spec, inner):
        self._spec, self.inner = spec, inner

    def __getattr__(self, name):  # op_fallbacks, kernel_steps, cuda...: the plan's
        return getattr(self.inner, name)

    def __call__(self, args, symbols=None):
        out = self.inner(self._spec.select(args), symbols)
        for k, value in self._spec.constant_outputs:
            out.insert(k, value)
        return out
