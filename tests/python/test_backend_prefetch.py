"""Backward prefetch (option prefetch_backward, kiln.backend), against a real kilnd: a training
graph's backward is sent to Compile when AOTAutograd's partitioner makes it, not at the first
backward(); the backward compiler's own request, the same bytes, then joins that compile or hits
the cache. Off, in cache-only mode, for inference and in kiln.precompile nothing is sent ahead, and
a prefetch that fails changes nothing."""
import copy
import logging
import os
import signal
import tempfile
import time
import warnings

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.backend
from kiln.rpc import KilnClient
from kilnd_server import Kilnd, fresh_kiln, kilnd_path, server_requests

logging.getLogger("torch.__trace").addFilter(lambda record: False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)

    def forward(self, x):
        return self.fc(x).relu().exp()


@pytest.fixture
def server():
    s = Kilnd()  # a fresh one per test: its compile counts are the test's
    yield s
    assert s.stop() == 0


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)



def hits(requests):
    return sum(n for outcome, n in requests.items() if outcome.endswith("_hit"))


def wait_for(condition, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(0.02)


def models():
    torch.manual_seed(0)
    eager = Net()
    return eager, copy.deepcopy(eager)


def assert_grads_match(eager, compiled_model, x, out):
    expect = eager(x)
    expect.sum().backward()
    torch.testing.assert_close(out, expect)
    for a, b in zip(compiled_model.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


def kiln_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]


def test_the_backward_is_compiled_before_the_first_backward_and_its_request_hits(server):
    eager, model = models()
    # aot_cache off: that option has AOTAutograd lower the backward with the forward, so the
    # backward's request would race the prefetch (joining it or hitting its artifact).
    compiled = torch.compile(model, backend="kiln", options={"server": server.address, "aot_cache": False})
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
        # Only the forward has been compiled by the backend; the backward's compile reaches kilnd
        # anyway, before backward() is called.
        wait_for(lambda: server_requests(server.address).get("compiled", 0) == 2,
                 "kilnd to compile the forward and the prefetched backward")
        out.sum().backward()
    assert not kiln_warnings(caught)
    assert_grads_match(eager, model, x, out)
    # The backward compiler's request found the prefetched artifact: a request that differed from
    # the prefetch (another key) would have been a third compile.
    requests = server_requests(server.address)
    assert requests.get("compiled") == 2 and hits(requests) == 1 and sum(requests.values()) == 3, requests
    s = kiln.stats()
    assert s["graphs"] == 2 and s["requests"] == 2 and s["backward_prefetches"] == 1
    assert s["compiles"] == 1 and s["hits"] == 1 and s["graph_fallbacks"] == 0
    assert s["plan_calls"] == 2 and s["eager_calls"] == 0


def test_a_backward_right_after_the_forward_joins_the_compile_or_hits(server):
    eager, model = models()
    compiled = torch.compile(model, backend="kiln", options={"server": server.address})
    opt_eager, opt = (torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, model))
    for step in range(3):
        x = torch.randn(8, 16)
        for m, fn, o in ((model, compiled, opt), (eager, eager, opt_eager)):
            o.zero_grad()
            fn(x).sum().backward()
        for a, b in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad)
        opt.step()
        opt_eager.step()
    requests = server_requests(server.address)
    assert requests.get("compiled") == 2, requests  # forward and backward, each once
    assert requests.get("joined", 0) + hits(requests) == 1 and sum(requests.values()) == 3, requests
    s = kiln.stats()
    assert s["graphs"] == 2 and s["backward_prefetches"] == 1 and s["graph_fallbacks"] == 0
    assert s["compiles"] + s["hits"] == 2 and s["joined"] + s["hits"] == 1
    assert s["plan_calls"] == 6


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x)).relu().mean((2, 3))


def test_with_training_layouts_a_convolutions_backward_is_sent_once_the_forward_is_compiled(server):
    """Option training_layouts: the backward's inputs take the strides of the forward's plan
    (kiln.layouts), so the prefetch waits for that plan, then sends the request the backward
    compiler will send (the same key: it hits). On CPU kilnd keeps NCHW, but the path is the same."""
    torch.manual_seed(0)
    eager = ConvNet()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="kiln",
                             options={"server": server.address, "aot_cache": False, "training_layouts": True})
    x = torch.randn(2, 3, 8, 8)
    out = compiled(x)
    wait_for(lambda: server_requests(server.address).get("compiled", 0) == 2,
             "kilnd to compile the forward and the backward sent after it")
    out.sum().backward()
    assert_grads_match(eager, model, x, out)
    requests = server_requests(server.address)
    assert requests.get("compiled") == 2 and hits(requests) == 1 and sum(requests.values()) == 3, requests
    s = kiln.stats()
    assert s["backward_prefetches"] == 1 and s["compiles"] == 1 and s["hits"] == 1 and s["graph_fallbacks"] == 0


@pytest.mark.parametrize("how", ["option", "environment"])
def test_off_the_backward_is_compiled_at_the_first_backward(server, monkeypatch, how):
    # aot_cache off: that option has AOTAutograd lower the backward with the forward (torch's
    # force_non_lazy_backward_lowering), so it is never compiled at the first backward.
    options = {"server": server.address, "aot_cache": False}
    if how == "option":
        options["prefetch_backward"] = False
    else:
        monkeypatch.setenv("KILN_PREFETCH_BACKWARD", "0")
    eager, model = models()
    x = torch.randn(8, 16)
    out = torch.compile(model, backend="kiln", options=options)(x)
    time.sleep(0.5)  # room for a prefetch that should not be there
    with KilnClient(server.address) as c:
        stats = c.get_stats()
    assert dict(stats.requests) == {"compiled": 1} and stats.compiles_in_flight + stats.compiles_queued == 0
    out.sum().backward()
    assert_grads_match(eager, model, x, out)
    assert server_requests(server.address) == {"compiled": 2}
    s = kiln.stats()
    assert s["backward_prefetches"] == 0 and s["compiles"] == 2 and s["joined"] == 0 and s["hits"] == 0


def test_nothing_is_sent_ahead_for_inference_in_cache_only_mode_or_by_precompile(server, monkeypatch):
    model = Net()
    with torch.no_grad():
        torch.compile(model, backend="kiln", options={"server": server.address})(torch.randn(8, 16))
    assert kiln.stats()["backward_prefetches"] == 0 and server_requests(server.address) == {"compiled": 1}

    torch._dynamo.reset()
    kiln.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cache-only misses' warning
        out = torch.compile(Net(), backend="kiln",
                            options={"server": server.address, "cache_only": True})(torch.randn(4, 16))
        out.sum().backward()
    assert kiln.stats()["backward_prefetches"] == 0
    assert server_requests(server.address) == {"compiled": 1, "miss": 2}  # Lookups only

    torch._dynamo.reset()
    kiln.reset_stats()
    records = kiln.precompile(Net(), (torch.randn(2, 16),), target="cpu", training=True,
                              options={"server": server.address})
    assert [r.kind for r in records] == ["forward", "backward"]
    assert server_requests(server.address) == {"compiled": 3, "miss": 2}


def test_a_prefetch_that_fails_changes_nothing(server, monkeypatch, caplog):
    def broken():
        raise RuntimeError("prefetch bug")

    monkeypatch.setattr(kiln.backend, "_compiled_autograd_on", broken)
    monkeypatch.setenv("KILN_FALLBACK", "error")
    eager, model = models()
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, logger="kiln"):
        warnings.simplefilter("always")
        out = torch.compile(model, backend="kiln", options={"server": server.address})(x)
        out.sum().backward()
    assert not kiln_warnings(caught)
    assert any("backward prefetch skipped (RuntimeError: prefetch bug)" in r.getMessage() for r in caplog.records)
    assert_grads_match(eager, model, x, out)
    assert server_requests(server.address) == {"compiled": 2}
    s = kiln.stats()
    assert s["backward_prefetches"] == 0 and s["compiles"] == 2 and s["graph_fallbacks"] == 0


def test_the_prefetch_waits_for_the_embedded_kilnd_the_forward_starts():
    cache_dir = tempfile.mkdtemp(prefix="kiln-pf-")  # short: unix socket paths are limited
    options = {"cache_dir": cache_dir, "kilnd": kilnd_path(), "idle_exit_after": "60s"}
    try:
        eager, model = models()
        x = torch.randn(8, 16)
        out = torch.compile(model, backend="kiln", options=options)(x)
        address = "unix:" + os.path.join(cache_dir, "kilnd.sock")
        wait_for(lambda: server_requests(address).get("compiled", 0) == 2,
                 "the embedded kilnd to compile the forward and the prefetched backward")
        out.sum().backward()
        assert_grads_match(eager, model, x, out)
        requests = server_requests(address)
        assert requests.get("compiled") == 2 and hits(requests) == 1, requests
        s = kiln.stats()
        assert s["backward_prefetches"] == 1 and s["compiles"] == 1 and s["hits"] == 1
    finally:
        pid_file = os.path.join(cache_dir, "kilnd.pid")
        if os.path.exists(pid_file):
            os.kill(int(open(pid_file).read()), signal.SIGTERM)
