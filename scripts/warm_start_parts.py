#!/usr/bin/env python3
"""Where a warm kiln.compile first call goes, measured with timers (no profiler).

    python3 scripts/warm_start_parts.py [--kilnd PATH] [--only block_train,resnet50_fp16]
                                        [--repeats 3] [--variants default,noprewarm,t1]

For each workload of scripts/bench_gpu.py's section c: a kilnd on a fresh cache dir, one new process
that captures and stores the package (cold), then --repeats rounds of one new process per variant
that loads it (warm). Each process builds the workload and runs bench_gpu's prime first, as
section c does, then times its first call and prints one line: the whole first call and its
parts, then the slowest steps of kiln's programs at that call.

Why timers: on Python 3.12 cProfile hears every thread, so kiln.prewarm's threads land in the
main thread's figures (bench_gpu.py --profile-first-call then says a guard builder took longer
than the whole call). The parts here are wall-clock time around torch's and kiln's own functions,
patched in the child process only:

  guard_manager   torch._dynamo.package.load_guard_manager (torch builds the package's guards)
  guards_state    torch._dynamo.package.load_guards_state (unpickles what the guards check)
  artifacts       AOTAutograd's bundled entry deserialized; kiln's graphs load inside it: their
                  Compile RPCs ("rpc") and plan loads ("load"), kiln.stats()'s client_time_s
  pkg_load        kiln.compile's whole package load (GetPackage, the above, the guard check)
  program         kiln's plan programs built at the first call (client_time_s)
  run             the first call minus the package load and the wait for warm-ups: the programs,
                  the step itself and the final synchronize
  steady          the median of five later calls

Variants: default (this client's options), noprewarm (option prewarm off), tN (kiln.prewarm's
MAX_THREADS = N). Figures are milliseconds; the first call includes what a steady call costs.
Exit status 0, or 1 when a child failed.
"""

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for sub in ("scripts", os.path.join("tests", "gpu"), os.path.join("tests", "python")):
    sys.path.insert(0, os.path.join(REPO, sub))

TIMES = {}  # label -> seconds, in the child
STEPS = {}  # program step label -> [count, seconds, longest], the first call's


def _timed(owner, name, label):
    """owner.name (a function or classmethod) adds its wall time to TIMES[label]. functools.wraps
    keeps its name: torch pickles deserialize_compile_artifacts by name into a package."""
    original = owner.__dict__[name]
    func = original.__func__ if isinstance(original, classmethod) else original

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            TIMES[label] = TIMES.get(label, 0.0) + time.perf_counter() - start

    setattr(owner, name, classmethod(wrapper) if isinstance(original, classmethod) else wrapper)


def _step_label(fn):
    """An aten step's op (from the step's description kiln keeps in its closure), else the
    function that emitted the step."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, str) and "aten." in value:
            found = re.search(r"aten\.[\w.]+", value)
            if found:
                return found.group(0)
    return fn.__module__.split(".")[-1] + ":" + fn.__qualname__.split(".<locals>")[0]


def _time_program_steps():
    from kiln import executor

    build = executor._Program.__init__

    def init(self, *args, **kwargs):
        build(self, *args, **kwargs)
        timed = []
        for fn in self.code:
            def step(env, fn=fn, label=_step_label(fn)):
                start = time.perf_counter()
                fn(env)
                seconds = time.perf_counter() - start
                entry = STEPS.setdefault(label, [0, 0.0, 0.0])
                entry[0] += 1
                entry[1] += seconds
                entry[2] = max(entry[2], seconds)
            timed.append(step)
        self.code = tuple(timed)

    executor._Program.__init__ = init


def child(args):
    import gc

    import torch

    import bench_compile
    import gpu_models as gm

    gm.import_kiln()
    import kiln
    from kiln import packages, prewarm

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=args.device)
    make, _ = bench_compile.build_compile_workload(args.workload, args.device, False)
    options = {"server": args.server, "timeout": 180}
    if args.variant == "noprewarm":
        options["prewarm"] = False
    elif re.fullmatch(r"t\d+", args.variant):
        prewarm.MAX_THREADS = int(args.variant[1:])
    elif args.variant != "default":
        raise SystemExit(f"unknown variant {args.variant!r}")
    wrap = lambda m: kiln.compile(m, options=options)  # noqa: E731
    bench_compile.prime(wrap, args.device, training=args.workload.endswith("_train"))
    sync()
    gc.collect()
    kiln.reset_stats()

    import torch._dynamo.aot_compile_types as aot_types
    import torch._dynamo.package as dynamo_package

    _timed(dynamo_package, "load_guards_state", "guards_state")
    _timed(dynamo_package, "load_guard_manager", "guard_manager")
    _timed(aot_types.BundledAOTAutogradSerializableCallable, "deserialize_compile_artifacts", "artifacts")
    _timed(packages.CompiledFunction, "_load", "pkg_load")
    _time_program_steps()
    step = make(wrap)
    start = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - start
    first_steps = {k: list(v) for k, v in STEPS.items()}
    steady = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        sync()
        steady.append(time.perf_counter() - start)
    stats = kiln.stats()
    with open(args.out, "w") as f:
        json.dump({"first": first, "steady": sorted(steady)[2], "times": TIMES, "steps": first_steps,
                   "client_time_s": stats["client_time_s"], "packages": stats["packages"],
                   "prewarm": stats["prewarm"]}, f)


def _line(workload, label, variant, r):
    t, c = r["times"], r["client_time_s"]
    ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
    run = r["first"] - t.get("pkg_load", 0.0) - c.get("prewarm_wait", 0.0)
    pw = r["prewarm"]
    text = (f"{workload} {label} {variant}: first {ms(r['first'])} (steady {ms(r['steady'])}) = "
            f"pkg_load {ms(t.get('pkg_load', 0))} [guard_manager {ms(t.get('guard_manager', 0))}, "
            f"guards_state {ms(t.get('guards_state', 0))}, artifacts {ms(t.get('artifacts', 0))} "
            f"(rpc {ms(c.get('rpc', 0))}, load {ms(c.get('load', 0))})] + run {ms(run)} "
            f"(program {ms(c.get('program', 0))}) + prewarm_wait {ms(c.get('prewarm_wait', 0))}; "
            f"packages loaded {r['packages']['loaded']}, warm-ups {pw['calls']} on {pw['threads']} threads")
    steps = sorted(r["steps"].items(), key=lambda kv: -kv[1][1])
    text += "\n    slowest steps: " + "; ".join(
        f"{k} x{n} {ms(total)} (longest {ms(longest)})" for k, (n, total, longest) in steps[:5])
    return text


def parent(args):
    import gpu_models as gm

    gm.import_kiln()
    binary = args.kilnd or os.environ.get("KILND") or os.path.join(REPO, ".bundle", "kiln", "kilnd")
    if not os.path.exists(binary):
        raise SystemExit(f"no kilnd at {binary}: pass --kilnd, set KILND, or build one (deploy/bundle.sh)")
    tmp = tempfile.mkdtemp(prefix="warm-parts-")
    failed = False
    for workload in args.only.split(","):
        kd = gm.Kilnd(binary, os.path.join(tmp, workload))
        try:
            def run(label, variant):
                out = os.path.join(tmp, f"{workload}-{label}-{variant}.json")
                cmd = [sys.executable, os.path.abspath(__file__), "--child", "--workload", workload,
                       "--server", kd.address, "--out", out, "--variant", variant, "--device", args.device]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
                if p.returncode != 0:
                    print(f"{workload} {label} {variant}: FAILED (exit {p.returncode})\n{p.stderr[-2000:]}",
                          flush=True)
                    return False
                with open(out) as f:
                    print(_line(workload, label, variant, json.load(f)), flush=True)
                return True

            failed |= not run("cold", "default")
            for i in range(args.repeats):
                for variant in args.variants.split(","):
                    failed |= not run(f"warm{i}", variant)
        finally:
            kd.stop()
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--kilnd", help="kilnd binary (default: $KILND, else .bundle/kiln/kilnd)")
    ap.add_argument("--only", default="block_train,resnet50_fp16", help="workloads, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="warm processes per variant (default 3)")
    ap.add_argument("--variants", default="default", help="comma-separated: default, noprewarm, tN")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run)")
    ap.add_argument("--child-timeout", type=float, default=300, help="seconds per process (default 300)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="default", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
