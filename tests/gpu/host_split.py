#!/usr/bin/env python3
"""Where a training step's host time goes: the forward call, the backward and the optimizer, for
Inductor and kiln side by side, and inside kiln's calls its guard and CUDA-graph runner.

Each step is timed with time.perf_counter after a torch.cuda.synchronize(), so it is the host's
own time (what it costs to enqueue the step), not the GPU's. kiln's functions are timed by
wrapping them (kiln.backend.StaticGuard.bind, and with CUDA graphs kiln.cuda_graphs' runner,
replay, copy-out, key and busy check); the wrappers add about a microsecond per call. Medians of
--steps steps after --warmup steps (the compiles, the CUDA-graph warm-up and capture, and the
replays that decide which outputs are handed out in place).

Examples (on the GPU machine, after tests/gpu/run_on_gpu.sh installed the client into /tmp/site):
  PYTHONPATH=/tmp/site python3 tests/gpu/host_split.py --model gpt_matmul --graphs
  python3 tests/gpu/host_split.py --model bert --backends kiln --kilnd .bundle/kiln/kilnd
On a machine without a GPU, --device cpu --quick runs the same steps on small CPU models; with
--graphs there, kiln.testing.CpuGraphs stands in for CUDA graphs (each "replay" runs the CPU plan),
so that kiln's graph-mode bookkeeping (capture key, busy check, copy-out) is timed on its own:
  python3 tests/gpu/host_split.py --device cpu --quick --graphs --backends kiln --dtype fp32
--free-replays (CPU, with --graphs) makes those replays do nothing, so that the step times kiln's
and torch's host work alone (the losses are then meaningless). --cprofile N then times the steps
once more under cProfile and prints each backend's N functions with the most own time.
"""

import argparse
import collections
import inspect
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "scripts"))
import gpu_models as gm  # noqa: E402

TOTALS = collections.defaultdict(float)  # label -> seconds
CALLS = collections.defaultdict(int)


def timed(owner, name, label):
    """Wraps owner.name (a function, method or staticmethod) to add its time to TOTALS[label]."""
    f = getattr(owner, name)
    if getattr(f, "_host_split", False):
        return

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            TOTALS[label] += time.perf_counter() - t0
            CALLS[label] += 1

    wrapper._host_split = True
    static = isinstance(inspect.getattr_static(owner, name), staticmethod)
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)


def wrap_kiln():
    from kiln import backend, cuda_graphs

    timed(backend.StaticGuard, "bind", "guard (StaticGuard.bind)")
    timed(cuda_graphs.CudaGraphRunner, "replay_if_captured", "CUDA-graph runner, captured key")
    timed(cuda_graphs.CudaGraphRunner, "__call__", "CUDA-graph runner, other calls")
    timed(cuda_graphs._Captured, "replay", "  replay")
    timed(type(cuda_graphs._DEVICE), "replay", "    graph.replay()")
    timed(cuda_graphs.CopyOut, "__call__", "    copy-out")
    timed(cuda_graphs._Captured, "busy", "  busy check")
    timed(cuda_graphs, "_key", "  capture key")


def step_times(run_parts, device, warmup, steps, profiler=None):
    import torch

    phases = collections.defaultdict(list)
    for i in range(warmup + steps):
        if i == warmup:
            TOTALS.clear()
            CALLS.clear()
            if profiler is not None:
                profiler.enable()
        if device == "cuda":
            torch.cuda.synchronize()
        for name, seconds in run_parts().items():
            if i >= warmup:
                phases[name].append(seconds)
    if profiler is not None:
        profiler.disable()
    return {name: statistics.median(v) for name, v in phases.items()}


def print_profile(profiler, backend, steps, top):
    """The `top` functions by their own time over the timed steps (cProfile: its hooks slow each
    Python call, so the figures rank functions; the step table above was not taken with it)."""
    import pstats

    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, ncalls, tottime, cumtime, _)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    print(f"\n## {backend}: top {top} functions by own time under cProfile, us per step ({steps} steps)")
    gm.table(["own us", "cumulative us", "calls", "function"],
             [[f"{tt / steps * 1e6:.1f}", f"{ct / steps * 1e6:.1f}", f"{nc / steps:.1f}",
               f"{os.path.basename(f)}:{ln}({fn})"[:90]] for (f, ln, fn), (_, nc, tt, ct, _) in rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt_matmul", choices=gm.MODEL_NAMES)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--backends", default="inductor,kiln")
    ap.add_argument("--graphs", action="store_true",
                    help="CUDA-graph modes: Inductor mode=\"reduce-overhead\", kiln option cuda_graphs=1")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per backend")
    ap.add_argument("--warmup", type=int, default=30, help="steps before the timed ones")
    ap.add_argument("--kilnd", default=None)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--quick", action="store_true", help="the small model sizes (as bench_gpu.py --quick)")
    ap.add_argument("--free-replays", action="store_true",
                    help="--device cpu --graphs: the stand-in's replays do nothing (host work alone)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="after the step table, time the steps again under cProfile and print each "
                         "backend's N functions with the most own time")
    args = ap.parse_args()
    if args.free_replays and not (args.graphs and args.device == "cpu"):
        ap.error("--free-replays needs --device cpu --graphs (it replaces the CPU stand-in's replays)")

    import torch

    import bench_gpu

    gm.import_kiln()
    if args.graphs and args.device == "cpu":
        from kiln import cuda_graphs, testing

        cuda_graphs._DEVICE = testing.CpuGraphs(replays_run=not args.free_replays)
    wrap_kiln()
    if args.graphs:
        gm.EXTRA_KILN_OPTIONS["cuda_graphs"] = True
    batch = None if args.quick else bench_gpu.BENCH_BATCH.get(args.model)
    print(f"# {args.model} training {args.dtype} ({gm.describe_size(args.model, args.quick, batch)}) on "
          f"{args.device}; torch {torch.__version__}; " + ("CUDA-graph modes" if args.graphs else "default modes")
          + (" (kiln: kiln.testing.CpuGraphs for CUDA graphs)" if args.graphs and args.device == "cpu" else ""))
    rows = []
    for backend in args.backends.split(","):
        case = gm.make_case(args.model, args.quick, args.device, seed=0, batch=batch)
        with tempfile.TemporaryDirectory(prefix="kiln-host-split-") as tmp:
            server = gm.Kilnd(gm.find_kilnd(args.kilnd), tmp) if backend == "kiln" else None
            try:
                if backend == "kiln":
                    fn = gm.compile_kiln(gm.with_loss(case.model, case.loss_fn), server.address)
                elif backend == "inductor":
                    fn = torch.compile(gm.with_loss(case.model, case.loss_fn),
                                       mode="reduce-overhead" if args.graphs else None)
                else:
                    fn = gm.with_loss(case.model, case.loss_fn)
                case.model.train()
                opt = torch.optim.SGD(case.model.parameters(), lr=0.01)
                autocast = torch.autocast(device_type=args.device, dtype=torch.bfloat16,
                                          enabled=args.dtype == "bf16")

                def run_parts():
                    t0 = time.perf_counter()
                    opt.zero_grad(set_to_none=True)
                    with autocast:
                        loss = fn(*case.inputs)
                    t1 = time.perf_counter()
                    loss.backward()
                    t2 = time.perf_counter()
                    opt.step()
                    t3 = time.perf_counter()
                    return {"forward call": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0}

                medians = step_times(run_parts, args.device, args.warmup, args.steps)
                rows.append([backend] + [f"{medians[k] * 1e6:.1f}" for k in
                                         ("forward call", "backward", "optimizer", "step")])
                if backend == "kiln":
                    print(f"\n## kiln's functions: us per step, summed over the step's calls ({args.steps} steps)")
                    gm.table(["function", "us per step", "calls per step"],
                             [[k, f"{TOTALS[k] / args.steps * 1e6:.1f}", f"{CALLS[k] / args.steps:.0f}"]
                              for k in TOTALS])
                if args.cprofile:
                    import cProfile

                    profiler = cProfile.Profile()
                    step_times(run_parts, args.device, 0, args.steps, profiler)
                    print_profile(profiler, backend, args.steps, args.cprofile)
            finally:
                if server is not None:
                    server.stop()
        torch._dynamo.reset()
    print(f"\n## host us per step (median of {args.steps})")
    gm.table(["backend", "forward call", "backward", "optimizer", "step"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
