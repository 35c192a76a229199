"""The GPU checking tools (tests/gpu/models_check.py, graph_diff.py, softmax_shapes.py and
host_split.py, scripts/bench_gpu.py) run on the CPU too (--device cpu --quick): these smoke runs
keep them working between GPU sessions, against a real kilnd and torch, and pin models_check's
float64 second opinion for training (the jittered eager peer and the training spread).
scripts/cuda_registers.py needs no GPU at all: it runs here on a real sm_90 compile, and so do
profile_model.py's byte counts (kiln's from real plans, Inductor's from its generated modules)."""
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from kilnd_server import kilnd_path

REPO = Path(__file__).resolve().parents[2]
GPU_TOOLS = REPO / "tests" / "gpu"


def run_tool(script, *args, timeout=600):
    """(exit status, stdout + stderr) of `script` --device cpu --quick --kilnd KILND `args`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "client" / "python"),
                                                       str(REPO / "tests" / "python")]))
    for var in ("KILN_SERVER", "KILN_FALLBACK", "KILN_CACHE_ONLY", "KILN_DEBUG"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, str(script), "--device", "cpu", "--quick", "--kilnd", kilnd_path(),
                          *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    return out.returncode, out.stdout + out.stderr


@pytest.fixture(scope="module")
def models_check():
    sys.path.insert(0, str(GPU_TOOLS))
    try:
        import models_check as mc
        yield mc
    finally:
        sys.path.remove(str(GPU_TOOLS))


def test_models_check_training_goes_through_the_training_spread():
    """Tolerances scaled down 20x so that ResNet-18's training rows need the float64 reference:
    they pass through it (PASS-REF) with the training spread printed, the graph check (each kiln
    graph call against its FX module on the same inputs, ~3e-6 here) stays within its 5e-6, and
    the exit status is 0."""
    rc, text = run_tool(GPU_TOOLS / "models_check.py", "--only", "resnet18", "--dtype", "fp32", "--mode", "training",
                        "--tol-scale", "0.05")
    assert rc == 0, text[-4000:]
    assert "resnet18 / fp32 / training: PASS-REF" in text, text[-4000:]
    assert "training spread" in text, text[-4000:]
    assert "graph check: 4 kiln graph calls against their FX modules on the same inputs" in text, text[-4000:]


def test_models_check_graph_check_fails_a_case_over_its_tolerance():
    """The graph check can fail: at 1e-7 (tolerances x 0.001) GPT's fp32 rounding is over it, and
    the case is a MISMATCH that names the graph call, the output and its FX node."""
    rc, text = run_tool(GPU_TOOLS / "models_check.py", "--only", "gpt_matmul", "--dtype", "fp32", "--mode",
                        "training", "--tol-scale", "0.001")
    assert rc == 1, text[-4000:]
    assert "gpt_matmul / fp32 / training: MISMATCH" in text, text[-4000:]
    assert re.search(r"graph check: (forward|backward) call \d output \d+ \w+ \([\w.]+\) differs from its FX "
                     r"module", text), text[-4000:]


def test_models_check_llama_block_matches_eager():
    """The Llama-style block (RMSNorm, rotary embeddings, grouped-query SDPA, SwiGLU) in both dtypes
    and modes: every graph compiled by kilnd and run as a plan, within the models' tolerances."""
    rc, text = run_tool(GPU_TOOLS / "models_check.py", "--only", "llama")
    assert rc == 0, text[-4000:]
    for dtype in ("fp32", "bf16"):
        for mode in ("inference", "training"):
            assert f"llama / {dtype} / {mode}: PASS " in text, text[-4000:]
    assert "4 cases: PASS 4" in text, text[-4000:]
    assert re.search(r"\| llama \| fp32 +\| training +\| PASS +\| [^|]+\| 2/2/0/0 ", text), text[-4000:]


def test_graph_diff_defer_replays_every_call():
    rc, text = run_tool(GPU_TOOLS / "graph_diff.py", "--model", "resnet18", "--steps", "2", "--defer", "--top", "3")
    assert rc == 0, text[-4000:]
    assert "over 4 graph calls" in text, text[-4000:]
    # On the CPU kiln's kernels are deterministic: a replay on the same inputs gives the same bits.
    assert "float outputs run again by kiln on the same inputs, 0 differ" in text, text[-4000:]


def test_peer_spread_is_the_largest_gradient_error_of_any_eager_peer(models_check):
    mc = models_check
    ref = [("grad", "g a", torch.ones(4)), ("grad", "g b", torch.ones(4)), ("update", "u a", torch.ones(4))]

    def run(ga, gb, ua):
        return [("grad", "g a", torch.full((4,), ga)), ("grad", "g b", torch.full((4,), gb)),
                ("update", "u a", torch.full((4,), ua))]

    res = {"eager": run(1.0, 1.001, 1.5), "eager-cl": run(1.002, 1.0, 1.0), mc.JITTER_LABEL: run(1.0, 1.003, 2.0),
           "kiln": run(1.1, 1.1, 1.1)}
    err, where = mc.peer_spread(res, ref)
    assert math.isclose(err, 0.003, rel_tol=1e-4) and where == f"{mc.JITTER_LABEL}: g b"  # updates and kiln ignored
    assert mc.peer_spread({"eager": res["eager"]}, ref) is None  # no jittered peer: no spread (inference)


def test_jitter_is_small_seeded_and_multiplicative(models_check):
    mc = models_check
    a = [("w", torch.nn.Parameter(torch.full((1000,), 2.0)))]
    b = [("w", torch.nn.Parameter(torch.full((1000,), 2.0)))]
    mc.jitter(a, step=1)
    mc.jitter(b, step=1)
    assert torch.equal(a[0][1], b[0][1])
    rel = (a[0][1].detach().double() / 2.0 - 1.0)
    assert 0 < rel.abs().max() < 10 * mc.JITTER_REL and rel.std() > mc.JITTER_REL / 4


def test_bench_section_c_kiln_compile_smoke():
    """Section c's kiln.compile rows (cold, then a warm new process) with the first-call profile."""
    rc, text = run_tool(REPO / "scripts" / "bench_gpu.py", "--sections", "c", "--only", "block_train",
                        "--kiln-compile-only", "--skip-inductor", "--warm-repeats", "1", "--profile-first-call",
                        "--time-budget", "0")
    assert rc == 0, text[-4000:]
    row = next((line for line in text.splitlines() if line.startswith("| block_train |")), "")
    assert "1l/0c" in row, text[-4000:]  # the warm process loaded the package instead of capturing
    assert "Ordered by: internal time" in text and "Ordered by: cumulative time" in text, text[-4000:]


def test_bench_dynamic_compiles_every_length_with_kiln():
    """scripts/bench_dynamic.py: a GPT block whose sequence length changes every step; Dynamo
    makes the length symbolic and kiln compiles each length met (kiln.specialize), none eagerly,
    every step matching eager's loss and gradients."""
    rc, text = run_tool(REPO / "scripts" / "bench_dynamic.py", "--skip-inductor", "--iters", "1", "--rounds", "1")
    assert rc == 0, text[-4000:]
    assert "All backends matched eager at every length." in text, text[-4000:]
    row = next(line for line in text.splitlines() if line.startswith("| kiln "))
    assert " 0 eager calls, 0 graphs eager," in row, row


def test_softmax_shapes_smoke():
    code, out = run_tool(GPU_TOOLS / "softmax_shapes.py")
    assert code == 0, out[-3000:]
    rows = [line for line in out.splitlines() if line.startswith("| softmax")]
    assert len(rows) == 3 and "of x[:, 1:]" in rows[1], out[-3000:]
    assert "0 ran eagerly" in out, out[-3000:]


def test_host_split_smoke():
    """tests/gpu/host_split.py: medians of the step's parts per backend, and kiln's guard time."""
    code, out = run_tool(GPU_TOOLS / "host_split.py", "--backends", "eager,kiln", "--steps", "2", "--warmup", "2")
    assert code == 0, out[-3000:]
    assert re.search(r"^\| kiln +\| [\d.]+ +\| [\d.]+ +\| [\d.]+ +\| [\d.]+ +\|$", out, re.M), out[-3000:]
    assert re.search(r"^\| guard \(StaticGuard.bind\) +\| [\d.]+ +\| 2 +\|$", out, re.M), out[-3000:]


def test_host_split_graph_mode_on_cpu():
    """host_split.py --graphs on the CPU (kiln.testing.CpuGraphs for CUDA graphs): after the
    warm-up steps every call replays a captured key, which needs no guard."""
    code, out = run_tool(GPU_TOOLS / "host_split.py", "--backends", "kiln", "--graphs", "--dtype", "fp32",
                         "--steps", "3", "--warmup", "4")
    assert code == 0, out[-3000:]
    assert "CpuGraphs" in out, out[-3000:]
    assert re.search(r"^\| CUDA-graph runner, captured key +\| [\d.]+ +\| 2 +\|$", out, re.M), out[-3000:]
    assert re.search(r"^\|   capture key +\| [\d.]+ +\| 2 +\|$", out, re.M), out[-3000:]
    assert "StaticGuard" not in out, out[-3000:]


@pytest.fixture
def nvrtc_kilnd():
    """(a fresh kilnd that compiles for CUDA targets, its NVRTC library's path); a skip without NVRTC."""
    from kilnd_server import Kilnd

    sys.path.insert(0, str(REPO / "tests" / "python"))
    from test_precompile import nvrtc_library

    nvrtc = nvrtc_library()
    if nvrtc is None:
        pytest.skip("no NVRTC library (pip install nvidia-cuda-nvrtc, or set KILN_NVRTC_PATH)")
    server = Kilnd(f"--nvrtc={nvrtc}")
    yield server, nvrtc
    assert server.stop() == 0


CODE_KB_LIMIT = 32  # per column kernel of the batch norm step below


def test_cuda_registers_finds_no_spill_in_a_batch_norm_training_step(nvrtc_kilnd):
    """scripts/cuda_registers.py compiles a cache entry's CUDA sources with NVRTC, no GPU needed: a
    convolution + batch norm training step precompiled for sm_90 has vector column kernels (the
    batch norm's split partials and per-channel sums), none of its kernels spills
    (--fail-on-spill), and none of its column kernels has more than CODE_KB_LIMIT of machine code
    (before session 27 the forward's Welford columns carried a vector and a scalar copy of their
    body and an unrolled fold of both kinds: 80-100 KB; small kernels' time follows their code's
    size on the GPU)."""
    import kiln

    server, nvrtc = nvrtc_kilnd
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64),
                                torch.nn.ReLU())
    x = torch.randn(8, 8, 32, 32).to(memory_format=torch.channels_last)
    records = kiln.precompile(model, (x,), target="cuda:sm_90", training=True,
                              options={"server": server.address, "debug": True})
    assert sorted(r.kind for r in records) == ["backward", "forward"], records
    for record in records:
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "cuda_registers.py"), "--server",
                              server.address, record.key, "--nvrtc", nvrtc, "--fail-on-spill"],
                             capture_output=True, text=True, timeout=600, cwd=REPO)
        assert out.returncode == 0, out.stdout + out.stderr
        columns = re.findall(r"^\| kiln_\w+ \| graph_\d+\.cu \| column \| (\d) \| (\d+) \| (\d+) \| 0 / 0 \| "
                             r"([\d.]+) \|$", out.stdout, re.M)
        assert columns and all(width == "4" for width, _, _, _ in columns), (record.kind, out.stdout)
        assert all(0 < float(kb) < CODE_KB_LIMIT for _, _, _, kb in columns), (record.kind, out.stdout)


def test_profile_model_counts_each_kernels_bytes(nvrtc_kilnd):
    """profile_model.py --bytes: a kiln kernel's bytes are its plan arguments' extents (here one
    pointwise kernel reading and writing 1024 x 256 f32: 2 MiB), and Inductor's are its own
    kernel_num_gb estimate, found after each kernel's name in its modules (a nested dict between
    them does not hide it; a kernel without one is left out)."""
    import kiln

    sys.path.insert(0, str(GPU_TOOLS))
    import profile_model as pm

    server, _ = nvrtc_kilnd
    kiln.precompile(lambda x: torch.relu(x) * 2, (torch.empty(1024, 256),), target="cuda:sm_90",
                    options={"server": server.address})
    counted = pm.kiln_kernel_bytes(server.address, pm.find_kilnctl(kilnd_path()))
    assert list(counted.values()) == [2 * 1024 * 256 * 4], counted
    assert all(re.fullmatch(r"kiln_[0-9a-f]{8}_\d+", k) for k in counted), counted

    module = (
        "@triton_heuristics.pointwise(inductor_meta={'kernel_name': 'triton_poi_fused_add_0', "
        "'tiling_scores': {'x': 12}, 'kernel_num_gb': 0.25})\n"
        "def triton_poi_fused_add_0(): pass\n"
        "@triton_heuristics.reduction(inductor_meta={'kernel_name': 'triton_red_fused_sum_1'})\n"
        "def triton_red_fused_sum_1(): pass\n")
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "ab"))
        with open(os.path.join(d, "ab", "cabc.py"), "w") as f:
            f.write(module)
        assert pm.inductor_kernel_bytes(d) == {"triton_poi_fused_add_0": 0.25e9}


def test_kernel_variants_parses_buffer_specs_and_names_a_bad_one():
    sys.path.insert(0, str(GPU_TOOLS))
    try:
        import kernel_variants as kv
    finally:
        sys.path.pop(0)
    assert kv.parse_buffers("f32:16384, bf16:64,i64:8") == [("float32", 16384), ("uint16", 64), ("int64", 8)]
    for bad in ("f32", "f33:4", "f32:0", "f32:x"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            kv.parse_buffers(bad)
