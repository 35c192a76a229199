"""Argument kinds, symbolic sizes and constants, on small FX graphs built by hand.

Every graph here that can run on this CPU machine is also run after the round trip and compared
with the original.
"""

import math
import struct

import pytest
import torch
import torch.fx

from kiln import SerializeError, deserialize_graph, proto, serialize_graph
from kiln._symbolic import INT64_MAX

aten = torch.ops.aten


def build(fn, root=None):
    """fn(graph, x) -> output value; x is a placeholder. Returns a GraphModule."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(fn(g, x))
    return torch.fx.GraphModule(root if root is not None else torch.nn.Module(), g)


def wire(gm, *example_inputs, **kw):
    graph = serialize_graph(gm, list(example_inputs) or None, **kw)
    return proto.Graph.FromString(graph.SerializeToString())


def node(graph, name):
    return next(n for n in graph.nodes if n.name == name)


def call(graph, target, i=0):
    """The i-th call_function node of `target` ("aten.view.default") in a kiln.proto.Graph."""
    return [n for n in graph.nodes if n.target == target][i]


def bits(f):
    return struct.pack("<d", f)


NEG_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0123))[0]  # sign and payload set
SPECIALS = [math.inf, -math.inf, math.nan, NEG_NAN, -0.0, 0.0, 5e-324, 1.7976931348623157e308]


def test_float_specials_are_exact():
    def fn(g, x):
        return tuple(g.call_function(aten.fill.Scalar, (x, v)) for v in SPECIALS)

    gm = build(fn)
    graph = wire(gm)
    fills = [n for n in graph.nodes if n.target == "aten.fill.Scalar"]
    assert [bits(n.args[1].float_value) for n in fills] == [bits(v) for v in SPECIALS]
    back = deserialize_graph(graph)
    back_fills = [n for n in back.graph.nodes if n.target is aten.fill.Scalar]
    assert [bits(n.args[1]) for n in back_fills] == [bits(v) for v in SPECIALS]
    x = torch.zeros(3, dtype=torch.float64)
    for want, got in zip(gm(x), back(x)):
        assert want.numpy().tobytes() == got.numpy().tobytes()
    assert torch.signbit(back(x)[4]).all() and not torch.signbit(back(x)[5]).any()


def test_scalars_strings_bools_ints():
    def fn(g, x):
        a = g.call_function(aten.div.Tensor_mode, (x, 2.0), {"rounding_mode": "floor"})
        b = g.call_function(aten.sum.dim_IntList, (a, [0, -1], True))
        return (g.call_function(aten.add.Tensor, (b, -(2 ** 63))), b)

    gm = build(fn)
    graph = wire(gm)
    div, total = call(graph, "aten.div.Tensor_mode"), call(graph, "aten.sum.dim_IntList")
    assert div.kwargs[0].name == "rounding_mode" and div.kwargs[0].value.string_value == "floor"
    assert [a.int_value for a in total.args[1].list.items] == [0, -1]
    assert total.args[2].WhichOneof("value") == "bool_value" and total.args[2].bool_value is True
    assert call(graph, "aten.add.Tensor").args[1].int_value == -(2 ** 63)
    x = torch.arange(12.0).reshape(3, 4)
    for want, got in zip(gm(x), deserialize_graph(graph)(x)):
        assert torch.equal(want, got)
    with pytest.raises(SerializeError, match=r"node 'add_tensor'.*args\[1\].*does not fit in int64"):
        serialize_graph(build(lambda g, x: g.call_function(aten.add.Tensor, (x, 2 ** 63))))


@pytest.mark.parametrize("dtype", [d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None),
    getattr(torch, "uint16", None), getattr(torch, "uint32", None), getattr(torch, "uint64", None)) if d])
def test_dtypes(dtype):
    gm = build(lambda g, x: g.call_function(aten._to_copy.default, (x,), {"dtype": dtype}))
    graph = wire(gm)
    arg = call(graph, "aten._to_copy.default").kwargs[0].value
    assert proto.DType.Name(arg.dtype) == "DTYPE_" + str(dtype).split(".")[1].upper()
    back = deserialize_graph(graph)
    assert next(n for n in back.graph.nodes if n.op == "call_function").kwargs["dtype"] is dtype
    if dtype.is_floating_point or dtype.is_complex or dtype in (torch.int32, torch.int64, torch.bool):
        x = torch.tensor([0.5, -1.0, 3.0])
        assert torch.equal(gm(x), back(x)) and back(x).dtype == dtype


def test_unsupported_dtype_names_the_node():
    gm = build(lambda g, x: g.call_function(aten._to_copy.default, (x,), {"dtype": torch.qint8}))
    with pytest.raises(SerializeError, match=r"node '_to_copy_default'.*kwargs\['dtype'\].*torch.qint8"):
        serialize_graph(gm)


def test_devices():
    devices = [torch.device("cpu"), torch.device("cpu", 0), torch.device("cuda", 3), torch.device("cuda"),
               torch.device("meta")]

    def fn(g, x):
        return tuple(g.call_function(aten._to_copy.default, (x,), {"device": d}) for d in devices)

    graph = wire(build(fn))
    got = [n.kwargs[0].value.device for n in graph.nodes if n.op == proto.Node.OP_CALL_FUNCTION]
    assert [(d.kind, d.index) for d in got] == [
        (proto.DEVICE_KIND_CPU, -1), (proto.DEVICE_KIND_CPU, 0), (proto.DEVICE_KIND_CUDA, 3),
        (proto.DEVICE_KIND_CUDA, -1), (proto.DEVICE_KIND_META, -1)]
    back = deserialize_graph(graph)
    assert [n.kwargs["device"] for n in back.graph.nodes if n.op == "call_function"] == devices
    bad = build(lambda g, x: g.call_function(aten._to_copy.default, (x,), {"device": torch.device("xpu", 1)}))
    with pytest.raises(SerializeError, match=r"node '_to_copy_default'.*'xpu' is not supported"):
        serialize_graph(bad)


def test_layouts_and_memory_formats():
    def fn(g, x):
        empty = g.call_function(aten.empty.memory_format, ([2, 3, 4, 5],), {
            "dtype": torch.float32, "layout": torch.strided, "device": torch.device("cpu"),
            "pin_memory": False, "memory_format": torch.channels_last})
        filled = g.call_function(aten.fill.Scalar, (empty, 1.0))
        clone = g.call_function(aten.clone.default, (x,), {"memory_format": torch.channels_last})
        keep = g.call_function(aten.clone.default, (x,), {"memory_format": torch.preserve_format})
        dense = g.call_function(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
        return (filled, clone, keep, dense)

    gm = build(fn)
    graph = wire(gm)
    kw = {k.name: k.value for k in call(graph, "aten.empty.memory_format").kwargs}
    assert kw["layout"].layout == proto.LAYOUT_STRIDED
    assert kw["memory_format"].memory_format == proto.MEMORY_FORMAT_CHANNELS_LAST
    assert kw["pin_memory"].bool_value is False
    assert [call(graph, "aten.clone.default", i).kwargs[0].value.memory_format for i in range(3)] == [
        proto.MEMORY_FORMAT_CHANNELS_LAST, proto.MEMORY_FORMAT_PRESERVE, proto.MEMORY_FORMAT_CONTIGUOUS]
    back = deserialize_graph(graph)
    x = torch.randn(2, 3, 4, 5)
    for want, got in zip(gm(x), back(x)):
        assert torch.equal(want, got) and want.stride() == got.stride()
    assert back(x)[1].stride() == (60, 1, 15, 3)  # channels_last really applied

    others = [torch.sparse_coo, torch.sparse_csr, torch._mkldnn, torch.channels_last_3d]
    graph = wire(build(lambda g, x: g.call_function(aten.add.Tensor, (x, others))))
    items = call(graph, "aten.add.Tensor").args[1].list.items
    assert [items[0].layout, items[1].layout, items[2].layout, items[3].memory_format] == [
        proto.LAYOUT_SPARSE_COO, proto.LAYOUT_SPARSE_CSR, proto.LAYOUT_MKLDNN,
        proto.MEMORY_FORMAT_CHANNELS_LAST_3D]
    assert next(n for n in deserialize_graph(graph).graph.nodes if n.op == "call_function").args[1] == others


def test_none_and_nested_lists_and_tuples():
    def fn(g, x):
        idx = g.call_function(aten.arange.default, (3,), {"dtype": torch.int64, "device": torch.device("cpu")})
        index = g.call_function(aten.index.Tensor, (x, [None, idx]))
        cat = g.call_function(aten.cat.default, ([x, x], 0))
        return [index, (cat, None)]

    gm = build(fn)
    graph = wire(gm)
    items = call(graph, "aten.index.Tensor").args[1].list
    assert not items.is_tuple
    assert items.items[0].WhichOneof("value") == "none" and items.items[1].node == call(graph, "aten.arange.default").name
    out = node(graph, "output").args[0].list
    assert not out.is_tuple and out.items[1].list.is_tuple
    assert [i.WhichOneof("value") for i in out.items[1].list.items] == ["node", "none"]
    back = deserialize_graph(graph)
    output = next(n for n in back.graph.nodes if n.op == "output").args[0]
    assert isinstance(output, list) and isinstance(output[1], tuple) and output[1][1] is None
    x = torch.randn(4, 3)
    want, got = gm(x), back(x)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1][0], got[1][0]) and got[1][1] is None

    # Faithful, not normalized: arbitrary nesting survives as written.
    nested = ((1, [2.5, None, (True,)]), "s", [])
    graph = wire(build(lambda g, x: g.call_function(aten.add.Tensor, (x, nested))))
    assert next(n for n in deserialize_graph(graph).graph.nodes if n.op == "call_function").args[1] == nested


def test_placeholder_meta_from_example_inputs():
    gm = torch.fx.symbolic_trace(lambda x, y: torch.ops.aten.mul.Tensor(x, y))
    x = torch.randn(2, 3, dtype=torch.float16).t()
    graph = wire(gm, x, 7)
    m = node(graph, "x").meta.tensor
    assert m.dtype == proto.DTYPE_FLOAT16
    assert [s.constant for s in m.sizes] == [3, 2] and [s.constant for s in m.strides] == [1, 3]
    assert node(graph, "y").meta.sym_int.constant == 7
    assert not call(graph, "aten.mul.Tensor").HasField("meta")  # no meta["val"] and not a placeholder


# -- symbolic sizes -----------------------------------------------------------------------------

def _shape_env_symints():
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    syms = [env.create_symbol(v, ConstantSource(n), dynamic_dim=DimDynamic.DYNAMIC)
            for n, v in (("a", 6), ("b", 10))]
    return env, [env.create_symintnode(s, hint=h) for s, h in zip(syms, (6, 10))]


def render(e, graph):
    """SymExpr -> compact text with symbol names, e.g. (add 3 (mul s12 s40))."""
    op = proto.SymExpr
    if e.op == op.OP_CONSTANT:
        return str(e.constant)
    if e.op == op.OP_SYMBOL:
        return graph.symbols[e.symbol].name
    name = op.Op.Name(e.op)[3:].lower()
    return "(" + " ".join([name] + [render(a, graph) for a in e.args]) + ")"


@pytest.mark.filterwarnings("ignore:Raw Sym")  # FX warns about SymInt literals in args; they are the point
def test_symint_arguments_become_expression_trees():
    env, (a, b) = _shape_env_symints()
    values = [-a, b * a + 3, -(a * b), a * -3, a ** 2, a // 4, (a + b) % 3, torch.sym_max(a, b),
              torch.sym_min(a, 2 * b), a - a + 5]
    gm = build(lambda g, x: g.call_function(aten.view.default, (x, values)))
    graph = wire(gm)
    sa, sb = str(a.node.expr), str(b.node.expr)
    # In order of first appearance; hints and ranges from the shape env ([2, inf) for sizes).
    assert [(s.name, s.hint, s.min_value, s.max_value) for s in graph.symbols] == [
        (sa, 6, 2, INT64_MAX), (sb, 10, 2, INT64_MAX)]
    items = call(graph, "aten.view.default").args[1].list.items
    assert items[-1].WhichOneof("value") == "int_value" and items[-1].int_value == 5
    ab = " ".join(sorted([sa, sb], key=lambda n: sympy_key(n)))  # sympy's canonical factor order
    rendered = [render(i.sym_int, graph) for i in items[:-1]]
    assert rendered == [
        f"(neg {sa})", f"(add 3 (mul {ab}))", f"(neg (mul {ab}))", f"(mul -3 {sa})",
        f"(mul {sa} {sa})", f"(floor_div {sa} 4)", f"(mod (add {ab}) 3)", f"(max {ab})",
        f"(min {sa} (mul 2 {sb}))"]
    back = deserialize_graph(graph)
    restored = next(n for n in back.graph.nodes if n.op == "call_function").args[1]
    for want, got in zip(values, restored):
        # OP_MOD is Python's modulo: it comes back as PythonMod where torch had written Mod (its
        # variant for operands known to be non-negative, where the two agree).
        assert str(got).replace("PythonMod", "Mod") == str(want)
        if isinstance(got, torch.SymInt):
            assert got.node.hint == want.node.hint
        else:  # a SymInt that is a constant (a - a + 5) is written and read back as a plain int
            assert type(got) is int and got == int(want)
    assert wire(back) == graph


def sympy_key(name):
    import sympy

    return sympy.Symbol(name, integer=True, positive=True).sort_key()


@pytest.mark.filterwarnings("ignore:Raw Sym")
def test_unsupported_symbolic_values_name_the_node():
    env, (a, b) = _shape_env_symints()
    cases = [(a / b, r"symbolic SymFloat"), (a == b, r"symbolic SymBool"),
             (a ** b, r"exponent"), (a ** 9, r"exponent 9")]
    for value, why in cases:
        gm = build(lambda g, x: g.call_function(aten.view.default, (x, [value])))
        with pytest.raises(SerializeError, match=r"node 'view_default'.*args\[1\]\[0\].*" + why):
            serialize_graph(gm)


# -- constants ----------------------------------------------------------------------------------

def _constants_module():
    root = torch.nn.Module()
    root.register_buffer("bf16", torch.tensor([1.5, -2.25, 3.0e38, -0.0], dtype=torch.bfloat16))
    root.register_buffer("flags", torch.tensor([True, False, True]))
    root.register_buffer("big", torch.tensor([-(2 ** 62), 2 ** 62 + 1, -1], dtype=torch.int64))
    root.register_buffer("cplx", torch.tensor([1 + 2j, complex(0.0, -3.5)], dtype=torch.complex64))
    root.sub = torch.nn.Module()
    root.sub.register_buffer("half_t", torch.arange(6, dtype=torch.float16).reshape(2, 3).t())
    return root


def test_tensor_constants_bytes_and_round_trip():
    root = _constants_module()

    def fn(g, x):
        consts = [g.get_attr(n) for n in ("bf16", "flags", "big", "cplx", "sub.half_t")]
        return (g.call_function(aten.add.Tensor, (x, consts[2])), *consts)

    gm = build(fn, root)
    graph = wire(gm)
    by_name = {c.name: c for c in graph.constants}
    assert sorted(by_name) == ["bf16", "big", "cplx", "flags", "sub.half_t"]
    bf16_bits = root.bf16.view(torch.int16).tolist()
    assert by_name["bf16"].data == struct.pack("<4h", *bf16_bits)
    assert by_name["flags"].data == b"\x01\x00\x01"
    assert by_name["big"].data == struct.pack("<3q", -(2 ** 62), 2 ** 62 + 1, -1)
    assert by_name["cplx"].data == struct.pack("<4f", 1.0, 2.0, 0.0, -3.5)  # -3.5j has real part +0.0 here
    half = by_name["sub.half_t"]  # transposed: data is row-major of the (3, 2) view, meta keeps strides
    assert half.data == struct.pack("<6e", 0, 3, 1, 4, 2, 5)
    assert [s.constant for s in half.meta.strides] == [1, 3]
    assert half.meta.dtype == proto.DTYPE_FLOAT16
    assert node(graph, "sub_half_t").target == "sub.half_t"
    assert node(graph, "bf16").meta.tensor.dtype == proto.DTYPE_BFLOAT16  # meta from the constant

    back = deserialize_graph(graph)
    x = torch.tensor([1, 2, 3], dtype=torch.int64)
    for want, got in zip(gm(x), back(x)):
        assert want.dtype == got.dtype and want.stride() == got.stride() and torch.equal(want, got)
    assert wire(back) == graph


def test_constant_size_cap_names_the_node():
    root = torch.nn.Module()
    root.register_buffer("w1", torch.zeros(1 << 18))  # 1 MiB
    root.register_buffer("w2", torch.zeros(1 << 18))

    def fn(g, x):
        return (g.call_function(aten.add.Tensor, (x, g.get_attr("w1"))), g.get_attr("w2"))

    gm = build(fn, root)
    assert len(wire(gm).constants) == 2  # under the 64 MiB default
    with pytest.raises(SerializeError, match=r"node 'w1'.*1048576 bytes.*limit of 1000000 bytes"):
        serialize_graph(gm, max_constant_bytes=1_000_000)
    with pytest.raises(SerializeError, match=r"node 'w2'.*2097152 bytes.*limit of 1500000 bytes"):
        serialize_graph(gm, max_constant_bytes=1_500_000)
