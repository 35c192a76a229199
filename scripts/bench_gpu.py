#!/usr/bin/env python3
"""kiln vs eager vs Inductor on a GPU, in one run: kernels, models, compile times.

    python3 scripts/bench_gpu.py [--sections a,b,c] [--only NAME[,NAME]] [--quick]
                                 [--device cuda|cpu] [--skip-inductor] [--kiln-first] [--kilnd PATH]

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
     GPT block (matmul attention and SDPA), ResNet-18, ResNet-50, BERT layer, Llama block; inference (eval,
     no_grad) and training (forward + loss + backward + SGD step); bf16 autocast by default
     (--dtype fp32 for fp32); eager, Inductor, kiln; geomean of Inductor time / kiln time.
     --graphs compares the CUDA-graph modes instead: Inductor's mode="reduce-overhead" against
     kiln's option cuda_graphs (eager stays plain).
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
time.perf_counter per call. Section b times its three backends in 5 rounds that take turns (the
order reversed every other round), so that a change in the host's load during a row reaches all
three. On --device cpu every figure is a smoke-test figure only (bandwidths
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
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

_T_PROCESS = time.perf_counter()  # for the compile children: before torch is imported

from bench_common import REPO, gx, log  # noqa: E402  (scripts/ is sys.path[0])
from bench_compile import COMPILE_WORKLOADS, compile_child, compile_estimate, section_c  # noqa: E402

sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import gpu_models as gm  # noqa: E402

SECTIONS = ("a", "b", "c")

# Rough seconds per row on an H200 with Inductor (compiles dominate), for --time-budget: a row is
# skipped (and named at the end) when starting it could run past the budget, keeping the time the
# sections still to come need.
# (Session 9, quiet host: section a 2.5 s a kernel; section b's two ResNet-50 rows 61 s together.
# A busy host takes up to twice as long.)
EST_A = 5
EST_B = {("resnet50", "training"): 80, ("resnet50", "inference"): 45, ("resnet18", "training"): 50,
         ("resnet18", "inference"): 30}


def section_estimate(args, section):
    """Seconds the rows of `section` that this command runs should take (section c counts its
    processes itself, --skip-inductor included)."""
    f = 0.5 if args.skip_inductor else 1.0
    if section == "a":
        n = len([k for k in KERNEL_NAMES if not args.only or k in args.only])
        return f * EST_A * n
    if section == "b":
        return f * sum(EST_B.get((m, mode), 30) for m in gm.MODEL_NAMES if not args.only or m in args.only
                       for mode in ("inference", "training"))
    return sum(compile_estimate(args, w) for w in COMPILE_WORKLOADS if not args.only or w in args.only)


def over_budget(args, estimate, section):
    """True when a row estimated at `estimate` s (sections a and b: with Inductor; section c: as
    compile_estimate counts), plus what the later sections need, would end past --time-budget (0:
    no budget)."""
    if not args.time_budget:
        return False
    f = 0.5 if args.skip_inductor and section != "c" else 1.0
    later = args.sections_list[args.sections_list.index(section) + 1:]
    reserve = sum(section_estimate(args, s) for s in later)
    return time.time() - args.t_start + f * estimate + reserve > args.time_budget


COPY_BYTES = 1 << 30
GPU_TIME_CALLS = 20  # calls profiled for the GPU's own time per call (section a)


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
    log("% copy: bytes moved per call time (CUDA events around each call, the median; the host's time "
        "per call shows when the host is slower than the GPU). % copy (GPU time): per the GPU's own busy "
        f"time per call (torch.profiler over {GPU_TIME_CALLS} calls: kernels, copies, memsets), the kernels' "
        "bandwidth; the >= 85% target is judged on it, softmax's >= 1.5x Inductor on call times.")
    log("")
    names = [n for n in KERNEL_NAMES if not args.only or n in args.only]
    ratios_all = []
    rows = gm.StreamTable(["kernel", "shape", "MB moved", "eager ms", "Inductor ms", "kiln ms", "kiln TB/s",
                           "kiln % copy", "Inductor % copy", "kiln % copy (GPU time)",
                           "Inductor % copy (GPU time)", "kiln vs Inductor", "target", "target met",
                           "kiln graphs/eager/kernels", "max abs diff vs eager"])
    for name in names:
        t0 = time.time()
        if over_budget(args, EST_A, "a"):
            rows.append([name] + ["-"] * 14 + ["skipped: --time-budget"])
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
                # The GPU's own time per call (its kernels, from torch.profiler): the kernels'
                # bandwidth, apart from the host's time per call, which the call time above includes
                # whenever the host is slower than the GPU.
                gpu = {}
                if args.device != "cpu":
                    gpu["kiln"] = gm.kernel_table(lambda: fk(*ins), GPU_TIME_CALLS)[1] * 1e-3
                    if "inductor" in times:
                        gpu["inductor"] = gm.kernel_table(lambda: fi(*ins), GPU_TIME_CALLS)[1] * 1e-3
                facts_after = gm.kiln_facts()
            eager_ran = (facts_after["eager_calls"] or 0) > 0 or (facts["graph_fallbacks"] or 0) > 0
            tbs = nbytes / (times["kiln"] * 1e-3) / 1e12
            ind = times.get("inductor")
            ratio = ind / times["kiln"] if ind else None
            if ratio and not eager_ran:
                ratios_all.append(ratio)

            def gpu_pct(backend):  # bandwidth over the GPU's own time per call, % of copy
                ms = gpu.get(backend)
                return f"{100 * nbytes / (ms * 1e-3) / 1e12 / copy_tbs:.1f}%" if ms else "-"
            # The bandwidth target is the kernels' (GPU time); softmax's 1.5x is on call times.
            kernel_tbs = nbytes / (gpu["kiln"] * 1e-3) / 1e12 if gpu.get("kiln") else tbs
            target = ">=85% copy" + (", >=1.5x Ind." if name.startswith("softmax") else "")
            met = kernel_tbs / copy_tbs >= 0.85 and (not name.startswith("softmax") or (ratio or 0) >= 1.5)
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
                         gpu_pct("kiln"), gpu_pct("inductor"),
                         f"**{ratio:.2f}x**" if ratio else "-", target, met_s,
                         f"{facts['graphs']}/{facts['graph_fallbacks']}/{facts.get('kernel_steps', '-')}",
                         f"{diff:.1e}" + ("" if ok else " MISMATCH")])
            if eager_ran:
                problems.append(f"(a) {name}: kiln ran it eagerly ({facts['fallbacks_by_cause'] or 'eager calls'}); "
                                f"the kiln column is eager's time")
                for line in gm.facts_details(facts, indent="")[:3]:
                    problems.append(f"(a) {name}: {line}")
        except Exception as e:
            rows.append([name] + ["-"] * 14 + [f"ERROR {type(e).__name__}"])
            problems.append(f"(a) {name}: {type(e).__name__}: {str(e)[:500]}")
        if args.verbose:
            print(f"[{time.time() - t0:.1f} s] {name}", file=sys.stderr, flush=True)
        del_cuda(args.device)
    log("")
    sm = [r for r in rows if r[0].startswith("softmax") and r[11] != "-"]
    log(f"Geomean kiln vs Inductor over these kernels (graphs kiln compiled): "
        f"{gx(gm.geomean(ratios_all))}; softmax rows: " + (", ".join(f"{r[0]} {r[11]}" for r in sm) or "-") +
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

    graphs = args.graphs
    pad = ["-"] if graphs else []  # the CUDA-graph column of a row without figures
    log(f"## (b) Models: step time ({args.dtype}{' autocast' if args.dtype == 'bf16' else ''}; "
        f"median of {args.iters_b} steps after {args.warmup_b} warm-up, in {args.rounds_b} rounds that "
        f"alternate the backends)" + ("; CUDA-graph modes: Inductor mode=\"reduce-overhead\", kiln "
                                      "cuda_graphs=1" if graphs else ""))
    log("")
    names = [n for n in gm.MODEL_NAMES if not args.only or n in args.only]
    ratios = []
    rows = gm.StreamTable(["model", "mode", "size", "eager ms", "Inductor ms", "kiln ms", "kiln vs Inductor",
                           "kiln vs eager", "Inductor 1st call s", "kiln 1st call s",
                           "kiln graphs/eager/kernels/op fallbacks", "kiln vs eager rel diff (1st)"]
                          + (["kiln CUDA graphs captured/replays/busy"] if graphs else []))
    for name in names:
        for mode in ("inference", "training"):
            t0 = time.time()
            if over_budget(args, EST_B.get((name, mode), 30), "b"):
                rows.append([name, mode] + ["-"] * 9 + ["skipped: --time-budget"] + pad)
                args.skipped.append(f"(b) {name}/{mode}")
                continue
            gm.reset_kiln()
            batch = None if args.quick else BENCH_BATCH.get(name)
            label = f"{name}/{mode}"
            try:
                base = gm.make_case(name, args.quick, args.device, seed=0, batch=batch)
                backends = ["eager"] + ([] if args.skip_inductor else ["inductor"]) + ["kiln"]
                if args.kiln_first:
                    backends = ["eager", "kiln"] + ([] if args.skip_inductor else ["inductor"])
                runs, first, firsts_out = {}, {}, {}
                facts = None
                for b in backends:
                    case = copy.deepcopy(base)
                    kiln_extra = {"cuda_graphs": True} if graphs else None
                    wrap = {"eager": lambda m: m,
                            "inductor": (lambda m: torch.compile(m, mode="reduce-overhead")) if graphs
                            else torch.compile,
                            "kiln": lambda m: gm.compile_kiln(m, address, timeout=args.kiln_timeout,
                                                              extra=kiln_extra)}[b]
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
                    firsts_out[b] = out.detach().float().clone()  # a CUDA graph's output is overwritten
                    runs[b] = (run, case)
                times = gm.interleaved_medians({b: runs[b][0] for b in backends}, args.device, args.iters_b,
                                               args.rounds_b, warmup=args.warmup_b)
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
                             f"/{facts['op_fallbacks']}", f"{rel:.1e}{flag}"]
                            + ([f"{after['cuda_graph_captures']}/{after['cuda_graph_replays']}/"
                                f"{after.get('cuda_graph_busy') or 0}"] if graphs else []))
                del runs, base
            except Exception as ex:
                rows.append([name, mode] + ["-"] * 9 + [f"ERROR {type(ex).__name__}"] + pad)
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
    ap.add_argument("--kiln-first", action="store_true",
                    help="section b: compile kiln before Inductor (default: Inductor first), to see whether "
                         "the order in which one process compiles the backends moves a row's figures")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="section b: bf16 autocast (default) or fp32")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations (default: a 50, b 20; --quick 10, 5)")
    ap.add_argument("--kilnd", default=None, help="kilnd binary (default: $KILND, .bundle/kilnd, .bundle/kiln/kilnd, "
                    "bazel-bin/server/kilnd)")
    ap.add_argument("--kilnd-flag", action="append", default=[], help="extra kilnd flag (repeatable)")
    ap.add_argument("--kiln-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra torch.compile(backend='kiln') option (repeatable), e.g. cuda_graphs=1")
    ap.add_argument("--graphs", action="store_true",
                    help="section b: CUDA-graph modes, Inductor mode=\"reduce-overhead\" against kiln option "
                         "cuda_graphs=1 (eager stays plain)")
    ap.add_argument("--no-kiln-compile", action="store_true", help="section c: skip the kiln.compile rows")
    ap.add_argument("--kiln-compile-only", action="store_true",
                    help="section c: of kiln's rows only kiln.compile cold and warm (no backend=\"kiln\" rows, "
                         "no restart of kilnd)")
    ap.add_argument("--warm-repeats", type=int, default=1, metavar="N",
                    help="section c: N new processes for each warm row (Inductor, kiln, kiln.compile); the "
                         "table shows the median first call, the warm-start figures list all (default 1)")
    ap.add_argument("--profile-first-call", action="store_true",
                    help="section c: cProfile each process's first call (its figures then include the "
                         "profiler's overhead) and print the warm ones' top 40 functions by cumulative time and top 25 by own time")
    ap.add_argument("--profile-dir", metavar="DIR",
                    help="section c with --profile-first-call: also save each process's raw profile there "
                         "(<workload>-<backend>-<row>.prof, for python -m pstats)")
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
        compile_child(args, _T_PROCESS)
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
    args.rounds_b = 1 if args.quick else 5
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
        if args.kiln_first and "b" in sections:
            log("- --kiln-first: section b compiles kiln before Inductor")
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
                    section_c(args, binary, problems, over_budget)
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
