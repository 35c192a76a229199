"""kiln never breaks training: every way a graph can fail to compile or run makes it run eagerly
with one clear warning per cause (or raises with KILN_FALLBACK=error), against a real kilnd."""
import glob
import logging
import os
import tempfile
import warnings

import pytest
import torch

import kiln
import kiln.backend
import kiln.rpc
import kiln.serialize
from kiln import proto, testing
from kiln.rpc import KilnClient
from kilnd_server import Kilnd, fresh_kiln, server_requests

# torch's structured-trace logger would flood failure reports with empty records.
logging.getLogger("torch.__trace").addFilter(lambda record: False)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)


def f1(x):
    return torch.sigmoid(x) * 2


def f2(x):
    return torch.cos(x) + x


def f3(x):
    return (x * x).mean(-1)


def f4(x):
    return torch.exp(-x).cumsum(0)


def run(fn, options, x=None):
    """Compiles and calls fn; returns (result, KilnWarning messages)."""
    x = torch.randn(4, 8) if x is None else x
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn, backend="kiln", options=options)(x)
    torch.testing.assert_close(got, fn(x))
    return got, [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]



def test_cache_only_mode_looks_up_counts_misses_and_runs_eagerly(server, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_ONLY", "1")
    before = server_requests(server.address)
    _, messages = run(f1, {"server": server.address, "debug": True, "debug_dir": str(tmp_path)})
    s = kiln.stats()
    assert s["misses"] == s["graphs"] == s["requests"] == 1
    assert s["fallbacks_by_cause"] == {"cache_miss": 1} and s["compiles"] == 0
    after = server_requests(server.address)
    assert after.get("miss", 0) - before.get("miss", 0) == 1
    assert after.get("unimplemented", 0) == before.get("unimplemented", 0)  # never asked to compile
    assert len(messages) == 1 and "KILN_CACHE_ONLY" in messages[0]
    # Once the artifact is in the cache, cache-only mode uses it.
    (path,) = glob.glob(f"{tmp_path}/*/*/request.binpb")
    request = proto.CompileRequest.FromString(open(path, "rb").read())
    with KilnClient(server.address) as c:
        testing.import_artifact(c, request, testing.make_artifact(testing.aten_plan(request.graph), request.target))
    torch._dynamo.reset()
    kiln.reset_stats()
    _, messages = run(f1, {"server": server.address})
    assert kiln.stats()["hits"] == 1 and kiln.stats()["plan_calls"] == 1 and not messages


def test_kilnd_killed_mid_run_falls_back_once_and_resumes_on_a_new_server(monkeypatch):
    link_dir = tempfile.mkdtemp(prefix="kiln-link-")
    link = os.path.join(link_dir, "kilnd.sock")
    first = Kilnd()
    os.symlink(first.address[len("unix:"):], link)
    opts = {"server": "unix:" + link, "retry_interval": 0}
    run(f1, opts)
    assert kiln.stats()["requests"] == 1 and sum(server_requests(first.address).values()) == 1
    first.proc.kill()  # a crash, not a clean shutdown
    first.stop()
    messages = run(f2, opts)[1] + run(f3, opts)[1]
    unreachable = [m for m in messages if "UNAVAILABLE" in m]
    assert len(unreachable) == 1, messages
    assert "runs eagerly" in unreachable[0] and "unreachable" in unreachable[0]
    assert kiln.stats()["fallbacks_by_cause"]["unavailable"] == 2
    second = Kilnd()
    try:
        os.remove(link)
        os.symlink(second.address[len("unix:"):], link)
        requests_before = kiln.stats()["requests"]
        plan_calls_before = kiln.stats()["plan_calls"]
        run(f4, opts)
        assert kiln.stats()["requests"] == requests_before + 1
        assert sum(server_requests(second.address).values()) == 1  # reached the new server
        # ... and compiled execution resumed: the new server compiled f4 and its plan ran.
        assert kiln.stats()["compiles"] >= 2 and kiln.stats()["plan_calls"] > plan_calls_before
        # A graph that fell back while the server was down is sent again on its next call.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = torch.randn(4, 8)
            torch.testing.assert_close(torch.compile(f2, backend="kiln", options=opts)(x), f2(x))
        assert sum(server_requests(second.address).values()) == 2
    finally:
        assert second.stop() == 0


def test_fallback_error_raises_instead(monkeypatch):
    monkeypatch.setenv("KILN_FALLBACK", "error")
    missing = "unix:" + os.path.join(tempfile.mkdtemp(prefix="kiln-none-"), "none.sock")
    with pytest.raises(Exception) as info:
        torch.compile(f1, backend="kiln", options={"server": missing})(torch.randn(3))
    chain, e = [], info.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert any(isinstance(x, kiln.KilnError) for x in chain), chain
    assert "KILN_FALLBACK=error" in str(info.value) and "UNAVAILABLE" in str(info.value)


def test_fallback_error_raises_on_unimplemented(no_compile_server, monkeypatch):
    monkeypatch.setenv("KILN_FALLBACK", "error")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.compile(f1, backend="kiln", options={"server": no_compile_server.address})(torch.randn(3))
    except Exception as e:
        assert "UNIMPLEMENTED" in str(e) and "KILN_FALLBACK=error" in str(e)
    else:
        pytest.fail("KILN_FALLBACK=error did not raise on UNIMPLEMENTED from a --no_compile kilnd")


def test_deadline_exceeded_falls_back():
    slow = Kilnd("--debug_rpc_delay=3s")
    try:
        _, messages = run(f1, {"server": slow.address, "timeout": 0.3})
        assert kiln.stats()["fallbacks_by_cause"] == {"deadline_exceeded": 1}
        assert len(messages) == 1 and "DEADLINE_EXCEEDED" in messages[0] and "timeout" in messages[0]
    finally:
        slow.stop()


def test_an_exception_inside_kiln_while_serializing_falls_back(server, monkeypatch):
    def broken(gm, *args, **kwargs):
        raise kiln.SerializeError("node 'mul' (call_function aten.mul.Tensor): simulated failure")

    monkeypatch.setattr(kiln.serialize, "serialize_graph", broken)
    before = sum(server_requests(server.address).values())
    _, messages = run(f1, {"server": server.address})
    assert kiln.stats()["fallbacks_by_cause"] == {"serialize": 1}
    assert len(messages) == 1 and "could not serialize" in messages[0] and "simulated failure" in messages[0]
    assert sum(server_requests(server.address).values()) == before  # nothing was sent


def test_invalid_argument_from_kilnd_falls_back_naming_the_node(server, monkeypatch):
    real = kiln.serialize.serialize_graph

    def corrupt(gm, *args, **kwargs):
        graph = real(gm, *args, **kwargs)
        for node in graph.nodes:
            if node.op == proto.Node.OP_CALL_FUNCTION:
                node.args[0].node = "no_such_node"
                break
        return graph

    monkeypatch.setattr(kiln.serialize, "serialize_graph", corrupt)
    _, messages = run(f1, {"server": server.address})
    assert kiln.stats()["fallbacks_by_cause"] == {"invalid_argument": 1}
    assert len(messages) == 1 and "INVALID_ARGUMENT" in messages[0] and "no_such_node" in messages[0]


def test_a_plan_that_fails_at_run_time_falls_back(no_compile_server, tmp_path):
    _, _ = run(f3, {"server": no_compile_server.address, "debug": True, "debug_dir": str(tmp_path)})
    (path,) = glob.glob(f"{tmp_path}/*/*/request.binpb")
    request = proto.CompileRequest.FromString(open(path, "rb").read())
    plan = testing.aten_plan(request.graph)
    plan.values[-1].meta.sizes[0].constant += 1  # the plan lies about a result's shape
    with KilnClient(no_compile_server.address) as c:
        testing.import_artifact(c, request, testing.make_artifact(plan, request.target))
    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()
    _, messages = run(f3, {"server": no_compile_server.address})
    s = kiln.stats()
    assert s["hits"] == 1 and s["fallbacks_by_cause"] == {"plan_error": 1} and s["eager_calls"] == 1
    assert len(messages) == 1 and "running its plan" in messages[0]


@pytest.mark.parametrize("code, advice", [("INTERNAL", "kilnd log"), ("RESOURCE_EXHAUSTED", "later try")])
def test_internal_and_resource_exhausted_fall_back(server, monkeypatch, code, advice):
    import grpc

    class Error(grpc.RpcError):
        def code(self):
            return getattr(grpc.StatusCode, code)

        def details(self):
            return f"simulated {code}"

    def fail(self, request, timeout=None):
        raise Error()

    monkeypatch.setattr(kiln.rpc.KilnClient, "compile", fail)
    _, messages = run(f2, {"server": server.address})
    assert kiln.stats()["fallbacks_by_cause"] == {code.lower(): 1}
    assert len(messages) == 1 and code in messages[0] and advice in messages[0]
