#!/usr/bin/env python3
"""Where a model step's time goes, for eager, Inductor and kiln side by side.

For each backend: the step time (CUDA events, median), the host time to enqueue one step (no
synchronization: when it is close to the step time, the step is launch-bound), and a torch.profiler
trace of a few steps summed per GPU kernel name: total GPU busy time and the top kernels. The
same step functions as scripts/bench_gpu.py's model section (bf16 autocast by default).

Examples (on the GPU machine, after tests/gpu/run_on_gpu.sh installed the client into /tmp/site):
  PYTHONPATH=/tmp/site python3 tests/gpu/profile_model.py --model resnet18 --mode inference
  tests/gpu/run_on_gpu.sh profile            (STEP_ARGS_profile="--model resnet50 --mode training")
"""

import argparse
import collections
import copy
import os
import re
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import gpu_models as gm  # noqa: E402


def host_ms(run, iters):
    """Median host time per step, without waiting for the GPU between steps (bounded queue)."""
    import torch

    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(times)


def host_profile(backend, run, steps, top):
    """cProfile of `steps` steps: the functions with the most own time, per step."""
    import cProfile
    import io
    import pstats

    import torch

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        run()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    print(f"\n## {backend}: host profile of {steps} steps (cProfile, sorted by own time)")
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    print("\n".join(line[:160] for line in lines[max(0, start - 3):]))


def timeline_report(backend, run, steps, top):
    """Where the GPU sits idle during `steps` steps, and what the host asked of the CUDA runtime
    meanwhile: a torch.profiler trace with CPU and CUDA activities. Prints the GPU's busy and idle
    time per step, the longest idle gaps with the GPU work on either side of each, and the CUDA
    runtime and driver calls (count and host us per step; a synchronizing call, or a cudaMalloc /
    cudaFree, inside a step is what makes a fast GPU wait for a slow host). The CPU activity adds
    host overhead of its own, so the step is slower than untraced."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    gpu, api = [], collections.defaultdict(lambda: [0, 0.0])
    runtime_call = re.compile(r"^cu(da)?[A-Z]")
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            gpu.append((ev.time_range.start, ev.time_range.end, ev.name))
        elif runtime_call.match(ev.name):
            api[ev.name][0] += 1
            api[ev.name][1] += ev.time_range.end - ev.time_range.start
    print(f"\n## {backend}: GPU timeline of {steps} steps (torch.profiler, CPU and CUDA "
          "activities)")
    if not gpu:
        print("no GPU activity recorded")
        return
    gpu.sort()
    busy, gaps = 0.0, []
    cur_start, cur_end, cur_last = gpu[0][0], gpu[0][1], gpu[0][2]
    for start, end, name in gpu[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append((start - cur_end, cur_last, name))
            cur_start = start
        if end >= cur_end:
            cur_end, cur_last = end, name
    busy += cur_end - cur_start
    span = cur_end - gpu[0][0]
    print(f"first to last GPU activity {span / steps:.0f} us per step: busy {busy / steps:.0f} us, "
          f"idle {(span - busy) / steps:.0f} us in {len(gaps) / steps:.0f} gaps per step "
          f"({sum(1 for g in gaps if g[0] >= 20) / steps:.1f} of them 20 us or longer)")
    gm.table(["idle us", "after", "before"],
             [[f"{g[0]:.1f}", short(g[1], 60), short(g[2], 60)] for g in sorted(gaps, reverse=True)[:top]])
    print()
    gm.table(["runtime call", "calls per step", "host us per step"],
             [[name, f"{v[0] / steps:.1f}", f"{v[1] / steps:.1f}"]
              for name, v in sorted(api.items(), key=lambda kv: -kv[1][1])[:top]])


def find_kilnctl(kilnd_binary):
    """kilnctl beside `kilnd_binary` (a bundle), else this repo's bazel-bin, else `kilnctl` on PATH."""
    for path in (os.path.join(os.path.dirname(kilnd_binary or ""), "kilnctl"),
                 os.path.join(REPO, "bazel-bin", "client", "kilnctl", "kilnctl")):
        if os.access(path, os.X_OK):
            return path
    return "kilnctl"


def cache_keys(address, kilnctl):
    """The keys of every entry of the kilnd at `address` (`kilnctl --json ls`); None, with the
    reason printed, when kilnctl fails."""
    import json
    import subprocess

    listing = subprocess.run([kilnctl, f"--server={address}", "--json", "ls"], capture_output=True, text=True,
                             timeout=60)
    if listing.returncode != 0:
        print(f"kilnctl ls failed: {listing.stderr.strip()}")
        return None
    return [entry["key"] for entry in json.loads(listing.stdout).get("entries", [])]


def write_sources(server, out_dir):
    """`kilnctl show KEY --source` of every entry of the server's cache, one file per key."""
    import subprocess

    kilnctl = find_kilnctl(server.binary)
    os.makedirs(out_dir, exist_ok=True)
    keys = cache_keys(server.address, kilnctl)
    if keys is None:
        return
    for key in keys:
        shown = subprocess.run([kilnctl, f"--server={server.address}", "show", key, "--source"],
                               capture_output=True, text=True, timeout=60)
        with open(os.path.join(out_dir, f"{key[:16]}.txt"), "w") as f:
            f.write(shown.stdout + shown.stderr)
    print(f"kiln sources: {out_dir}")


def _extent_bytes(meta):
    """Bytes spanned by a plan value (1 + sum((size - 1) * |stride|) elements); None when a size
    or stride is symbolic."""
    try:
        sizes = [int(d["constant"]) for d in meta["sizes"]]
        strides = [int(d["constant"]) for d in meta["strides"]]
    except KeyError:
        return None
    if any(n == 0 for n in sizes):
        return 0
    elems = 1 + sum((n - 1) * abs(st) for n, st in zip(sizes, strides))
    from kiln import _tables, proto

    return elems * _tables.PB_TO_DTYPE[getattr(proto, meta["dtype"])].itemsize


def kiln_kernel_bytes(address, kilnctl):
    """{generated kernel symbol: bytes one run of its plans moves through it}: for each kernel step
    of every cache entry's plan (the kilnd at `address`), the extents of its argument values
    (inputs, outputs and workspace scratch, each counted once per launch). Each graph is assumed
    to run once a step."""
    import json
    import subprocess

    out = {}
    for key in cache_keys(address, kilnctl) or []:
        shown = subprocess.run([kilnctl, f"--server={address}", "--json", "show", key, "--plan"],
                               capture_output=True, text=True, timeout=120)
        if shown.returncode != 0:
            continue
        plan = json.loads(shown.stdout).get("plan", {})
        values = plan.get("values", [])
        for step in plan.get("steps", []):
            k = step.get("kernel")
            if not k:
                continue
            spans = [_extent_bytes(values[a]["meta"]) for a in k.get("args", []) if a >= 0]
            if any(b is None for b in spans):
                continue
            out[k["symbol"]] = out.get(k["symbol"], 0) + sum(spans)
    return out


def inductor_kernel_bytes(cache_dir):
    """{Triton kernel name: bytes per launch}, Inductor's own estimate (`kernel_num_gb`, written into
    each kernel's inductor_meta when torch._inductor.config.benchmark_kernel is set), read from the
    generated modules under `cache_dir`. A name defined twice with different sizes keeps the larger."""
    import re

    out = {}
    name_pat = re.compile(r"'kernel_name':\s*'(\w+)'")
    gb_pat = re.compile(r"'kernel_num_gb':\s*([0-9.eE+-]+)")
    for root, _, files in os.walk(cache_dir):
        for f in files:
            if not f.endswith(".py"):
                continue
            try:
                text = open(os.path.join(root, f), errors="replace").read()
            except OSError:
                continue
            names = list(name_pat.finditer(text))
            for i, m in enumerate(names):  # its estimate: before the next kernel's name
                end = names[i + 1].start() if i + 1 < len(names) else len(text)
                gb = gb_pat.search(text, m.end(), end)
                if gb:
                    out[m.group(1)] = max(out.get(m.group(1), 0), float(gb.group(1)) * 1e9)
    return out


def bytes_report(backend, kernels, steps, per_step_bytes, copy_tbps, top):
    """Generated kernels against their bytes: the total, and the kernels that lose the most time
    against a copy of their bytes at `copy_tbps`."""
    rows = []
    for name, (calls, us) in kernels.items():
        b = per_step_bytes(name, calls / steps)
        if b is not None:
            us_step = us / steps
            at_copy = b / (copy_tbps * 1e12) * 1e6
            rows.append((us_step - at_copy, us_step, b, calls / steps, name))
    if not rows:
        print(f"\n## {backend}: no generated kernel with known bytes")
        return
    us = sum(r[1] for r in rows)
    b = sum(r[2] for r in rows)
    print(f"\n## {backend}: generated kernels against their bytes (copy {copy_tbps:.2f} TB/s)")
    print(f"{len(rows)} kernels, {sum(r[3] for r in rows):.0f} launches, {us:.0f} us and {b / 1e9:.2f} GB per "
          f"step: {b / (us * 1e-6) / 1e12:.2f} TB/s, {100 * b / (us * 1e-6) / 1e12 / copy_tbps:.0f}% of copy; "
          f"{b / (copy_tbps * 1e12) * 1e6:.0f} us at copy")
    sizes = [(0, 8e6), (8e6, 32e6), (32e6, 128e6), (128e6, float("inf"))]
    size_rows = []
    for lo, hi in sizes:
        sel = [r for r in rows if lo <= r[2] / max(r[3], 1) < hi]
        if sel:
            s_us, s_b = sum(r[1] for r in sel), sum(r[2] for r in sel)
            size_rows.append([f"{lo / 1e6:.0f}-{hi / 1e6:.0f} MB", f"{sum(r[3] for r in sel):.0f}", f"{s_us:.0f}",
                              f"{s_b / 1e9:.2f}", f"{100 * s_b / (s_us * 1e-6) / 1e12 / copy_tbps:.0f}",
                              f"{sum(r[0] for r in sel):.0f}"])
    gm.table(["bytes per launch", "launches", "us/step", "GB/step", "% of copy", "us over copy"], size_rows)
    print()
    gm.table(["us over copy", "us/step", "MB/step", "calls", "% of copy", "kernel"],
             [[f"{r[0]:.1f}", f"{r[1]:.1f}", f"{r[2] / 1e6:.1f}", f"{r[3]:.0f}",
               f"{100 * r[2] / (r[1] * 1e-6) / 1e12 / copy_tbps:.0f}", short(r[4])]
              for r in sorted(rows, reverse=True)[:top]])


def short(name, width=90):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18", choices=gm.MODEL_NAMES)
    ap.add_argument("--mode", default="inference", choices=["inference", "training"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--batch", type=int, default=None, help="default: scripts/bench_gpu.py's")
    ap.add_argument("--iters", type=int, default=30, help="timed steps per backend")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per backend")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per backend")
    ap.add_argument("--backends", default="eager,inductor,kiln")
    ap.add_argument("--kiln-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--kilnd", default=None)
    ap.add_argument("--graphs", action="store_true",
                    help="CUDA-graph modes, as scripts/bench_gpu.py --graphs: Inductor mode=\"reduce-overhead\" "
                         "and kiln option cuda_graphs=1 (eager stays plain)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="STEPS",
                    help="also run STEPS steps of each backend under cProfile and print the host "
                         "functions taking the most time (tottime)")
    ap.add_argument("--timeline", type=int, default=0, metavar="STEPS",
                    help="also trace STEPS steps of each backend with CPU and CUDA activities and print the GPU's "
                         "idle gaps and the CUDA runtime calls (synchronizations, allocations) per step")
    ap.add_argument("--sources-out", default=None, metavar="DIR",
                    help="write each kiln cache entry (plan and generated source, `kilnctl show --source`) "
                         "to DIR/<key>.txt; needs kilnctl beside kilnd")
    ap.add_argument("--bytes", action="store_true",
                    help="also set each generated kernel's time against its bytes (kiln: its plan's argument "
                         "extents, through kilnctl; Inductor: its kernel_num_gb estimate, with "
                         "torch._inductor.config.benchmark_kernel set and $TORCHINDUCTOR_CACHE_DIR, else a "
                         "fresh Inductor cache dir) and list the kernels that lose the most time against a "
                         "copy of the same bytes")
    args = ap.parse_args()
    if args.bytes:
        inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or tempfile.mkdtemp(prefix="kiln-profile-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache

    import torch

    import bench_gpu

    if args.bytes:
        torch._inductor.config.benchmark_kernel = True
        copy_tbps = bench_gpu.measure_copy("cuda", 30, 1)[0]
    kiln, where = gm.import_kiln()
    gm.EXTRA_KILN_OPTIONS.update(gm.parse_kiln_options(args.kiln_option))
    if args.graphs:
        gm.EXTRA_KILN_OPTIONS["cuda_graphs"] = True
    device = "cuda"
    batch = args.batch or bench_gpu.BENCH_BATCH.get(args.model)
    base = gm.make_case(args.model, False, device, seed=0, batch=batch)
    print(f"# {args.model} {args.mode} {args.dtype} ({gm.describe_size(args.model, False, batch)}); "
          f"torch {torch.__version__}; kiln client {where}")
    server = None
    results = {}
    reports = []
    with tempfile.TemporaryDirectory(prefix="kiln-profile-") as tmp:
        try:
            for b in args.backends.split(","):
                case = copy.deepcopy(base)
                if b == "kiln":
                    if server is None:
                        server = gm.Kilnd(gm.find_kilnd(args.kilnd), tmp)
                    wrap = lambda m: gm.compile_kiln(m, server.address)  # noqa: E731
                else:
                    wrap = {"eager": lambda m: m,
                            "inductor": (lambda m: torch.compile(m, mode="reduce-overhead")) if args.graphs
                            else torch.compile}[b]
                run = bench_gpu.model_runner(case, args.mode, args.dtype, device, wrap)
                step_ms = gm.time_calls(run, device, args.iters, warmup=3)[0]
                enqueue_ms = host_ms(run, args.iters)
                kernels, busy_us = gm.kernel_table(run, args.steps)
                results[b] = (step_ms, enqueue_ms, busy_us, kernels)
                if args.bytes and b == "kiln":
                    plan_bytes = kiln_kernel_bytes(server.address, find_kilnctl(server.binary))
                    reports.append((b, kernels, lambda name, calls: plan_bytes.get(name)))
                elif args.bytes and b == "inductor":
                    gb = inductor_kernel_bytes(inductor_cache)
                    reports.append((b, kernels, lambda name, calls, gb=gb: gb[name] * calls if name in gb else None))
                if args.cprofile:
                    host_profile(b, run, args.cprofile, args.top)
                if args.timeline:
                    timeline_report(b, run, args.timeline, args.top)
                if b == "kiln":
                    print("kiln: " + gm.facts_line(gm.kiln_facts()))
                    if args.sources_out:
                        write_sources(server, args.sources_out)
        finally:
            if server is not None:
                server.stop()

    print()
    gm.table(["backend", "step ms", "host enqueue ms", "GPU busy ms", "kernels per step"],
             [[b, f"{r[0]:.3f}", f"{r[1]:.3f}", f"{r[2] / 1e3:.3f}",
               f"{sum(v[0] for v in r[3].values()) / args.steps:.0f}"] for b, r in results.items()])
    for b, (_, _, busy_us, kernels) in results.items():
        print(f"\n## {b}: top kernels (us per step, calls per step)")
        rows = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:args.top]
        gm.table(["us/step", "calls", "% busy", "kernel"],
                 [[f"{v[1] / args.steps:.1f}", f"{v[0] / args.steps:.0f}",
                   f"{100 * v[1] / args.steps / max(busy_us, 1e-9):.1f}", short(k)] for k, v in rows])
    for b, kernels, per_step_bytes in reports:
        bytes_report(b, kernels, args.steps, per_step_bytes, copy_tbps, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
