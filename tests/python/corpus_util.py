"""Compile an aten graph through a real kilnd, run the artifact with kiln's executor, compare with
eager torch. Shared by tests/python/test_corpus.py and scripts/opinfo_check.py."""
import collections
import os
import tempfile

import torch

import kiln
from kiln import proto
from kiln.backend import detect_cpu_isa
from kiln.executor import PlanExecutor

_CACHE_DIR = tempfile.mkdtemp(prefix="kiln-corpus-rt-")
OK_SOURCES = (proto.CACHE_SOURCE_COMPILED, proto.CACHE_SOURCE_JOINED,
              proto.CACHE_SOURCE_MEMORY_HIT, proto.CACHE_SOURCE_DISK_HIT)

# dtype -> (rtol, atol); anything else (ints, bools) is compared exactly.
TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1.6e-2, 1e-2),
}


# Where the corpus runs: "cpu" (CI), or "cuda" on the GPU machine (KILN_CORPUS_DEVICE=cuda): inputs,
# captures and eager references on that device, compiled for its architecture.
DEVICE = os.environ.get("KILN_CORPUS_DEVICE", "cpu")


def target():
    if DEVICE.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(torch.device(DEVICE))
        return proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch=f"sm_{major}{minor}")
    isa = detect_cpu_isa()
    return proto.Target(device=proto.DEVICE_KIND_CPU,
                        cpu_isa=isa if isa.startswith("x86-64-v") else "x86-64-v2")


def to_device(t):
    """t on DEVICE with the same sizes, strides and storage offset (its whole storage moves, so
    expanded and sliced inputs keep their layout)."""
    if not isinstance(t, torch.Tensor) or t.device.type == torch.device(DEVICE).type:
        return t
    n = t.untyped_storage().nbytes() // t.element_size()
    return t.as_strided((n,), (1,), 0).to(DEVICE).as_strided(t.shape, t.stride(), t.storage_offset())


def request_for(gm, name, kind=proto.GRAPH_KIND_INFERENCE):
    graph = kiln.serialize_graph(gm, kind=kind, debug_name=name)
    return proto.CompileRequest(graph=graph, target=target())


def _runtime():
    from kiln.runtime import load_runtime

    return load_runtime(_CACHE_DIR)


def plan_counts(plan):
    """(kernel steps, extern aten steps, fallback aten steps, [fallback targets])."""
    kernels = extern = fallback = 0
    targets = []
    for s in plan.steps:
        kind = s.WhichOneof("kind")
        if kind == "kernel":
            kernels += 1
        elif kind == "aten" and s.aten.fallback:
            fallback += 1
            targets.append(s.aten.target)
        elif kind == "aten":
            extern += 1
    return kernels, extern, fallback, targets


def run_plan(response, request, inputs):
    executor = PlanExecutor(response.artifact, request.graph, runtime_loader=_runtime)
    return executor(list(inputs))


def fresh_like(t, gen):
    """A random tensor with t's dtype, sizes, strides and storage offset (expanded inputs keep
    their stride 0; slices keep their offset)."""
    if not isinstance(t, torch.Tensor):
        return t
    n = t.storage_offset() + sum((d - 1) * st for d, st in zip(t.shape, t.stride())) + 1 if t.numel() else 1
    base = random_tensor((n,), t.dtype, gen)
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def random_tensor(shape, dtype, gen, low=-20, high=20):
    """Drawn on the CPU from `gen` (the same values on every device), returned on DEVICE."""
    if dtype == torch.bool:
        return (torch.rand(shape, generator=gen, device="cpu") > 0.5).to(DEVICE)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64, device="cpu").to(dtype).to(DEVICE)
    if dtype == torch.uint8:
        low = max(low, 0)
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64, device="cpu").to(dtype).to(DEVICE)


def flatten(out):
    if isinstance(out, torch.Tensor) or out is None:
        return [out]
    items = []
    for o in out:
        items.extend(flatten(o))
    return items


def upcast(inputs):
    """float32/bfloat16/float16 tensors -> float64 (for a float64 reference run); None when there
    are none."""
    low = (torch.float32, torch.bfloat16, torch.float16)
    if not any(isinstance(t, torch.Tensor) and t.dtype in low for t in inputs):
        return None
    return [t.double() if isinstance(t, torch.Tensor) and t.dtype in low else t for t in inputs]


def compare(got, want, where="", gold=None):
    """Raises AssertionError unless every output matches eager at its dtype's tolerance.

    gold: a callable returning the outputs of a float64 run (see upcast). A float32/bfloat16/float16
    output that misses eager's tolerance still passes when it is at least as accurate as eager: elementwise
    |kiln - gold| <= atol + rtol * |gold| + 2 * max|eager - gold| (rounding order differs, e.g. in
    fused reductions feeding a matmul, so eager is no better reference than kiln there)."""
    got, want = flatten(got), flatten(want)
    assert len(got) == len(want), f"{where}: {len(got)} outputs, eager has {len(want)}"
    golds = None
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or not isinstance(w, torch.Tensor):
            continue
        assert isinstance(g, torch.Tensor), f"{where}: output {i} is {type(g).__name__}"
        assert g.dtype == w.dtype and g.shape == w.shape, \
            f"{where}: output {i} is {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
        rtol, atol = TOLERANCES.get(w.dtype, (0, 0))
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"{where}: output {i}: {m}")
        except AssertionError:
            if gold is None or w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise
            golds = flatten(gold()) if golds is None else golds
            d = golds[i]
            if not isinstance(d, torch.Tensor) or d.dtype != torch.float64 or d.shape != w.shape:
                raise
            eager_err = torch.nan_to_num((w.double() - d).abs(), nan=0.0).max().item() if w.numel() else 0.0
            bound = atol + rtol * d.abs() + 2 * eager_err
            bad = ~(((g.double() - d).abs() <= bound) | (g.isnan() & d.isnan()) | (g.double() == d))
            if bad.any():
                at = tuple(bad.nonzero()[0].tolist())
                raise AssertionError(f"{where}: output {i}: {int(bad.sum())} elements miss eager's tolerance "
                                     f"and the float64 result by more than 2x eager's error ({eager_err:.3g}); "
                                     f"at {list(at)}: kiln {g[at].item()}, eager {w[at].item()}, "
                                     f"float64 {d[at].item()}")


SUMMARIES = []  # tables printed by conftest.py at the end of the session


class Summary:
    def __init__(self):
        self.rows = collections.Counter()
        self.fallback_ops = collections.Counter()

    def add(self, plan):
        k, e, f, targets = plan_counts(plan)
        self.rows["graphs"] += 1
        self.rows["kernels"] += k
        self.rows["extern steps"] += e
        self.rows["library steps"] += sum(1 for s in plan.steps if s.WhichOneof("kind") == "library")
        self.rows["op fallbacks"] += f
        self.rows["graphs with fallbacks"] += bool(f)
        self.fallback_ops.update(targets)

    def table(self):
        lines = [f"{k:>24}: {v}" for k, v in self.rows.items()]
        if self.fallback_ops:
            lines.append("fallback ops: " + ", ".join(f"{t} x{n}" for t, n in self.fallback_ops.most_common()))
        return "\n".join(lines)
