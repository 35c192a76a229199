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
import copy
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
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


def write_sources(server, out_dir):
    """`kilnctl show KEY --source` of every entry of the server's cache, one file per key."""
    import json
    import subprocess

    kilnctl = os.path.join(os.path.dirname(server.binary), "kilnctl")
    os.makedirs(out_dir, exist_ok=True)
    listing = subprocess.run([kilnctl, f"--server={server.address}", "--json", "ls"], capture_output=True,
                             text=True, timeout=60)
    if listing.returncode != 0:
        print(f"kilnctl ls failed: {listing.stderr.strip()}")
        return
    for entry in json.loads(listing.stdout).get("entries", []):
        key = entry["key"]
        shown = subprocess.run([kilnctl, f"--server={server.address}", "show", key, "--source"],
                               capture_output=True, text=True, timeout=60)
        with open(os.path.join(out_dir, f"{key[:16]}.txt"), "w") as f:
            f.write(shown.stdout + shown.stderr)
    print(f"kiln sources: {out_dir}")


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
    ap.add_argument("--sources-out", default=None, metavar="DIR",
                    help="write each kiln cache entry (plan and generated source, `kilnctl show --source`) "
                         "to DIR/<key>.txt; needs kilnctl beside kilnd")
    args = ap.parse_args()

    import torch

    import bench_gpu

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
                if args.cprofile:
                    host_profile(b, run, args.cprofile, args.top)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
