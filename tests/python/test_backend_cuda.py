"""The backend with CUDA artifacts, on a machine without a GPU: the artifacts kilnd compiles for
CUDA satisfy the executor's plan checks and give a launch table, and a CUDA artifact that cannot
be loaded (no NVIDIA driver) makes its graph run eagerly with one warning, counted as for CPU.
Running them is tests/gpu/test_cuda_backend.py."""
import re
import contextlib
import glob
import logging
import warnings

import pytest
import torch

import kiln
import kiln.backend
import kiln.requests
from kiln import executor, proto, testing
from kiln.executor import PlanExecutor
from kiln.precompiler import _capture, _meta_clone, _to_meta, parse_target, rewrite_devices
from kiln.rpc import KilnClient
from kilnd_server import Kilnd, fresh_kiln
from test_precompile import MLP, nvrtc_library

logging.getLogger("torch.__trace").addFilter(lambda record: False)

SM90 = proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    yield from fresh_kiln(monkeypatch)


def f(x):
    return torch.softmax(x * 2 + 1, -1)


def test_cuda_artifact_without_a_driver_runs_eagerly_with_one_warning(no_compile_server, monkeypatch,
                                                                      tmp_path):
    """The backend asks for CUDA (target_for is made to answer sm_90 for these CPU inputs) and
    kilnd serves a CUDA artifact with a kernel step; loading it needs libcuda, which is absent
    (KILN_LIBCUDA_PATH names no library, so this holds on GPU machines too)."""
    monkeypatch.setenv("KILN_LIBCUDA_PATH", str(tmp_path / "no" / "libcuda.so.1"))
    monkeypatch.setattr(kiln.requests, "target_for", lambda inputs, opts: SM90)
    # aot_cache off: its load path asks for the target of the real (CPU) inputs, not the patch's.
    opts = {"server": no_compile_server.address, "aot_cache": False}
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        torch.compile(f, backend="kiln", options=dict(opts, debug=True, debug_dir=str(tmp_path / "d")))(x)
    (path,) = glob.glob(f"{tmp_path}/d/*/*/request.binpb")
    request = proto.CompileRequest.FromString(open(path, "rb").read())
    assert request.target == SM90
    plan = testing.aten_plan(request.graph)
    k = plan.steps.add().kernel  # a kernel step after the aten steps: the plan needs the runtime
    k.symbol, k.grid[:], k.block[:] = "kiln_kernel_0", [1], [32]
    k.args.append(plan.outputs[0])
    artifact = testing.make_artifact(plan, SM90, [proto.Binary(kind=proto.Binary.KIND_CUBIN, data=b"\x7fELF")])
    with KilnClient(no_compile_server.address) as c:
        testing.import_artifact(c, request, artifact)

    torch._dynamo.reset()
    kiln.backend.reset()
    kiln.reset_stats()
    compiled = torch.compile(f, backend="kiln", options=opts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(compiled(x), f(x))
    messages = [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    assert len(messages) == 1, messages
    assert "cannot run its compiled kernels here" in messages[0] and "libcuda" in messages[0]
    s = kiln.stats()
    assert s["hits"] == s["graphs"] == 1 and s["compiles"] == 0
    assert s["fallbacks_by_cause"] == {"runtime_unavailable": 1}
    assert s["eager_calls"] == 3 and s["plan_calls"] == 0 and s["kernel_steps"] == 0


def cuda_artifacts(server, model, x, training):
    """[(request, response)] for the graphs of `model` compiled by kilnd for sm_90."""
    out = []
    with KilnClient(server.address) as c:
        def send(kind, graph):  # as kiln.precompile sends: a backward follows its forward's plan
            rewrite_devices(graph, proto.DEVICE_KIND_META, proto.Device(kind=proto.DEVICE_KIND_CUDA, index=0))
            request = proto.CompileRequest(graph=graph, target=parse_target("cuda:sm_90"))
            out.append((request, c.compile(request, timeout=300)))
            return out[-1][1].artifact.plan if out[-1][1].HasField("artifact") else None

        _capture(_meta_clone(model), _to_meta((x,)), {}, training, send)
    torch._dynamo.reset()
    return out


def compiled_for_cuda(monkeypatch, *cases):
    """[(request, response)] of every graph of each (model, x, training) case, from a kilnd
    started here with NVRTC (skips without it); the executor's device guard is a no-op."""
    nvrtc = nvrtc_library()
    if nvrtc is None:
        pytest.skip("no NVRTC library for kilnd's CUDA compiles")
    monkeypatch.setattr(executor, "_device_guard", lambda index: contextlib.nullcontext())
    server = Kilnd(f"--nvrtc={nvrtc}")
    try:
        return [pair for model, x, training in cases for pair in cuda_artifacts(server, model, x, training)]
    finally:
        assert server.stop() == 0


def plan_executor(request, response, runtime=None):
    """The executor of a CUDA artifact, its cubins loaded by `runtime` (default: a FakeRuntime)."""
    return PlanExecutor(response.artifact, request.graph, runtime_loader=lambda: runtime or FakeRuntime(),
                        device=kiln.backend.graph_device(request.graph))


class FakeModule:
    def __init__(self):
        self.kernels = {}

    def add_kernel(self, symbol):
        assert re.fullmatch(r"kiln_[0-9a-f]{8}_[0-9]+", symbol), symbol  # kiln_<key>_<i>
        return self.kernels.setdefault(symbol, len(self.kernels))


class FakeRuntime:
    def __init__(self):
        self.loads = []

    def cuda_init(self):
        pass

    def cuda_load(self, data, device):
        self.loads.append((bytes(data[:4]), device))
        return FakeModule()


def test_kilnds_cuda_artifacts_pass_the_plan_checks(monkeypatch):
    """The plans kilnd really writes for CUDA (an MLP's inference, forward and backward graphs)
    load in the executor: cubins, kernel steps with grid/block, one launch table per batch."""
    pairs = compiled_for_cuda(monkeypatch, (MLP(), torch.randn(8, 16), False), (MLP(), torch.randn(8, 16), True))
    assert len(pairs) == 3
    for request, response in pairs:
        artifact = response.artifact
        kiln.backend.check_artifact(artifact)
        assert artifact.target.device == proto.DEVICE_KIND_CUDA
        assert {b.kind for b in artifact.binaries} <= {proto.Binary.KIND_CUBIN, proto.Binary.KIND_PTX}
        rt = FakeRuntime()
        ex = plan_executor(request, response, rt)
        assert ex.cuda and ex.kernel_steps > 0
        assert rt.loads and all(d == 0 and data == b"\x7fELF" for data, d in rt.loads)
        specs = [spec for kind, batch, *_ in ex._steps if kind == "cuda" for spec in batch]
        assert len(specs) == ex.kernel_steps
        for spec in specs:
            assert spec.grid_x >= 1 and 1 <= spec.block_x <= 1024 and spec.scalars == ()


def _gemms():
    """GEMM-only functions (views and cuBLASLt library steps in a CUDA plan, no kernels)."""
    f32, bf16 = torch.float32, torch.bfloat16
    r = torch.randn
    return [
        ("mm-t", lambda x, w: x @ w.t(), (r(6, 8), r(4, 8))),
        ("linear", torch.nn.functional.linear, (r(6, 8), r(4, 8), r(4))),
        ("linear-bf16", torch.nn.functional.linear, (r(6, 8, dtype=bf16), r(4, 8, dtype=bf16), r(4, dtype=bf16))),
        ("addmm-matrix", lambda c, x, w: torch.addmm(c, x, w, beta=0.5, alpha=2.0), (r(6, 4), r(6, 8), r(4, 8).t())),
        ("bmm-t", lambda q, k: torch.bmm(q, k.transpose(1, 2)), (r(3, 5, 8), r(3, 7, 8))),
        ("baddbmm", lambda c, x, y: torch.baddbmm(c, x, y, beta=0.5, alpha=2.0),
         (r(2, 5, 3, dtype=f32), r(2, 5, 8), r(2, 8, 3))),
        # 1x1 convolutions of channels-last bf16/f16 images: one GEMM over the N*H*W pixel rows.
        ("conv1x1-bf16", torch.nn.functional.conv2d,
         (r(2, 8, 5, 6, dtype=bf16).contiguous(memory_format=torch.channels_last), r(4, 8, 1, 1, dtype=bf16),
          r(4, dtype=bf16))),
        ("conv1x1-f16", lambda x, w: torch.nn.functional.conv2d(x, w),
         (r(3, 16, 4, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last),
          r(8, 16, 1, 1, dtype=torch.float16))),
    ]


def test_cuda_library_steps_run_with_torch_on_cpu_tensors(monkeypatch):
    """kilnd's CUDA plans for GEMMs (library steps "cublasLt.matmul") run here on CPU tensors through
    the executor's torch path: the encoding (strides, transposes, bias, alpha/beta, batches, 1x1
    convolutions of channels-last images) gives what eager torch gives, and the plans hold library
    steps, not aten GEMMs or convolutions."""
    nvrtc = nvrtc_library()
    if nvrtc is None:
        pytest.skip("no NVRTC library for kilnd's CUDA compiles")
    monkeypatch.setattr(kiln.requests, "target_for", lambda inputs, opts: SM90)
    server = Kilnd(f"--nvrtc={nvrtc}")
    try:
        for name, fn, args in _gemms():
            torch._dynamo.reset()
            kiln.backend.reset()
            kiln.reset_stats()
            got = torch.compile(fn, backend="kiln", options={"server": server.address})(*args)
            tol = dict(rtol=2e-2, atol=2e-2) if args[0].dtype in (torch.bfloat16, torch.float16) else \
                dict(rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got, fn(*args), **tol, msg=name)
            s = kiln.stats()
            assert s["plan_calls"] == 1 and s["graph_fallbacks"] == 0, (name, s)
            assert s["library_steps"] == 1 and s["kernel_steps"] == 0 and s["op_fallbacks"] == 0, (name, s)
    finally:
        assert server.stop() == 0


def test_library_step_plan_errors(monkeypatch):
    """A library step the client does not know, or one whose params do not match its values, is a
    PlanError (the graph then runs eagerly), never a wrong call into the runtime."""
    plan = proto.Plan(num_inputs=2)
    for sizes in ([4, 8], [8, 3], [4, 3]):
        v = plan.values.add(storage=proto.PlanValue.STORAGE_OUTPUT)
        v.meta.dtype = proto.DTYPE_FLOAT32
        for s in sizes:
            v.meta.sizes.add().constant = s
        for st in torch.empty(sizes).stride():
            v.meta.strides.add().constant = st
    plan.values[0].storage = plan.values[1].storage = proto.PlanValue.STORAGE_INPUT
    plan.values[1].index = 1
    lib = plan.steps.add().library
    lib.function = "cublasLt.matmul"
    lib.args[:] = [2, 0, 1, -1, -1]
    lib.int_params[:] = [1, 4, 3, 8, proto.DTYPE_FLOAT32, 0, 8, 1, 0, 3, 1, 0, 3, 0, 0, 0, 0, 0]
    lib.float_params[:] = [1.0, 0.0]
    plan.outputs.append(2)
    artifact = testing.make_artifact(plan, SM90, [])
    graph = proto.Graph()
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    (out,) = PlanExecutor(artifact, graph)([x, w])  # good: torch on CPU tensors
    torch.testing.assert_close(out, x @ w)
    bad = proto.Artifact()
    bad.CopyFrom(artifact)
    bad.plan.steps[0].library.int_params[6] = 9  # A's row stride: reaches past x
    with pytest.raises(executor.PlanError, match="reaches element"):
        PlanExecutor(bad, graph)([x, w])
    bad.plan.steps[0].library.function = "cublas.gemm"
    with pytest.raises(executor.PlanError, match="unknown library function"):
        PlanExecutor(bad, graph)
    bad.CopyFrom(artifact)
    bad.plan.steps[0].library.args[3] = 0  # a C value without c_kind
    with pytest.raises(executor.PlanError, match="does not match the params"):
        PlanExecutor(bad, graph)


class ConvNet(torch.nn.Module):
    """Two convolutions of one kind and one of another (prewarm runs each kind once)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.b = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.c = torch.nn.Conv2d(4, 8, 1, stride=2, bias=False)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_prewarm_calls_of_kilnds_cuda_plans(monkeypatch):
    """kiln.prewarm reads kilnd's real CUDA plans for a conv net (inference, then training's forward
    and backward): one warm call per distinct convolution, with arguments the op accepts. Run here
    on CPU scratch tensors (same op, shapes, strides, dtypes and constants as the GPU would get);
    tests/gpu/test_cuda_backend.py runs them in the background of a kiln.compile load."""
    from kiln import prewarm

    # Channels-last, as kilnd makes the relus that convolutions b and c read (in training too:
    # they are saved for the backward, see kiln.layouts), so that a and b read alike.
    x = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    pairs = compiled_for_cuda(monkeypatch, (ConvNet(), x, False), (ConvNet(), x, True))
    deduped = 0
    for (request, response), forward in zip(pairs, (True, True, False)):
        ex = plan_executor(request, response)
        assert prewarm._device_of(ex) == torch.device("cuda", 0)  # where its warm-up would run
        steps = [s for s in ex._steps if s[0] == "aten" and str(s[1]) in prewarm.WARM_OPS]
        calls = prewarm.calls(ex, torch.device("cuda", 0))
        assert len({(str(op), repr(args)) for op, args, _ in calls}) == len(calls) <= len(steps) == 3
        deduped += len(steps) - len(calls)
        assert {str(op) for op, _, _ in calls} == {"aten.convolution.default" if forward
                                                   else "aten.convolution_backward.default"}
        weight = 1 if forward else 2  # convolution(input, weight, ...), convolution_backward(grad, input, weight, ...)
        assert {args[weight][1] for _, args, _ in calls} == {(4, 4, 3, 3), (8, 4, 1, 1)}
        for call in calls:  # the arguments are ones the op accepts
            args, kwargs = prewarm.materialize(call, torch.device("cpu"))
            assert call[0](*args, **kwargs) is not None
    assert deduped >= 1  # conv a and conv b read alike-laid-out inputs in at least one plan
    assert kiln.stats()["prewarm"]["skipped"] == 0
    # Under cudnn.benchmark, convolutions are not warmed (their timing runs would compete).
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    assert prewarm.calls(ex, torch.device("cuda", 0)) == []
    assert kiln.stats()["prewarm"]["skipped"] >= 2


class PointwiseConvNet(torch.nn.Module):
    """1x1 convolutions of bf16 images and a Linear. In a CUDA plan, `a` reads the NCHW graph
    input and stays a convolution; kiln makes the relus' results channels-last, so `b` and `c`
    (same shape) become cuBLASLt GEMMs, and so does the Linear."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 8, 1)
        self.b = torch.nn.Conv2d(8, 8, 1)
        self.c = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x))))))
        return self.fc(y.mean((2, 3)))


def test_prewarm_calls_include_the_plans_cublaslt_gemms(monkeypatch):
    """A plan's library GEMMs are warmed too (kiln's runtime: cuBLASLt opened, the algorithm of
    each shape found, its kernels loaded), once per distinct params, on scratch buffers big enough
    for the params' strides; without cuBLASLt in the runtime the warm-up does nothing."""
    from kiln import prewarm

    model = PointwiseConvNet().to(torch.bfloat16)
    x = torch.randn(2, 8, 5, 5, dtype=torch.bfloat16)
    ((request, response),) = compiled_for_cuda(monkeypatch, (model, x, False))
    ex = plan_executor(request, response)
    library = [s[1] for s in ex._steps if s[0] == "library"]
    assert len(library) == 3  # conv b, conv c (same params), fc
    calls = [c for c in prewarm.calls(ex, torch.device("cuda", 0)) if not isinstance(c[0], torch._ops.OpOverload)]
    assert len(calls) == 2 and kiln.stats()["prewarm"]["skipped"] == 0
    ran = []

    class FakeGemm:
        def __init__(self, params):
            self.params, self.buffers = params, [0] * 5

        def run(self, stream):
            ran.append((self.params, list(self.buffers)))

    class FakeCublas:
        def gemm_call(self, index, params, alpha, beta):
            assert index == 0
            return FakeGemm(params)

    for runtime in (None, FakeCublas()):
        monkeypatch.setattr(ex, "_cublas", lambda: runtime)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: type("S", (), {"cuda_stream": 7})())
        for call in calls:
            args, kwargs = prewarm.materialize(call, torch.device("cpu"))
            d, a, b = args[:3]
            p = call[0].args[2]
            # Each scratch operand spans what the params address (batch 1: rows and columns only).
            assert d.numel() >= (p[1] - 1) * p[12] + p[2] and a.numel() >= (p[1] - 1) * p[6] + (p[3] - 1) * p[7] + 1
            assert b.numel() >= (p[3] - 1) * p[9] + (p[2] - 1) * p[10] + 1 and d.dtype == torch.bfloat16
            call[0](*args, **kwargs)
    assert len(ran) == 2  # nothing without cuBLASLt, then both shapes
    assert {tuple(p[1:4]) for p, _ in ran} == {(50, 8, 8), (2, 4, 8)}  # conv: N*H*W rows; fc
    assert all(buffers[0] and buffers[1] and buffers[2] and buffers[4] for _, buffers in ran)


def test_prewarm_leaves_out_gemms_that_cost_more_gpu_time_than_they_save(monkeypatch):
    """A warm-up runs on the caller's stream, ahead of the first call's own kernels: GEMMs of more
    than MAX_GEMM_FLOPS (a training block's fp32 8192 x 1024 x 4096 ones) are not warmed, smaller
    ones are; aten matrix multiplies are measured alike."""
    from kiln import prewarm

    model = PointwiseConvNet().to(torch.bfloat16)
    x = torch.randn(2, 8, 5, 5, dtype=torch.bfloat16)
    big = torch.nn.Linear(1024, 4096)
    tokens = torch.randn(8192, 1024)
    (small_pair, big_pair) = compiled_for_cuda(monkeypatch, (model, x, False), (big, tokens, False))
    ex = plan_executor(*small_pair)
    # conv b and c: 2 x 50 x 8 x 8 = 6,400 operations; fc: 2 x 2 x 4 x 8 = 128
    default = prewarm.MAX_GEMM_FLOPS
    monkeypatch.setattr(prewarm, "MAX_GEMM_FLOPS", 1000)
    calls = [c for c in prewarm.calls(ex, torch.device("cuda", 0)) if not isinstance(c[0], torch._ops.OpOverload)]
    assert [tuple(c[0].args[2][1:4]) for c in calls] == [(2, 4, 8)] and kiln.stats()["prewarm"]["skipped"] == 2
    monkeypatch.setattr(prewarm, "MAX_GEMM_FLOPS", default)
    kiln.reset_stats()
    ex = plan_executor(*big_pair)
    assert [s for s in ex._steps if s[0] == "library"]  # the Linear is a cuBLASLt GEMM...
    assert prewarm.calls(ex, torch.device("cuda", 0)) == []  # ...of 69 GFLOP: not warmed
    assert kiln.stats()["prewarm"]["skipped"] == 1
    mm = ("t", (8192, 1024), (1024, 1), torch.float32, False), ("t", (1024, 4096), (4096, 1), torch.float32, False)
    assert prewarm._matmul_flops("aten.mm.default", mm) == 2.0 * 8192 * 1024 * 4096
    bias = ("t", (4096,), (1,), torch.float32, False)
    assert prewarm._matmul_flops("aten.addmm.default", (bias,) + mm) == 2.0 * 8192 * 1024 * 4096
    batched = tuple(("t", (3,) + t[1], None, torch.float32, False) for t in mm)
    assert prewarm._matmul_flops("aten.baddbmm.default", (bias,) + batched) == 3 * 2.0 * 8192 * 1024 * 4096
    assert prewarm._matmul_flops("aten.convolution.default", mm) == 0
    # Attention is warmed at any size (its first call's one-time work dwarfs its GPU time).
    q = ("t", (8, 16, 2048, 64), None, torch.bfloat16, False)
    assert prewarm._matmul_flops("aten._scaled_dot_product_flash_attention.default", (q, q, q)) == 0


class GroupNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = torch.nn.GroupNorm(2, 8)

    def forward(self, x):
        return torch.relu(self.gn(x))


def test_prewarm_calls_include_torchs_kernels_run_as_aten_steps(monkeypatch):
    """Training plans for CUDA (kilnd's) of a group norm, which kiln leaves to torch: those aten
    steps (they read no indices) are warmed too, and run on CPU scratch tensors."""
    from kiln import prewarm

    ops = []
    for request, response in compiled_for_cuda(
            monkeypatch, (GroupNormNet(), torch.randn(2, 8, 4, 4, requires_grad=True), True)):
        ex = plan_executor(request, response)
        aten = [str(s[1]) for s in ex._steps if s[0] == "aten"]
        for call in prewarm.calls(ex, torch.device("cuda", 0)):
            assert str(call[0]) in aten and str(call[0]) in prewarm.WARM_OPS
            ops.append(str(call[0]))
            args, kwargs = prewarm.materialize(call, torch.device("cpu"))
            call[0](*args, **kwargs)
    assert ops == ["aten.native_group_norm.default", "aten.native_group_norm_backward.default"], ops


def test_prewarm_starts_no_thread_for_a_graph_without_plans():
    """(CPU packages: test_compile_api's second process starts none either.)"""
    from kiln import prewarm

    assert prewarm.start_for_graph(type("Graph", (), {"specs": []})()) is None
    assert kiln.stats()["prewarm"] == {"threads": 0, "calls": 0, "skipped": 0, "errors": 0}
