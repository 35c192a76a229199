"""kiln.specialize: static graphs made from symbolic ones for concrete inputs (no kilnd needed)."""

import operator

import pytest
import torch
import torch.nn as nn

from kiln import specialize
from kiln.guards import GuardFailure
from kiln_capture import assert_same_outputs, capture


class Attention(nn.Module):
    """Sizes read from the input (view/reshape by them), a softmax over the sequence."""

    def __init__(self, d=8):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, -1)
        a = torch.softmax(q @ k.transpose(1, 2) / d ** 0.5, -1)
        return (a @ v).reshape(b * t, d)


def _symbolic_graphs():
    torch.manual_seed(0)
    graphs = capture(Attention(), [torch.randn(2, 5, 8)], dynamic=True, train=True)
    assert all(specialize.is_symbolic(g.example_inputs) for g in graphs)
    return graphs


def _assert_computes_the_same(static, gm, args):
    """The static graph on `args`' tensors, its folded sizes put back among the outputs, gives
    what the symbolic `gm` gives on `args`."""
    got = list(static.gm(*static.select(args)))
    for k, value in static.constant_outputs:
        got.insert(k, value)
    assert_same_outputs(got, gm(*args))


def _nodes(gm, op):
    return [n for n in gm.graph.nodes if n.op == op]


def test_is_symbolic_tells_fake_symbolic_inputs_from_static_ones():
    graphs = capture(Attention(), [torch.randn(2, 5, 8)], dynamic=False, train=True)
    assert not any(specialize.is_symbolic(g.example_inputs) for g in graphs)
    assert not specialize.is_symbolic([torch.randn(3), 4, 2.0])


def test_forward_and_backward_become_static_graphs_that_compute_the_same():
    forward, backward = _symbolic_graphs()
    for g in (forward, backward):
        args = g.real_inputs
        static = specialize.specialize(g.gm, args)
        ints = [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
        assert ints, "a dynamic capture passes its sizes as ints"
        assert [i for i, _ in static.fixed] == ints
        assert len(_nodes(static.gm, "placeholder")) == len(args) - len(ints)
        for n in _nodes(static.gm, "call_function"):
            assert isinstance(n.meta.get("val"), torch.Tensor) or n.meta.get("val") is None \
                or isinstance(n.meta.get("val"), (tuple, list)), n.format_node()
            assert not isinstance(n.meta.get("val"), torch.SymInt)
        for t in static.example_inputs:
            assert not specialize.is_symbolic([t])
        _assert_computes_the_same(static, g.gm, args)
    # The forward returns sizes for the backward: they come back as the constants they are now.
    static = specialize.specialize(forward.gm, forward.real_inputs)
    assert static.constant_outputs and all(type(v) is int for _, v in static.constant_outputs)


def test_sizes_fold_to_what_the_nodes_computed_not_their_metadata(monkeypatch):
    """torch 2.11's FakeTensorProp leaves a node's meta["val"] as the symbolic trace's SymInt when
    the node now computes a plain int (2.13 replaces it): folding must use the computed values
    (a GPT block's forward ran eagerly on the H200 before)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    graphs = _symbolic_graphs()
    original = FakeTensorProp.run_node

    def run_node_as_in_torch_2_11(self, n):
        before = n.meta.get("val")
        out = original(self, n)
        if isinstance(out, (int, float, bool)) and before is not None:
            n.meta["val"] = before
        return out

    monkeypatch.setattr(FakeTensorProp, "run_node", run_node_as_in_torch_2_11)
    for g in graphs:
        _assert_computes_the_same(specialize.specialize(g.gm, g.real_inputs), g.gm, g.real_inputs)


def test_the_backwards_inputs_follow_from_the_forwards_symbol_values():
    """bind_symbols on the forward's run-time inputs, bound_inputs on the backward's symbolic
    example inputs: the backward's actual input shapes (what kiln's per-shape backward prefetch
    compiles before the backward runs), from which a static specialization is made."""
    forward, backward = _symbolic_graphs()
    values = specialize.bind_symbols(forward.gm, forward.real_inputs)
    assert values and all(type(v) is int for v in values.values())
    inputs = specialize.bound_inputs(backward.example_inputs, values)
    assert len(inputs) == len(backward.real_inputs)
    for got, real in zip(inputs, backward.real_inputs):
        if isinstance(real, torch.Tensor):  # (capture's real inputs are clones: dense strides)
            assert (tuple(got.shape), got.dtype, got.device) == (tuple(real.shape), real.dtype, real.device)
        else:
            assert got == real
    ahead = specialize.specialize(backward.gm, inputs)
    assert not specialize.is_symbolic(ahead.example_inputs)
    ints = [i for i, a in enumerate(backward.real_inputs) if not isinstance(a, torch.Tensor)]
    assert [i for i, _ in ahead.fixed] == ints
    with pytest.raises(specialize.SpecializeError, match="not bound"):
        specialize.bound_inputs(backward.example_inputs, {})


class _Recorder:
    """Stands for the static graph's guard and executor: records what reaches them."""

    def __init__(self, outputs):
        self.seen, self.outputs = [], outputs
        self.kernel_steps = 3

    def bind(self, args):
        self.seen.append(args)
        return {}

    def __call__(self, args, symbols=None):
        self.seen.append(args)
        return [torch.zeros(1)] * self.outputs


def test_guard_and_executor_take_the_original_arguments():
    forward, _ = _symbolic_graphs()
    args = forward.real_inputs
    static = specialize.specialize(forward.gm, args)
    inner = _Recorder(len(_nodes(static.gm, "output")[0].args[0]))
    guard, executor = static.guard(inner), static.executor(inner)
    assert guard.bind(args) == {} and len(inner.seen[-1]) == len(static.tensors)
    i, value = static.fixed[0]
    for wrong in (value + 1, float(value)):
        changed = list(args)
        changed[i] = wrong
        with pytest.raises(GuardFailure, match=f"input {i}"):
            guard.bind(changed)
    with pytest.raises(GuardFailure, match="inputs"):
        guard.bind(args[:-1])
    out = executor(args)
    assert len(out) == inner.outputs + len(static.constant_outputs)
    for k, v in static.constant_outputs:
        assert out[k] == v
    assert executor.kernel_steps == 3  # the plan's facts stay readable through the wrapper


def _graph_with_a_size_assertion():
    """x -> x * 2, asserting (as Dynamo's torch._check leaves it in the graph) that x.size(0) is even."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    n = g.call_function(torch.ops.aten.sym_size.int, (x, 0))
    even = g.call_function(operator.eq, (g.call_function(operator.mod, (n, 2)), 0))
    g.call_function(torch.ops.aten._assert_scalar.default, (even, "x.size(0) must be even"))
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (x, 2)),))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_size_assertions_are_checked_then_dropped():
    gm = _graph_with_a_size_assertion()
    static = specialize.specialize(gm, [torch.ones(4, 3)])
    assert [n.target for n in static.gm.graph.nodes if n.op == "call_function"] == [torch.ops.aten.mul.Tensor]
    torch.testing.assert_close(static.gm(torch.ones(4, 3))[0], torch.full((4, 3), 2.0))
    with pytest.raises(specialize.SpecializeError, match="must be even|assert"):
        specialize.specialize(gm, [torch.ones(5, 3)])


def test_arguments_that_are_neither_tensors_nor_numbers_are_refused():
    forward, _ = _symbolic_graphs()
    args = list(forward.real_inputs)
    with pytest.raises(specialize.SpecializeError, match="inputs"):
        specialize.specialize(forward.gm, args[:-1])
    i = next(i for i, a in enumerate(args) if not isinstance(a, torch.Tensor))
    args[i] = "seven"
    with pytest.raises(specialize.SpecializeError, match=f"input {i} is a str"):
        specialize.specialize(forward.gm, args)
