"""The plan executor on hand-built plans of AtenSteps and views (real tensors, compared with eager),
and on plans made from graphs that torch.compile + AOTAutograd really produce."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln import proto, serialize_graph, testing
from kiln.executor import PlanError, PlanExecutor
from kiln.guards import InputGuard
from kiln_capture import assert_same_outputs, capture

PV = proto.PlanValue
F32 = proto.DTYPE_FLOAT32


def meta(sizes, strides=None, dtype=F32, offset=0):
    if strides is None:
        strides = list(torch.empty(sizes, device="meta").stride())
    m = proto.TensorMeta(dtype=dtype, device=proto.Device(kind=proto.DEVICE_KIND_CPU))
    for s in sizes:
        m.sizes.add(constant=s)
    for s in strides:
        m.strides.add(constant=s)
    m.storage_offset.constant = offset
    return m


def value(plan, sizes, storage, index=0, offset=0, strides=None, dtype=F32):
    v = plan.values.add(storage=storage, index=index, offset=offset)
    v.meta.CopyFrom(meta(sizes, strides, dtype))
    return len(plan.values) - 1


def ref(i):
    return proto.Argument(node=f"v{i}")


def aten(plan, target, args, outputs, kwargs=None, fallback=False):
    step = plan.steps.add().aten
    step.target, step.fallback = target, fallback
    for a in args:
        step.args.add().CopyFrom(a if isinstance(a, proto.Argument) else _const(a))
    for k, a in (kwargs or {}).items():
        step.kwargs.add(name=k).value.CopyFrom(a if isinstance(a, proto.Argument) else _const(a))
    step.outputs.extend(outputs)
    return step


def _const(x):
    if isinstance(x, bool):
        return proto.Argument(bool_value=x)
    if isinstance(x, int):
        return proto.Argument(int_value=x)
    if isinstance(x, float):
        return proto.Argument(float_value=x)
    if isinstance(x, list):
        a = proto.Argument()
        a.list.SetInParent()
        for item in x:
            a.list.items.add().CopyFrom(_const(item))
        return a
    raise TypeError(x)


def run(plan, inputs, graph=None, **kw):
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"))
    ex = PlanExecutor(artifact, graph or proto.Graph(), **kw)
    return ex, ex(inputs)


def test_aten_steps_with_step_values_match_eager():
    # y = gelu(x @ w.T + b); out = y.sum(-1)
    plan = proto.Plan(num_inputs=3)
    x, w, b = (value(plan, s, PV.STORAGE_INPUT, i) for i, s in enumerate([[4, 8], [16, 8], [16]]))
    wt = value(plan, [8, 16], PV.STORAGE_STEP, strides=[1, 8])
    h = value(plan, [4, 16], PV.STORAGE_STEP)
    y = value(plan, [4, 16], PV.STORAGE_STEP)
    s = value(plan, [4], PV.STORAGE_STEP)
    aten(plan, "aten.t.default", [ref(w)], [wt])
    aten(plan, "aten.addmm.default", [ref(b), ref(x), ref(wt)], [h])
    aten(plan, "aten.gelu.default", [ref(h)], [y], kwargs={"approximate": proto.Argument(string_value="tanh")},
         fallback=True)
    aten(plan, "aten.sum.dim_IntList", [ref(y), [-1]], [s])
    plan.outputs.extend([y, s])
    args = [torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)]
    ex, (out_y, out_s) = run(plan, args)
    expect = F.gelu(F.linear(*args), approximate="tanh")
    torch.testing.assert_close(out_y, expect)
    torch.testing.assert_close(out_s, expect.sum(-1))
    assert ex.op_fallbacks == 1


def test_outputs_workspace_views_and_constants():
    # Graph constant c (2x3); z = x * c lands in a workspace slice; out = OUTPUT <- z + 1 viewed
    # through a transposed view; also returns a view of the input at an offset.
    plan = proto.Plan(num_inputs=1, workspace_bytes=256)
    x = value(plan, [2, 3], PV.STORAGE_INPUT, 0)
    c = value(plan, [2, 3], PV.STORAGE_CONSTANT, 0)
    z = value(plan, [2, 3], PV.STORAGE_WORKSPACE, offset=64)
    plan.values[z].meta.storage_offset.constant = 7  # the graph's; storage offset 0 is at `offset`
    zt = value(plan, [3, 2], PV.STORAGE_VIEW, index=z, strides=[1, 3])
    out = value(plan, [3, 2], PV.STORAGE_OUTPUT)
    row1 = value(plan, [3], PV.STORAGE_VIEW, index=x, offset=3, strides=[1])
    aten(plan, "aten.mul.Tensor", [ref(x), ref(c)], [z])
    aten(plan, "aten.add.Tensor", [ref(zt), 1.0], [out])
    plan.outputs.extend([out, row1])
    graph = proto.Graph()
    const = torch.arange(6.0).reshape(2, 3)
    graph.constants.add(name="c", meta=meta([2, 3]))
    xin = torch.randn(2, 3)
    _, (o, r) = run(plan, [xin], graph=graph, constants={"c": const})
    torch.testing.assert_close(o, (xin * const).t() + 1)
    assert o.stride() == (2, 1)  # allocated with the plan's strides
    assert r.data_ptr() == xin[1].data_ptr()  # a real view of the input, not a copy
    torch.testing.assert_close(r, xin[1])


def test_constant_rebuilt_from_the_graph_when_not_held():
    plan = proto.Plan(num_inputs=0)
    c = value(plan, [3], PV.STORAGE_CONSTANT, 0)
    y = value(plan, [3], PV.STORAGE_STEP)
    aten(plan, "aten.neg.default", [ref(c)], [y])
    plan.outputs.append(y)
    graph = proto.Graph()
    graph.constants.add(name="k", meta=meta([3]), data=torch.tensor([1.0, 2.0, 3.0]).numpy().tobytes())
    _, (out,) = run(plan, [], graph=graph)
    assert out.tolist() == [-1.0, -2.0, -3.0]


def test_multi_output_step_and_skipped_items():
    plan = proto.Plan(num_inputs=1)
    x = value(plan, [4, 6], PV.STORAGE_INPUT, 0)
    mean = value(plan, [4, 1], PV.STORAGE_STEP)
    y = value(plan, [4, 6], PV.STORAGE_STEP)
    # native_layer_norm returns (out, mean, rstd); keep out and mean, skip rstd
    aten(plan, "aten.native_layer_norm.default", [ref(x), [6], proto.Argument(none=proto.NoneValue()),
                                                  proto.Argument(none=proto.NoneValue()), 1e-5], [y, mean, -1])
    plan.outputs.extend([y, mean])
    xin = torch.randn(4, 6)
    _, (out, m) = run(plan, [xin])
    torch.testing.assert_close(out, F.layer_norm(xin, [6]))
    torch.testing.assert_close(m, xin.mean(-1, keepdim=True))


def test_symbolic_sizes_and_symint_arguments():
    # graph: placeholder x: f32[s0, 4]; plan: y = x.view(s0 * 4); outputs y and s0 (a SymInt output)
    graph = proto.Graph()
    graph.symbols.add(name="s0", hint=3, min_value=2, max_value=(1 << 63) - 1)
    sym = proto.SymExpr(op=proto.SymExpr.OP_SYMBOL, symbol=0)
    ph = graph.nodes.add(name="x", op=proto.Node.OP_PLACEHOLDER, target="x")
    ph.meta.tensor.dtype = F32
    ph.meta.tensor.device.kind = proto.DEVICE_KIND_CPU
    ph.meta.tensor.sizes.add(expr=sym)
    ph.meta.tensor.sizes.add(constant=4)
    ph.meta.tensor.strides.add(constant=4)
    ph.meta.tensor.strides.add(constant=1)
    size_node = graph.nodes.add(name="sz", op=proto.Node.OP_CALL_FUNCTION, target="aten.sym_size.int")
    size_node.meta.sym_int.expr.CopyFrom(sym)
    out_node = graph.nodes.add(name="output", op=proto.Node.OP_OUTPUT, target="output")
    outs = out_node.args.add().list
    outs.items.add(node="view")
    outs.items.add(node="sz")
    plan = proto.Plan(num_inputs=1)
    x = plan.values.add(storage=PV.STORAGE_INPUT, index=0)
    x.meta.CopyFrom(ph.meta.tensor)
    y = plan.values.add(storage=PV.STORAGE_STEP)
    y.meta.dtype = F32
    numel = proto.SymExpr(op=proto.SymExpr.OP_MUL)
    numel.args.add().CopyFrom(sym)
    numel.args.add(op=proto.SymExpr.OP_CONSTANT, constant=4)
    y.meta.sizes.add(expr=numel)
    y.meta.strides.add(constant=1)
    size_arg = proto.Argument()
    size_arg.list.items.add(sym_int=numel)
    aten(plan, "aten.view.default", [ref(0), size_arg], [1])
    plan.outputs.extend([1, -1])
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"))
    ex = PlanExecutor(artifact, graph)
    guard = InputGuard(graph)
    for n in (3, 7):
        xin = torch.randn(n, 4)
        symbols = guard.bind([xin])
        assert symbols == {0: n}
        flat, size = ex([xin], symbols)
        assert size == n
        torch.testing.assert_close(flat, xin.reshape(-1))


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.steps[0].aten.args[0].__setattr__("node", "v99"), "not a plan value"),
    (lambda p: p.steps[0].aten.__setattr__("target", "aten.no_such_op.default"), "no_such_op"),
    (lambda p: p.values[1].__setattr__("storage", PV.STORAGE_VIEW) or p.values[1].__setattr__("index", 1),
     "does not exist"),
    (lambda p: p.values.add(storage=PV.STORAGE_WORKSPACE, offset=3).meta.CopyFrom(meta([1])), "multiple of 4"),
    (lambda p: p.outputs.append(42), "does not exist"),
    (lambda p: p.values[0].__setattr__("index", 5), "input 5"),
])
def test_malformed_plans_are_refused_at_load(mutate, message):
    plan = proto.Plan(num_inputs=1)
    x = value(plan, [3], PV.STORAGE_INPUT, 0)
    y = value(plan, [3], PV.STORAGE_STEP)
    aten(plan, "aten.neg.default", [ref(x)], [y])
    plan.outputs.append(y)
    mutate(plan)
    with pytest.raises(PlanError, match=message):
        run(plan, [torch.randn(3)])


def test_view_cycle_is_refused():
    plan = proto.Plan(num_inputs=0)
    value(plan, [3], PV.STORAGE_VIEW, index=1)
    value(plan, [3], PV.STORAGE_VIEW, index=0)
    with pytest.raises(PlanError, match="cycle"):
        run(plan, [])


def test_workspace_overflow_and_wrong_step_result_fail_at_run_time():
    plan = proto.Plan(num_inputs=1, workspace_bytes=8)
    x = value(plan, [4], PV.STORAGE_INPUT, 0)
    w = value(plan, [4], PV.STORAGE_WORKSPACE, offset=0)  # 16 bytes in an 8-byte workspace
    aten(plan, "aten.neg.default", [ref(x)], [w])
    plan.outputs.append(w)
    with pytest.raises(PlanError, match="overflow"):
        run(plan, [torch.randn(4)])
    plan = proto.Plan(num_inputs=1)
    x = value(plan, [4], PV.STORAGE_INPUT, 0)
    y = value(plan, [5], PV.STORAGE_STEP)  # the op really returns 4 elements
    aten(plan, "aten.neg.default", [ref(x)], [y])
    plan.outputs.append(y)
    with pytest.raises(PlanError, match="the plan says"):
        run(plan, [torch.randn(4)])


def test_unknown_library_steps_and_cuda_kernels_without_a_runtime_are_refused():
    plan = proto.Plan(num_inputs=0)
    plan.steps.add().library.function = "cublas.gemm"
    with pytest.raises(PlanError, match="unknown library function"):
        run(plan, [])
    plan = proto.Plan(num_inputs=0)
    plan.steps.add().library.function = "cublasLt.matmul"  # no params
    with pytest.raises(PlanError, match="int_params"):
        run(plan, [])
    plan = proto.Plan(num_inputs=0)
    plan.steps.add().kernel.symbol = "kiln_kernel_0"
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90"),
                                     [proto.Binary(kind=proto.Binary.KIND_CUBIN, data=b"x")])
    with pytest.raises(NotImplementedError, match="no runtime"):
        PlanExecutor(artifact, proto.Graph())
    # CUDA kernel steps: test_executor_cuda.py


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.ln(self.fc1(x)))).softmax(-1)


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1)


@pytest.mark.parametrize("model, shape, dynamic", [(MLP, (4, 16), False), (Conv, (2, 3, 8, 8), False),
                                                   (MLP, (4, 16), True)])
def test_plans_made_from_real_aot_graphs_match_the_graphs(model, shape, dynamic):
    torch.manual_seed(0)
    graphs = capture(model(), [torch.randn(*shape)], train=True, dynamic=dynamic)
    assert [g.kind for g in graphs] == ["forward", "backward"]
    kinds = {"forward": proto.GRAPH_KIND_FORWARD, "backward": proto.GRAPH_KIND_BACKWARD}
    for g in graphs:
        pb = serialize_graph(g.gm, g.example_inputs, kind=kinds[g.kind])
        for preallocate in (False, True):
            plan = testing.aten_plan(pb, preallocate_outputs=preallocate)
            artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"))
            ex = PlanExecutor(artifact, pb)
            got = ex(g.real_inputs, InputGuard(pb).bind(g.real_inputs))
            assert_same_outputs(got, g.gm(*g.real_inputs))
            assert ex.op_fallbacks == len(plan.steps)
        if dynamic:
            assert len(pb.symbols) > 0  # really symbolic: sizes are bound from the inputs


def test_tuple_items_returned_as_none_are_fine_until_read():
    # native_layer_norm_backward with output_mask [True, False, False] returns (grad, None, None);
    # the plan names values for all three items (as captures with dead getitems do).
    def build(read_none):
        plan = proto.Plan(num_inputs=5)
        g, x, mean, rstd, w = (value(plan, s, PV.STORAGE_INPUT, i)
                               for i, s in enumerate([[4, 8], [4, 8], [4, 1], [4, 1], [8]]))
        dx = value(plan, [4, 8], PV.STORAGE_STEP)
        dw = value(plan, [8], PV.STORAGE_STEP)
        db = value(plan, [8], PV.STORAGE_STEP)
        aten(plan, "aten.native_layer_norm_backward.default",
             [ref(g), ref(x), [8], ref(mean), ref(rstd), ref(w), ref(w), [True, False, False]], [dx, dw, db])
        plan.outputs.extend([dx, dw] if read_none else [dx])
        return plan

    x = torch.randn(4, 8)
    mean = x.mean(-1, keepdim=True)
    rstd = (x.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt()
    args = [torch.randn(4, 8), x, mean, rstd, torch.randn(8)]
    _, (dx,) = run(build(False), args)
    want = torch.ops.aten.native_layer_norm_backward(args[0], x, [8], mean, rstd, args[4], args[4],
                                                     [True, False, False])[0]
    torch.testing.assert_close(dx, want)
    with pytest.raises(PlanError, match="returned None"):
        run(build(True), args)


def test_input_updates_at_the_end_run_as_foreach_copies_per_dtype(monkeypatch):
    # A forward that updates two inputs (as batch norm's running statistics), the way AOTAutograd
    # leaves them with keep_inference_input_mutations: copy_(input, new value) after the compute.
    # The third copy writes into the first's source, so it starts a new run (a lone copy_).
    def build():
        plan = proto.Plan(num_inputs=3)
        x, rm, nbt = (value(plan, s, PV.STORAGE_INPUT, i, dtype=d)
                      for i, (s, d) in enumerate([([4, 3], F32), ([3], F32), ([], proto.DTYPE_INT64)]))
        mean = value(plan, [3], PV.STORAGE_STEP)
        new_rm = value(plan, [3], PV.STORAGE_STEP)
        new_nbt = value(plan, [], PV.STORAGE_STEP, dtype=proto.DTYPE_INT64)
        out = value(plan, [4, 3], PV.STORAGE_STEP)
        aliases = [value(plan, [3], PV.STORAGE_STEP), value(plan, [], PV.STORAGE_STEP, dtype=proto.DTYPE_INT64)]
        aten(plan, "aten.mean.dim", [ref(x), [0]], [mean])
        aten(plan, "aten.lerp.Scalar", [ref(rm), ref(mean), 0.1], [new_rm])
        aten(plan, "aten.add.Tensor", [ref(nbt), 1], [new_nbt])
        aten(plan, "aten.sub.Tensor", [ref(x), ref(mean)], [out])
        aten(plan, "aten.copy_.default", [ref(rm), ref(new_rm)], [aliases[0]])
        aten(plan, "aten.copy_.default", [ref(nbt), ref(new_nbt)], [aliases[1]])
        aten(plan, "aten.copy_.default", [ref(new_rm), ref(mean)], [-1])
        plan.outputs.extend([out, aliases[0]])
        return plan

    calls = []
    real = torch._foreach_copy_
    monkeypatch.setattr("kiln._exec_aten._FOREACH_COPY", lambda d, s: (calls.append(len(d)), real(d, s)))
    x, rm, nbt = torch.randn(4, 3), torch.randn(3), torch.tensor(5)
    want_rm = torch.lerp(rm, x.mean(0), 0.1)
    ex, (out, rm_out) = run(build(), [x, rm, nbt])
    torch.testing.assert_close(out, x - x.mean(0))
    torch.testing.assert_close(rm, want_rm)  # the input itself was updated
    assert rm_out is rm and nbt.item() == 6
    assert calls == [1, 1]  # rm (f32) and nbt (int64) in one instruction; the third copy_ ran alone
    assert [e[0] for e in ex._steps][-2:] == ["copies", "aten"]


def test_programs_are_built_once_per_device_and_outputs_are_fresh():
    plan = proto.Plan(num_inputs=1, workspace_bytes=128)
    x = value(plan, [2, 3], PV.STORAGE_INPUT, 0)
    w = value(plan, [2, 3], PV.STORAGE_WORKSPACE, offset=64)
    out = value(plan, [3, 2], PV.STORAGE_OUTPUT)
    aten(plan, "aten.mul.Tensor", [ref(x), 2.0], [w])
    aten(plan, "aten.t.default", [ref(w)], [value(plan, [3, 2], PV.STORAGE_STEP, strides=[1, 3])])
    aten(plan, "aten.add.Tensor", [ref(3), 1.0], [out])
    plan.outputs.extend([out, x])
    ex, _ = run(plan, [torch.randn(2, 3)])
    results = []
    for _ in range(3):
        xin = torch.randn(2, 3)
        o, same = ex([xin])
        torch.testing.assert_close(o, xin.t() * 2 + 1)
        assert same is xin
        results.append(o)
    assert len({r.data_ptr() for r in results}) == 3  # each call allocates its outputs
    assert len(ex._programs) == 1


def test_inputs_that_are_not_tensors_or_missing_are_plan_errors():
    plan = proto.Plan(num_inputs=2)
    x = value(plan, [3], PV.STORAGE_INPUT, 0)
    y = value(plan, [3], PV.STORAGE_INPUT, 1)
    z = value(plan, [3], PV.STORAGE_STEP)
    aten(plan, "aten.add.Tensor", [ref(x), ref(y)], [z])
    plan.outputs.append(z)
    ex, _ = run(plan, [torch.randn(3), torch.randn(3)])
    with pytest.raises(PlanError, match="graph input 1 is not a tensor"):
        ex([torch.randn(3), 7])
    with pytest.raises(PlanError, match="takes 2 inputs, got 1"):
        ex([torch.randn(3)])


def test_values_read_before_their_step_and_step_results_read_through_views():
    plan = proto.Plan(num_inputs=1)
    x = value(plan, [4], PV.STORAGE_INPUT, 0)
    y = value(plan, [4], PV.STORAGE_STEP)
    half = value(plan, [2], PV.STORAGE_VIEW, index=y, offset=2, strides=[1])
    z = value(plan, [2], PV.STORAGE_STEP)
    aten(plan, "aten.neg.default", [ref(x)], [y])
    aten(plan, "aten.mul.Tensor", [ref(half), 3.0], [z])
    plan.outputs.extend([z, half])
    xin = torch.randn(4)
    _, (got, view) = run(plan, [xin])
    torch.testing.assert_close(got, -xin[2:] * 3)
    torch.testing.assert_close(view, -xin[2:])
    plan.steps[0].aten.outputs[0] = -1  # nothing produces y now
    with pytest.raises(PlanError, match="v1 is used before the step that produces it ran"):
        run(plan, [xin])


def test_bound_aten_steps_run_as_op_overloads_would_under_a_torch_function_mode():
    """A convolution step calls torch's binding (kiln._exec_aten._BOUND: fewer microseconds a call
    than the OpOverload), with __torch_function__ disabled around the program, so a mode the caller
    has active sees nothing of it, as with an OpOverload."""
    from torch.overrides import TorchFunctionMode

    from kiln._exec_aten import _callable_of

    assert _callable_of(torch.ops.aten.convolution.default) is torch._C._VariableFunctions.convolution
    assert _callable_of(torch.ops.aten.add.Tensor) is torch.ops.aten.add.Tensor._op
    plan = proto.Plan(num_inputs=2)
    x = value(plan, [1, 3, 6, 6], PV.STORAGE_INPUT, 0)
    w = value(plan, [4, 3, 3, 3], PV.STORAGE_INPUT, 1)
    y = value(plan, [1, 4, 6, 6], PV.STORAGE_STEP)
    none = proto.Argument()
    none.none.SetInParent()
    aten(plan, "aten.convolution.default", [ref(x), ref(w), none, [1, 1], [1, 1], [1, 1], False, [0, 0], 1], [y])
    plan.outputs.append(y)

    class Record(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    args = [torch.randn(1, 3, 6, 6), torch.randn(4, 3, 3, 3)]
    with Record() as mode:
        _, (out,) = run(plan, args)
    torch.testing.assert_close(out, F.conv2d(*args, padding=1))
    assert "convolution" not in mode.seen, mode.seen
