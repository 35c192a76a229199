"""Registration (the torch_dynamo_backends entry point), options overriding the environment,
KILN_DEBUG folders and the `kiln` logger, against a real kilnd."""
import glob
import importlib.metadata
import logging
import os
import re
import tempfile
import warnings

import pytest
import torch

import kiln
import kiln.backend
from kiln import proto, testing
from kiln.rpc import KilnClient
from kilnd_server import fresh_kiln, server_requests

logging.getLogger("torch.__trace").addFilter(lambda record: False)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)



def f(x):
    return torch.nn.functional.silu(x) @ x.t()


def test_kiln_is_a_registered_dynamo_backend():
    import torch._dynamo

    assert "kiln" in torch._dynamo.list_backends()
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    (ep,) = [e for e in eps if e.name == "kiln"]
    assert ep.value == "kiln.backend:kiln_backend" and ep.load() is kiln.backend.kiln_backend
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kiln") is kiln.backend.kiln_backend


def test_options_override_environment_variables(server, monkeypatch):
    monkeypatch.setenv("KILN_SERVER", "unix:" + os.path.join(tempfile.mkdtemp(), "nobody.sock"))
    monkeypatch.setenv("KILN_CACHE_ONLY", "1")
    monkeypatch.setenv("KILN_FALLBACK", "error")  # would raise on the miss below if it applied
    before = server_requests(server.address)
    x = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.compile(f, backend="kiln", options={"server": server.address, "cache_only": False,
                                                         "fallback": "eager"})(x)
    torch.testing.assert_close(got, f(x))
    after = server_requests(server.address)
    assert sum(after.values()) - sum(before.values()) == 1  # the option's server, not the env's
    assert after.get("miss", 0) == before.get("miss", 0)  # Compile, not the env's cache-only Lookup
    assert kiln.stats()["misses"] == 0


def test_unknown_options_are_refused():
    with pytest.raises(Exception, match="unknown kiln option"):
        torch.compile(f, backend="kiln", options={"sever": "x"})(torch.randn(2, 2))


def test_debug_folders_and_logs(server, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("KILN_DEBUG", "1")
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    x = torch.randn(4, 4, requires_grad=True)
    caplog.set_level(logging.INFO, logger="kiln")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(f, backend="kiln", options={"server": server.address})(x).sum().backward()
    def numbered():
        paths = glob.glob(f"{tmp_path}/{os.getpid()}/*")
        return sorted(paths, key=lambda p: int(os.path.basename(p).split("_")[0]))

    folders = numbered()  # <n>_<kind>, n counting the graphs of this process
    assert [os.path.basename(p).split("_")[1] for p in folders] == ["forward", "backward"]
    for folder in folders:
        files = set(os.listdir(folder))
        assert {"fx_graph.txt", "request.binpb", "key.txt", "outcome.txt"} <= files
        assert "def forward" in open(os.path.join(folder, "fx_graph.txt")).read()
        request = proto.CompileRequest.FromString(open(os.path.join(folder, "request.binpb"), "rb").read())
        assert request.options.keep_source  # kilnd keeps the generated source for these
        key = re.search(r"key: ([0-9a-f]{64})", open(os.path.join(folder, "key.txt")).read()).group(1)
        with KilnClient(server.address) as c:
            assert c.lookup(request, timeout=30).key == key
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln")
    assert str(tmp_path) in logged and "debug files" in logged
    # kilnd compiled these graphs: each folder has the hashed fields, the generated source and a
    # plan with compiled kernels.
    compiled = folders[0]
    key_text = open(os.path.join(compiled, "key.txt")).read()
    assert "target.cpu_isa" in key_text and "compiler.cxx" in key_text, key_text
    sources = glob.glob(os.path.join(compiled, "source", "*"))
    assert sources and 'extern "C"' in open(sources[0]).read()
    plan = open(os.path.join(compiled, "plan.txt")).read()
    assert plan.startswith("plan: 1 inputs") and "kernel" in plan, plan
    assert "COMPILED" in open(os.path.join(compiled, "outcome.txt")).read()
    # Served from the cache the second time: plan and timings again, and the tier.
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(f, backend="kiln", options={"server": server.address})(x).sum().backward()
    hit = numbered()[2]
    assert hit.endswith("_forward")
    assert open(os.path.join(hit, "plan.txt")).read() == plan
    timings = open(os.path.join(hit, "timings.txt")).read()
    assert "client rpc" in timings and "server hash" in timings
    assert "MEMORY_HIT" in open(os.path.join(hit, "outcome.txt")).read()


def _with_intermediates(x, w):
    a = torch.relu(x @ w)
    b = torch.softmax(a * 2.0, -1)  # an intermediate in the workspace: a kernel writes it, mm reads it
    return (b @ w.t()).sum(1), (a > 0).sum()


@pytest.mark.parametrize("poison", [False, True])
def test_poison_buffers_fills_what_plans_allocate_and_results_stay_right(server, monkeypatch, poison):
    import kiln._exec_common as common

    fills = []
    original = common._poison_value
    monkeypatch.setattr(common, "_poison_value", lambda dtype: fills.append(dtype) or original(dtype))
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    got = torch.compile(_with_intermediates, backend="kiln",
                        options={"server": server.address, "fallback": "error", "poison_buffers": poison})(x, w)
    for g, e in zip(got, _with_intermediates(x, w)):
        torch.testing.assert_close(g, e)
    assert kiln.stats()["graph_fallbacks"] == 0 and kiln.stats()["plan_calls"] >= 1
    if poison:  # every OUTPUT value was filled before the plan wrote it (the float ones and the
        # count), and the workspace (uint8 bytes)
        assert torch.float32 in fills and torch.int64 in fills and torch.uint8 in fills
    else:
        assert fills == []


def test_poison_values_follow_the_dtype():
    from kiln._exec_common import _poisoned

    assert torch.isnan(_poisoned(lambda: torch.empty(3))()).all()
    assert torch.isnan(_poisoned(lambda: torch.empty(3, dtype=torch.bfloat16))()).all()
    assert (_poisoned(lambda: torch.empty(2, dtype=torch.int32))() == 2**31 - 1).all()
    assert _poisoned(lambda: torch.empty(2, dtype=torch.bool))().all()
    # The workspace is bytes of 0xFF: a NaN whichever float type views them.
    ws = _poisoned(lambda: torch.empty(8, dtype=torch.uint8))()
    assert torch.isnan(ws.view(torch.float32)).all() and torch.isnan(ws.view(torch.float16)).all()
    assert torch.isnan(ws.view(torch.bfloat16)).all() and torch.isnan(ws.view(torch.float64)).all()
