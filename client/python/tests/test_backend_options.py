"""kiln.options (environment, overridden by torch.compile options), kiln.guards and the embedded
server's helpers, without a server."""

import os

import pytest
import torch

from kiln import options, proto, serialize_graph
from kiln.guards import GuardFailure, InputGuard, eval_expr, signature
from kiln import server


def test_defaults():
    o = options.resolve({}, environ={})
    assert o.embedded and o.fallback == "eager" and not o.cache_only and not o.debug
    assert o.max_graphs_per_function == 8 and o.idle_exit_after == 600.0 and o.prefetch_backward
    assert o.resolved_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "kiln")


def test_environment_then_options_on_top():
    env = {"KILN_SERVER": "unix:/tmp/a.sock", "KILN_FALLBACK": "error", "KILN_CACHE_ONLY": "1",
           "KILN_DEBUG": "yes", "KILN_DEBUG_DIR": "/tmp/dbg", "KILN_MAX_GRAPHS_PER_FUNCTION": "3",
           "KILN_IDLE_EXIT_AFTER": "90s", "KILN_PREFETCH_BACKWARD": "0", "XDG_CACHE_HOME": "/tmp/xdg"}
    o = options.resolve(None, environ=env)
    assert not o.prefetch_backward and options.resolve({"prefetch_backward": True}, environ=env).prefetch_backward
    assert (o.server, o.fallback, o.cache_only, o.debug, o.debug_dir) == ("unix:/tmp/a.sock", "error", True, True, "/tmp/dbg")
    assert o.max_graphs_per_function == 3 and o.idle_exit_after == 90.0
    o = options.resolve({"server": "127.0.0.1:9", "fallback": "eager", "cache_only": False,
                         "max_graphs_per_function": 5, "idle_exit_after": "2m"}, environ=env)
    assert (o.server, o.fallback, o.cache_only, o.max_graphs_per_function, o.idle_exit_after) == \
        ("127.0.0.1:9", "eager", False, 5, 120.0)
    assert options.default_cache_dir({"XDG_CACHE_HOME": "/tmp/xdg"}) == "/tmp/xdg/kiln"


@pytest.mark.parametrize("opts, message", [
    ({"severs": "x"}, "unknown kiln option"),
    ({"fallback": "ignore"}, "fallback"),
    ({"cache_only": "maybe"}, "not a boolean"),
    ({"idle_exit_after": "soon"}, "not a duration"),
    ({"max_graphs_per_function": "-1"}, "negative"),
])
def test_bad_options_are_errors(opts, message):
    with pytest.raises(ValueError, match=message):
        options.resolve(opts, environ={})


def test_durations():
    assert options.parse_duration("500ms", "x") == 0.5
    assert options.parse_duration("1h", "x") == 3600
    assert options.parse_duration(3, "x") == 3.0
    assert options.format_duration(600.0) == "600s" and options.format_duration(0.25) == "250ms"


def test_find_kilnd(tmp_path, monkeypatch):
    exe = tmp_path / "kilnd"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    o = options.resolve({"kilnd": str(exe)}, environ={})
    assert server.find_kilnd(o, environ={}) == str(exe)
    assert server.find_kilnd(None, environ={"KILN_KILND": str(exe)}) == str(exe)
    with pytest.raises(server.ServerError, match="not an executable"):
        server.find_kilnd(None, environ={"KILN_KILND": str(tmp_path / "missing")})
    assert server.find_kilnd(None, environ={"PATH": str(tmp_path)}) == str(exe)


def test_embedded_socket_path_too_long_is_a_clear_error(tmp_path):
    o = options.resolve({"cache_dir": str(tmp_path / ("x" * 120))}, environ={})
    with pytest.raises(server.ServerError, match="longer than a unix socket allows"):
        server.ensure_embedded(o)


def static_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x, y: (x @ y).relu())(torch.randn(4, 8), torch.randn(8, 3))
    return serialize_graph(gm)


def test_static_guard():
    g = InputGuard(static_graph())
    assert g.bind([torch.randn(4, 8), torch.randn(8, 3)]) == {}
    with pytest.raises(GuardFailure, match="size\\(0\\) is 5"):
        g.bind([torch.randn(5, 8), torch.randn(8, 3)])
    with pytest.raises(GuardFailure, match="stride"):
        g.bind([torch.randn(8, 4).t(), torch.randn(8, 3)])
    with pytest.raises(GuardFailure, match="dtype"):
        g.bind([torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 3)])
    with pytest.raises(GuardFailure, match="takes 2 inputs"):
        g.bind([torch.randn(4, 8)])
    assert signature([torch.randn(4, 8)]) != signature([torch.randn(8, 4).t()])


def test_static_guard_fast_path_agrees_with_input_guard():
    from kiln.backend import StaticGuard

    g = StaticGuard(static_graph())
    assert g.fast is not None
    assert g.bind([torch.randn(4, 8), torch.randn(8, 3)]) == {}
    assert g.bind([torch.randn(4, 8), torch.nn.Parameter(torch.randn(8, 3))]) == {}
    for args, message in [([torch.randn(5, 8), torch.randn(8, 3)], "size\\(0\\) is 5"),
                          ([torch.randn(8, 4).t(), torch.randn(8, 3)], "stride"),
                          ([torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 3)], "dtype"),
                          ([torch.randn(4, 8)], "takes 2 inputs"),
                          ([torch.randn(4, 8), 3], "not a tensor"),
                          ([torch.randn(4, 8, device="meta"), torch.randn(8, 3)], "is on meta")]:
        with pytest.raises(GuardFailure, match=message):
            g.bind(args)
    # The stride of a size-1 dimension is not guarded: such inputs pass, and then take the fast path.
    one = make_fx_graph(lambda x: x * 2, torch.randn(1, 8))
    g = StaticGuard(one)
    odd = torch.randn(8, 1).t()  # size (1, 8), strides (1, 1)
    assert odd.stride() != (8, 1) and g.bind([odd]) == {} and len(g._accepted) == 1
    assert g.bind([torch.randn(8, 1).t()]) == {} and len(g._accepted) == 1
    with pytest.raises(GuardFailure, match="stride"):
        g.bind([torch.randn(8, 2)[:, :1].t()])  # strides (1, 2)


def make_fx_graph(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    return serialize_graph(make_fx(fn)(*args))


def test_dynamic_guard_binds_symbols_and_checks_ranges():
    graph = proto.Graph()
    graph.symbols.add(name="s0", hint=4, min_value=2, max_value=64)
    s0 = proto.SymExpr(op=proto.SymExpr.OP_SYMBOL, symbol=0)
    twice = proto.SymExpr(op=proto.SymExpr.OP_MUL)
    twice.args.add(op=proto.SymExpr.OP_CONSTANT, constant=2)
    twice.args.add().CopyFrom(s0)
    for name, size in (("n", None), ("x", s0), ("y", twice)):
        ph = graph.nodes.add(name=name, op=proto.Node.OP_PLACEHOLDER, target=name)
        if size is None:
            ph.meta.sym_int.expr.CopyFrom(s0)
            continue
        ph.meta.tensor.dtype = proto.DTYPE_FLOAT32
        ph.meta.tensor.device.kind = proto.DEVICE_KIND_CPU
        ph.meta.tensor.sizes.add(expr=size)
        ph.meta.tensor.strides.add(constant=1)
    g = InputGuard(graph)
    assert g.bind([5, torch.randn(5), torch.randn(10)]) == {0: 5}
    with pytest.raises(GuardFailure, match="expects 12"):
        g.bind([6, torch.randn(6), torch.randn(10)])
    with pytest.raises(GuardFailure, match="symbol s0 is 5"):
        g.bind([5, torch.randn(6), torch.randn(12)])
    with pytest.raises(GuardFailure, match="outside the range"):
        g.bind([65, torch.randn(65), torch.randn(130)])


def test_eval_expr_uses_python_integer_semantics():
    e = proto.SymExpr(op=proto.SymExpr.OP_FLOOR_DIV)
    e.args.add(op=proto.SymExpr.OP_CONSTANT, constant=-7)
    e.args.add(op=proto.SymExpr.OP_SYMBOL, symbol=0)
    assert eval_expr(e, {0: 2}) == -4
    e.op = proto.SymExpr.OP_CEIL_DIV
    assert eval_expr(e, {0: 2}) == -3
    e.op = proto.SymExpr.OP_MOD
    assert eval_expr(e, {0: 2}) == 1


def test_artifact_checksum_is_checked():
    from kiln import testing
    from kiln.backend import check_artifact

    plan = proto.Plan(num_inputs=1)
    plan.values.add(storage=proto.PlanValue.STORAGE_INPUT)
    plan.outputs.append(0)
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"))
    check_artifact(artifact)
    artifact.plan.outputs[0] = 1  # altered after the checksum was computed
    with pytest.raises(ValueError, match="checksum mismatch"):
        check_artifact(artifact)
    artifact.checksum = ""
    with pytest.raises(ValueError, match="no checksum"):
        check_artifact(artifact)


def test_target_for_cpu_inputs_uses_the_option_or_this_machine():
    from kiln.backend import detect_cpu_isa, target_for

    t = target_for([torch.randn(2)], options.resolve({"cpu_isa": "x86-64-v3"}, environ={}))
    assert t.device == proto.DEVICE_KIND_CPU and t.cpu_isa == "x86-64-v3"
    isa = detect_cpu_isa()
    assert isa and isa != "native"
    assert target_for([torch.randn(2)], options.resolve({}, environ={})).cpu_isa == isa


def test_readable_plan():
    from kiln.debug import format_plan

    plan = proto.Plan(num_inputs=1, workspace_bytes=64)
    v = plan.values.add(storage=proto.PlanValue.STORAGE_INPUT)
    v.meta.dtype = proto.DTYPE_FLOAT32
    v.meta.sizes.add(constant=4)
    step = plan.steps.add().aten
    step.target, step.fallback, step.node = "aten.neg.default", True, "neg"
    step.args.add(node="v0")
    step.outputs.append(0)
    kernel = plan.steps.add().kernel
    kernel.symbol = "kiln_kernel_0"
    kernel.args.append(0)
    plan.outputs.append(0)
    text = format_plan(plan)
    assert "plan: 1 inputs, 1 values, 2 steps, workspace 64 bytes" in text
    assert "v0 = input[0]" in text and "float32[4]" in text
    assert "step 0: aten aten.neg.default(v0) -> v0 [fallback] (node neg)" in text
    assert "step 1: kernel kiln_kernel_0@binary0(v0; scalars [])" in text
