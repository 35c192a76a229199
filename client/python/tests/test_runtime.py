"""Kernel steps through the runtime library (runtime/kiln_runtime.h via ctypes): the library is
built with runtime/build.sh into a cache dir keyed by a hash of its sources, and a hand-written
kernel in the generated-kernel calling convention runs inside a plan next to aten steps."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

from kiln import proto, runtime, testing
from kiln.executor import PlanExecutor
from kiln.guards import InputGuard

PV = proto.PlanValue

KERNELS = r"""
#include <stdint.h>
// out[i] = a[i] * 2 + b[i], i < scalars[0]
extern "C" void kiln_kernel_0(void* const* buffers, const int64_t* scalars) {
  const float* a = (const float*)buffers[0];
  const float* b = (const float*)buffers[1];
  float* out = (float*)buffers[2];
  for (int64_t i = 0; i < scalars[0]; ++i) out[i] = a[i] * 2.0f + b[i];
}
// out[i] = out[i] + 1 (in place)
extern "C" void kiln_kernel_1(void* const* buffers, const int64_t* scalars) {
  float* out = (float*)buffers[0];
  for (int64_t i = 0; i < scalars[0]; ++i) out[i] += 1.0f;
}
"""

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or runtime.source_dir() is None,
                                reason="needs g++ and the runtime sources (runtime/ in the checkout)")


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    path = runtime.build(str(cache))
    assert path.startswith(str(cache)) and os.path.isfile(path)
    assert runtime.source_hash(runtime.source_dir()) in path
    assert runtime.build(str(cache)) == path  # built once, then reused
    return runtime.Runtime(path)


@pytest.fixture(scope="module")
def kernel_so(tmp_path_factory):
    d = tmp_path_factory.mktemp("kernels")
    (d / "k.cc").write_text(KERNELS)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(d / "k.cc"), "-o", str(d / "k.so")], check=True)
    return (d / "k.so").read_bytes()


def dynamic_graph():
    """Placeholders a: f32[s0], b: f32[s0]."""
    graph = proto.Graph()
    graph.symbols.add(name="s0", hint=8, min_value=2, max_value=(1 << 63) - 1)
    for name in ("a", "b"):
        ph = graph.nodes.add(name=name, op=proto.Node.OP_PLACEHOLDER, target=name)
        t = ph.meta.tensor
        t.dtype, t.device.kind = proto.DTYPE_FLOAT32, proto.DEVICE_KIND_CPU
        t.sizes.add(expr=proto.SymExpr(op=proto.SymExpr.OP_SYMBOL, symbol=0))
        t.strides.add(constant=1)
    return graph


def test_kernel_steps_run_through_the_runtime(rt, kernel_so):
    graph = dynamic_graph()
    plan = proto.Plan(num_inputs=2)
    for i in range(2):
        v = plan.values.add(storage=PV.STORAGE_INPUT, index=i)
        v.meta.CopyFrom(graph.nodes[i].meta.tensor)
    out = plan.values.add(storage=PV.STORAGE_OUTPUT)
    out.meta.CopyFrom(graph.nodes[0].meta.tensor)
    neg = plan.values.add(storage=PV.STORAGE_STEP)
    neg.meta.CopyFrom(graph.nodes[0].meta.tensor)
    k0 = plan.steps.add().kernel
    k0.binary, k0.symbol = 0, "kiln_kernel_0"
    k0.args.extend([0, 1, 2])
    k0.scalar_args.append(0)
    k1 = plan.steps.add().kernel
    k1.binary, k1.symbol = 0, "kiln_kernel_1"
    k1.args.append(2)
    k1.scalar_args.append(0)
    step = plan.steps.add().aten
    step.target = "aten.neg.default"
    step.args.add(node="v2")
    step.outputs.append(3)
    plan.outputs.extend([2, 3])
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"),
                                     [proto.Binary(kind=proto.Binary.KIND_SHARED_OBJECT, data=kernel_so)])
    ex = PlanExecutor(artifact, graph, runtime_loader=lambda: rt)
    guard = InputGuard(graph)
    for n in (8, 1000):
        a, b = torch.randn(n), torch.randn(n)
        got, negated = ex([a, b], guard.bind([a, b]))
        torch.testing.assert_close(got, a * 2 + b + 1)
        torch.testing.assert_close(negated, -(a * 2 + b + 1))


def test_kernel_tables_from_several_threads_at_once(rt, kernel_so):
    """Each call fills launch tables of its own (a pool per program), so concurrent calls of one
    plan do not see each other's pointers; each size (symbol value) has its program."""
    import threading

    graph = dynamic_graph()
    plan = proto.Plan(num_inputs=2)
    for i in range(2):
        plan.values.add(storage=PV.STORAGE_INPUT, index=i).meta.CopyFrom(graph.nodes[i].meta.tensor)
    plan.values.add(storage=PV.STORAGE_OUTPUT).meta.CopyFrom(graph.nodes[0].meta.tensor)
    for symbol in ("kiln_kernel_0", "kiln_kernel_1"):
        k = plan.steps.add().kernel
        k.binary, k.symbol = 0, symbol
        k.args.extend([0, 1, 2] if symbol.endswith("0") else [2])
        k.scalar_args.append(0)
    plan.outputs.append(2)
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"),
                                     [proto.Binary(kind=proto.Binary.KIND_SHARED_OBJECT, data=kernel_so)])
    ex = PlanExecutor(artifact, graph, runtime_loader=lambda: rt)
    guard = InputGuard(graph)
    errors = []

    def work(n):
        try:
            for _ in range(200):
                a, b = torch.randn(n), torch.randn(n)
                (got,) = ex([a, b], guard.bind([a, b]))
                torch.testing.assert_close(got, a * 2 + b + 1)
        except Exception as e:  # pragma: no cover  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in (7, 7, 300, 300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(ex._programs) == 2


def _workspace_plan(aten_reads_view):
    """a, b: inputs f32[s0 = 8]; w: f32[12] in the workspace at byte 16, tv: its elements 4..11 (a
    view); kernels: tv = 2a + b; tv += 1; out = 2 tv + b (one batch, so workspace and tensor
    pointers interleave in its table). aten_reads_view: also neg = -tv by an aten step."""
    graph = dynamic_graph()
    plan = proto.Plan(num_inputs=2, workspace_bytes=80)
    for i in range(2):
        plan.values.add(storage=PV.STORAGE_INPUT, index=i).meta.CopyFrom(graph.nodes[i].meta.tensor)
    out = plan.values.add(storage=PV.STORAGE_OUTPUT)
    out.meta.CopyFrom(graph.nodes[0].meta.tensor)
    for storage, size, index, offset in ((PV.STORAGE_WORKSPACE, 12, 0, 16), (PV.STORAGE_VIEW, 8, 3, 4)):
        v = plan.values.add(storage=storage, index=index, offset=offset)  # v3 = w, v4 = tv
        v.meta.dtype, v.meta.device.kind = proto.DTYPE_FLOAT32, proto.DEVICE_KIND_CPU
        v.meta.sizes.add(constant=size)
        v.meta.strides.add(constant=1)
    for symbol, args in (("kiln_kernel_0", [0, 1, 4]), ("kiln_kernel_1", [4]), ("kiln_kernel_0", [4, 1, 2])):
        k = plan.steps.add().kernel
        k.binary, k.symbol = 0, symbol
        k.args.extend(args)
        k.scalar_args.append(0)
    plan.outputs.append(2)
    if aten_reads_view:
        neg = plan.values.add(storage=PV.STORAGE_STEP)
        neg.meta.CopyFrom(graph.nodes[0].meta.tensor)
        step = plan.steps.add().aten
        step.target = "aten.neg.default"
        step.args.add(node="v4")
        step.outputs.append(5)
        plan.outputs.append(5)
    return graph, plan


def _count_tensor_views(monkeypatch):
    """Counts Tensor.as_strided, .view and .set_ calls (how the executor makes workspace values)."""
    calls = []
    for name in ("as_strided", "view", "set_"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


@pytest.mark.parametrize("aten_reads_view", [False, True])
def test_workspace_values_read_only_by_kernels_get_no_tensor(rt, kernel_so, monkeypatch, aten_reads_view):
    """Kernels take a workspace value's pointer as the call's workspace pointer plus the byte
    offset the program computed (a view's too: 16 + 4 * 4 bytes); no tensor is made for it per
    call. A value an aten step reads keeps its tensor, made straight from the workspace (not
    through its base)."""
    graph, plan = _workspace_plan(aten_reads_view)
    artifact = testing.make_artifact(plan, proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa="x86-64-v2"),
                                     [proto.Binary(kind=proto.Binary.KIND_SHARED_OBJECT, data=kernel_so)])
    ex = PlanExecutor(artifact, graph, runtime_loader=lambda: rt)
    guard = InputGuard(graph)
    a, b = torch.randn(8), torch.randn(8)
    ex([a, b], guard.bind([a, b]))  # builds the program
    (program,) = ex._programs.values()
    assert (4 in program.tensor_reads) == aten_reads_view and 3 not in program.tensor_reads
    calls = _count_tensor_views(monkeypatch)
    for _ in range(3):
        a, b = torch.randn(8), torch.randn(8)
        got = ex([a, b], guard.bind([a, b]))
        tv = a * 2 + b + 1
        torch.testing.assert_close(got[0], tv * 2 + b)
        if aten_reads_view:
            torch.testing.assert_close(got[1], -tv)
    assert calls == (["view", "as_strided"] * 3 if aten_reads_view else [])


def test_runtime_errors_are_reported(rt, kernel_so):
    module = rt.load(kernel_so)
    with pytest.raises(runtime.RuntimeCallError, match="no_such_kernel"):
        module.add_kernel("no_such_kernel")
    with pytest.raises(runtime.RuntimeCallError):
        rt.load(b"not an ELF file at all")


def test_missing_cublaslt_is_a_clear_error(rt, tmp_path):
    """cuBLASLt opens once per process: a child whose KILN_LIBCUBLASLT_PATH names no library (so
    this holds on GPU machines too) gets RuntimeUnavailable naming it, twice, and no crash."""
    code = (f"from kiln import runtime\nrt = runtime.Runtime({rt.path!r})\n"
            "for _ in range(2):\n"
            "    try:\n        rt.cublas_init()\n    except runtime.RuntimeUnavailable as e:\n        print(e)\n")
    env = dict(os.environ, KILN_LIBCUBLASLT_PATH=str(tmp_path / "no" / "libcublasLt.so.13"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and all("libcublasLt.so.13" in line and "KILN_LIBCUBLASLT_PATH" in line for line in lines)


def test_missing_runtime_library_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_RUNTIME_LIB", str(tmp_path / "nope.so"))
    monkeypatch.setattr(runtime, "_LOADED", {})
    with pytest.raises(runtime.RuntimeUnavailable, match="nope.so"):
        runtime.load_runtime(str(tmp_path))


def test_load_runtime_hashes_the_sources_once_per_cache_dir(monkeypatch, tmp_path):
    """Every loaded CUDA or library plan asks for the runtime: the sources' hash (file reads and
    sha256, milliseconds) is computed at the first request for a cache dir only."""
    monkeypatch.delenv("KILN_RUNTIME_LIB", raising=False)
    monkeypatch.setattr(runtime, "_BUILT", {})
    calls = []
    real = runtime.source_hash
    monkeypatch.setattr(runtime, "source_hash", lambda root: calls.append(root) or real(root))
    first = runtime.load_runtime(str(tmp_path))
    assert runtime.load_runtime(str(tmp_path)) is first and len(calls) == 1
