"""Round trips of graphs that torch.compile + AOTAutograd produce from real modules.

serialize -> bytes -> parse -> deserialize -> run on the real inputs the original graph ran on,
compare bit for bit; serializing the deserialized graph again must give the same message.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln_capture import capture
from kiln import deserialize_graph, proto, serialize_graph

KINDS = {"forward": proto.GRAPH_KIND_FORWARD, "backward": proto.GRAPH_KIND_BACKWARD,
         "inference": proto.GRAPH_KIND_INFERENCE}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), dim=-1)
        return self.out_proj((att @ v).transpose(1, 2).reshape(b, t, d))


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _same(expected, got, where):
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), where
        for i, (e, g) in enumerate(zip(expected, got)):
            _same(e, g, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert (got.dtype, got.shape, got.stride()) == (expected.dtype, expected.shape, expected.stride()), where
        assert torch.equal(got, expected), f"{where}: values differ"
    else:
        assert got == expected, where


def _clone(values):
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def roundtrip(c, name):
    kind = KINDS[c.kind]
    debug_name = f"{c.kind} of {name}"
    graph = serialize_graph(c.gm, c.example_inputs, kind=kind, debug_name=debug_name)
    parsed = proto.Graph.FromString(graph.SerializeToString())
    assert parsed == graph
    assert parsed.kind == kind and parsed.debug_name == debug_name
    gm = deserialize_graph(parsed)
    _same(c.gm(*_clone(c.real_inputs)), gm(*_clone(c.real_inputs)), f"{name} {c.kind} outputs")
    again = serialize_graph(gm, kind=kind, debug_name=debug_name)
    assert again == parsed, f"{name} {c.kind}: re-serializing the deserialized graph changed it"
    return parsed


def _check_structure(graph, gm):
    fx_nodes = list(gm.graph.nodes)
    assert [n.name for n in graph.nodes] == [n.name for n in fx_nodes]
    assert graph.nodes[-1].op == proto.Node.OP_OUTPUT
    for pb, n in zip(graph.nodes, fx_nodes):
        if n.op == "call_function":
            assert pb.target == (str(n.target) if isinstance(n.target, torch._ops.OpOverload)
                                 else f"operator.{n.target.__name__}")
        if n.op == "placeholder":
            assert pb.target == n.target
            assert pb.meta.WhichOneof("kind") in ("tensor", "sym_int"), pb.name
    targets = {n.target for n in graph.nodes}
    assert all(t.startswith(("aten.", "prims.", "operator.")) for t in targets
               if t and "." in t), targets
    return targets


def _tensor_meta_of(graph, name):
    node = next(n for n in graph.nodes if n.name == name)
    return node.meta.tensor


MODELS = {
    "mlp": (MLP, lambda: [torch.randn(4, 32)]),
    "attention": (Attention, lambda: [torch.randn(2, 6, 32)]),
    "conv": (ConvBlock, lambda: [torch.randn(2, 3, 8, 8)]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_forward_and_backward(name):
    torch.manual_seed(0)
    make, inputs = MODELS[name]
    model = make()
    captured = capture(model, inputs(), train=True)
    assert [c.kind for c in captured] == ["forward", "backward"]
    for c in captured:
        assert c.real_inputs is not None, f"{c.kind} graph never ran"
        graph = roundtrip(c, name)
        targets = _check_structure(graph, c.gm)
        placeholders = [n for n in graph.nodes if n.op == proto.Node.OP_PLACEHOLDER]
        if c.kind == "backward":
            assert any(n.name.startswith("tangents") for n in placeholders)
        else:
            assert all(n.name.startswith("primals") for n in placeholders)
        expected = {("mlp", "forward"): "aten.addmm.default", ("mlp", "backward"): "aten.mm.default",
                    ("attention", "forward"): "aten._softmax.default",
                    ("attention", "backward"): "aten._softmax_backward_data.default",
                    ("conv", "forward"): "aten.convolution.default",
                    ("conv", "backward"): "aten.convolution_backward.default"}[name, c.kind]
        assert expected in targets
        assert not graph.symbols
    fw = serialize_graph(captured[0].gm, captured[0].example_inputs)
    # Debug info from the user's module: module paths and stack traces of the forward graph.
    paths = {p for n in fw.nodes for p in n.debug.module_path}
    assert {"mlp": "fc1", "attention": "q_proj", "conv": "bn"}[name] in paths, paths
    assert any("forward" in n.debug.stack_trace for n in fw.nodes)


def test_conv_forward_meta_is_faithful():
    captured = capture(ConvBlock(), [torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)],
                       train=True)
    fw = captured[0]
    graph = serialize_graph(fw.gm, fw.example_inputs)
    for pb, node in zip(graph.nodes, fw.gm.graph.nodes):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            m = pb.meta.tensor
            assert [s.constant for s in m.sizes] == list(val.shape)
            assert [s.constant for s in m.strides] == list(val.stride())
            assert m.storage_offset.constant == val.storage_offset()
            assert m.dtype == {torch.float32: proto.DTYPE_FLOAT32, torch.int64: proto.DTYPE_INT64}[val.dtype]
            assert m.device.kind == proto.DEVICE_KIND_CPU
            assert m.device.index == -1 and m.layout == proto.LAYOUT_STRIDED
    # The channels-last input keeps its strides (8*3*8, 1, 8*3, 3).
    x = next(n for n in graph.nodes if n.op == proto.Node.OP_PLACEHOLDER and
             [s.constant for s in n.meta.tensor.sizes] == [2, 3, 8, 8])
    assert [s.constant for s in x.meta.tensor.strides] == [192, 1, 24, 3]
    roundtrip(fw, "conv channels_last")


def test_inference_graph():
    model = Attention().eval()
    with torch.no_grad():
        captured = capture(model, [torch.randn(2, 5, 32)])
    assert [c.kind for c in captured] == ["inference"]
    graph = roundtrip(captured[0], "attention")
    assert graph.kind == proto.GRAPH_KIND_INFERENCE


@pytest.mark.parametrize("name", ["mlp", "attention"])
def test_dynamic_shapes(name):
    torch.manual_seed(0)
    make, inputs = MODELS[name]
    captured = capture(make(), inputs(), dynamic=True, train=True)
    assert [c.kind for c in captured] == ["forward", "backward"]
    batch = inputs()[0].shape[0]
    for c in captured:
        graph = roundtrip(c, name)
        assert graph.symbols, "dynamic=True produced no symbols"
        assert batch in [s.hint for s in graph.symbols]
        for s in graph.symbols:
            assert s.name.startswith("s") and s.min_value >= 0 and s.max_value > s.min_value
        # Some tensor has a symbolic size, written as an expression over the symbol table.
        sym_sizes = [s.expr for n in graph.nodes if n.meta.WhichOneof("kind") == "tensor"
                     for s in n.meta.tensor.sizes if s.WhichOneof("value") == "expr"]
        assert sym_sizes
        assert all(0 <= e.symbol < len(graph.symbols) for e in sym_sizes if e.op == proto.SymExpr.OP_SYMBOL)
        # SymInt inputs are placeholders with sym_int meta.
        assert any(n.meta.WhichOneof("kind") == "sym_int" for n in graph.nodes
                   if n.op == proto.Node.OP_PLACEHOLDER)
    if name == "attention":
        # view(b, t, heads, head_dim) etc. take symbolic sizes: node references in a list.
        fw = serialize_graph(captured[0].gm, captured[0].example_inputs)
        view = next(n for n in fw.nodes if n.target == "aten.view.default")
        sizes = view.args[1].list.items
        assert any(a.WhichOneof("value") == "node" for a in sizes)
        # b * t on SymInts is an operator.mul node whose meta is a symbolic product.
        mul = next(n for n in fw.nodes if n.target == "operator.mul")
        assert mul.meta.sym_int.expr.op == proto.SymExpr.OP_MUL


class MixedPrecisionNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.softmax((self.fc(self.ln(x)).to(torch.bfloat16) * 2).float(), dim=-1)


def test_inductor_decompositions_give_prims_and_mixed_dtypes():
    from torch._inductor.decomposition import select_decomp_table

    torch.manual_seed(0)
    captured = capture(MixedPrecisionNorm(), [torch.randn(4, 16)], train=True,
                       decompositions=select_decomp_table())
    assert [c.kind for c in captured] == ["forward", "backward"]
    for c in captured:
        graph = roundtrip(c, "mixed precision norm")
        targets = {n.target for n in graph.nodes}
        assert "prims.convert_element_type.default" in targets, targets
        dtypes = {n.meta.tensor.dtype for n in graph.nodes if n.meta.WhichOneof("kind") == "tensor"}
        assert {proto.DTYPE_FLOAT32, proto.DTYPE_BFLOAT16} <= dtypes


def test_dynamic_strided_conv_has_floor_div_sizes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU())
    captured = capture(model, [torch.randn(2, 3, 11, 9)], dynamic=True, train=True)
    ops = set()

    def walk(e):
        ops.add(proto.SymExpr.Op.Name(e.op))
        for a in e.args:
            walk(a)

    for c in captured:
        graph = roundtrip(c, "strided conv")
        for n in graph.nodes:
            if n.meta.WhichOneof("kind") == "tensor":
                for s in list(n.meta.tensor.sizes) + list(n.meta.tensor.strides):
                    if s.WhichOneof("value") == "expr":
                        walk(s.expr)
    # (H - 3) // 2 + 1 and the strides built from it.
    assert {"OP_FLOOR_DIV", "OP_ADD", "OP_MUL", "OP_SYMBOL", "OP_CONSTANT"} <= ops, ops
