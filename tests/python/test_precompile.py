"""kiln.precompile against a real kilnd: graphs captured on meta tensors (no compute) and compiled
for a target without running anything must get the keys that a real torch.compile(backend="kiln")
process later asks for, so that it is served from the cache."""
import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
import kiln.backend
from kiln import proto
from kiln.precompiler import parse_target, rewrite_devices
from kiln.rpc import KilnClient
from kilnd_server import Kilnd, server_requests, fresh_kiln

MODEL = textwrap.dedent("""
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.ln, self.fc2 = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.ln(self.fc1(x)))).softmax(-1)
""")
namespace = {}
exec(MODEL, namespace)
MLP = namespace["MLP"]

CHILD = MODEL + textwrap.dedent("""
    import json, sys, warnings
    import kiln

    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend="kiln")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if sys.argv[1] == "inference":
            with torch.no_grad():
                got, want = compiled(x), model(x)
        else:
            got = compiled(x)
            got.sum().backward()
            grad = model.fc1.weight.grad.clone()
            model.zero_grad()
            want = model(x)
            want.sum().backward()
            assert torch.allclose(grad, model.fc1.weight.grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(json.dumps({"stats": kiln.stats(),
                      "warnings": [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]}))
""")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)


def nvrtc_library():
    """An NVRTC for kilnd's CUDA compiles (no GPU needed), or None."""
    if os.environ.get("KILN_NVRTC_PATH"):
        return os.environ["KILN_NVRTC_PATH"]
    for pattern in (f"{sys.prefix}/lib/python3*/site-packages/nvidia/cu*/lib/libnvrtc.so.*",
                    "/usr/local/cuda/lib64/libnvrtc.so.*"):
        found = sorted(p for p in glob.glob(pattern) if "builtins" not in p and ".alt." not in p)
        if found:
            return found[-1]
    return None


def cpu_supports(isa):
    order = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"]
    here = kiln.backend.detect_cpu_isa()
    return here in order and order.index(here) >= order.index(isa)


def run_child(server, mode, isa):
    env = dict(os.environ, KILN_SERVER=server.address, KILN_CPU_ISA=isa)
    for var in ("KILN_FALLBACK", "KILN_CACHE_ONLY", "KILN_DEBUG", "KILN_DETERMINISTIC", "KILN_DISABLE_FUSION"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("training, kinds", [(False, ["inference"]), (True, ["forward", "backward"])])
def test_cpu_precompile_is_hit_by_a_later_process(server, training, kinds):
    isa = "x86-64-v3"
    if not cpu_supports(isa):
        pytest.skip(f"this CPU ({kiln.backend.detect_cpu_isa()}) cannot run {isa} code")
    torch.manual_seed(1)  # other weights than the child's: only shapes matter
    model = MLP()
    before = [p.detach().clone() for p in model.parameters()]
    records = kiln.precompile(model, (torch.randn(8, 16),), target=f"cpu:{isa}", training=training,
                              options={"server": server.address})
    assert [r.kind for r in records] == kinds
    for r in records:
        assert r.ok and len(r.key) == 64 and r.source in ("compiled", "memory_hit", "disk_hit"), r
        assert r.kernels > 0 and r.op_fallbacks == 0, r
    # The model is untouched (still on the CPU, same values); nothing was counted.
    assert all(p.device.type == "cpu" and torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert kiln.stats()["requests"] == 0
    # A fresh process compiling the model for real gets every graph from the cache.
    child = run_child(server, "training" if training else "inference", isa)
    s = child["stats"]
    assert not child["warnings"], child["warnings"]
    assert s["graphs"] == s["hits"] == len(kinds) and s["compiles"] == 0, s
    assert s["graph_fallbacks"] == 0 and s["plan_calls"] >= len(kinds) and s["kernel_steps"] > 0, s
    assert sorted(s["keys"]) == sorted(r.key for r in records)
    # Precompiling again is a hit.
    again = kiln.precompile(MLP(), (torch.randn(8, 16),), target=f"cpu:{isa}", training=training,
                            options={"server": server.address})
    assert [r.key for r in again] == [r.key for r in records]
    assert all(r.source == "memory_hit" for r in again)


@pytest.fixture(scope="module")
def cuda_server():
    nvrtc = nvrtc_library()
    if nvrtc is None:
        pytest.skip("no NVRTC library for kilnd's CUDA compiles (pip install nvidia-cuda-nvrtc, or set "
                    "KILN_NVRTC_PATH)")
    s = Kilnd(f"--nvrtc={nvrtc}")
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("training, kinds", [(False, ["inference"]), (True, ["forward", "backward"])])
def test_cuda_precompile_without_a_gpu(cuda_server, training, kinds):
    records = kiln.precompile(MLP(), (torch.randn(8, 16),), target="cuda:sm_90", training=training,
                              options={"server": cuda_server.address})
    assert [r.kind for r in records] == kinds
    for r in records:
        assert r.ok and len(r.key) == 64 and r.source == "compiled", r
        assert r.kernels > 0, r
    cpu = kiln.precompile(MLP(), (torch.randn(8, 16),), target="cpu:x86-64-v2", training=training,
                          options={"server": cuda_server.address})
    assert not {r.key for r in cpu} & {r.key for r in records}  # the target is in the key
    sm80 = kiln.precompile(MLP(), (torch.randn(8, 16),), target="cuda:sm_80", training=training,
                           options={"server": cuda_server.address})
    assert not {r.key for r in sm80} & {r.key for r in records}


def aot_graphs_on_fake_cuda(model, x):
    """The graphs AOTAutograd (as the kiln backend runs it) makes from Dynamo's graph of `model`
    when the inputs are CUDA tensors: fake ones, so no GPU is needed (inference only: a CPU-only
    torch cannot run autograd on CUDA tensors, fake or not)."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = []

    def backend(gm, example_inputs):
        with FakeTensorMode():
            fakes = [torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cuda:0")
                     for t in example_inputs]

        def compiler(kind):
            def compile_fn(g, inputs):
                graphs.append(kiln.serialize_graph(g, inputs, kind=kind))
                return make_boxed_func(g)
            return compile_fn

        with torch.no_grad():
            kiln.backend.make_aot(compiler)(gm, fakes)
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(x)
    torch._dynamo.reset()
    return graphs


def test_channels_last_convolution_inputs_precompile(cuda_server):
    """torch's meta convolution returns an NCHW result for a channels-last input where cuDNN
    returns channels-last; kiln re-propagates such graphs with cuDNN's format
    (kiln.layouts.repropagate), so that they state what kilnd infers (it refused them before)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    cl_model = model.to(memory_format=torch.channels_last)
    for training in (False, True):
        records = kiln.precompile(cl_model, (x.contiguous(memory_format=torch.channels_last),),
                                  target="cuda:sm_90", training=training, options={"server": cuda_server.address})
        assert [r.error for r in records] == [""] * (2 if training else 1), records
        assert all(r.kernels >= 1 for r in records)


def test_cuda_graphs_hash_like_graphs_captured_on_cuda_tensors(server):
    """What precompile sends for cuda:sm_90 has the key of what AOTAutograd makes on CUDA inputs
    (the device index aside, which the key ignores)."""
    model = MLP()
    (graph,) = aot_graphs_on_fake_cuda(model, torch.randn(8, 16))
    assert graph.nodes[0].meta.tensor.device.kind == proto.DEVICE_KIND_CUDA
    records = kiln.precompile(model, (torch.randn(8, 16),), target="cuda:sm_90", strict=False,
                              options={"server": server.address})
    with KilnClient(server.address) as c:
        key = c.lookup(proto.CompileRequest(graph=graph, target=parse_target("cuda:sm_90")), timeout=30).key
    assert [r.key for r in records] == [key]


def test_failures_are_reported_with_their_keys():
    """A kilnd that cannot compile for CUDA (no NVRTC): every graph gets its error and, through
    Lookup, its key; strict (the default) raises after sending them all."""
    s = Kilnd("--nvrtc=/nonexistent/libnvrtc.so.13")
    try:
        opts = {"server": s.address}
        with pytest.raises(kiln.KilnError, match="2 of 2 graphs failed for target cuda:sm_90") as err:
            kiln.precompile(MLP(), (torch.randn(8, 16),), target="cuda:sm_90", training=True, options=opts)
        records = err.value.records
        assert [r.kind for r in records] == ["forward", "backward"]
        for r in records:
            assert not r.ok and r.error.startswith("FAILED_PRECONDITION: ") and len(r.key) == 64, r
        lenient = kiln.precompile(MLP(), (torch.randn(8, 16),), target="cuda:sm_90", training=True,
                                  options=opts, strict=False)
        assert [r.key for r in lenient] == [r.key for r in records]
        # kilnd counts these as what they are (no compiler for the target), not as internal errors.
        outcomes = server_requests(s.address)
        assert outcomes.get("failed_precondition", 0) >= 2 and not outcomes.get("internal"), outcomes
    finally:
        assert s.stop() == 0


def test_targets_and_devices():
    assert parse_target("cuda:sm_90") == proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90")
    assert parse_target("cpu:x86-64-v3") == proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v3")
    assert parse_target("cpu").cpu_isa == kiln.backend.detect_cpu_isa()
    for bad in ("cuda", "cuda:90", "cuda:sm_", "cpu:native", "tpu:v5"):
        with pytest.raises(ValueError):
            parse_target(bad)
    # Device rewriting: meta -> the target's device, in metadata and arguments; cpu stays cpu.

    def f(x):
        return x + torch.ones(3, device=x.device) + torch.zeros(3, device="cpu").sum()

    from torch.fx.experimental.proxy_tensor import make_fx

    graph = kiln.serialize_graph(make_fx(f)(torch.empty(3, device="meta")))
    rewrite_devices(graph, proto.DEVICE_KIND_META, proto.Device(kind=proto.DEVICE_KIND_CUDA, index=0))
    text = str(graph)
    assert "DEVICE_KIND_META" not in text
    assert "DEVICE_KIND_CUDA" in text and "DEVICE_KIND_CPU" in text


def test_functions_single_tensors_and_kwargs(server):
    def fn(x, *, scale):
        return torch.softmax(x * scale, -1)

    records = kiln.precompile(fn, torch.randn(4, 8), target="cpu:x86-64-v2", kwargs={"scale": 2.0},
                              options={"server": server.address})
    assert [r.kind for r in records] == ["inference"] and records[0].kernels > 0
    torch._dynamo.reset()
    # The same graph captured for real on the CPU (through the backend) has that key.
    compiled = torch.compile(fn, backend="kiln", options={"server": server.address, "cpu_isa": "x86-64-v2"})
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, scale=2.0), fn(x, scale=2.0))
    s = kiln.stats()
    assert s["keys"] == [records[0].key] and s["hits"] == 1 and s["compiles"] == 0, s


def test_tensor_attributes_move_and_foreign_tensors_get_a_clear_error(server):
    """A module's plain tensor attribute (not a registered buffer) goes to the meta device with the
    parameters, so the capture works and its key is the one the real process asks for; a tensor
    reached only through a closure (a loss's targets) cannot be moved, and precompile says so
    instead of torch's "device mismatch" from inside Dynamo."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)
            self.scale = torch.full((8,), 0.5)  # not register_buffer'ed

        def forward(self, x):
            return self.fc(x) * self.scale

    opts = {"server": server.address}
    model, x = Scaled(), torch.randn(4, 16)
    (record,) = kiln.precompile(model, (x,), target="cpu", options=opts)
    assert record.ok and record.kernels >= 1, record
    assert model.scale.device.type == "cpu" and model.fc.weight.device.type == "cpu"  # untouched
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kiln", options=opts)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    s = kiln.stats()
    assert s["keys"] == [record.key] and s["hits"] == 1 and s["compiles"] == 0, s

    targets = torch.tensor([1, 0, 3, 2])

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)

        def forward(self, x):
            return torch.nn.functional.cross_entropy(self.fc(x), targets)

    with pytest.raises(kiln.KilnError, match=r"real tensor beside the meta ones \(.*meta and cpu.*pass them as "
                                             r"inputs, register them as buffers"):
        kiln.precompile(WithLoss(), (x,), target="cpu", training=True, options=opts)


class ResidualConvNet(torch.nn.Module):
    """Two convolution-batch-norm-relu layers with a residual add, pooled to 10 logits."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.c2, self.b2 = torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y))) + y
        return self.fc(y.mean((2, 3)))


def test_a_training_forward_lays_out_its_saved_activations_and_its_backward_follows(cuda_server, monkeypatch):
    """kiln.layouts (option training_layouts, on by default): the forward lists its saved tensors as free_layout_outputs; kilnd makes the
    activations convolution c2 reads and returns channels-last, and what follows them (c1 reads
    the NCHW input); the backward is captured for the strides of the forward's plan."""
    from kiln import layouts, precompiler

    sent = []
    send = precompiler._Sender.send

    def spy(self, kind, graph):
        record, plan = send(self, kind, graph)
        sent.append((kind, proto.Graph.FromString(graph.SerializeToString()), plan))
        return record, plan

    monkeypatch.setattr(precompiler._Sender, "send", spy)
    records = kiln.precompile(ResidualConvNet(), (torch.randn(4, 3, 16, 16),), target="cuda:sm_90",
                              training=True, options={"server": cuda_server.address, "training_layouts": True})
    assert [r.kind for r in records] == ["forward", "backward"] and all(r.ok for r in records)
    (_, forward, plan), (_, backward, _) = sent
    free = list(forward.free_layout_outputs)
    output_strides = layouts.plan_output_strides(plan)
    (output,) = [n for n in forward.nodes if n.op == proto.Node.OP_OUTPUT]
    returned = [a.node for a in output.args[0].list.items]
    inputs = {n.name for n in forward.nodes if n.op == proto.Node.OP_PLACEHOLDER}
    # The saved tensors come after the updated buffers and the logits. Kept as given: the saved
    # parameters (graph inputs) and batch statistics also returned as buffer updates.
    assert free == [k for k in range(free[0], len(returned))
                    if returned[k] not in inputs and returned[k] not in returned[:free[0]]]
    assert len(free) >= 8 and len(output_strides) == len(returned)
    channels_last = {returned[k] for k in free if output_strides[k] == (4096, 1, 256, 16)}
    # c2's input and result, and the second relu, which follows its channels-last input.
    assert channels_last == {"relu", "convolution_1", "relu_1"}
    placeholders = {n.name: n for n in backward.nodes if n.op == proto.Node.OP_PLACEHOLDER}
    for k in free:  # AOTAutograd names the backward's inputs after the saved nodes
        strides = tuple(s.constant for s in placeholders[returned[k]].meta.tensor.strides)
        assert strides == output_strides[k], returned[k]
    assert not backward.free_layout_outputs
    sent.clear()  # option off: nothing is free
    kiln.precompile(ResidualConvNet(), (torch.randn(4, 3, 16, 16),), target="cuda:sm_90", training=True,
                    options={"server": cuda_server.address, "training_layouts": False})
    assert [list(g.free_layout_outputs) for _, g, _ in sent] == [[], []]
