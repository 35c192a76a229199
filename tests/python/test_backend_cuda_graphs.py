"""CUDA-graph mode (option cuda_graphs) against a real kilnd, on CPU plans: kiln.testing.CpuGraphs
stands in for CUDA graphs (a "replay" runs the plan into the captured outputs, as a replay writes
the graph's memory, without touching version counters), so that the runner's bookkeeping (capture
keys, saved tensors and gradients returned in place, busy checks, the guard skipped on replays)
meets the training loops people write: every pattern's losses, outputs, gradients and parameters
match an eager copy of the model step by step."""
import copy
import logging

import pytest
import torch

import kiln
from kiln import cuda_graphs, guards, testing
from kilnd_server import fresh_kiln

logging.getLogger("torch.__trace").addFilter(lambda record: False)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)


@pytest.fixture
def cpu_graphs(monkeypatch):
    graphs = testing.CpuGraphs()
    monkeypatch.setattr(cuda_graphs, "_DEVICE", graphs)
    return graphs


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                               torch.nn.Linear(16, 4))


# Training patterns: (step function, whether some calls must find a graph busy). A step function
# takes (the model's callable, the model, its optimizer, inputs, a list kept across steps) and
# returns tensors to compare with eager's.

def plain(f, m, opt, xs, kept):
    opt.zero_grad(set_to_none=True)
    loss = f(xs[0]).square().mean()
    loss.backward()
    opt.step()
    return [loss.detach()]


def accumulate(f, m, opt, xs, kept):  # two micro-batches per update
    opt.zero_grad(set_to_none=True)
    losses = []
    for x in xs[:2]:
        loss = f(x).square().mean()
        loss.backward()
        losses.append(loss.detach())
    opt.step()
    return losses


def three_forwards(f, m, opt, xs, kept):  # one backward through three forwards' saved tensors
    opt.zero_grad(set_to_none=True)
    a, b, c = (f(x) for x in xs)
    (a * b + c).mean().backward()
    opt.step()
    return [a.detach(), b.detach(), c.detach()]


def keep_outputs(f, m, opt, xs, kept):  # every step's output kept
    opt.zero_grad(set_to_none=True)
    out = f(xs[0])
    out.square().mean().backward()
    opt.step()
    kept.append(out.detach())
    return kept[-3:]


def keep_gradients(f, m, opt, xs, kept):  # every step's .grad tensors kept
    opt.zero_grad(set_to_none=True)
    f(xs[0]).square().mean().backward()
    kept.append([p.grad for p in m.parameters()])
    opt.step()
    return [g for grads in kept[-3:] for g in grads]


def gradients_zeroed_in_place(f, m, opt, xs, kept):
    opt.zero_grad(set_to_none=False)
    f(xs[0]).square().mean().backward()
    opt.step()
    return [p.grad.clone() for p in m.parameters()]


def inference_between(f, m, opt, xs, kept):  # an inference graph of its own between steps
    loss = plain(f, m, opt, xs, kept)
    with torch.no_grad():
        return loss + [f(xs[1])]


def backward_a_step_later(f, m, opt, xs, kept):  # step n's forward, then step n-1's backward
    m.zero_grad(set_to_none=True)
    loss = f(xs[0]).square().mean()
    if kept:
        kept.pop().backward()
    kept.append(loss)
    return [loss.detach()] + [p.grad for p in m.parameters() if p.grad is not None]


PATTERNS = [(plain, False), (accumulate, False), (three_forwards, True), (keep_outputs, False),
            (keep_gradients, False), (gradients_zeroed_in_place, False), (inference_between, False),
            (backward_a_step_later, True)]


def check_pattern(pattern, busy, compiled, model, ref, make_inputs, tol, steps=12):
    """Runs `steps` steps of `pattern` on the compiled model and on its eager copy `ref` (the same
    weights), comparing what the pattern returns and the parameters after each step; then checks
    kiln's counters. Shared with tests/gpu/test_cuda_backend.py (real CUDA graphs)."""
    runs = [(compiled, model, torch.optim.SGD(model.parameters(), lr=0.05), []),
            (ref, ref, torch.optim.SGD(ref.parameters(), lr=0.05), [])]
    for step in range(steps):
        xs = make_inputs()
        got, want = (pattern(f, m, opt, xs, kept) for f, m, opt, kept in runs)
        assert len(got) == len(want)
        for a, b in zip(got + list(model.parameters()), want + list(ref.parameters())):
            torch.testing.assert_close(a, b, **tol, msg=lambda m: f"step {step}: {m}")
    s = kiln.stats()
    assert s["eager_calls"] == 0 and not s["graph_fallbacks"], s
    assert s["cuda_graph_captures"] >= 2 and s["cuda_graph_replays"] >= steps, s
    # Calls that find a graph busy run the plan without it (correct, slower): only the patterns
    # that hold one forward's saved tensors into another forward call may see one.
    assert (s["cuda_graph_busy"] > 0) == busy, s
    return s


@pytest.mark.parametrize("pattern,busy", PATTERNS, ids=[p.__name__ for p, _ in PATTERNS])
def test_training_patterns_match_eager(server, cpu_graphs, pattern, busy):
    torch.manual_seed(0)
    model = mlp()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kiln", options={"server": server.address, "cuda_graphs": True})
    check_pattern(pattern, busy, compiled, model, ref, lambda: [torch.randn(5, 8) for _ in range(3)],
                  dict(rtol=1e-5, atol=1e-5))
    assert cpu_graphs.captures >= 2

def test_cuda_graph_mode_replays_captured_keys_without_the_guard(server, cpu_graphs, monkeypatch):
    """CUDA-graph mode (kiln.testing.CpuGraphs standing in for CUDA graphs around CPU plans),
    training: the first two calls of each graph (the warm-up and the capture) pass kiln's guard;
    later calls with the captured key replay without it (the key holds what the guard checks).
    Gradients match eager's at every step."""
    graphs = cpu_graphs
    binds = []
    bind = guards.StaticGuard.bind
    monkeypatch.setattr(guards.StaticGuard, "bind", lambda self, args: binds.append(len(args)) or bind(self, args))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kiln", options={"server": server.address, "cuda_graphs": True})
    for step in range(6):
        x = torch.randn(5, 8)
        for m, f in ((model, compiled), (ref, ref)):
            m.zero_grad(set_to_none=True)
            f(x).square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5)
    s = kiln.stats()
    assert not s["graph_fallbacks"] and s["eager_calls"] == 0, s
    # The forward: warm-up, capture, 4 replays. The backward warms up twice: once the forward is
    # captured, the saved tensor it reads is in the forward graph's memory (read in place: a new
    # key); then capture and 3 replays. Only the warm-ups and captures pass the guard.
    assert graphs.captures == 2 and s["cuda_graph_captures"] == 2
    assert s["cuda_graph_replays"] == 5 + 4 and s["plan_calls"] == 2 * 6
    assert len(binds) == 2 + 3, binds


class ConvNet(torch.nn.Module):
    """A convolution (an aten step), batch norm (running statistics updated by the graph: inputs
    written back after each replay) and a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
@pytest.mark.parametrize("pattern", [plain, three_forwards, backward_a_step_later], ids=lambda p: p.__name__)
def test_batch_norm_net_patterns_match_eager(server, cpu_graphs, pattern, layout):
    """Inputs in a channels-last layout or with gaps (every other column) are copied into the
    graph's static buffers at each replay; batch norm's running statistics follow eager's."""
    def make_inputs():
        if layout == "channels_last":
            return [torch.randn(4, 3, 6, 6).to(memory_format=torch.channels_last) for _ in range(3)]
        return [torch.randn(4, 3, 6, 12)[..., ::2] for _ in range(3)]

    torch.manual_seed(0)
    model = ConvNet()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kiln", options={"server": server.address, "cuda_graphs": True})
    check_pattern(pattern, dict(PATTERNS)[pattern], compiled, model, ref, make_inputs, dict(rtol=1e-4, atol=1e-5))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(model.bn, name), getattr(ref.bn, name), rtol=1e-4, atol=1e-5)
