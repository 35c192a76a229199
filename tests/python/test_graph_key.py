"""The cache key end to end: graphs captured by real torch, serialized by the kiln client, and
hashed by a real kilnd (Compiler.Lookup computes the key and never compiles).

A key must hit wherever the generated code would be the same (other processes, other node names,
other device indices, other process-group names, keyword vs positional spelling) and only there.
"""
import json
import os
import pathlib
import subprocess
import sys

import grpc
import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln import proto
from kiln.rpc import KilnClient
from kilnd_server import Kilnd

HERE = pathlib.Path(__file__).resolve().parent
CPU = proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2")


@pytest.fixture(scope="module")
def client():
    server = Kilnd()
    with KilnClient(server.address) as c:
        yield c
    assert server.stop() == 0


def key_of(client, graph, target=CPU, options=None, client_info=None):
    request = proto.CompileRequest(graph=graph, target=target)
    if options is not None:
        request.options.CopyFrom(options)
    if client_info is not None:
        request.client.CopyFrom(client_info)
    reply = client.lookup(request, timeout=30)
    assert reply.source == proto.CACHE_SOURCE_MISS
    assert len(reply.key) == 64
    return reply.key


def capture_in_subprocess(tmp_path, name, hashseed, rename):
    out = tmp_path / name
    env = dict(os.environ, PYTHONHASHSEED=str(hashseed))
    subprocess.run([sys.executable, str(HERE / "capture_mlp.py"), str(out)] + (["--rename"] if rename else []),
                   check=True, env=env, timeout=300)
    graphs = []
    for path in sorted(out.glob("graph*.binpb")):
        g = proto.Graph()
        g.ParseFromString(path.read_bytes())
        graphs.append(g)
    return graphs, json.loads((out / "names.json").read_text())


def test_key_is_stable_across_processes_hash_seeds_and_node_names(client, tmp_path):
    first, names_a = capture_in_subprocess(tmp_path, "a", 1, rename=False)
    second, names_b = capture_in_subprocess(tmp_path, "b", 12345, rename=True)
    assert len(first) == len(second) == 2  # forward and backward of a training step
    assert names_a != names_b, "the second capture must really use other node names"
    for a, b in zip(first, second):
        assert a != b  # the messages differ (names) ...
        assert key_of(client, a) == key_of(client, b)  # ... the keys do not


def rewrite_device_index(graph, index):
    """Every Device in the message set to cuda:<index> (metadata and arguments)."""
    g = proto.Graph()
    g.CopyFrom(graph)

    def fix_meta(meta):
        if meta.HasField("tensor"):
            meta.tensor.device.kind = proto.DEVICE_KIND_CUDA
            meta.tensor.device.index = index
        elif meta.HasField("list"):
            for item in meta.list.items:
                fix_meta(item)

    def fix_arg(arg):
        if arg.HasField("device"):
            arg.device.kind = proto.DEVICE_KIND_CUDA
            arg.device.index = index
        elif arg.HasField("list"):
            for item in arg.list.items:
                fix_arg(item)

    for node in g.nodes:
        fix_meta(node.meta)
        for arg in node.args:
            fix_arg(arg)
        for kw in node.kwargs:
            fix_arg(kw.value)
    return g


def fake_cuda_capture(device):
    """An inference graph captured with make_fx on FakeTensors placed on `device` (no GPU needed)."""
    def block(x, w, b, g):
        h = torch.nn.functional.linear(x, w, b)
        return torch.nn.functional.layer_norm(torch.nn.functional.gelu(h), (16,), g).softmax(-1)

    with FakeTensorMode():
        args = [torch.randn(4, 8, device=device), torch.randn(16, 8, device=device),
                torch.randn(16, device=device), torch.randn(16, device=device)]
        gm = make_fx(block, tracing_mode="fake", pre_dispatch=False)(*args)
    return kiln.serialize_graph(gm, kind=proto.GRAPH_KIND_INFERENCE)


def test_cuda_device_index_is_not_in_the_key(client):
    sm90 = proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90")
    on0 = fake_cuda_capture("cuda:0")
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        # With CUDA present, fake tensors still check the device ordinal: a one-GPU machine
        # cannot place even a fake tensor on cuda:1, so the index is rewritten instead.
        on1 = rewrite_device_index(on0, 1)
    else:
        on1 = fake_cuda_capture("cuda:1")
    assert on0.nodes[0].meta.tensor.device.index == 0
    assert on1.nodes[0].meta.tensor.device.index == 1
    assert key_of(client, on0, sm90) == key_of(client, on1, sm90)
    # Training graphs: a CPU-only torch cannot run autograd on (fake) CUDA tensors, so the
    # forward/backward graphs captured on the CPU get their device indices rewritten.
    train, _ = capture_in_subprocess_cached()
    for graph in train:
        assert key_of(client, rewrite_device_index(graph, 0), sm90) == \
            key_of(client, rewrite_device_index(graph, 3), sm90)


_CACHED = {}


def capture_in_subprocess_cached():
    if "train" not in _CACHED:
        import tempfile
        _CACHED["train"] = capture_in_subprocess(pathlib.Path(tempfile.mkdtemp(prefix="kiln-cap-")),
                                                 "c", 7, rename=False)
    return _CACHED["train"]


def traced(fn, *args):
    return kiln.serialize_graph(make_fx(fn)(*args))


def test_key_differs_when_shape_dtype_stride_target_or_option_differ(client):
    def f(x, y):
        return torch.relu(x * y + 1.0).sum(1)

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    base = key_of(client, traced(f, x, y))
    assert key_of(client, traced(f, x, y)) == base  # deterministic
    assert key_of(client, traced(f, torch.randn(5, 8), torch.randn(5, 8))) != base  # shape
    assert key_of(client, traced(f, x.double(), y.double())) != base  # dtype
    transposed = torch.randn(8, 4).t()  # same shape, strides (1, 4)
    assert key_of(client, traced(f, transposed, y)) != base  # stride
    graph = traced(f, x, y)
    assert key_of(client, graph, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v3")) != base
    sm80 = key_of(client, graph, proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_80"))
    sm90 = key_of(client, graph, proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90"))
    assert len({base, sm80, sm90}) == 3
    assert key_of(client, graph, options=proto.CompileOptions(disable_fusion=True)) != base
    assert key_of(client, graph, options=proto.CompileOptions(deterministic=True)) != base
    # Options that do not change generated code, and who is asking, stay out of the key.
    assert key_of(client, graph, options=proto.CompileOptions(keep_source=True, compile_timeout_ms=5)) == base
    assert key_of(client, graph, client_info=proto.ClientInfo(hostname="node17", rank=7, pid=42)) == base


def build_graph(calls):
    """An FX graph over two fake (4, 8) float inputs; `calls(graph, x, y)` adds nodes and returns
    the output node."""
    with FakeTensorMode() as mode:
        vals = [torch.empty(4, 8), torch.empty(4, 8)]
    g = torch.fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    x.meta["val"], y.meta["val"] = vals
    out = calls(g, x, y)
    g.output((out,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    with mode:  # fill meta["val"] of call nodes by running them on the fake inputs
        env = {x: vals[0], y: vals[1]}
        for node in g.nodes:
            if node.op == "call_function":
                args = torch.fx.node.map_arg(node.args, lambda n: env[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
                env[node] = node.meta["val"] = node.target(*args, **kwargs)
    return kiln.serialize_graph(gm)


def test_keyword_positional_and_default_spellings_share_a_key(client):
    aten = torch.ops.aten
    spellings = [
        lambda g, x, y: g.call_function(aten.sum.dim_IntList, (g.call_function(aten.add.Tensor, (x, y)), [1])),
        lambda g, x, y: g.call_function(aten.sum.dim_IntList,
                                        (g.call_function(aten.add.Tensor, (x, y), {"alpha": 1}), [1], False)),
        lambda g, x, y: g.call_function(aten.sum.dim_IntList,
                                        (g.call_function(aten.add.Tensor, (x,), {"other": y}), [1]),
                                        {"keepdim": False, "dtype": None}),
    ]
    keys = {key_of(client, build_graph(s)) for s in spellings}
    assert len(keys) == 1, keys
    different = key_of(client, build_graph(
        lambda g, x, y: g.call_function(aten.sum.dim_IntList, (g.call_function(aten.add.Tensor, (x, y), {"alpha": 2}), [1]))))
    assert different not in keys


def test_process_group_names_are_not_in_the_key(client):
    c10d = torch.ops._c10d_functional

    def all_reduce(group, op="sum"):
        def calls(g, x, y):
            reduced = g.call_function(c10d.all_reduce.default, (g.call_function(torch.ops.aten.add.Tensor, (x, y)), op, group))
            return g.call_function(c10d.wait_tensor.default, (reduced,))
        return calls

    def graph(group, op="sum"):
        # Collectives need a process group to run, not to be described: write the metadata directly.
        with FakeTensorMode():
            val = torch.empty(4, 8)
        g = torch.fx.Graph()
        x, y = g.placeholder("x"), g.placeholder("y")
        x.meta["val"] = y.meta["val"] = val
        out = all_reduce(group, op)(g, x, y)
        for node in g.nodes:
            if node.op == "call_function":
                node.meta["val"] = val
        g.output((out,))
        return kiln.serialize_graph(torch.fx.GraphModule(torch.nn.Module(), g))

    tp = key_of(client, graph("tp_group_ranks_0_1"))
    assert key_of(client, graph("7")) == tp
    assert key_of(client, graph("default_pg")) == tp
    assert key_of(client, graph("tp_group_ranks_0_1", op="avg")) != tp  # the reduction matters


def test_malformed_graphs_get_invalid_argument_naming_the_node(client):
    def f(x):
        return torch.exp(x) + 1

    good = traced(f, torch.randn(4, 8))
    exp_node = next(n for n in good.nodes if n.target == "aten.exp.default")

    dangling = proto.Graph()
    dangling.CopyFrom(good)
    node = next(n for n in dangling.nodes if n.name == exp_node.name)
    node.args[0].node = "no_such_node"
    with pytest.raises(grpc.RpcError) as err:
        key_of(client, dangling)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exp_node.name in err.value.details() and "no_such_node" in err.value.details()

    wrong_meta = proto.Graph()
    wrong_meta.CopyFrom(good)
    node = next(n for n in wrong_meta.nodes if n.name == exp_node.name)
    node.meta.tensor.sizes[1].constant = 9
    with pytest.raises(grpc.RpcError) as err:
        key_of(client, wrong_meta)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exp_node.name in err.value.details()

    native = proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="native")
    with pytest.raises(grpc.RpcError) as err:
        key_of(client, good, native)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "native" in err.value.details()
