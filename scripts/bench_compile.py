"""Section c of scripts/bench_gpu.py (see its --help): cold compile and warm start, each in a new
process, for Inductor, torch.compile(backend="kiln") and kiln.compile. bench_gpu.py runs it and is
also what each measurement's child process runs (--compile-child)."""
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import REPO, gx, log

sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import gpu_models as gm  # noqa: E402

BENCH_GPU = os.path.join(REPO, "scripts", "bench_gpu.py")

COMPILE_WORKLOADS = ["block_train", "resnet50_fp16"]
# Rough seconds per new process of a workload on an H200 (import, prime, the call; the session-9 run
# measured 8-18 s for the block, 8-24 s for ResNet-50 on a quiet host), and the extra of Inductor's
# cold compile, for --time-budget.
EST_PROCESS = {"block_train": 14, "resnet50_fp16": 16}
EST_INDUCTOR_COLD = {"block_train": 5, "resnet50_fp16": 15}


def compile_estimate(args, workload):
    """Seconds section c's rows of `workload` should take: the processes the options start (cold and
    --warm-repeats warm ones for each of Inductor, the plain backend and kiln.compile, plus a disk
    row for each of kiln's) at EST_PROCESS each."""
    warm = max(1, args.warm_repeats)
    processes, extra = 0, 0
    if not args.skip_inductor:
        processes += 1 + warm
        extra += EST_INDUCTOR_COLD.get(workload, 10)
    if args.kiln_compile_only:
        processes += 1 + warm  # kiln.compile: cold, warm
    else:
        processes += 2 + warm  # the plain backend: cold, warm, disk
        if not args.no_kiln_compile:
            processes += 2 + warm  # kiln.compile: cold, warm, disk
    return processes * EST_PROCESS.get(workload, 20) + extra


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


def compile_child(args, t0):
    """One measurement in this fresh process (started at perf_counter `t0`, before torch was
    imported); writes JSON to args.child_out."""
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
            profiler.dump_stats(args.child_out + ".prof")
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("cumulative").print_stats(40)
            stats.sort_stats("tottime").print_stats(25)
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
    cmd = [sys.executable, BENCH_GPU, "--compile-child", "--backend", backend, "--workload", workload,
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
    if args.profile_first_call and getattr(args, "profile_dir", None) and os.path.exists(out + ".prof"):
        os.makedirs(args.profile_dir, exist_ok=True)
        shutil.copy(out + ".prof", os.path.join(args.profile_dir, f"{workload}-{backend}-{label or 'cold'}.prof"))
    if args.verbose:
        k = r.get("kiln") or {}
        times = k.get("client_time_s") or {}
        extra = ""
        if times.get("package_load"):
            extra = (f", package load {seconds_text(times['package_load'])} s (kiln's Compile RPCs "
                     f"{times.get('rpc', 0) * 1e3:.1f} ms, plan loads {times.get('load', 0) * 1e3:.1f} ms), "
                     f"plan programs built in the call {times.get('program', 0) * 1e3:.1f} ms")
        if (k.get("prewarm") or {}).get("threads"):  # thread-seconds: summed over the threads
            extra += (f", {k['prewarm']['calls']} warm-up calls on {k['prewarm']['threads']} threads "
                      f"({times.get('prewarm', 0):.2f} thread-s; the call waited "
                      f"{times.get('prewarm_wait', 0):.3f} s for them)")
        print(f"[{r['wall_s']:.1f} s] {label} {backend} {workload}: first call {seconds_text(r['first_s'])} s{extra}",
              file=sys.stderr, flush=True)
    return r


def seconds_text(x):
    """Seconds for the tables: 3 decimals under 0.1 s (warm starts of tens of ms), else 2."""
    return f"{x:.3f}" if abs(x) < 0.1 else f"{x:.2f}"


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


def section_c(args, kilnd_binary, problems, over_budget):
    """over_budget(args, estimate s, section): bench_gpu's --time-budget rule."""
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
        if over_budget(args, compile_estimate(args, wl), "c"):
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
        if pkg_eager or pkg_fallback:
            if "pkg_warm" in ok:
                problems.append(f"(c) {wl}: kiln.compile ran graphs eagerly or fell back: "
                                f"{'; '.join(pkg_fallback)[:300] or 'eager graphs'}")
        elif px:  # no ratio without Inductor's row (--skip-inductor)
            pkg_x.append(px)
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
            return seconds_text(x) if x is not None else "-"

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
        log("First-call profiles (--profile-first-call; cProfile, top 40 by cumulative time, then top 25 by own time):")
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
