"""The executor's CUDA path without a GPU: plan validation, the launch table built from a plan
(which module, kernel, grid/block/shared bytes and data pointers each launch gets), module loading
per device through a stand-in runtime, the runtime's CUDA bindings when libcuda is absent
(RuntimeUnavailable with the runtime's message), and the CUDA-graph helpers that need no device.
What needs a GPU is in tests/gpu/test_cuda_backend.py."""

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from kiln import _exec_kernels, _exec_workspace, cuda_graphs, executor, proto, runtime, testing
from kiln.executor import CudaLaunchSpec, PlanError, PlanExecutor

PV = proto.PlanValue
SM90 = proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90")
CUBIN = proto.Binary.KIND_CUBIN


def meta(sizes, kind=proto.DEVICE_KIND_CUDA):
    m = proto.TensorMeta(dtype=proto.DTYPE_FLOAT32, device=proto.Device(kind=kind, index=0))
    for s in sizes:
        m.sizes.add(constant=s)
    for s in torch.empty(sizes, device="meta").stride():
        m.strides.add(constant=s)
    return m


def value(plan, sizes, storage, index=0, offset=0):
    v = plan.values.add(storage=storage, index=index, offset=offset)
    v.meta.CopyFrom(meta(sizes))
    return len(plan.values) - 1


def kernel(plan, binary, symbol, args, grid=(4,), block=(128,), shared=0):
    k = plan.steps.add().kernel
    k.binary, k.symbol, k.shared_bytes = binary, symbol, shared
    k.args.extend(args)
    k.grid.extend(grid)
    k.block.extend(block)
    return k


def two_binary_plan():
    """a, b inputs [8]; t (workspace) = k0(a, b); out = k1(t); an aten step; out2 = k0@binary1(out)."""
    plan = proto.Plan(num_inputs=2, workspace_bytes=64)
    a, b = value(plan, [8], PV.STORAGE_INPUT, 0), value(plan, [8], PV.STORAGE_INPUT, 1)
    t = value(plan, [8], PV.STORAGE_WORKSPACE, offset=0)
    out = value(plan, [8], PV.STORAGE_OUTPUT)
    neg = value(plan, [8], PV.STORAGE_STEP)
    out2 = value(plan, [8], PV.STORAGE_OUTPUT)
    kernel(plan, 0, "kiln_kernel_0", [a, b, t], grid=(1,), block=(256,))
    kernel(plan, 0, "kiln_kernel_1", [t, out], grid=(2, 1, 1), block=(64, 1), shared=128)
    step = plan.steps.add().aten
    step.target = "aten.neg.default"
    step.args.add(node=f"v{out}")
    step.outputs.append(neg)
    kernel(plan, 1, "kiln_kernel_0", [neg, out2], grid=(3,), block=(32,))
    plan.outputs.extend([out, out2])
    return plan


def artifact_of(plan, target=SM90, kinds=(CUBIN, proto.Binary.KIND_PTX)):
    return testing.make_artifact(plan, target, [proto.Binary(kind=k, data=f"binary {i}".encode())
                                                for i, k in enumerate(kinds)])


class FakeModule:
    def __init__(self, data, device):
        self.data, self.device, self.kernels = data, device, {}

    def add_kernel(self, symbol):
        return self.kernels.setdefault(symbol, len(self.kernels))


class FakeTable:
    """Stands in for kiln.runtime.CudaLaunchTable: `buffers` is filled by the executor per call,
    run() records the launches it would make."""

    def __init__(self, rt, entries):
        self.rt, self.entries = rt, list(entries)
        self.buffers = [None] * sum(e[5] for e in self.entries)

    def run(self, stream):
        launches, k = [], 0
        for module, kernel, grid, block, shared, count, scalars in self.entries:
            launches.append((module, kernel, grid, block, shared, list(self.buffers[k:k + count]), list(scalars)))
            k += count
        self.rt.runs.append((launches, stream))


class FakeRuntime:
    def __init__(self):
        self.inits, self.loads, self.runs, self.tables = 0, [], [], []

    def cuda_init(self):
        self.inits += 1

    def cuda_load(self, data, device):
        self.loads.append((bytes(data), device))
        return FakeModule(bytes(data), device)

    def cuda_launch_table(self, entries):
        table = FakeTable(self, entries)
        self.tables.append(table)
        return table


@pytest.fixture
def no_device_guard(monkeypatch):
    monkeypatch.setattr(executor, "_device_guard", lambda index: contextlib.nullcontext())


def test_launch_table_from_a_plan(no_device_guard, monkeypatch):
    rt = FakeRuntime()
    ex = PlanExecutor(artifact_of(two_binary_plan()), proto.Graph(), runtime_loader=lambda: rt)
    assert rt.inits == 1 and rt.loads == []  # no device known yet: binaries load at the first call
    assert ex.cuda and ex.kernel_steps == 3
    assert [s[0] for s in ex._steps] == ["cuda", "aten", "cuda"]
    first, last = ex._steps[0][1], ex._steps[2][1]
    assert first == [CudaLaunchSpec(0, "kiln_kernel_0", (0, 1, 2), (), 1, 256, 0),
                     CudaLaunchSpec(0, "kiln_kernel_1", (2, 3), (), 2, 64, 128)]
    assert last == [CudaLaunchSpec(1, "kiln_kernel_0", (4, 5), (), 3, 32, 0)]

    modules = ex.cuda_modules(torch.device("cuda", 2))
    assert rt.loads == [(b"binary 0", 2), (b"binary 1", 2)]
    assert ex.cuda_modules(2) is modules and len(rt.loads) == 2  # once per device
    assert modules[0].kernels == {"kiln_kernel_0": 0, "kiln_kernel_1": 1}
    assert modules[1].kernels == {"kiln_kernel_0": 0}

    # Run on CPU tensors: refused, nothing launched.
    a, b = torch.randn(8), torch.randn(8)
    with pytest.raises(PlanError, match="compiled for CUDA runs on cpu"):
        ex([a, b])
    assert rt.runs == [] and rt.tables == []


def test_launch_tables_are_built_once_and_filled_per_call(no_device_guard, monkeypatch):
    """The program for cuda:2, with CPU tensors standing in for device memory: one table per batch
    of consecutive kernel steps, built once; per call only the buffer pointers change, and the
    stream is looked up once per call."""
    rt = FakeRuntime()
    ex = PlanExecutor(artifact_of(two_binary_plan()), proto.Graph(), runtime_loader=lambda: rt)
    monkeypatch.setattr(executor._Program, "_device_of", lambda self, i: torch.device("cpu"))
    monkeypatch.setattr(_exec_kernels, "_IS_CUDA", lambda t: True)
    streams = []
    monkeypatch.setattr(_exec_kernels, "_current_stream", lambda device: streams.append(device) or 7)
    device = torch.device("cuda", 2)
    program = executor._Program(ex, device, {})
    modules = ex.cuda_modules(device)
    assert len(rt.tables) == 2  # the two batches' tables, built with the program
    for call in range(3):
        a, b = torch.randn(8), torch.randn(8)
        out, out2 = program([a, b])
        (first, s1), (last, s2) = rt.runs[-2:]
        t = first[0][5][2]  # the workspace value
        assert first == [
            (modules[0], 0, 1, 256, 0, [a.data_ptr(), b.data_ptr(), t], []),
            (modules[0], 1, 2, 64, 128, [t, out.data_ptr()], []),
        ]
        assert t not in (a.data_ptr(), b.data_ptr(), out.data_ptr())
        assert len(last) == 1 and last[0][:5] == (modules[1], 0, 3, 32, 0)
        assert last[0][5][1] == out2.data_ptr() and (s1, s2) == (7, 7)
        assert len(streams) == call + 1  # once per call
    assert len(rt.tables) == 2 and len(rt.runs) == 6
    assert out.shape == (8,) and out2.shape == (8,)
    # Arguments that may live elsewhere (inputs, aten results) are checked per call.
    monkeypatch.setattr(_exec_kernels, "_IS_CUDA", lambda t: t.data_ptr() != b.data_ptr())
    with pytest.raises(PlanError, match="kernel kiln_kernel_0: argument v1 is on cpu, not on cuda:2"):
        program([a, b])
    assert len(rt.runs) == 6


class FakeGemm:
    """Stands in for kiln.runtime.GemmCall: run() records the buffers (D, A, B, C, workspace), or
    raises GemmUnsupported (then the executor runs the GEMM with torch)."""

    def __init__(self, rt, device, params, alpha, beta):
        self.rt, self.buffers = rt, [None] * 5

    def run(self, stream):
        self.rt.gemm_runs.append(list(self.buffers))
        if self.rt.unsupported:
            raise runtime.GemmUnsupported("no algorithm for this GEMM")


class FakeGemmRuntime(FakeRuntime):
    def __init__(self):
        super().__init__()
        self.gemm_runs, self.unsupported = [], False

    def cublas_init(self):
        pass

    def gemm_call(self, device, params, alpha, beta):
        return FakeGemm(self, device, params, alpha, beta)


def gemm(plan, args, m, n, k):
    """D[m, n] = A[m, k] @ B[k, n], all row-major (server/lower/gemm_step.h's params)."""
    lib = plan.steps.add().library
    lib.function = "cublasLt.matmul"
    lib.args[:] = args + [-1, -1]
    lib.int_params[:] = [1, m, n, k, proto.DTYPE_FLOAT32, 0, k, 1, 0, n, 1, 0, n, 0, 0, 0, 0, 0]
    lib.float_params[:] = [1.0, 0.0]


def gemm_program(plan, monkeypatch, unsupported, ws_on_cuda=False):
    """(the stand-in runtime, the program for cuda:2) of a plan with GEMM steps, CPU tensors
    standing in for device memory; GEMMs have no cuBLASLt algorithm when `unsupported`."""
    rt = FakeGemmRuntime()
    rt.unsupported = unsupported
    ex = PlanExecutor(artifact_of(plan), proto.Graph(), runtime_loader=lambda: rt)
    monkeypatch.setattr(executor._Program, "_device_of", lambda self, i: torch.device("cpu"))
    monkeypatch.setattr(_exec_kernels, "_IS_CUDA", lambda t: True)
    monkeypatch.setattr(_exec_kernels, "_current_stream", lambda device: 7)
    if ws_on_cuda:
        monkeypatch.setattr(_exec_workspace, "_is_cuda_device", lambda device: True)
    return rt, executor._Program(ex, torch.device("cuda", 2), {})


@pytest.mark.parametrize("ws_on_cuda", [True, False])
@pytest.mark.parametrize("unsupported", [False, True])
def test_workspace_values_reach_kernels_and_gemms_as_pointers(no_device_guard, monkeypatch, ws_on_cuda,
                                                              unsupported):
    """d = x @ w lives in the workspace (byte 64) and is read only by a kernel (with a view of it,
    12 bytes further) and by a second GEMM: on a CUDA workspace they get the call's workspace
    pointer plus their offsets, and no tensor is made for them (where cuBLASLt has no algorithm,
    the torch fallback makes the operands' tensors then). A workspace that is not on a CUDA
    device keeps the tensor path, whose per-call check names the value."""
    plan = proto.Plan(num_inputs=3, workspace_bytes=256)
    x, w, w2 = (value(plan, s, PV.STORAGE_INPUT, i) for i, s in enumerate([[4, 8], [8, 3], [3, 5]]))
    d = value(plan, [4, 3], PV.STORAGE_WORKSPACE, offset=64)
    dv = value(plan, [3], PV.STORAGE_VIEW, index=d, offset=3)
    out = value(plan, [4, 5], PV.STORAGE_OUTPUT)
    gemm(plan, [d, x, w], 4, 3, 8)
    kernel(plan, 0, "kiln_kernel_0", [d, x, dv])
    gemm(plan, [out, d, w2], 4, 5, 3)
    plan.outputs.append(out)
    rt, program = gemm_program(plan, monkeypatch, unsupported, ws_on_cuda)
    assert program.tensor_reads == {out}
    strided = []
    original = torch.Tensor.as_strided
    monkeypatch.setattr(torch.Tensor, "as_strided",
                        lambda t, *a: strided.append(a) or original(t, *a))
    for _ in range(2):
        args = [torch.randn(4, 8), torch.randn(8, 3), torch.randn(3, 5)]
        (got,) = program(args)
        g1, g2 = rt.gemm_runs[-2:]
        ((_, _, _, _, _, buffers, _),), _ = rt.runs[-1]
        base = g1[0]
        assert g1 == [base, args[0].data_ptr(), args[1].data_ptr(), None, None]
        assert g2 == [got.data_ptr(), base, args[2].data_ptr(), None, None]
        assert buffers == [base, args[0].data_ptr(), base + 12]
        if unsupported:
            torch.testing.assert_close(got, args[0] @ args[1] @ args[2])
    if not unsupported:  # (torch's GEMMs make views of their own)
        assert len(strided) == (0 if ws_on_cuda else 2 * 2)  # d and its view per call
    if not ws_on_cuda:  # per-call device check of the tensor path
        monkeypatch.setattr(_exec_kernels, "_IS_CUDA", lambda t: t.dim() != 1)
        with pytest.raises(PlanError, match="kernel kiln_kernel_0: argument v4 is on cpu, not on cuda:2"):
            program([torch.randn(4, 8), torch.randn(8, 3), torch.randn(3, 5)])


@pytest.mark.parametrize("unsupported", [False, True])
def test_views_of_inputs_and_step_results_reach_kernels_and_gemms_as_pointers(no_device_guard, monkeypatch,
                                                                             unsupported):
    """out = x @ wt where wt is a transposed view of input w (cuBLASLt gets w's pointer); a kernel
    reads a row of x (a view 8 floats in) and a slice of an aten result (neg of x, 4 floats in):
    each gets its root's pointer plus the offset, and no view is made per call (where cuBLASLt
    has no algorithm, the torch fallback makes wt's tensor). A root on another device is named."""
    plan = proto.Plan(num_inputs=2)
    x, w = value(plan, [4, 8], PV.STORAGE_INPUT, 0), value(plan, [3, 8], PV.STORAGE_INPUT, 1)
    wt = plan.values.add(storage=PV.STORAGE_VIEW, index=w, offset=0)
    wt.meta.CopyFrom(meta([8, 3]))
    wt.meta.strides[0].constant, wt.meta.strides[1].constant = 1, 8
    wt = len(plan.values) - 1
    out = value(plan, [4, 3], PV.STORAGE_OUTPUT)
    row = value(plan, [8], PV.STORAGE_VIEW, index=x, offset=8)
    neg = value(plan, [4, 8], PV.STORAGE_STEP)
    part = value(plan, [4], PV.STORAGE_VIEW, index=neg, offset=4)
    out2 = value(plan, [8], PV.STORAGE_OUTPUT)
    lib = plan.steps.add().library
    lib.function = "cublasLt.matmul"
    lib.args[:] = [out, x, wt, -1, -1]
    lib.int_params[:] = [1, 4, 3, 8, proto.DTYPE_FLOAT32, 0, 8, 1, 0, 1, 8, 0, 3, 0, 0, 0, 0, 0]
    lib.float_params[:] = [1.0, 0.0]
    step = plan.steps.add().aten
    step.target = "aten.neg.default"
    step.args.add(node=f"v{x}")
    step.outputs.append(neg)
    kernel(plan, 0, "kiln_kernel_0", [row, part, out2])
    plan.outputs.extend([out, out2])
    rt, program = gemm_program(plan, monkeypatch, unsupported)
    strided = []
    original = torch.Tensor.as_strided
    monkeypatch.setattr(torch.Tensor, "as_strided", lambda t, *a: strided.append(a) or original(t, *a))
    for _ in range(2):
        args = [torch.randn(4, 8), torch.randn(3, 8)]
        got, got2 = program(args)
        (g,) = rt.gemm_runs[-1:]
        ((_, _, _, _, _, buffers, _),), _ = rt.runs[-1]
        assert g[:3] == [got.data_ptr(), args[0].data_ptr(), args[1].data_ptr()]
        assert buffers[0] == args[0].data_ptr() + 8 * 4
        assert buffers[2] == got2.data_ptr() and buffers[1] not in (args[0].data_ptr(), got.data_ptr())
        if unsupported:
            torch.testing.assert_close(got, args[0] @ args[1].t())
    if not unsupported:  # (torch's GEMMs make views of their own)
        assert strided == []
    monkeypatch.setattr(_exec_kernels, "_IS_CUDA", lambda t: t.shape != (4, 8) or t.data_ptr() != args[0].data_ptr())
    args = [torch.randn(4, 8), torch.randn(3, 8)]
    with pytest.raises(PlanError, match="is not on cuda:2|argument v0 is on cpu"):
        program(args)


def test_binaries_load_at_plan_load_when_the_device_is_known(no_device_guard):
    rt = FakeRuntime()
    PlanExecutor(artifact_of(two_binary_plan()), proto.Graph(), runtime_loader=lambda: rt,
                 device=torch.device("cuda", 0))
    assert rt.loads == [(b"binary 0", 0), (b"binary 1", 0)]
    rt = FakeRuntime()
    PlanExecutor(artifact_of(two_binary_plan()), proto.Graph(), runtime_loader=lambda: rt,
                 device=torch.device("cpu"))
    assert rt.loads == []


def test_plans_without_kernel_steps_need_no_runtime():
    plan = proto.Plan(num_inputs=1)
    x = value(plan, [3], PV.STORAGE_INPUT, 0)
    plan.outputs.append(x)
    ex = PlanExecutor(artifact_of(plan, kinds=()), proto.Graph())
    assert ex.cuda and ex.kernel_steps == 0


@pytest.mark.parametrize("mutate, message", [
    (lambda k: k.ClearField("grid"), "without grid"),
    (lambda k: k.ClearField("block"), "without block"),
    (lambda k: k.grid.__setitem__(0, 0), r"grid\[0\] = 0 is outside"),
    (lambda k: k.grid.__setitem__(0, 1 << 31), "is outside"),
    (lambda k: k.block.__setitem__(0, 2048), r"block\[0\] = 2048 is outside 1..1024"),
    (lambda k: k.grid.append(2), "only the x dimension"),
    (lambda k: k.block.extend([1, 4]), "only the x dimension"),
    (lambda k: k.__setattr__("shared_bytes", -1), "shared_bytes"),
    (lambda k: k.__setattr__("binary", 7), "binary 7 does not exist"),
    (lambda k: k.__setattr__("symbol", ""), "no symbol"),
    (lambda k: k.args.append(99), "v99 does not exist"),
    (lambda k: k.scalar_args.append(0), "scalar argument 0"),
])
def test_malformed_cuda_kernel_steps_are_refused(mutate, message):
    plan = two_binary_plan()
    mutate(plan.steps[0].kernel)
    with pytest.raises(PlanError, match=message):
        PlanExecutor(artifact_of(plan), proto.Graph(), runtime_loader=FakeRuntime)


def test_binary_kinds_must_match_the_target():
    with pytest.raises(PlanError, match="KIND_SHARED_OBJECT in an artifact for a CUDA target"):
        PlanExecutor(artifact_of(two_binary_plan(), kinds=(proto.Binary.KIND_SHARED_OBJECT, CUBIN)),
                     proto.Graph(), runtime_loader=FakeRuntime)
    cpu = proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2")
    with pytest.raises(PlanError, match="KIND_CUBIN in an artifact for a CPU target"):
        PlanExecutor(artifact_of(two_binary_plan(), target=cpu), proto.Graph(),
                     runtime_loader=lambda: object())


def test_runtime_errors_surface_at_load():
    class NoDriver(FakeRuntime):
        def cuda_init(self):
            raise runtime.RuntimeUnavailable("kiln CUDA runtime: initializing CUDA: error 5: no libcuda")

    with pytest.raises(runtime.RuntimeUnavailable, match="no libcuda"):
        PlanExecutor(artifact_of(two_binary_plan()), proto.Graph(), runtime_loader=NoDriver)


needs_build = pytest.mark.skipif(shutil.which("g++") is None or runtime.source_dir() is None,
                                 reason="needs g++ and the runtime sources (runtime/ in the checkout)")


@needs_build
def test_real_runtime_without_libcuda_raises_runtime_unavailable(tmp_path):
    """In a child process whose KILN_LIBCUDA_PATH names no library (so this holds on GPU machines
    too): the runtime's own message comes through, as RuntimeUnavailable, at plan load."""
    lib = runtime.build(str(tmp_path / "cache"))
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {sys.path!r}
        from kiln import runtime, proto, testing
        from kiln.executor import PlanExecutor
        rt = runtime.Runtime({lib!r})
        try:
            rt.cuda_init()
        except runtime.RuntimeUnavailable as e:
            print("init:", e)
        try:
            rt.cuda_load(b"not a cubin", 0)
        except runtime.RuntimeCallError as e:
            print("load:", e)
        plan = proto.Plan(num_inputs=0)
        k = plan.steps.add().kernel
        k.symbol = "kiln_kernel_0"; k.grid.append(1); k.block.append(32)
        artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90"),
                                         [proto.Binary(kind=proto.Binary.KIND_CUBIN, data=b"x")])
        try:
            PlanExecutor(artifact, proto.Graph(), runtime_loader=lambda: rt)
        except runtime.RuntimeUnavailable as e:
            print("plan:", type(e).__name__)
    """)
    env = dict(os.environ, KILN_LIBCUDA_PATH=str(tmp_path / "no" / "libcuda.so.1"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("init: kiln CUDA runtime: initializing CUDA: error 5: ")
    assert "libcuda" in lines[0] and "KILN_LIBCUDA_PATH" in lines[0]
    assert lines[1].startswith("load: kiln CUDA runtime: loading a CUDA binary on device 0: error ")
    assert "neither a cubin nor PTX" in lines[1]
    assert lines[2] == "plan: RuntimeUnavailable"


def test_copy_out_keeps_layout_and_aliasing():
    base = torch.arange(40, dtype=torch.float32)
    a = base[4:20].view(4, 4).t()  # strided view at offset 4
    b = base[8:12]  # overlaps a
    c = torch.randn(3, 2)
    d = base.view(torch.int32)[30:34]  # the same storage seen as another dtype
    e = torch.empty(0, 5)
    out = cuda_graphs.copy_out([a, None, b, c, 7, d, e, c], keep={7})
    # With torch's allocation function for compiled code (what replays use on their device).
    fast = torch._C._dynamo.guards._empty_strided_cpu
    got = cuda_graphs.copy_out([c, c.t(), None], alloc=fast)
    assert torch.equal(got[0], c) and torch.equal(got[1], c.t()) and got[1].stride() == c.t().stride()
    got = cuda_graphs.copy_out([c.t().contiguous()], alloc=fast)
    assert torch.equal(got[0], c.t()) and got[0].untyped_storage().data_ptr() != c.untyped_storage().data_ptr()
    for got, want in zip(out, [a, None, b, c, 7, d, e, c]):
        if isinstance(want, torch.Tensor):
            assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
            assert torch.equal(got, want)
        else:
            assert got == want
    assert out[7] is c  # kept as is
    assert out[0].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    # One new storage for the three views of `base`, at the same relative offsets.
    storages = {out[i].untyped_storage().data_ptr() for i in (0, 2, 5)}
    assert len(storages) == 1
    assert out[2].storage_offset() - out[0].storage_offset() == 4
    base.fill_(-1)  # the copies are independent of the originals
    assert torch.equal(out[2], torch.arange(8, 12, dtype=torch.float32))
    out[0][0, 0] = 100.0  # ... and still alias each other as the originals did
    assert out[2][0] != 100.0 and out[0].flatten()[0] == 100.0
    out[2][0] = 55.0
    assert out[0][0, 1] == 55.0


def test_inspect_graph_finds_the_inputs_a_graph_updates():
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln import serialize_graph

    def pure(x):
        return torch.relu(x) * 2

    def updating(x, y, z):
        z.copy_(y + 1)  # AOTAutograd's form of a kept input update
        x.add_(1)
        return x * y

    def into_a_view(x, y):
        x[0].add_(y[0])
        return (y * 2,)

    def into_its_own(x):
        t = x * 2
        t[1:].mul_(3)
        return (t,)

    def trace(fn, n):
        return serialize_graph(make_fx(fn)(*[torch.randn(3) for _ in range(n)]))

    assert cuda_graphs.inspect_graph(trace(pure, 1)) == (None, ())
    assert cuda_graphs.inspect_graph(trace(updating, 3)) == (None, (0, 2))
    refusal, updated = cuda_graphs.inspect_graph(trace(into_a_view, 2))
    assert "writes into" in refusal and "a view of input" in refusal and updated == ()
    assert cuda_graphs.inspect_graph(trace(into_its_own, 1)) == (None, ())


def runner_for(fn, *args, saved=()):
    from torch.fx.experimental.proxy_tensor import make_fx

    from kiln import serialize_graph

    graph = serialize_graph(make_fx(fn)(*args))
    graph.saved_outputs.extend(saved)  # as a training forward's (kiln.requests.serialize_aot_graph)
    cpu = proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2")
    ex = PlanExecutor(testing.make_artifact(testing.aten_plan(graph), cpu), graph)
    return cuda_graphs.CudaGraphRunner(ex, max_graphs=2)


@pytest.fixture
def fake_graphs(monkeypatch):
    from kiln import counters

    fake = testing.CpuGraphs()
    monkeypatch.setattr(cuda_graphs, "_DEVICE", fake)
    counters.reset_stats()
    yield fake
    counters.reset_stats()


def test_cuda_graph_runner_warms_up_captures_and_replays(fake_graphs):
    from kiln import counters

    def fn(x, w):
        return torch.relu(x @ w) + 1, x, x.t()

    w = torch.nn.Parameter(torch.randn(8, 3))
    runner = runner_for(fn, torch.randn(4, 8), w.detach())
    assert runner.refusal is None and runner.op_fallbacks == runner.executor.op_fallbacks
    xs = [torch.randn(4, 8) for _ in range(4)]
    outs = []
    for i, x in enumerate(xs):
        out = runner([x, w])
        outs.append(out)
        assert fake_graphs.captures == (0 if i == 0 else 1)
        assert fake_graphs.replays == max(0, i)
        # Outputs that are the input (or a view of it) are views of this call's input.
        assert out[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert out[2].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert out[2].stride() == (1, 8) and torch.equal(out[2], x.t())
    for x, out in zip(xs, outs):  # earlier results were copied out, not overwritten
        torch.testing.assert_close(out[0], torch.relu(x @ w.detach()) + 1)
    s = counters.stats()
    assert s["cuda_graph_captures"] == 1 and s["cuda_graph_replays"] == 3
    # Parameters are read in place: an in-place update is seen without a new capture ...
    with torch.no_grad():
        w.mul_(2)
    torch.testing.assert_close(runner([xs[0], w])[0], torch.relu(xs[0] @ w.detach()) + 1)
    assert fake_graphs.captures == 1
    # ... another parameter (another address) is another key: warm-up, then a second capture.
    w2 = torch.nn.Parameter(torch.randn(8, 3))
    for _ in range(2):
        torch.testing.assert_close(runner([xs[1], w2])[0], torch.relu(xs[1] @ w2.detach()) + 1)
    assert fake_graphs.captures == 2
    # Past max_graphs (2), new keys run without a graph.
    w3 = torch.nn.Parameter(torch.randn(8, 3))
    for _ in range(3):
        torch.testing.assert_close(runner([xs[2], w3])[0], torch.relu(xs[2] @ w3.detach()) + 1)
    assert fake_graphs.captures == 2


def test_replay_if_captured_replays_only_captured_free_keys(fake_graphs):
    """replay_if_captured (what kiln.backend calls before its guard) replays a captured key and
    returns None, running nothing, for anything else: before a capture, another layout, another
    dtype, another parameter address, a non-tensor where a tensor was, and a busy graph."""
    from kiln import counters

    def fn(x, w):
        h = x @ w
        return h.sum(), h * 2

    w = torch.nn.Parameter(torch.randn(8, 3))
    runner = runner_for(fn, torch.randn(4, 8), w.detach(), saved=[1])
    x = torch.randn(4, 8)
    assert runner.replay_if_captured([x, w]) is None  # nothing captured yet
    runner([x, w])
    assert runner.replay_if_captured([x, w]) is None  # warmed up, not captured
    del runner([x, w])[1]  # the capture
    assert fake_graphs.captures == 1 and fake_graphs.replays == 1
    loss, saved = runner.replay_if_captured([x, w])
    torch.testing.assert_close(loss, (x @ w.detach()).sum())
    assert fake_graphs.replays == 2 and counters.stats()["cuda_graph_replays"] == 2
    # While `saved` (in the graph's memory) lives, the graph is busy: no replay.
    assert runner.replay_if_captured([x, w]) is None and fake_graphs.replays == 2
    del saved
    misses = [[torch.randn(8, 4).t(), w],  # same sizes, other strides
              [x.double(), w],
              [x, torch.nn.Parameter(w.detach().clone())],  # another address
              [x, 3],
              [x]]
    for inputs in misses:
        assert runner.replay_if_captured(inputs) is None
    assert fake_graphs.replays == 2 and counters.stats()["cuda_graph_replays"] == 2
    del runner.replay_if_captured([x, w])[1]
    assert fake_graphs.replays == 3


def test_cuda_graph_runner_returns_saved_outputs_in_place(fake_graphs):
    """A forward's saved tensors (Graph.saved_outputs) are returned where the replay wrote them;
    a graph taking one as input (the backward) keys it by address and reads it in place; a call
    made while one is still referenced runs without the graph."""
    from kiln import counters

    def forward(x, w):
        h = x @ w
        return h.relu().sum(), h * 2, w.t()  # outputs 1 and 2 stand for saved tensors

    w = torch.nn.Parameter(torch.randn(8, 3))
    runner = runner_for(forward, torch.randn(4, 8), w.detach(), saved=[1])
    assert runner.kept_outputs == {1}
    for i in range(3):
        x = torch.randn(4, 8)
        loss, saved, wt = runner([x, w])
        torch.testing.assert_close(loss, (x @ w.detach()).relu().sum())
        torch.testing.assert_close(saved, x @ w.detach() * 2)
        if i > 0:  # replays: the saved tensor is the graph's memory, the loss a copy
            (captured,) = runner._graphs.values()
            assert saved.data_ptr() == captured.outputs[1].data_ptr()
            assert loss.data_ptr() != captured.outputs[0].data_ptr()
            assert cuda_graphs._static_flags([saved, x, w]) == (True, False, True)
            # A saved parameter may reach the backward as a plain tensor: still read in place.
            assert wt.data_ptr() == w.data_ptr() and cuda_graphs._static_flags([wt, w.detach()]) == (True, True)
        del saved  # dead before the next call, as after a backward
    assert fake_graphs.captures == 1 and fake_graphs.replays == 2
    # Still referenced at the next call (two forwards before a backward): that call runs plain.
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    _, kept, _ = runner([x1, w])
    _, fresh, _ = runner([x2, w])
    torch.testing.assert_close(kept, x1 @ w.detach() * 2)  # not overwritten
    torch.testing.assert_close(fresh, x2 @ w.detach() * 2)
    assert not cuda_graphs._static_flags([fresh])[0]
    assert counters.stats()["cuda_graph_busy"] == 1 and fake_graphs.replays == 3

    # A "backward" given the kept tensor: captured with it keyed by address, read in place.
    backward = runner_for(lambda s, g: (s * g,), kept.clone(), torch.randn(4, 3))
    for i in range(3):
        g = torch.randn(4, 3)
        torch.testing.assert_close(backward([kept, g])[0], kept * g)
    (bw,) = backward._graphs.values()
    # g is copied in, kept is read where it is
    assert [i for _, sources in bw.copy_in for i, _ in sources] == [1]
    del kept  # free again once the backward is done with it: a replay
    runner([x1, w])
    assert fake_graphs.replays == 4 + 2


def test_cuda_graph_runner_returns_released_outputs_in_place(fake_graphs):
    """Outputs whose copies are dropped before the next call (a backward's gradients) are returned
    in the graph's memory after PROMOTE_AFTER such calls; one held into a later call makes that
    call run without the graph (not overwritten), and the next call captures the graph again,
    copying that output. An output kept across the next call (a loss) stays a copy."""
    from kiln import counters

    def backward(x, w):
        return x.t() @ x @ w, (x * 2).sum()

    w = torch.nn.Parameter(torch.randn(8, 3))
    runner = runner_for(backward, torch.randn(4, 8), w.detach())
    expect = lambda x: (x.t() @ x @ w.detach(), (x * 2).sum())  # noqa: E731
    held = []
    for i in range(2 + cuda_graphs.PROMOTE_AFTER + 2):
        x = torch.randn(4, 8)
        grad, total = runner([x, w])
        torch.testing.assert_close([grad, total], list(expect(x)))
        held = [total]  # the "loss" lives into the next call; the "gradient" does not
        del grad
    (captured,) = runner._graphs.values()
    assert captured.in_place == {0}
    x = torch.randn(4, 8)
    grad, _ = runner([x, w])
    assert grad.data_ptr() == captured.outputs[0].data_ptr()
    # Held into the next call: that call runs without the graph, and the held one is intact.
    replays = fake_graphs.replays
    x2 = torch.randn(4, 8)
    grad2, _ = runner([x2, w])
    torch.testing.assert_close(grad, expect(x)[0])
    torch.testing.assert_close(grad2, expect(x2)[0])
    assert fake_graphs.replays == replays and counters.stats()["cuda_graph_busy"] == 1
    grad3, _ = runner([x2, w])  # captured again: the held gradient keeps the old graph's memory
    assert fake_graphs.captures == 2 and fake_graphs.replays == replays + 1
    (recaptured,) = runner._graphs.values()
    assert recaptured is not captured and 0 not in recaptured.candidates
    torch.testing.assert_close(grad, expect(x)[0])
    for i in range(cuda_graphs.PROMOTE_AFTER + 2):
        del grad3
        grad3, _ = runner([x, w])
        assert grad3.data_ptr() != recaptured.outputs[0].data_ptr()  # copied from now on
        torch.testing.assert_close(grad3, expect(x)[0])
    assert recaptured.in_place == set() and counters.stats()["cuda_graph_busy"] == 1


def test_a_promotion_leaves_the_busy_check_of_saved_outputs_intact(fake_graphs):
    """A forward whose loss is released before each next call gets it promoted in place while the
    replay that promotes it holds the saved tensors' new views: the saved tensors' idle use counts
    must not include those views, or a saved tensor still held at a later call (two forwards
    before a backward) would be overwritten by that call's replay."""
    from kiln import counters

    def forward(x, w):
        h = x @ w
        return (h * 3).sum(), h * 2  # output 1 stands for a saved tensor

    w = torch.nn.Parameter(torch.randn(8, 3))
    runner = runner_for(forward, torch.randn(4, 8), w.detach(), saved=[1])
    for _ in range(2 + cuda_graphs.PROMOTE_AFTER + 1):
        loss, saved = runner([torch.randn(4, 8), w])
        del loss, saved  # both released before the next call
    (captured,) = runner._graphs.values()
    assert captured.in_place == {0} and captured.kept == {1}
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    saved1 = runner([x1, w])[1]  # (the loss, in place, is released)
    replays = fake_graphs.replays
    saved2 = runner([x2, w])[1]  # saved1 is still held: this call must not replay over it
    assert fake_graphs.replays == replays and counters.stats()["cuda_graph_busy"] == 1
    torch.testing.assert_close(saved1, x1 @ w.detach() * 2)
    torch.testing.assert_close(saved2, x2 @ w.detach() * 2)


def test_static_storages_are_forgotten_once_freed():
    """A parameter a forward returned is read in place by address only while its storage lives:
    a later tensor at a freed one's address is copied like any other."""
    t = torch.randn(8)
    ptr = t.untyped_storage().data_ptr()
    cuda_graphs._remember_static_storages([t.untyped_storage()])
    assert cuda_graphs._read_in_place(ptr)
    del t
    assert not cuda_graphs._read_in_place(ptr) and ptr not in cuda_graphs._STATIC_STORAGES


def test_cuda_graph_runner_copies_strided_and_expanded_inputs(fake_graphs):
    def fn(x, y):
        return ((x * y).sum(0),)

    runner = runner_for(fn, torch.randn(1, 8).expand(4, 8), torch.randn(8, 4).t())
    for i in range(4):
        x = torch.randn(1, 8).expand(4, 8)  # stride 0: its span is one row
        y = torch.randn(8, 4).t()
        torch.testing.assert_close(runner([x, y])[0], (x * y).sum(0))
    assert fake_graphs.captures == 1 and fake_graphs.replays == 3


def test_cuda_graph_runner_copies_inputs_in_one_foreach_copy_per_dtype(fake_graphs):
    """Copied inputs of one dtype go in by one torch._foreach_copy_ (a strided one, an expanded
    one's span and a scalar together), an input alone in its dtype by copy_; each replay sees the
    call's values."""
    def fn(x, y, s, idx):
        return ((x * y).sum(0) * s + idx.sum(),)

    args = lambda: (torch.randn(1, 8).expand(4, 8), torch.randn(8, 4).t(), torch.randn(()),
                    torch.randint(0, 9, (3,)))
    runner = runner_for(fn, *args())
    for _ in range(4):
        a = args()
        torch.testing.assert_close(runner(list(a))[0], fn(*a)[0])
    (captured,) = runner._graphs.values()
    assert sorted(len(buffers) for buffers, _ in captured.copy_in) == [1, 3]
    assert fake_graphs.captures == 1 and fake_graphs.replays == 3


def test_cuda_graph_runner_captures_input_updates(fake_graphs):
    """Updated inputs: a static-address one (a buffer) is updated once per call, the capturing call
    included; another one is copied back from its static buffer after each replay."""
    def fn(x, buf, acc):
        buf.copy_(buf * 0.5 + x.mean())  # as a batch norm's running mean
        acc.add_(x)
        return (x * 2,)

    buf = torch.zeros(())
    torch._dynamo.mark_static_address(buf)
    runner = runner_for(fn, torch.randn(4), buf.clone(), torch.zeros(4))
    assert runner.refusal is None and runner.updated == (1, 2)
    want_buf, acc, want_acc = torch.zeros(()), torch.zeros(4), torch.zeros(4)
    for i in range(4):
        x = torch.randn(4)
        out = runner([x, buf, acc])
        want_buf = want_buf * 0.5 + x.mean()
        want_acc += x
        torch.testing.assert_close(out[0], x * 2)
        torch.testing.assert_close(buf, want_buf)
        torch.testing.assert_close(acc, want_acc)
    assert fake_graphs.captures == 1 and fake_graphs.replays == 3


def test_cuda_graph_runner_leaves_graphs_that_write_into_input_views_alone(fake_graphs):
    def fn(x, y):
        x[0].add_(1)
        return (x * y,)

    runner = runner_for(fn, torch.randn(3), torch.randn(3))
    assert "a view of input" in runner.refusal
    for _ in range(3):
        x, y = torch.randn(3), torch.randn(3)
        want = x.clone()
        want[0] += 1
        torch.testing.assert_close(runner([x, y])[0], want * y)
        torch.testing.assert_close(x, want)
    assert fake_graphs.captures == 0


def test_cuda_graph_runner_skips_updated_inputs_that_share_memory(fake_graphs, caplog):
    def fn(x, y):
        x.add_(1)
        return (x + y,)

    runner = runner_for(fn, torch.randn(3), torch.randn(3))
    caplog.set_level(logging.INFO, logger="kiln")
    for _ in range(3):
        base = torch.randn(6)
        x, y = base[:3], base[3:]
        want = (x + 1) + y
        torch.testing.assert_close(runner([x, y])[0], want)
    assert fake_graphs.captures == 0 and "input 0, which the graph updates, shares memory with input 1" in caplog.text


def test_cuda_graph_runner_gives_up_on_a_failing_capture(fake_graphs, monkeypatch):
    def fail(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(fake_graphs, "capture", fail)
    runner = runner_for(lambda x: (x.exp(),), torch.randn(3))
    for _ in range(4):
        x = torch.randn(3)
        torch.testing.assert_close(runner([x])[0], x.exp())
    assert fake_graphs.replays == 0 and "capture failed (RuntimeError: operation not permitted" in runner.refusal
