"""Guards and specializations of the kiln backend against a real kilnd: new shapes send new
compile requests with new keys, inputs that do not match an artifact compile a new
specialization, and the per-function cap makes the function run eagerly with a warning."""
import glob
import logging
import warnings

import pytest
import torch

import kiln
import kiln.backend
from kiln import proto, testing
from kiln.rpc import KilnClient

# torch's structured-trace logger would flood failure reports with empty records.
logging.getLogger("torch.__trace").addFilter(lambda record: False)


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()
    yield
    torch._dynamo.reset()


def requests_in(debug_dir):
    out = []
    for path in sorted(glob.glob(f"{debug_dir}/*/*/request.binpb"),
                       key=lambda p: int(p.split("/")[-2].split("_")[0])):
        with open(path, "rb") as f:
            out.append(proto.CompileRequest.FromString(f.read()))
    return out


def keys_of(server, requests):
    with KilnClient(server.address) as c:
        return [c.lookup(r, timeout=30).key for r in requests]


def server_count(server, outcome):
    with KilnClient(server.address) as c:
        return c.get_stats().requests.get(outcome, 0)


def fn(x, w):
    return torch.tanh(x @ w).sum(-1)


def test_a_shape_change_sends_a_new_request_with_a_new_key(server, tmp_path):
    opts = {"server": server.address, "debug": True, "debug_dir": str(tmp_path)}
    compiled = torch.compile(fn, backend="kiln", options=opts, dynamic=False)
    w = torch.randn(8, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rows in (4, 4, 6):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert kiln.stats()["requests"] == 2  # the repeated shape reuses the first graph
    reqs = requests_in(tmp_path)
    assert len(reqs) == 2
    assert reqs[0].graph.nodes[0].meta.tensor.sizes[0].constant == 4
    assert reqs[1].graph.nodes[0].meta.tensor.sizes[0].constant == 6
    k0, k1 = keys_of(server, reqs)
    assert k0 != k1 and len(k0) == len(k1) == 64


def test_the_per_function_cap_runs_the_function_eagerly_with_a_warning(server):
    opts = {"server": server.address, "max_graphs_per_function": 2}
    compiled = torch.compile(fn, backend="kiln", options=opts, dynamic=False)
    w = torch.randn(8, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (2, 3, 4, 5):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x, w), fn(x, w))
    s = kiln.stats()
    assert s["requests"] == 2  # the third and fourth shapes never reach kilnd
    assert s["fallbacks_by_cause"]["graph_limit"] == 2
    capped = [w for w in caught if issubclass(w.category, kiln.KilnWarning)
              and "max_graphs_per_function=2" in str(w.message)]
    assert len(capped) == 1, [str(w.message) for w in caught]
    assert "runs eagerly" in str(capped[0].message)


def test_inputs_that_do_not_match_the_artifact_compile_a_new_specialization(no_compile_server, tmp_path):
    """Called outside Dynamo (whose own guards would recompile first), so kiln's guards decide."""
    gm = torch.fx.symbolic_trace(lambda x, w: (fn(x, w),))  # AOTAutograd wants tuple outputs
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    opts = {"server": no_compile_server.address, "debug": True, "debug_dir": str(tmp_path)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.backend.kiln_backend(gm, [x, w], options=opts)(x, w)
    first = requests_in(tmp_path)
    assert len(first) == 1 and first[0].graph.kind == proto.GRAPH_KIND_INFERENCE
    with KilnClient(no_compile_server.address) as c:
        testing.import_artifact(c, first[0], testing.make_artifact(testing.aten_plan(first[0].graph),
                                                                   first[0].target))
    kiln.backend.reset()
    kiln.reset_stats()
    compiled = kiln.backend.kiln_backend(gm, [x, w], options=opts)
    torch.testing.assert_close(compiled(x, w)[0], fn(x, w))
    assert kiln.stats()["plan_calls"] >= 1 and kiln.stats()["hits"] == 1
    unimplemented_before = server_count(no_compile_server, "unimplemented")
    x_t = torch.randn(8, 4).t()  # same shape, other strides: the artifact's guard fails
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(x_t, w)[0]
    torch.testing.assert_close(out, fn(x_t, w))
    s = kiln.stats()
    assert s["requests"] == 2 and s["graphs"] == 2  # one new specialization, sent to kilnd
    reqs = requests_in(tmp_path)
    assert [st.constant for st in reqs[-1].graph.nodes[0].meta.tensor.strides] == [1, 4]
    new_key = keys_of(no_compile_server, reqs[-1:])[0]
    assert new_key not in s["keys"]
    if s["fallbacks_by_cause"].get("unimplemented"):
        assert server_count(no_compile_server, "unimplemented") == unimplemented_before + 1
    plan_calls = s["plan_calls"]
    compiled(x, w)  # the first specialization still runs its plan
    assert kiln.stats()["plan_calls"] == plan_calls + 1

