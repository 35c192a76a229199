"""torch.compile(model, backend="kiln") end to end against a real kilnd: an MLP, a transformer
block and a conv model, for inference and several training steps, an optimizer step captured by
Dynamo, and a function with a graph break.

Checked: every graph reaches the server (the backward prefetch is one more Compile per training
graph) and runs a compiled plan, with no fallback and no warning, and the results match eager; a
fresh kilnd compiles every graph, and a new process state then gets every graph from its cache
and runs the compiled kernels. Hand-made all-aten artifacts planted through Admin.Import
(kiln.testing) check the cache-hit path of plans kilnd did not compile itself.
"""
import copy
import glob
import os
import shutil
import logging
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
import kiln.backend
import kiln.executor
from kiln import proto, testing
from kiln.rpc import KilnClient

import corpus_util
from kilnd_server import Kilnd, fresh_kiln, server_requests

# torch's structured-trace logger would flood failure reports with empty records.
logging.getLogger("torch.__trace").addFilter(lambda record: False)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        att = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1))


MODELS = {"mlp": (MLP, (8, 16)), "transformer_block": (Block, (2, 6, 16)), "conv": (ConvNet, (4, 3, 8, 8))}


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)



def train_and_infer(model_cls, shape, backend_options=None, steps=3):
    """Trains a copy of the model eagerly and one compiled with kiln; returns both runs' losses,
    final gradients and parameters, inference outputs, and the KilnWarnings issued."""
    torch.manual_seed(0)
    eager = model_cls()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="kiln", options=backend_options)
    data = [torch.randn(*shape) for _ in range(steps)]
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, model, fn in (("eager", eager, eager), ("kiln", compiled_model, compiled)):
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            losses, grads = [], None
            for x in data:
                opt.zero_grad()
                loss = fn(x).pow(2).mean()
                loss.backward()
                losses.append(loss.item())
                grads = [p.grad.clone() for p in model.parameters()]
                opt.step()
            model.eval()
            with torch.no_grad():
                inference = fn(data[0])
            model.train()
            results[name] = (losses, grads, [p.detach().clone() for p in model.parameters()], inference)
    kiln_warnings = [w for w in caught if issubclass(w.category, kiln.KilnWarning)]
    return results, kiln_warnings


def assert_same(results):
    (l0, g0, p0, i0), (l1, g1, p1, i1) = results["eager"], results["kiln"]
    assert l1 == pytest.approx(l0, rel=1e-4, abs=1e-5)
    for a, b in zip(g0 + p0, g1 + p1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(i1, i0, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_models_match_eager_and_every_graph_reaches_kilnd(server, name):
    before = sum(server_requests(server.address).values())
    results, kiln_warnings = train_and_infer(*MODELS[name], {"server": server.address})
    assert_same(results)
    s = kiln.stats()
    assert s["graphs"] >= 3  # forward, backward, inference
    assert s["requests"] >= s["graphs"]
    # The backward prefetch (option prefetch_backward) is one more Compile per training graph.
    assert sum(server_requests(server.address).values()) - before == s["requests"] + s["backward_prefetches"]
    # Every graph runs a compiled plan: no fallback, no warning.
    assert s["graph_fallbacks"] == 0 and not s["fallbacks_by_cause"], s["fallbacks_by_cause"]
    assert s["hits"] + s["compiles"] == s["graphs"]
    assert not kiln_warnings, [str(w.message) for w in kiln_warnings]
    assert s["plan_calls"] > 0 and s["eager_calls"] == 0


def test_models_are_compiled_and_hit_the_cache_once_kilnd_compiles(server):
    results, _ = train_and_infer(MLP, (8, 16), {"server": server.address}, steps=1)
    s = kiln.stats()
    assert_same(results)
    assert s["compiles"] + s["hits"] == s["graphs"] and s["plan_calls"] > 0
    torch._dynamo.reset()
    kiln.reset_stats()
    train_and_infer(MLP, (8, 16), {"server": server.address}, steps=1)
    assert kiln.stats()["hits"] == kiln.stats()["graphs"] and kiln.stats()["compiles"] == 0


def plant_aten_plans(server, debug_dir):
    """Imports an all-aten artifact for every request kiln wrote under debug_dir; returns keys."""
    keys = []
    with KilnClient(server.address) as client:
        for path in sorted(glob.glob(f"{debug_dir}/*/*/request.binpb")):
            with open(path, "rb") as f:
                request = proto.CompileRequest.FromString(f.read())
            artifact = testing.make_artifact(testing.aten_plan(request.graph), request.target)
            key, response = testing.import_artifact(client, request, artifact)
            assert response.imported + response.skipped == 1 and response.rejected == 0
            keys.append(key)
    return keys


@pytest.mark.parametrize("name", MODELS)
def test_models_compile_then_hit_the_cache_and_run_kernels(name):
    """A fresh kilnd compiles every graph of the model (inference and training steps) on the first
    run; a new process state then gets every graph from kilnd's cache and runs its compiled
    kernels; both runs match eager."""
    fresh_server = Kilnd()
    try:
        opts = {"server": fresh_server.address}
        results, kiln_warnings = train_and_infer(*MODELS[name], opts)
        assert_same(results)
        first = kiln.stats()
        assert not kiln_warnings, [str(w.message) for w in kiln_warnings]
        assert first["graph_fallbacks"] == 0 and first["compiles"] + first["hits"] == first["graphs"] >= 3
        assert first["hits"] <= first["backward_prefetches"]  # a backward compiled ahead (prefetch)
        torch._dynamo.reset()
        kiln.backend.reset()
        kiln.reset_stats()
        results, kiln_warnings = train_and_infer(*MODELS[name], opts)
        assert_same(results)
        s = kiln.stats()
        assert not kiln_warnings, [str(w.message) for w in kiln_warnings]
        assert s["graph_fallbacks"] == 0 and s["eager_calls"] == 0
        assert s["hits"] == s["graphs"] and s["compiles"] == 0
        assert sum(s["hits_by_tier"].values()) == s["hits"]
        assert s["plan_calls"] >= 3 * 2 + 1  # three training steps (forward + backward) and inference
        assert s["client_time_s"]["load"] > 0 and s["server_time_s"]["lookup"] > 0
        assert s["client_time_s"]["program"] > 0  # each plan's program, built at its first call
        # The plans really are compiled code: kernel steps in every graph's artifact.
        with KilnClient(fresh_server.address) as c:
            for key in set(s["keys"]):
                plan = c.get_entry(proto.GetEntryRequest(key=key, include_plan=True)).plan
                assert any(step.HasField("kernel") for step in plan.steps), (key, plan)
    finally:
        assert fresh_server.stop() == 0


def test_training_forward_lists_its_saved_tensors(server):
    """A training forward's Graph.saved_outputs (not hashed) lists the outputs the backward takes
    that are neither graph inputs nor user outputs: what cuda_graphs keeps in a captured forward's
    memory for the backward to read in place."""
    import gc

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = torch.compile(model, backend="kiln", options={"server": server.address})
    compiled(torch.randn(5, 8)).sum().backward()
    graphs = {}
    for o in gc.get_objects():
        if issubclass(type(o), kiln.backend.CompiledGraph):
            for spec in o.specs:
                graphs[spec.executor.graph.kind] = spec.executor.graph
    forward, backward = graphs[proto.GRAPH_KIND_FORWARD], graphs[proto.GRAPH_KIND_BACKWARD]
    outputs = [n for n in forward.nodes if n.op == proto.Node.OP_OUTPUT][0].args[0].list.items
    names = {i: item.node for i, item in enumerate(outputs) if item.WhichOneof("value") == "node"}
    placeholders = {n.name for n in forward.nodes if n.op == proto.Node.OP_PLACEHOLDER}
    saved = list(forward.saved_outputs)
    assert saved and 0 not in saved, saved  # output 0 is the model's result
    assert all(names[i] not in placeholders for i in saved)
    # The backward takes each of them (and then the tangent).
    assert len([n for n in backward.nodes if n.op == proto.Node.OP_PLACEHOLDER]) >= len(saved) + 1
    assert list(backward.saved_outputs) == []


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_batch_norm_running_statistics_are_updated_by_the_plan(server, monkeypatch, cuda_graphs):
    """A training forward updates batch norm's buffers (running mean, variance, batches tracked).
    By default the graph keeps those updates (copy_ nodes, as Inductor's do) and the plan runs them
    together (a torch._foreach_copy_ per dtype, kiln._exec_aten.merge_copies), with the cuda_graphs
    option too (it changes neither the graphs nor their keys; on CPU it captures nothing). The
    buffers match eager's after every step."""
    merged = []
    real = kiln.executor.merge_copies

    def spy(steps, values, root):
        out = real(steps, values, root)
        merged.append([len(e[1]) if e[0] == "copies" else e[1].__name__ for e in out
                       if e[0] == "copies" or (e[0] == "aten" and "copy_" in str(e[1]))])
        return out

    monkeypatch.setattr(kiln.executor, "merge_copies", spy)
    torch.manual_seed(0)
    eager = ConvNet()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="kiln", options={"server": server.address, "cuda_graphs": cuda_graphs})
    for _ in range(3):
        x = torch.randn(4, 3, 8, 8)
        for fn in (eager, compiled):
            fn(x).pow(2).mean().backward()
        for a, b in zip(eager.buffers(), model.buffers()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert model.bn.num_batches_tracked.item() == 3
    s = kiln.stats()
    assert s["graph_fallbacks"] == 0 and s["op_fallbacks"] == 0 and s["eager_calls"] == 0
    # forward: the three buffer updates in one run; backward: none.
    assert sorted(merged) == [[], [3]], merged


def test_bf16_batch_norm_training_compiles_on_cpu(server):
    """A bf16 batch norm in training mode on CPU: torch's decomposition returns the running
    statistics' update in f32 where CUDA's kernel keeps bf16, and kilnd takes the graph's dtype
    (it refused the forward as malformed before, session 26). The buffers match eager's; the
    parameters' gradients match eager's or, as in the corpus, an fp64 run's within 2x eager's error
    (they are sums over 1152 products, rounded to bf16 once)."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.BatchNorm2d(16)).to(torch.bfloat16)
    model, ref = copy.deepcopy(eager), copy.deepcopy(eager).double()
    compiled = torch.compile(model, backend="kiln", options={"server": server.address})
    for step in range(2):
        x = torch.randn(8, 16, 12, 12, dtype=torch.bfloat16) * 2 + 3
        go = torch.randn(8, 16, 12, 12, dtype=torch.bfloat16)
        for fn in (eager, compiled, ref):
            fn(x.to(torch.float64) if fn is ref else x).backward(go.to(torch.float64) if fn is ref else go)
        for a, b in zip(eager.buffers(), model.buffers()):
            torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)
        corpus_util.compare([q.grad for q in model.parameters()], [p.grad for p in eager.parameters()],
                            f"step {step}", gold=lambda: [r.grad for r in ref.parameters()])
        for m in (eager, model, ref):
            m.zero_grad(set_to_none=True)
    s = kiln.stats()
    assert s["graph_fallbacks"] == 0 and s["op_fallbacks"] == 0 and s["eager_calls"] == 0, s


def test_optimizer_step_captured_by_dynamo(server):
    torch.manual_seed(0)
    models = [nn.Linear(8, 4), None]
    models[1] = copy.deepcopy(models[0])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    compiled_step = torch.compile(opts[1].step, backend="kiln", options={"server": server.address})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            x = torch.randn(2, 8)
            for m, step in zip(models, (opts[0].step, compiled_step)):
                m(x).sum().backward()
                step()
                m.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b)
    s = kiln.stats()
    assert s["graphs"] >= 1 and s["requests"] >= 1
    assert set(s["fallbacks_by_cause"]) <= {"unimplemented"}


def test_graph_breaks_give_several_graphs_that_all_run(server):
    def fn(x, w):
        y = torch.relu(x @ w)
        torch._dynamo.graph_break()
        z = y.sum(-1, keepdim=True) * y
        if z.sum() > 0:  # data-dependent branch: another break
            z = z + 1
        return z.softmax(-1)

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn, backend="kiln", options={"server": server.address})(x, w)
    torch.testing.assert_close(got, fn(x, w))
    s = kiln.stats()
    assert s["graphs"] >= 3 and s["requests"] == s["graphs"]
    assert set(s["fallbacks_by_cause"]) <= {"unimplemented"}
    assert len([w for w in caught if issubclass(w.category, kiln.KilnWarning)]) <= 1


def _train_step_matches_eager(compiled, model, reference, x):
    """One forward + backward through `compiled` (of `model`) and `reference` (an eager copy):
    outputs and every parameter's gradient within float32 tolerances."""
    for m in (model, reference):
        m.zero_grad()
    out = compiled(x)
    out.pow(2).sum().backward()
    want = reference(x)
    want.pow(2).sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}.grad: {m}")


@pytest.mark.parametrize("dynamic", [None, True])
def test_symbolic_graphs_are_compiled_per_shape(server, dynamic):
    """Graphs that Dynamo makes symbolic (automatic dynamic shapes after a second shape, or
    dynamic=True) are not run eagerly: kilnd compiles static shapes, so each (batch, sequence)
    shape met gets a static specialization of the forward and backward graphs, and everything
    matches eager."""
    torch.manual_seed(0)
    model = Block()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kiln", options={"server": server.address}, dynamic=dynamic)
    shapes = [(2, 6, 16), (2, 9, 16), (3, 5, 16), (2, 9, 16), (4, 7, 16)]
    compiles = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shape in shapes:
            _train_step_matches_eager(compiled, model, reference, torch.randn(*shape))
            compiles.append((kiln.stats()["compiles"], kiln.stats()["requests"]))
    assert not [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    s = kiln.stats()
    assert s["graph_fallbacks"] == 0 and s["eager_calls"] == 0, s
    assert s["plan_calls"] == 2 * len(shapes) and s["kernel_steps"] > 0
    if dynamic:  # one Dynamo graph: a shape met before reuses its specializations
        assert compiles[3] == compiles[2], compiles


def test_a_new_shapes_backward_is_compiled_alongside_its_forward():
    """Training with dynamic=True: when the forward meets a new batch size, the backward's static
    specialization for that size is sent to kilnd at once (prefetch), so the backward's own
    request joins that compile or hits it: kilnd compiles each graph once per size."""
    fresh_server = Kilnd()
    try:
        torch.manual_seed(0)
        model = MLP()
        reference = copy.deepcopy(model)
        compiled = torch.compile(model, backend="kiln", options={"server": fresh_server.address}, dynamic=True)
        for batch in (3, 5, 7):
            _train_step_matches_eager(compiled, model, reference, torch.randn(batch, 16))
        s = kiln.stats()
        assert s["eager_calls"] == 0 and s["backward_prefetches"] >= 3, s
        outcomes = server_requests(fresh_server.address)
        assert outcomes.get("compiled") == 6, outcomes  # forward + backward per batch size, no double
        assert outcomes.get("joined", 0) + outcomes.get("memory_hit", 0) >= 3, outcomes
    finally:
        assert fresh_server.stop() == 0


def test_a_symbolic_graph_kiln_cannot_serialize_is_compiled_per_shape(server, monkeypatch):
    """A symbolic graph whose size arithmetic the serializer refuses (on CUDA, SDPA's scale made
    one such graph) still compiles per shape: the static specializations have no sizes left to
    serialize. The refusal is forced here for every symbolic graph."""
    from kiln import specialize

    original = kiln.backend._compile_request

    def refuse_symbolic(opts, fn, kind, gm, example_inputs):
        if specialize.is_symbolic(example_inputs):
            raise ValueError("a size expression (test): not an integer operation kiln supports")
        return original(opts, fn, kind, gm, example_inputs)

    monkeypatch.setattr(kiln.backend, "_compile_request", refuse_symbolic)
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kiln", options={"server": server.address}, dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (3, 5):
            _train_step_matches_eager(compiled, model, reference, torch.randn(batch, 16))
    assert not [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    s = kiln.stats()
    assert s["plan_calls"] == 4 and s["eager_calls"] == 0 and s["graph_fallbacks"] == 0, s


def test_symbolic_graph_shapes_are_capped(server):
    """max_graphs_per_function also caps the static specializations of one symbolic graph: a
    shape past it runs eagerly, correctly, with one warning naming the option."""
    torch.manual_seed(0)
    model = MLP()
    reference = copy.deepcopy(model)
    opts = {"server": server.address, "max_graphs_per_function": 2}
    compiled = torch.compile(model, backend="kiln", options=opts, dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (3, 5, 7, 9):
            _train_step_matches_eager(compiled, model, reference, torch.randn(batch, 16))
    messages = [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    assert len(messages) == 1 and "max_graphs_per_function" in messages[0], messages
    s = kiln.stats()
    assert s["plan_calls"] == 2 * 2 and s["eager_calls"] == 2 * 2, s
    assert s["fallbacks_by_cause"] == {"graph_limit": 2}, s["fallbacks_by_cause"]  # forward, backward


def test_dynamic_shapes_one_graph_for_several_batch_sizes(server, tmp_path):
    """dynamic=True: symbolic graphs reach kilnd (which compiles static shapes only: each batch
    size gets a static specialization meanwhile, see test_symbolic_graphs_are_compiled_per_shape);
    once a (hand-made) artifact for the symbolic graphs is cached, the same plan serves every
    batch size, its sizes bound from the inputs."""
    opts = {"server": server.address, "debug": True, "debug_dir": str(tmp_path)}
    torch.manual_seed(0)
    model = MLP()
    compiled = torch.compile(model, backend="kiln", options=opts, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in (4, 6):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x))
            compiled(x).sum().backward()
    s = kiln.stats()
    assert s["graph_fallbacks"] == 0 and s["eager_calls"] == 0, s
    requests = [proto.CompileRequest.FromString(open(p, "rb").read())
                for p in glob.glob(f"{tmp_path}/*/*/request.binpb")]
    symbolic = [r for r in requests if r.graph.symbols]
    assert len(symbolic) == 2 and len(requests) == 2 + 2 * 2  # forward, backward; per batch size
    shutil.rmtree(tmp_path)
    for i, r in enumerate(symbolic):
        os.makedirs(f"{tmp_path}/symbolic/{i}")
        with open(f"{tmp_path}/symbolic/{i}/request.binpb", "wb") as f:
            f.write(r.SerializeToString())
    plant_aten_plans(server, tmp_path)
    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()
    compiled = torch.compile(model, backend="kiln", options={"server": server.address}, dynamic=True)
    for batch in (5, 9, 3):
        x = torch.randn(batch, 16)
        model.zero_grad()
        out = compiled(x)
        out.pow(2).sum().backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expect = model(x)
        expect.pow(2).sum().backward()
        torch.testing.assert_close(out, expect)
        for a, b in zip(got, [p.grad for p in model.parameters()]):
            torch.testing.assert_close(a, b)
    s = kiln.stats()
    assert s["graph_fallbacks"] == 0 and s["hits"] == s["graphs"] and s["eager_calls"] == 0
    assert s["plan_calls"] >= 6 and s["requests"] == s["graphs"]  # no new graph per batch size


def test_kernels_read_views_of_aten_results_without_a_tensor_per_call(server, monkeypatch):
    # The GEMMs run as torch steps on CPU; the kernels read slices of their results (and of an
    # input at an offset) through pointers (_Program._view_pointer): no as_strided per call.
    def fn(x, w, v):
        h = x @ w
        return (h[:, 2:] * 2 + v[1:, 3:]).relu(), (h[1:, :4] - 1).exp()

    monkeypatch.setenv("KILN_SERVER", server.address)
    args = [torch.randn(6, 8), torch.randn(8, 10), torch.randn(7, 11)]
    compiled = torch.compile(fn, backend="kiln")
    want = fn(*args)
    got = compiled(*args)
    calls = []
    original = torch.Tensor.as_strided

    def counting(self, *a, **kw):
        calls.append(a)
        return original(self, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "as_strided", counting)
    args2 = [torch.randn(6, 8), torch.randn(8, 10), torch.randn(7, 11)]
    got2 = compiled(*args2)
    monkeypatch.setattr(torch.Tensor, "as_strided", original)
    for g, w_ in zip(got, want):
        torch.testing.assert_close(g, w_)
    for g, w_ in zip(got2, fn(*args2)):
        torch.testing.assert_close(g, w_)
    assert kiln.stats()["plan_calls"] >= 2 and kiln.stats()["graph_fallbacks"] == 0
    assert calls == [], f"{len(calls)} views made per call"
