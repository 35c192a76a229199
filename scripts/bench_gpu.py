#!/usr/bin/env python3
"""kiln vs eager vs Inductor on a GPU, in one run: kernels, models, compile times.

    python3 scripts/bench_gpu.py [--sections a,b,c] [--only NAME[,NAME]] [--quick]
                                 [--device cuda|cpu] [--skip-inductor] [--kilnd PATH]

Sections (all by default; the full run is sized for about 6-8 minutes on one H200, and
--time-budget, 540 s by default on CUDA, skips (and lists) rows that could run past it, so that one
command stays under a 10-minute limit; --sections splits a run):
  a  memory-bound kernels through backend="kiln", eager and Inductor (torch.compile's default):
     a*b+c f32, a bf16 pointwise chain, row softmax f32/bf16 (65536 x 1024) and over long
     rows (8192 x 8192, 2048 x 32768, 4096 x 50257 bf16, 64 x 262144), log_softmax f32
     (8192 x 8192), layer norm f32/bf16 and RMSNorm f32/bf16 (65536 x 1024), column sum f32 and a
     transposed broadcast add f32 (8192 x 8192). Bandwidth = bytes every input read once + every
     output written once, over the median time; shown in TB/s and as % of a device-to-device copy
     (dst.copy_(src) of a 1 GiB buffer, measured in the same run). "kiln vs Inductor" = Inductor time / kiln
     time (> 1: kiln faster). Each result is checked against eager.
  b  end-to-end step time of the models of tests/gpu/models_check.py (tests/gpu/gpu_models.py):
     GPT block (matmul attention and SDPA), ResNet-18, ResNet-50, BERT layer; inference (eval,
     no_grad) and training (forward + loss + backward + SGD step); bf16 autocast by default
     (--dtype fp32 for fp32); eager, Inductor, kiln; geomean of Inductor time / kiln time.
  c  cold compile and warm start, each in a NEW process, for an LN + MLP + softmax block (training:
     forward + backward, fp32) and ResNet-50 fp16 inference (model.half(), eval):
       Inductor cold: fresh TORCHINDUCTOR_CACHE_DIR (Triton's cache inside it; remote caches off)
       Inductor warm: a new process on the same cache dir (FX graph / AOTAutograd / Triton hits)
       kiln cold: a new kilnd with an empty --cache_dir; kiln warm: a new process against the same
       kilnd (memory-tier hits); kiln warm (disk): kilnd restarted on that cache dir.
     Figure: start of the first call to its result ready (synchronized), model already built and
     on the device; `import torch` (+ kiln) + CUDA init is measured separately and not included,
     and so is a small unrelated graph each process runs through the same backend first ("prime":
     one-time process costs such as Inductor's worker pool, Triton's driver stubs, kiln's runtime
     library load). The kiln client's runtime library is built once beforehand (a one-time cost per
     machine), as Triton's driver stubs are in the prime.

Timing: on CUDA, torch.cuda.Event pairs around each call, enqueued back to back, median of --iters
calls after warm-up (host overhead shows whenever the host is slower than the GPU); on CPU,
time.perf_counter per call. On --device cpu every figure is a smoke-test figure only (bandwidths
and ratios there mean nothing for the GPU targets).

Targets printed next to the figures: memory-bound kernels >= 85% of copy bandwidth; softmax >= 1.5x
Inductor; model geomean >= 1.0x Inductor; cold compile >= 3x faster than Inductor's; warm start
>= 5x faster than Inductor's warm start.

kilnd: --kilnd PATH, else $KILND, .bundle/kilnd, .bundle/kiln/kilnd, bazel-bin/server/kilnd; run in
place with fresh cache dirs on unix sockets; KILN_NVRTC_PATH is set for it from torch's nvidia
wheels when unset. Graphs that kiln ran eagerly (e.g. a target kilnd does not compile yet) are
flagged in every table: such figures are eager's, not kiln's. Exit status: 0, or 1 when a kiln
result did not match eager, 2 when the setup failed.
"""

import argparse
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_T_PROCESS = time.perf_counter()  # for the compile children: before torch is imported

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import gpu_models as gm  # noqa: E402

SECTIONS = ("a", "b", "c")

# Rough seconds per row on an H200 with Inductor (compiles dominate), for --time-budget: a row is
# skipped (and named at the end) when starting it could run past the budget, keeping the time the
# sections still to come need.
EST_A = 8
EST_B = {("resnet50", "training"): 150, ("resnet50", "inference"): 60, ("resnet18", "training"): 80,
         ("resnet18", "inference"): 35}
EST_C = {"block_train": 75, "resnet50_fp16": 170}


def section_estimate(args, section):
    f = 0.5 if args.skip_inductor else 1.0
    if section == "a":
        n = len([k for k in KERNEL_NAMES if not args.only or k in args.only])
        return f * EST_A * n
    if section == "b":
        return f * sum(EST_B.get((m, mode), 30) for m in gm.MODEL_NAMES if not args.only or m in args.only
                       for mode in ("inference", "training"))
    return f * sum(EST_C.get(w, 60) for w in COMPILE_WORKLOADS if not args.only or w in args.only)


def over_budget(args, estimate, section):
    """True when a row estimated at `estimate` s, plus what the later sections need, would end past
    --time-budget (0: no budget)."""
    if not args.time_budget:
        return False
    f = 0.5 if args.skip_inductor else 1.0
    later = args.sections_list[args.sections_list.index(section) + 1:]
    reserve = sum(section_estimate(args, s) for s in later)
    return time.time() - args.t_start + f * estimate + reserve > args.time_budget
COPY_BYTES = 1 << 30


def gx(x):
    return "n/a" if x is None or math.isnan(x) else f"{x:.2f}x"


def log(msg=""):
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------------
# (a) kernels
# --------------------------------------------------------------------------------------------------

# name -> (description, kind) ; kind "softmax" gets the 1.5x target too
KERNEL_NAMES = ["add_f32", "chain_bf16", "softmax_f32", "softmax_bf16", "softmax_f32_8k", "softmax_f32_32k",
                "softmax_bf16_50k", "softmax_f32_256k", "log_softmax_f32", "layer_norm_f32",
                "layer_norm_bf16", "rms_norm_f32", "rms_norm_bf16", "col_sum_f32", "transpose_add_f32",
                "full_sum_f32", "full_sum_bf16"]
# Softmax over long rows (rows x columns at scale 1), where a row no longer fits one block's
# registers: Inductor loops over such rows and reads them more than once. 50257: a GPT-2-sized
# vocabulary (odd length); 64 x 262144: few rows, each longer than one block should take.
LONG_SOFTMAX = {"softmax_f32_8k": (8192, 8192), "softmax_f32_32k": (2048, 32768),
                "softmax_bf16_50k": (4096, 50257), "softmax_f32_256k": (64, 262144)}


def kernel_spec(name, device, scale):
    """(fn, inputs, bytes moved, shape text, (rtol, atol)) for one kernel; sizes divided by `scale`."""
    import torch
    import torch.nn.functional as F

    f32, bf16 = torch.float32, torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype=f32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    N = (1 << 26) // scale  # 64M elements
    R = 65536 // scale  # rows of the 1024-wide row kernels
    S = 8192 // int(math.sqrt(scale))  # square side
    es = {f32: 4, bf16: 2}
    if name == "add_f32":
        def fn(a, b, c):
            return a * b + c
        ins = [rnd(N), rnd(N), rnd(N)]
        return fn, ins, 4 * N * 4, f"{N:,}", (1e-6, 1e-6)
    if name == "chain_bf16":
        def fn(a, b, c):
            return ((F.silu(a.float() * b.float()) + 1.0) * c.float()).to(torch.bfloat16)
        ins = [rnd(N, dtype=bf16), rnd(N, dtype=bf16), rnd(N, dtype=bf16)]
        return fn, ins, 4 * N * 2, f"{N:,}", (1e-2, 1e-2)
    if name.startswith("softmax"):
        dt = bf16 if "bf16" in name else f32
        rows, cols = LONG_SOFTMAX.get(name, (R * scale, 1024))
        rows = max(1, rows // scale)

        def fn(x):
            return torch.softmax(x, dim=-1)
        return fn, [rnd(rows, cols, dtype=dt)], 2 * rows * cols * es[dt], f"{rows}x{cols}", \
            ((1e-2, 1e-3) if dt == bf16 else (1e-5, 1e-6))
    if name == "log_softmax_f32":
        def fn(x):
            return torch.log_softmax(x, dim=-1)
        return fn, [rnd(S, S)], 2 * S * S * 4, f"{S}x{S}", (1e-5, 1e-5)
    if name.startswith("layer_norm"):
        dt = bf16 if name.endswith("bf16") else f32

        def fn(x, w, b):
            return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
        ins = [rnd(R, 1024, dtype=dt), rnd(1024, dtype=dt), rnd(1024, dtype=dt)]
        return fn, ins, (2 * R * 1024 + 2 * 1024) * es[dt], f"{R}x1024", \
            ((2e-2, 2e-2) if dt == bf16 else (1e-4, 1e-4))
    if name.startswith("rms_norm"):
        dt = bf16 if name.endswith("bf16") else f32
        if dt == f32:
            def fn(x, w):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        else:
            def fn(x, w):  # LLaMA's: statistics in fp32, scale in bf16
                xf = x.float()
                return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        ins = [rnd(R, 1024, dtype=dt), rnd(1024, dtype=dt)]
        return fn, ins, (2 * R * 1024 + 1024) * es[dt], f"{R}x1024", \
            ((2e-2, 2e-2) if dt == bf16 else (1e-4, 1e-4))
    if name == "col_sum_f32":
        def fn(x):
            return x.sum(0)
        return fn, [rnd(S, S)], (S * S + S) * 4, f"{S}x{S} -> {S}", (1e-4, 1e-2)
    if name.startswith("full_sum"):  # loss.sum() of a big tensor: one output, 64M inputs
        dt = bf16 if name.endswith("bf16") else f32

        def fn(x):
            return x.sum()
        return fn, [rnd(N, dtype=dt)], (N + 1) * es[dt], f"{N} -> 1", \
            ((2e-2, 1.0) if dt == bf16 else (1e-4, 1e-1))
    if name == "transpose_add_f32":
        def fn(a, b):
            return a.t() + b
        return fn, [rnd(S, S), rnd(S, S)], 3 * S * S * 4, f"{S}x{S}", (0.0, 0.0)
    raise ValueError(name)


def measure_copy(device, iters, scale):
    import torch

    n = COPY_BYTES // 4 // scale
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    med, best = gm.time_calls(lambda: dst.copy_(src), device, iters, warmup=5)
    return 2 * n * 4 / (med * 1e-3) / 1e12, 2 * n * 4


def section_a(args, address, problems):
    import torch

    log("## (a) Memory-bound kernels")
    log("")
    scale = args.scale
    copy_tbs, copy_bytes = measure_copy(args.device, args.iters_a, scale)
    log(f"Device-to-device copy (dst.copy_(src), {copy_bytes / 2**30:.2f} GiB moved): **{copy_tbs:.3g} TB/s** "
        f"(median of {args.iters_a}).")
    log("")
    names = [n for n in KERNEL_NAMES if not args.only or n in args.only]
    ratios_all = []
    rows = gm.StreamTable(["kernel", "shape", "MB moved", "eager ms", "Inductor ms", "kiln ms", "kiln TB/s",
                           "kiln % copy", "Inductor % copy", "kiln vs Inductor", "target", "target met",
                           "kiln graphs/eager/kernels", "max abs diff vs eager"])
    for name in names:
        t0 = time.time()
        if over_budget(args, EST_A, "a"):
            rows.append([name] + ["-"] * 12 + ["skipped: --time-budget"])
            args.skipped.append(f"(a) {name}")
            continue
        gm.reset_kiln()
        try:
            fn, ins, nbytes, shape, (rtol, atol) = kernel_spec(name, args.device, scale)
            with torch.no_grad():
                ref = fn(*ins)
                fk = gm.compile_kiln(fn, address, timeout=args.kiln_timeout)
                before = gm.compiled_graph_ids()
                with gm.capture_kiln_warnings() as w:
                    out_k = fk(*ins)
                    gm.sync(args.device)
                    facts = gm.kiln_facts(w.kiln, exclude=before)
                diff = (out_k.double() - ref.double()).abs().max().item()
                ok = torch.allclose(out_k.float(), ref.float(), rtol=rtol, atol=atol)
                if not ok:
                    problems.append(f"(a) {name}: kiln differs from eager (max abs diff {diff:.3g}, rtol {rtol}, atol {atol})")
                times = {"eager": gm.time_calls(lambda: fn(*ins), args.device, args.iters_a)[0]}
                if not args.skip_inductor:
                    fi = torch.compile(fn)
                    out_i = fi(*ins)
                    gm.sync(args.device)
                    times["inductor"] = gm.time_calls(lambda: fi(*ins), args.device, args.iters_a)[0]
                times["kiln"] = gm.time_calls(lambda: fk(*ins), args.device, args.iters_a)[0]
                facts_after = gm.kiln_facts()
            eager_ran = (facts_after["eager_calls"] or 0) > 0 or (facts["graph_fallbacks"] or 0) > 0
            tbs = nbytes / (times["kiln"] * 1e-3) / 1e12
            ind = times.get("inductor")
            ratio = ind / times["kiln"] if ind else None
            if ratio and not eager_ran:
                ratios_all.append(ratio)
            target = ">=85% copy" + (", >=1.5x Ind." if name.startswith("softmax") else "")
            met = tbs / copy_tbs >= 0.85 and (not name.startswith("softmax") or (ratio or 0) >= 1.5)
            if eager_ran:
                met_s = "n/a (eager)"
            elif args.device == "cpu":
                met_s = "n/a (CPU)"
            else:
                met_s = "met" if met else "**not met**"
            kiln_cell = gm.fmt_ms(times["kiln"]) + (" (EAGER)" if eager_ran else "")
            rows.append([name, shape, f"{nbytes / 1e6:.1f}", gm.fmt_ms(times["eager"]), gm.fmt_ms(ind), kiln_cell,
                         f"{tbs:.3g}", f"{100 * tbs / copy_tbs:.1f}%",
                         f"{100 * nbytes / (ind * 1e-3) / 1e12 / copy_tbs:.1f}%" if ind else "-",
                         f"**{ratio:.2f}x**" if ratio else "-", target, met_s,
                         f"{facts['graphs']}/{facts['graph_fallbacks']}/{facts.get('kernel_steps', '-')}",
                         f"{diff:.1e}" + ("" if ok else " MISMATCH")])
            if eager_ran:
                problems.append(f"(a) {name}: kiln ran it eagerly ({facts['fallbacks_by_cause'] or 'eager calls'}); "
                                f"the kiln column is eager's time")
                for line in gm.facts_details(facts, indent="")[:3]:
                    problems.append(f"(a) {name}: {line}")
        except Exception as e:
            rows.append([name] + ["-"] * 12 + [f"ERROR {type(e).__name__}"])
            problems.append(f"(a) {name}: {type(e).__name__}: {str(e)[:500]}")
        if args.verbose:
            print(f"[{time.time() - t0:.1f} s] {name}", file=sys.stderr, flush=True)
        del_cuda(args.device)
    log("")
    sm = [r for r in rows if r[0].startswith("softmax") and r[9] != "-"]
    log(f"Geomean kiln vs Inductor over these kernels (graphs kiln compiled): "
        f"{gx(gm.geomean(ratios_all))}; softmax rows: " + (", ".join(f"{r[0]} {r[9]}" for r in sm) or "-") +
        " (target >= 1.5x).")
    log("")


def del_cuda(device):
    import gc

    import torch

    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------
# (b) models
# --------------------------------------------------------------------------------------------------

BENCH_BATCH = {"resnet18": 32, "resnet50": 32}


def model_runner(case, mode, dtype, device, wrap):
    """A zero-argument step function and the model it trains/evaluates."""
    import contextlib

    import torch

    model = case.model
    if dtype == "bf16":
        ac = lambda: torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)  # noqa: E731
    else:
        ac = contextlib.nullcontext
    if mode == "inference":
        model.eval()
        model.requires_grad_(False)
        fn = wrap(model)

        def run():
            with torch.no_grad(), ac():
                return fn(*case.inputs)
        return run
    model.train()
    fn = wrap(gm.with_loss(model, case.loss_fn))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run():
        opt.zero_grad(set_to_none=True)
        with ac():
            loss = fn(*case.inputs)
        loss.backward()
        opt.step()
        return loss.detach()
    return run


def section_b(args, address, problems):
    import copy

    import torch

    log(f"## (b) Models: step time ({args.dtype}{' autocast' if args.dtype == 'bf16' else ''}; "
        f"median of {args.iters_b} steps after {args.warmup_b} warm-up)")
    log("")
    names = [n for n in gm.MODEL_NAMES if not args.only or n in args.only]
    ratios = []
    rows = gm.StreamTable(["model", "mode", "size", "eager ms", "Inductor ms", "kiln ms", "kiln vs Inductor",
                           "kiln vs eager", "Inductor 1st call s", "kiln 1st call s",
                           "kiln graphs/eager/kernels/op fallbacks", "kiln vs eager rel diff (1st)"])
    for name in names:
        for mode in ("inference", "training"):
            t0 = time.time()
            if over_budget(args, EST_B.get((name, mode), 30), "b"):
                rows.append([name, mode] + ["-"] * 9 + ["skipped: --time-budget"])
                args.skipped.append(f"(b) {name}/{mode}")
                continue
            gm.reset_kiln()
            batch = None if args.quick else BENCH_BATCH.get(name)
            label = f"{name}/{mode}"
            try:
                base = gm.make_case(name, args.quick, args.device, seed=0, batch=batch)
                backends = ["eager"] + ([] if args.skip_inductor else ["inductor"]) + ["kiln"]
                runs, first, firsts_out = {}, {}, {}
                facts = None
                for b in backends:
                    case = copy.deepcopy(base)
                    wrap = {"eager": lambda m: m, "inductor": torch.compile,
                            "kiln": lambda m: gm.compile_kiln(m, address, timeout=args.kiln_timeout)}[b]
                    run = model_runner(case, mode, args.dtype, args.device, wrap)
                    t1 = time.perf_counter()
                    if b == "kiln":
                        before = gm.compiled_graph_ids()
                        with gm.capture_kiln_warnings() as w:
                            out = run()
                            gm.sync(args.device)
                            facts = gm.kiln_facts(w.kiln, exclude=before)
                    else:
                        out = run()
                        gm.sync(args.device)
                    first[b] = time.perf_counter() - t1
                    firsts_out[b] = out.detach().float()
                    runs[b] = (run, case)
                times = {}
                for b in backends:
                    times[b] = gm.time_calls(runs[b][0], args.device, args.iters_b, warmup=args.warmup_b)[0]
                after = gm.kiln_facts()
                eager_ran = (after["eager_calls"] or 0) > 0 or (facts["graph_fallbacks"] or 0) > 0
                e, k = firsts_out["eager"], firsts_out["kiln"]
                rel = ((k.double() - e.double()).norm() / max(e.double().norm().item(), 1e-30)).item() \
                    if k.shape == e.shape else float("inf")
                ind = times.get("inductor")
                ratio = ind / times["kiln"] if ind else None
                if ratio and not eager_ran:
                    ratios.append(ratio)
                tol = 2e-2 if args.dtype == "bf16" else 1e-3
                flag = "" if rel <= tol else " (!)"
                if rel > tol:
                    problems.append(f"(b) {label}: kiln's first {'loss' if mode == 'training' else 'output'} "
                                    f"differs from eager's by rel {rel:.2e} (models_check.py is the real check)")
                if eager_ran:
                    problems.append(f"(b) {label}: {facts['graph_fallbacks']} graph(s) ran eagerly "
                                    f"({facts['fallbacks_by_cause']}); its kiln time is mostly eager's")
                rows.append([name, mode, gm.describe_size(name, args.quick, batch), gm.fmt_ms(times["eager"]),
                             gm.fmt_ms(ind), gm.fmt_ms(times["kiln"]) + (" (EAGER)" if eager_ran else ""),
                             f"**{ratio:.2f}x**" if ratio else "-", f"{times['eager'] / times['kiln']:.2f}x",
                             f"{first.get('inductor', float('nan')):.1f}" if ind else "-", f"{first['kiln']:.1f}",
                             f"{facts['graphs']}/{facts['graph_fallbacks']}/{facts.get('kernel_steps', '-')}"
                             f"/{facts['op_fallbacks']}", f"{rel:.1e}{flag}"])
                del runs, base
            except Exception as ex:
                rows.append([name, mode] + ["-"] * 9 + [f"ERROR {type(ex).__name__}"])
                problems.append(f"(b) {label}: {type(ex).__name__}: {str(ex)[:500]}")
            if args.verbose:
                print(f"[{time.time() - t0:.1f} s] {label}", file=sys.stderr, flush=True)
            gm.reset_kiln()
            del_cuda(args.device)
    log("")
    log(f"Geomean kiln vs Inductor (Inductor ms / kiln ms) over the rows kiln compiled: "
        f"**{gx(gm.geomean(ratios))}** over {len(ratios)} rows (target >= 1.0x).")
    log("")


# --------------------------------------------------------------------------------------------------
# (c) cold compile / warm start
# --------------------------------------------------------------------------------------------------

COMPILE_WORKLOADS = ["block_train", "resnet50_fp16"]


@functools.lru_cache(maxsize=None)
def _block_class():
    """block_train's module, a module-level class (kiln.compile's packages pickle it by name)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

        def forward(self, x):
            return torch.softmax(self.fc2(F.gelu(self.fc1(self.ln(x)))), dim=-1)

    Block.__qualname__ = "Block"
    globals()["Block"] = Block
    return Block


def build_compile_workload(name, device, quick):
    """(step function given a compile wrapper, description)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    if name == "block_train":
        tokens, d, h = (256, 256, 1024) if quick else (8192, 1024, 4096)
        model = _block_class()(d, h).to(device)
        x = torch.randn(tokens, d, device=device, requires_grad=True)
        grad = torch.randn(tokens, d, device=device)

        def make(wrap):
            fn = wrap(model)

            def step():
                out = fn(x)
                out.backward(grad)
                return out
            return step
        return make, f"LayerNorm + Linear {d}->{h} + GELU + Linear {h}->{d} + softmax, {tokens} tokens, fp32, forward + backward"
    if name == "resnet50_fp16":
        half = torch.float16
        batch, hw = (2, 64) if quick else (32, 224)
        model = gm.build_resnet(50).to(device=device, dtype=half).eval().requires_grad_(False)
        x = torch.randn(batch, 3, hw, hw, device=device, dtype=half)

        def make(wrap):
            fn = wrap(model)

            def step():
                with torch.no_grad():
                    return fn(x)
            return step
        return make, f"ResNet-50 fp16 (model.half()), eval, batch {batch}, {hw}x{hw}, inference"
    raise ValueError(name)


@functools.lru_cache(maxsize=None)
def _prime_class():
    import torch.nn as nn

    class Prime(nn.Module):  # unlike every workload: a GEMM, pointwise, a column reduction
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return (self.fc(x).sin() * 3).sum(0)

    Prime.__qualname__ = "Prime"  # module level, as _block_class's
    globals()["Prime"] = Prime
    return Prime


def prime(wrap, device, training):
    import torch

    torch.manual_seed(1)
    m = _prime_class()().to(device)
    x = torch.randn(5, 8, device=device, requires_grad=training)
    fn = wrap(m)
    if training:
        fn(x).sum().backward()
    else:
        with torch.no_grad():
            fn(x)


class _GcTimer:
    """Seconds the Python garbage collector ran inside the `with` block (gc.callbacks)."""

    def __init__(self):
        self.seconds, self._start = 0.0, None

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    def __enter__(self):
        import gc

        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        import gc

        gc.callbacks.remove(self._callback)


def compile_child(args):
    """One measurement in this fresh process; writes JSON to args.child_out."""
    t0 = _T_PROCESS
    import torch

    if args.backend.startswith("kiln"):
        gm.import_kiln()
        import kiln  # noqa: F401
    if args.device.startswith("cuda"):
        torch.cuda.init()
        torch.zeros(1, device=args.device)
        torch.cuda.synchronize()
    t_import = time.perf_counter() - t0
    make, desc = build_compile_workload(args.workload, args.device, args.quick)
    gm.sync(args.device)
    if args.backend == "kiln":
        wrap = lambda m: gm.compile_kiln(m, args.server, timeout=args.kiln_timeout)  # noqa: E731
    elif args.backend == "kiln.compile":
        def wrap(m):
            options = {"server": args.server, "timeout": args.kiln_timeout}
            options.update(gm.EXTRA_KILN_OPTIONS)
            return kiln.compile(m, options=options)
    else:
        wrap = torch.compile
    res = {"import_s": t_import, "desc": desc}
    # Prime: one small unrelated graph through the same backend first, so that one-time costs of the
    # process (the backend's modules and worker pools, Triton's driver stubs, kiln's runtime library
    # load) are reported apart ("prime s") instead of being charged to the workload.
    t1 = time.perf_counter()
    prime(wrap, args.device, training=args.workload.endswith("_train"))
    gm.sync(args.device)
    # A full garbage collection, part of the prime: the imports leave one owed (CPython collects
    # the oldest generation once enough objects survived since the last full pass), and it would
    # otherwise fall into whichever first call comes next, whatever that call allocates itself.
    import gc

    gc.collect()
    res["prime_s"] = time.perf_counter() - t1
    if args.backend.startswith("kiln"):
        import kiln

        kiln.reset_stats()
    try:
        from torch._dynamo.utils import counters

        counters.clear()
    except Exception:
        pass
    step = make(wrap)
    gc_time = _GcTimer()
    with gm.capture_kiln_warnings() as w:
        before = gm.dynamo_seconds()
        t1 = time.perf_counter()
        profiler = None
        if args.profile_first_call:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        with gc_time:
            step()
            gm.sync(args.device)
        res["first_s"] = time.perf_counter() - t1
        if profiler is not None:
            import io
            import pstats

            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
            res["profile"] = text.getvalue()
        res["gc_s"] = gc_time.seconds
        res["split"] = gm.split_seconds(before, gm.dynamo_seconds())
        times = []
        for _ in range(5):
            t2 = time.perf_counter()
            step()
            gm.sync(args.device)
            times.append(time.perf_counter() - t2)
        res["steady_s"] = statistics.median(times)
        if args.backend.startswith("kiln"):
            f = gm.kiln_facts(w.kiln)
            res["kiln"] = {k: f[k] for k in ("graphs", "compiles", "hits", "graph_fallbacks", "fallbacks_by_cause",
                                             "op_fallbacks", "kernel_steps", "server_time_s", "client_time_s",
                                             "eager_calls", "warnings")}
            res["kiln"]["packages"] = kiln.stats()["packages"]
            res["kiln"]["prewarm"] = kiln.stats()["prewarm"]
    try:
        from torch._dynamo.utils import counters

        res["inductor_counters"] = {k: v for k, v in dict(counters.get("inductor", {})).items()
                                    if "cache" in k}
        res["aot_counters"] = {k: v for k, v in dict(counters.get("aot_autograd", {})).items() if "cache" in k}
    except Exception:
        pass
    json.dump(res, open(args.child_out, "w"), default=str)


def inductor_env(cache_dir):
    env = dict(os.environ)
    for k in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        env.pop(k, None)
    env.update({
        "TORCHINDUCTOR_CACHE_DIR": cache_dir,  # Triton's cache goes under it when TRITON_CACHE_DIR is unset
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0", "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "0",
        "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0",
        "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO": "0",
    })
    return env


def run_child(args, backend, workload, env, server=None, label=""):
    out = os.path.join(args.tmp, f"c-{backend}-{workload}-{label}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--compile-child", "--backend", backend, "--workload", workload,
           "--device", args.device, "--child-out", out, "--kiln-timeout", str(args.kiln_timeout)]
    if server:
        cmd += ["--server", server]
    cmd += [f"--kiln-option={o}" for o in args.kiln_option]
    if args.quick:
        cmd.append("--quick")
    if args.profile_first_call:
        cmd.append("--profile-first-call")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.child_timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.child_timeout:g} s"}
    if p.returncode != 0 or not os.path.exists(out):
        return {"error": f"exit {p.returncode}: {(p.stderr or '')[-1500:]}"}
    r = json.load(open(out))
    r["wall_s"] = time.time() - t0
    if args.verbose:
        print(f"[{r['wall_s']:.1f} s] {label} {backend} {workload}: first call {r['first_s']:.2f} s",
              file=sys.stderr, flush=True)
    return r


def run_warm(args, backend, workload, env, server=None):
    """--warm-repeats new processes on the same caches: the one with the median first call, with
    every process's first call in "first_all"."""
    runs = [run_child(args, backend, workload, env, server=server, label=f"warm{i}")
            for i in range(max(1, args.warm_repeats))]
    ok = sorted((r for r in runs if "error" not in r), key=lambda r: r["first_s"])
    if not ok:
        return runs[0]
    chosen = dict(ok[(len(ok) - 1) // 2])
    chosen["first_all"] = [r["first_s"] for r in ok]
    return chosen


def section_c(args, kilnd_binary, problems):
    log("## (c) Cold compile and warm start (new processes)")
    log("")
    log("First call = start of the first call to its result ready (synchronized); the model is built and "
        "on the device before. import = `import torch` (+ kiln) + CUDA context, before the first call, not "
        "included. prime = a small unrelated graph run through the same backend first in each process "
        "(one-time process costs: the backend's modules and worker pools, Triton's driver stubs, kiln's "
        "runtime library load), not included. compile = first call - steady call. Inductor cold: empty TORCHINDUCTOR_CACHE_DIR "
        "(remote caches off); warm: new process, same dir. kiln cold: new kilnd, empty --cache_dir; warm: "
        "new process, same kilnd (memory tier); warm (disk): kilnd restarted on the same cache dir. "
        "Warm first call split: torch's compile-time records (Dynamo's frame compile without the backend / "
        "the backend call: AOTAutograd and the compiler or cache behind it; the backward's compile at the "
        "first backward is in neither). kiln.compile (experimental, kiln.packages): the workload wrapped in "
        "kiln.compile(model) instead of torch.compile; cold: new kilnd, empty cache (capture, compile, store the "
        "package); warm: new process, same kilnd (the package and the plans are memory hits: no Dynamo trace); "
        "disk: kilnd restarted. package load = GetPackage, unpickling, guard building. Garbage collector = "
        "time Python's gc ran inside the warm first call (gc.callbacks), part of the first call's time; the "
        "prime ends with a full collection (gc.collect()), so a pass owed by the imports is not charged to "
        "the first call.")
    log("")
    client_cache = os.environ["KILN_CACHE_DIR"]
    try:
        import kiln.runtime

        t0 = time.time()
        kiln.runtime.build(client_cache)
        log(f"kiln client runtime library built beforehand in {time.time() - t0:.1f} s (one-time per machine "
            "and kiln version; not charged below).")
    except Exception as e:
        log(f"(could not pre-build the kiln client runtime library: {type(e).__name__}: {str(e)[:200]}; "
            "its build is then inside kiln's cold figure)")
    log("")
    names = [n for n in COMPILE_WORKLOADS if not args.only or n in args.only]
    cold_x, warm_x, pkg_x, descs, profiles = [], [], [], [], []
    rows = gm.StreamTable(["workload", "Inductor cold s", "kiln cold s", "kiln faster (cold)", "Inductor warm s",
                           "kiln warm s", "kiln faster (warm)", "kiln warm (disk) s", "compile s Ind./kiln (cold)",
                           "steady ms Ind./kiln", "import s", "prime s Ind./kiln (cold)",
                           "kiln graphs cold; warm; disk (c=compiled h=hit e=eager)",
                           "Inductor FX cache cold; warm (h=hit m=miss)", "kilnd phases, cold (s)",
                           "warm first call: Dynamo trace / backend s, Ind.; kiln",
                           "kiln.compile cold s", "kiln.compile warm s", "kiln.compile faster (warm)",
                           "kiln.compile warm (disk) s", "kiln.compile packages cold; warm; disk (l=loaded c=captured w=convolutions prewarmed, kiln.prewarm)",
                           "kiln.compile warm: package load s",
                           "warm first call: garbage collector s, Ind. / kiln / kiln.compile"])
    for wl in names:
        if over_budget(args, EST_C.get(wl, 60), "c"):
            rows.append([wl] + ["-"] * 21 + ["skipped: --time-budget"])
            args.skipped.append(f"(c) {wl}")
            continue
        res = {}
        if not args.skip_inductor:
            ind_dir = tempfile.mkdtemp(prefix=f"ind-{wl}-", dir=args.tmp)
            env = inductor_env(ind_dir)
            res["ind_cold"] = run_child(args, "inductor", wl, env, label="cold")
            res["ind_warm"] = run_warm(args, "inductor", wl, env)
        kdir = tempfile.mkdtemp(prefix=f"kc-{wl}-", dir=args.tmp)
        kcache = os.path.join(kdir, "cache")
        kenv = dict(os.environ)
        kenv.pop("KILN_SERVER", None)
        # With --kiln-option aot_cache=1, AOTAutograd's cache keeps kiln's graphs: a fresh dir
        # shared by this workload's kiln processes only, so that "cold" is cold.
        kenv["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(kdir, "torch")
        kd = None
        try:
            if not args.kiln_compile_only:
                kd = gm.Kilnd(kilnd_binary, kdir, cache_dir=kcache, flags=args.kilnd_flag)
                res["kiln_cold"] = run_child(args, "kiln", wl, kenv, server=kd.address, label="cold")
                res["kiln_warm"] = run_warm(args, "kiln", wl, kenv, server=kd.address)
                kd.stop()
                kd = gm.Kilnd(kilnd_binary, kdir, cache_dir=kcache, flags=args.kilnd_flag)
                res["kiln_disk"] = run_child(args, "kiln", wl, kenv, server=kd.address, label="disk")
                kd.stop()
                kd = None
            if not args.no_kiln_compile:  # kiln.compile: its own kilnd, cache and torch cache dir
                pdir = tempfile.mkdtemp(prefix=f"kp-{wl}-", dir=args.tmp)
                pcache = os.path.join(pdir, "cache")
                penv = dict(kenv, TORCHINDUCTOR_CACHE_DIR=os.path.join(pdir, "torch"))
                kd = gm.Kilnd(kilnd_binary, pdir, cache_dir=pcache, flags=args.kilnd_flag)
                res["pkg_cold"] = run_child(args, "kiln.compile", wl, penv, server=kd.address, label="cold")
                res["pkg_warm"] = run_warm(args, "kiln.compile", wl, penv, server=kd.address)
                kd.stop()
                kd = None
                if not args.kiln_compile_only:
                    kd = gm.Kilnd(kilnd_binary, pdir, cache_dir=pcache, flags=args.kilnd_flag)
                    res["pkg_disk"] = run_child(args, "kiln.compile", wl, penv, server=kd.address, label="disk")
        except Exception as e:
            problems.append(f"(c) {wl}: kilnd: {type(e).__name__}: {str(e)[:500]}")
        finally:
            if kd is not None:
                kd.stop()
        for k, v in res.items():
            if "error" in v:
                problems.append(f"(c) {wl} {k}: {v['error']}")
            elif k in ("ind_warm", "kiln_warm", "pkg_warm") and v.get("profile"):
                profiles.append((f"{wl}: {k}", v["profile"]))
        ok = {k: v for k, v in res.items() if "error" not in v}
        descs.append(f"{wl}: " + next((v["desc"] for v in ok.values()), "?"))

        def f(key, field="first_s"):
            return ok[key][field] if key in ok else None

        def kinfo(key):
            if key not in ok or "kiln" not in ok[key]:
                return "-"
            k = ok[key]["kiln"]
            s = f"{k['compiles']}c/{k['hits']}h/{k['graph_fallbacks']}e"
            if k["graph_fallbacks"]:
                s += f" ({','.join(sorted(k['fallbacks_by_cause']))})"
            return s

        def icache(key):
            if key not in ok:
                return "-"
            c = ok[key].get("inductor_counters", {})
            hit, miss = c.get("fxgraph_cache_hit", 0), c.get("fxgraph_cache_miss", 0)
            return f"{hit}h/{miss}m"

        def pinfo(key):  # kiln.compile's packages: l=loaded from kilnd, c=captured, w=convolutions prewarmed
            if key not in ok or "kiln" not in ok[key]:
                return "-"
            p = ok[key]["kiln"].get("packages") or {}
            w = (ok[key]["kiln"].get("prewarm") or {}).get("calls", 0)
            return (f"{p.get('loaded', 0)}l/{p.get('captured', 0)}c" + (f"/{w}w" if w else "")
                    + (f"/{p['errors']}err" if p.get("errors") else ""))

        kiln_eager = any(ok[k]["kiln"]["graph_fallbacks"] for k in ("kiln_cold", "kiln_warm", "kiln_disk")
                         if k in ok and "kiln" in ok[k])
        pkg_eager = any(ok[k]["kiln"]["graph_fallbacks"] for k in ("pkg_cold", "pkg_warm", "pkg_disk")
                        if k in ok and "kiln" in ok[k])
        pkg_fallback = [w for k in ("pkg_cold", "pkg_warm") if k in ok and "kiln" in ok[k]
                        for w in ok[k]["kiln"]["warnings"] if "kiln.compile" in w]
        px = f("ind_warm") / f("pkg_warm") if f("ind_warm") and f("pkg_warm") else None
        if px and not pkg_eager and not pkg_fallback:
            pkg_x.append(px)
        elif "pkg_warm" in ok:
            problems.append(f"(c) {wl}: kiln.compile ran graphs eagerly or fell back: "
                            f"{'; '.join(pkg_fallback)[:300] or 'eager graphs'}")
        cx = f("ind_cold") / f("kiln_cold") if f("ind_cold") and f("kiln_cold") else None
        wx = f("ind_warm") / f("kiln_warm") if f("ind_warm") and f("kiln_warm") else None
        if not kiln_eager:
            if cx:
                cold_x.append(cx)
            if wx:
                warm_x.append(wx)
        else:
            problems.append(f"(c) {wl}: kiln ran graphs eagerly, so its 'compile' figures are not compiles")

        def sec(x):
            return f"{x:.2f}" if x is not None else "-"

        def wsec(key):  # a warm row: the median process, and the range over --warm-repeats processes
            runs = ok.get(key, {}).get("first_all") or []
            if len(runs) < 2:
                return sec(f(key))
            return f"{sec(f(key))} ({sec(min(runs))}-{sec(max(runs))}, {len(runs)} runs)"

        def split(key):  # where a first call's time went (gm.split_seconds), the rest is running it
            sp = ok.get(key, {}).get("split") or {}
            return f"{sec(sp['trace_s'])} / {sec(sp['backend_s'])}" if sp else "-"

        def tgt(x, t):
            if x is None:
                return "-"
            if kiln_eager:
                return f"{x:.1f}x (kiln EAGER)"
            return f"**{x:.1f}x** ({'met' if x >= t else 'not met'}; >= {t}x)"

        imports = [ok[k]["import_s"] for k in ok]
        steady = (f"{gm.fmt_ms(f('ind_warm', 'steady_s') * 1e3) if f('ind_warm', 'steady_s') else '-'} / "
                  f"{gm.fmt_ms(f('kiln_warm', 'steady_s') * 1e3) if f('kiln_warm', 'steady_s') else '-'}")
        comp = (f"{sec(f('ind_cold') - f('ind_cold', 'steady_s')) if f('ind_cold') else '-'} / "
                f"{sec(f('kiln_cold') - f('kiln_cold', 'steady_s')) if f('kiln_cold') else '-'}")
        server = "-"
        if "kiln_cold" in ok and "kiln" in ok["kiln_cold"]:
            st = ok["kiln_cold"]["kiln"]["server_time_s"]
            server = ", ".join(f"{p} {v:.2f}" for p, v in st.items() if v >= 0.005) or "-"
        rows.append([wl, sec(f("ind_cold")), sec(f("kiln_cold")), tgt(cx, 3), wsec("ind_warm"), wsec("kiln_warm"),
                     tgt(wx, 5), sec(f("kiln_disk")), comp, steady,
                     f"{min(imports):.1f}-{max(imports):.1f}" if imports else "-",
                     f"{sec(f('ind_cold', 'prime_s'))} / {sec(f('kiln_cold', 'prime_s'))}",
                     f"{kinfo('kiln_cold')}; {kinfo('kiln_warm')}; {kinfo('kiln_disk')}",
                     f"{icache('ind_cold')}; {icache('ind_warm')}", server,
                     f"{split('ind_warm')}; {split('kiln_warm')}",
                     sec(f("pkg_cold")), wsec("pkg_warm"), tgt(px, 5) if not pkg_fallback else "fell back",
                     sec(f("pkg_disk")), f"{pinfo('pkg_cold')}; {pinfo('pkg_warm')}; {pinfo('pkg_disk')}",
                     sec(ok.get("pkg_warm", {}).get("kiln", {}).get("client_time_s", {}).get("package_load")),
                     f"{sec(f('ind_warm', 'gc_s'))} / {sec(f('kiln_warm', 'gc_s'))} / {sec(f('pkg_warm', 'gc_s'))}"])
        for k in ("kiln_cold",):
            if k in ok and ok[k].get("kiln", {}).get("warnings"):
                for wmsg in dict.fromkeys(ok[k]["kiln"]["warnings"]):
                    problems.append(f"(c) {wl} {k} warning: {wmsg[:300]}")
    if profiles:
        log("")
        log("First-call profiles (--profile-first-call; cProfile, top 40 by cumulative time):")
        for title, text in profiles:
            log("")
            log(f"#### {title}")
            log("")
            log("```")
            log(text.rstrip())
            log("```")
    log("")
    for d in descs:
        log(f"- {d}")
    log("")
    log(f"Geomean kiln cold-compile speedup over Inductor: **{gx(gm.geomean(cold_x))}** (target >= 3x); "
        f"warm start: torch.compile(backend=\"kiln\") **{gx(gm.geomean(warm_x))}**, kiln.compile (the Dynamo "
        f"capture kept in kilnd) **{gx(gm.geomean(pkg_x))}** (target >= 5x)" +
        ("" if cold_x or warm_x else " (no comparable rows)"))
    log("")


# --------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Sections"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="a,b,c", help="comma-separated: a (kernels), b (models), c (compile times)")
    ap.add_argument("--only", default="", help="comma-separated names across sections: kernels " +
                    ", ".join(KERNEL_NAMES) + "; models " + ", ".join(gm.MODEL_NAMES) + "; compile workloads " +
                    ", ".join(COMPILE_WORKLOADS) + " (a section with none of its names selected runs all of them)")
    ap.add_argument("--quick", action="store_true", help="small sizes and few iterations (smoke runs)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test: figures mean nothing)")
    ap.add_argument("--skip-inductor", action="store_true", help="no Inductor columns (faster smoke runs)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="section b: bf16 autocast (default) or fp32")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations (default: a 50, b 20; --quick 10, 5)")
    ap.add_argument("--kilnd", default=None, help="kilnd binary (default: $KILND, .bundle/kilnd, .bundle/kiln/kilnd, "
                    "bazel-bin/server/kilnd)")
    ap.add_argument("--kilnd-flag", action="append", default=[], help="extra kilnd flag (repeatable)")
    ap.add_argument("--kiln-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra torch.compile(backend='kiln') option (repeatable), e.g. cuda_graphs=1")
    ap.add_argument("--no-kiln-compile", action="store_true", help="section c: skip the kiln.compile rows")
    ap.add_argument("--kiln-compile-only", action="store_true",
                    help="section c: of kiln's rows only kiln.compile cold and warm (no backend=\"kiln\" rows, "
                         "no restart of kilnd)")
    ap.add_argument("--warm-repeats", type=int, default=1, metavar="N",
                    help="section c: N new processes for each warm row (Inductor, kiln, kiln.compile); the "
                         "table shows the median first call, the warm-start figures list all (default 1)")
    ap.add_argument("--profile-first-call", action="store_true",
                    help="section c: cProfile each process's first call (its figures then include the "
                         "profiler's overhead) and print the warm ones' top 40 functions by cumulative time")
    ap.add_argument("--kiln-timeout", type=float, default=300.0, help="kiln's per-Compile timeout (s)")
    ap.add_argument("--child-timeout", type=float, default=300.0, help="section c: per process limit (s)")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (default 540 on "
                    "cuda, none on cpu; 0: none): rows that could run past it are skipped and listed")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    # compile children
    ap.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    args = ap.parse_args()

    try:
        gm.EXTRA_KILN_OPTIONS.update(gm.parse_kiln_options(args.kiln_option))
    except ValueError as e:
        ap.error(str(e))
    if args.compile_child:
        compile_child(args)
        return 0

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    for s in sections:
        if s not in SECTIONS:
            ap.error(f"unknown section {s!r}; use a, b, c")
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    known = set(KERNEL_NAMES) | set(gm.MODEL_NAMES) | set(COMPILE_WORKLOADS)
    for n in only:
        if n not in known:
            ap.error(f"unknown name {n!r} for --only")
    # --only applies per section; a section with none of its names selected runs them all,
    # unless --only named something: then sections without a match are skipped.
    per_section = {"a": set(KERNEL_NAMES), "b": set(gm.MODEL_NAMES), "c": set(COMPILE_WORKLOADS)}
    if only:
        sections = [s for s in sections if per_section[s] & set(only)]
    args.only = set(only)
    args.iters_a = args.iters or (10 if args.quick else 50)
    args.iters_b = args.iters or (5 if args.quick else 20)
    args.warmup_b = 2 if args.quick else 3
    args.scale = 64 if args.quick else 1

    import torch

    kiln, kiln_from = gm.import_kiln()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_gpu: --device cuda but CUDA is not available (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    t_start = time.time()
    args.t_start = t_start
    args.sections_list = sections
    args.skipped = []
    if args.time_budget is None:
        args.time_budget = 540.0 if args.device.startswith("cuda") else 0.0
    tmp = tempfile.mkdtemp(prefix="kiln-bench-")
    args.tmp = tmp
    os.environ["KILN_CACHE_DIR"] = os.path.join(tmp, "client-cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor-main")  # fresh for a and b
    os.environ.pop("KILN_SERVER", None)
    problems = []
    kilnd = None
    try:
        try:
            binary = gm.find_kilnd(args.kilnd)
        except FileNotFoundError as e:
            print(f"bench_gpu: {e}", file=sys.stderr)
            return 2
        if any(s in sections for s in ("a", "b")):
            try:
                kilnd = gm.Kilnd(binary, tmp, flags=args.kilnd_flag, log_level="warn")
            except Exception as e:
                print(f"bench_gpu: cannot start kilnd: {e}", file=sys.stderr)
                return 2
        import datetime

        log(f"# kiln GPU benchmark: kiln vs eager vs Inductor — "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
        log("")
        log(f"- command: `{' '.join([os.path.basename(sys.executable), os.path.relpath(os.path.abspath(__file__), REPO)] + sys.argv[1:])}`")
        log(f"- device {args.device}: {gm.device_description(args.device)}")
        _, note = gm.kiln_backend_handle()
        kv = kilnd.version() if kilnd else subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
        nv = kilnd.nvrtc if kilnd else gm.find_nvrtc()
        log(f"- kiln client {kiln.__version__} from {kiln_from} ({note}); {kv} at {binary}; NVRTC for kilnd: "
            f"{nv or 'kilnd default search'}" + (f"; kiln options {gm.EXTRA_KILN_OPTIONS}" if gm.EXTRA_KILN_OPTIONS else ""))
        log(f"- ResNets: {gm.resnet_source()}; sizes: {'--quick' if args.quick else 'full'}")
        if args.device.startswith("cuda"):
            log(f"- timing: CUDA events around each call, enqueued back to back; median of {args.iters_a} (a) / "
                f"{args.iters_b} (b) calls after warm-up; torch defaults for TF32 (matmul "
                f"{torch.backends.cuda.matmul.allow_tf32}, cuDNN {torch.backends.cudnn.allow_tf32})")
        else:
            log(f"- timing: time.perf_counter per call, median of {args.iters_a} (a) / {args.iters_b} (b). "
                "**CPU smoke run: bandwidths, % of copy and ratios mean nothing for the GPU targets.**")
        log("- targets: memory-bound >= 85% of copy; softmax >= 1.5x Inductor; model geomean >= 1.0x Inductor; "
            "cold compile >= 3x faster than Inductor; warm start >= 5x faster than Inductor's warm start")
        if args.skip_inductor:
            log("- --skip-inductor: no Inductor figures, no ratios")
        if args.time_budget:
            log(f"- time budget {args.time_budget:g} s: rows that could run past it are skipped and listed at the end")
        log("")
        for s in sections:
            t0 = time.time()
            try:
                if s == "a":
                    section_a(args, kilnd.address, problems)
                elif s == "b":
                    section_b(args, kilnd.address, problems)
                else:
                    section_c(args, binary, problems)
            except Exception as e:
                import traceback

                problems.append(f"section {s} failed: {type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}")
            log(f"(section {s}: {time.time() - t0:.0f} s)")
            log("")
        if kilnd is not None and not kilnd.alive():
            problems.append(f"kilnd died during the run (status {kilnd.proc.returncode}):\n{kilnd.log_tail()}")
        if args.skipped:
            problems.append(f"skipped to stay within --time-budget={args.time_budget:g} s: {', '.join(args.skipped)}; "
                            "run them with --sections/--only in another command")
        if problems:
            log("## Problems")
            log("")
            for p in problems:
                log(f"- {p}")
            log("")
        log(f"Total {time.time() - t_start:.0f} s.")
        return 1 if any("differs" in p or "MISMATCH" in p for p in problems) else 0
    finally:
        if kilnd is not None:
            kilnd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
