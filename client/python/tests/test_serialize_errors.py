"""What kiln cannot represent is refused with a SerializeError that names the node and says why."""

import operator

import pytest
import torch
import torch.fx
import torch.nn as nn

from kiln import SerializeError, deserialize_graph, proto, serialize_graph

aten = torch.ops.aten


def _graph(fn):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(fn(g, x))
    return torch.fx.GraphModule(nn.Module(), g)


def my_helper(x):
    return x + 1


def test_call_method_is_refused():
    class M(nn.Module):
        def forward(self, x):
            return x.relu()

    with pytest.raises(SerializeError, match=r"node 'relu' \(call_method relu\): call_method nodes"):
        serialize_graph(torch.fx.symbolic_trace(M()))


def test_call_module_is_refused():
    with pytest.raises(SerializeError, match=r"node '_0' \(call_module 0\): call_module nodes"):
        serialize_graph(torch.fx.symbolic_trace(nn.Sequential(nn.ReLU())))


def test_python_callable_target_is_refused():
    gm = _graph(lambda g, x: g.call_function(my_helper, (x,), name="helper"))
    with pytest.raises(SerializeError, match=r"node 'helper' \(call_function .*my_helper\): "
                                             r"the target is not an aten/prims op"):
        serialize_graph(gm)


def test_overload_packet_and_torch_function_are_refused():
    with pytest.raises(SerializeError, match=r"node 'add'.*overload packet"):
        serialize_graph(_graph(lambda g, x: g.call_function(aten.add, (x, x), name="add")))
    with pytest.raises(SerializeError, match=r"node 'relu'.*not an aten/prims op"):
        serialize_graph(_graph(lambda g, x: g.call_function(torch.relu, (x,), name="relu")))


def test_operator_and_sym_helpers_are_accepted():
    def fn(g, x):
        n = g.call_function(aten.sym_size.int, (x, 0), name="n")
        m = g.call_function(operator.floordiv, (g.call_function(operator.mul, (n, 3)), 2))
        k = g.call_function(torch.sym_max, (m, n), name="k")
        item = g.call_function(operator.getitem, ((x, x), 1), name="item")
        return (g.call_function(aten.view.default, (item, [k, -1])),)

    gm = _graph(fn)
    graph = serialize_graph(gm)
    assert [n.target for n in graph.nodes if n.op == proto.Node.OP_CALL_FUNCTION] == [
        "aten.sym_size.int", "operator.mul", "operator.floordiv", "torch.sym_max", "operator.getitem",
        "aten.view.default"]
    x = torch.randn(4, 6)
    assert torch.equal(deserialize_graph(graph)(x)[0], gm(x)[0])


@pytest.mark.parametrize("value, kind", [(slice(1, 2), "slice"), (1j, "complex"),
                                         (torch.ones(2), "Tensor"), (Ellipsis, "ellipsis")])
def test_unrepresentable_argument_names_node_and_position(value, kind):
    gm = _graph(lambda g, x: g.call_function(aten.add.Tensor, (x, [1, value]), name="bad"))
    with pytest.raises(SerializeError, match=rf"node 'bad' \(call_function aten.add.Tensor\): "
                                             rf"args\[1\]\[1\]: a value of type {kind}"):
        serialize_graph(gm)


def test_unrepresentable_kwarg_and_meta():
    gm = _graph(lambda g, x: g.call_function(aten.add.Tensor, (x, x), {"alpha": 2 + 1j}, name="bad"))
    with pytest.raises(SerializeError, match=r"node 'bad'.*kwargs\['alpha'\]: a value of type complex"):
        serialize_graph(gm)
    gm = _graph(lambda g, x: g.call_function(aten.add.Tensor, (x, x), name="odd"))
    next(n for n in gm.graph.nodes if n.name == "odd").meta["val"] = "text"
    with pytest.raises(SerializeError, match=r"node 'odd'.*meta\[\"val\"\]: a value of type str"):
        serialize_graph(gm)


def test_get_attr_that_is_not_a_tensor():
    root = nn.Module()
    root.sub = nn.Linear(2, 2)
    g = torch.fx.Graph()
    g.output(g.get_attr("sub"))
    with pytest.raises(SerializeError, match=r"node 'sub' \(get_attr sub\).*is a Linear, not a tensor"):
        serialize_graph(torch.fx.GraphModule(root, g))


def test_deserialize_rejects_unknown_targets_and_references():
    graph = serialize_graph(_graph(lambda g, x: g.call_function(aten.neg.default, (x,), name="neg")))
    bad = proto.Graph()
    bad.CopyFrom(graph)
    bad.nodes[1].target = "aten.no_such_op.default"
    with pytest.raises(SerializeError, match=r"node 'neg'.*'aten.no_such_op.default' does not name an op"):
        deserialize_graph(bad)
    bad.CopyFrom(graph)
    bad.nodes[1].args[0].node = "ghost"
    with pytest.raises(SerializeError, match=r"node 'neg'.*refers to 'ghost', which is not an earlier node"):
        deserialize_graph(bad)
    bad.CopyFrom(graph)
    bad.nodes[1].target = "builtins.eval"
    with pytest.raises(SerializeError, match=r"does not name an op"):
        deserialize_graph(bad)


def test_higher_order_operator_is_refused():
    hop = torch.ops.higher_order.cond
    gm = _graph(lambda g, x: g.call_function(hop, (True, x, x, (x,)), name="branch"))
    with pytest.raises(SerializeError, match=r"node 'branch'.*higher-order operator cond is not supported"):
        serialize_graph(gm)
