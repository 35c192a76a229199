#!/usr/bin/env python3
"""kiln vs eager vs Inductor on CPU, side by side in one run on the same machine.

    .venv/bin/python scripts/bench_cpu.py [--quick] [--only NAME[,NAME...]]

Prints tables, writes nothing else (temp dirs are removed at exit):

1. Run time per call of each workload (pointwise chain, row sum, softmax, layer norm, GELU, an MLP
   block, an attention block; inference under torch.no_grad and training = forward + backward):
   eager, Inductor (torch.compile's default backend) and kiln (backend="kiln" against a kilnd this
   script starts), each the median of many calls after warm-up, measured interleaved (rounds that
   rotate the order of the three); "kiln speed" = Inductor time / kiln time (> 1: kiln faster), and
   its geomean over the memory-bound set (the first five workloads). kiln's outputs (and gradients)
   are compared with eager's; a mismatch or a graph that kiln ran eagerly is printed loudly.
2. Cold compile (graph in, artifact out) of the same functions: first call minus a normal call, in
   fresh processes. Inductor: each function inside torch._inductor.utils.fresh_cache() (a new empty
   TORCHINDUCTOR_CACHE_DIR and Inductor's in-memory caches cleared) after torch._dynamo.reset().
   kiln: against the kilnd started with an EMPTY --cache_dir, with the phases kilnd reports
   (kiln.stats()["server_time_s"]). Warm start: a new process against the warm caches (Inductor:
   the cache dir each function filled when cold; kiln: the same kilnd), first call minus a normal
   call. Two processes (cold, then warm) measure each function with kiln, then with Inductor; each
   first compiles one small unrelated function with both backends (inference and training) so that
   one-time costs (imports, first compile in a process, kiln's runtime library) are not charged to
   the first workload.

Sizes (full): pointwise 2048 x 2048 (4M floats), row sum/softmax/layer norm/GELU 4096 x 1024, MLP
128 x 256 -> 1024 -> 256, attention 4 x 64 x 256 with 4 heads. --quick: pointwise, softmax and MLP
only, smaller (pointwise 4x, softmax 8x, MLP 2x), fewer calls, compile times for pointwise only; it is a
smoke run, its figures mean little. Figures are only worth keeping from a quiet machine.

kilnd comes from $KILND, else bazel-bin/server/kilnd (copied to a temp dir first, so a rebuild
during the run does not change it); it listens on a unix socket in a temp dir.
"""
import argparse
import datetime
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- workloads -------------------------------------------------------------------------------------
# Each: name -> (memory_bound, make(quick) -> (module, inputs, grad_inputs)). Training differentiates
# with respect to every parameter, and to the inputs when grad_inputs is True.

MODES_BOTH = ("inference", "training")


def _workloads():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Pointwise(nn.Module):
        def forward(self, x, y):
            return torch.relu(x * 2 + y).exp() * 0.5

    class RowSum(nn.Module):
        def forward(self, x):
            return x.sum(-1)

    class Softmax(nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1)

    class Gelu(nn.Module):
        def forward(self, x):
            return F.gelu(x)

    class MLP(nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

        def forward(self, x):
            return self.fc2(F.gelu(self.fc1(x)))

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x):
            b, t, d = x.shape
            h = self.heads

            def split(y):
                return y.view(b, t, h, d // h).transpose(1, 2)

            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)
            return self.o((att @ v).transpose(1, 2).reshape(b, t, d))

    def rows(quick):
        return 512 if quick else 4096

    return {
        # 4M floats (2048 x 2048; --quick: 1M)
        "pointwise": (True, lambda q: (Pointwise(), [torch.randn(1024 if q else 2048, 1024 if q else 2048),
                                                     torch.randn(1024 if q else 2048, 1024 if q else 2048)], True)),
        "row_sum": (True, lambda q: (RowSum(), [torch.randn(rows(q), 1024)], True)),
        "softmax": (True, lambda q: (Softmax(), [torch.randn(rows(q), 1024)], True)),
        "layer_norm": (True, lambda q: (nn.LayerNorm(1024), [torch.randn(rows(q), 1024)], True)),
        "gelu": (True, lambda q: (Gelu(), [torch.randn(rows(q), 1024)], True)),
        "mlp": (False, lambda q: (MLP(256, 1024), [torch.randn(64 if q else 128, 256)], False)),
        "attention": (False, lambda q: (Attention(256, 4), [torch.randn(2 if q else 4, 64, 256)], False)),
    }


WORKLOAD_NAMES = ["pointwise", "row_sum", "softmax", "layer_norm", "gelu", "mlp", "attention"]
QUICK_NAMES = ["pointwise", "softmax", "mlp"]  # --quick: these workloads (smaller sizes)
QUICK_COLD = ["pointwise"]  # --quick: cold/warm compile for these only


def _make(name, mode, quick, seed=0):
    """A fresh (module, inputs, grad_inputs) for one workload and mode."""
    import torch

    torch.manual_seed(seed)
    return _prepare(*_workloads()[name][1](quick), mode)


def _prepare(module, inputs, grad_inputs, mode):
    if mode == "inference":
        module.requires_grad_(False)
    elif grad_inputs:
        for t in inputs:
            t.requires_grad_(True)
    return module, inputs, grad_inputs


def _runner(module, backend, address, inputs, grad_inputs, mode):
    """A zero-argument callable doing one call of a copy of `module` compiled with `backend` (forward,
    plus backward in training); it returns the outputs and the gradients of inputs and parameters."""
    import copy

    import torch

    module = copy.deepcopy(module)
    if backend == "eager":
        fn = module
    elif backend == "inductor":
        fn = torch.compile(module)
    else:
        fn = torch.compile(module, backend="kiln", options={"server": address})
    if mode == "inference":
        def run():
            with torch.no_grad():
                return [fn(*inputs)]
        return run
    wrt = (list(inputs) if grad_inputs else []) + list(module.parameters())
    grad_out = []

    def run():
        out = fn(*inputs)
        if not grad_out:
            torch.manual_seed(1)
            grad_out.append(torch.randn_like(out))
        grads = torch.autograd.grad(out, wrt, grad_out[0])
        return [out.detach(), *grads]
    return run


def _time_calls(run, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


# -- cold / warm compile (child processes) ---------------------------------------------------------


def _split(result):
    sp = (result or {}).get("split") or {}
    return f"{_sec(sp['trace_s'])} / {_sec(sp['backend_s'])}" if sp else "-"


def _child(args):
    """One fresh process (phase "cold" or "warm"): for each workload, kiln then Inductor, the first
    call's time minus the median of normal calls."""
    import torch
    import torch.nn as nn
    from torch._inductor.utils import _set_env, clear_caches, fresh_cache

    import kiln

    sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
    import gpu_models as gm  # dynamo_seconds / split_seconds: where a first call's time goes

    phase = args.child
    state = json.load(open(args.state)) if os.path.exists(args.state) else {}
    results = {"kiln": {}, "inductor": {}}

    def measure(name, mode, backend, module=None, inputs=None, grad_inputs=True):
        torch._dynamo.reset()
        kiln.reset_stats()
        if module is None:
            module, inputs, grad_inputs = _make(name, mode, args.quick)
        else:
            module, inputs, grad_inputs = _prepare(module, inputs, grad_inputs, mode)
        run = _runner(module, backend, args.server, inputs, grad_inputs, mode)
        before = gm.dynamo_seconds()
        t0 = time.perf_counter()
        run()
        first = time.perf_counter() - t0
        split = gm.split_seconds(before, gm.dynamo_seconds())
        normal = statistics.median(_time_calls(run, 5 if args.quick else 10))
        s = kiln.stats()
        return {"first": first, "normal": normal, "compile": first - normal,
                "server": s["server_time_s"], "client": s["client_time_s"], "compiles": s["compiles"],
                "hits": s["hits"], "fallbacks": s["graph_fallbacks"], "prefetches": s.get("backward_prefetches", 0),
                "split": split}

    class Prime(nn.Module):  # a graph unlike every workload: pointwise, a reduction, a GEMM
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return (self.fc(x).sin() * 3).sum(0)

    # One-time costs (imports, the first compile of each kind in a process, kiln's runtime library)
    # are paid here, on an unrelated graph, for both backends, inference and training.
    for mode in MODES_BOTH:
        torch.manual_seed(0)
        prime, x = Prime(), torch.randn(5, 8)
        measure("prime", mode, "kiln", prime, [x], True)
        if phase == "cold":
            with fresh_cache(dir=args.tmp, delete=False):
                state[f"prime/{mode}"] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
                measure("prime", mode, "inductor", prime, [x], True)
        else:
            clear_caches()
            with _set_env("TORCHINDUCTOR_CACHE_DIR", state[f"prime/{mode}"]):
                measure("prime", mode, "inductor", prime, [x], True)

    for name, mode in args.cases:
        key = f"{name}/{mode}"
        results["kiln"][key] = measure(name, mode, "kiln")
        if phase == "cold":
            with fresh_cache(dir=args.tmp, delete=False):
                state[key] = os.environ["TORCHINDUCTOR_CACHE_DIR"]
                results["inductor"][key] = measure(name, mode, "inductor")
        else:
            clear_caches()
            with _set_env("TORCHINDUCTOR_CACHE_DIR", state[key]):
                results["inductor"][key] = measure(name, mode, "inductor")
    if phase == "cold":
        json.dump(state, open(args.state, "w"))
    json.dump(results, open(args.out, "w"))


# -- the parent ------------------------------------------------------------------------------------


class Kilnd:
    def __init__(self, tmp):
        src = os.environ.get("KILND") or os.path.join(REPO, "bazel-bin", "server", "kilnd")
        if not os.access(src, os.X_OK):
            sys.exit(f"kilnd not found at {src}: run `bazel build //server:kilnd` or set KILND")
        # A copy, so that a rebuild of bazel-bin during the run cannot change it; a bundle's kilnd
        # (deploy/bundle.sh: libraries beside it, rpath $ORIGIN) runs in place.
        if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(src)), "kiln_nvrtc_worker")) and \
                any(f.startswith("libabsl") for f in os.listdir(os.path.dirname(os.path.abspath(src)))):
            self.binary = src
        else:
            self.binary = os.path.join(tmp, "kilnd")
            shutil.copy(src, self.binary)
        self.address = f"unix:{tmp}/kilnd.sock"
        self.log_path = os.path.join(tmp, "kilnd.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([self.binary, f"--listen={self.address}",
                                      f"--cache_dir={os.path.join(tmp, 'kiln-cache')}", "--log_level=warn"],
                                     stdout=self._log, stderr=self._log)
        from kiln.server import health as server_health

        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"kilnd exited at startup:\n{open(self.log_path).read()}")
            if server_health(self.address) == "SERVING":
                return
            if time.time() > deadline:
                self.stop()
                sys.exit(f"kilnd did not become SERVING within 30 s:\n{open(self.log_path).read()}")
            time.sleep(0.05)

    def version(self):
        return subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout.strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


_VERBOSE = [False]


def _progress(msg):
    if _VERBOSE[0]:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _table(header, rows):
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()


def _ms(s):
    return f"{s * 1e3:.3f}" if s < 0.01 else f"{s * 1e3:.1f}" if s < 1 else f"{s * 1e3:.0f}"


def _sec(s):
    return f"{s:.3f}" if abs(s) < 1 else f"{s:.2f}"


def _geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _header(kilnd, argv):
    import torch

    import kiln

    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()
    mem = ""
    try:
        mem = f", {int(open('/proc/meminfo').readline().split()[1]) / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    print(f"# kiln vs eager vs Inductor on CPU — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print()
    print(f"- command: `{' '.join(argv)}`")
    print(f"- machine: {os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))}), {cpu}{mem}, "
          f"{platform.system()} {platform.release()}; load average at start "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"- torch {torch.__version__} (threads {torch.get_num_threads()}), kiln client {kiln.__version__}, "
          f"{kilnd.version()}, {gxx[0] if gxx else 'g++ unknown'}, Python {platform.python_version()}")
    env = [f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_"))]
    print(f"- OpenMP environment: {' '.join(env) if env else 'none set (defaults)'}")
    print()


def _check(ref, got):
    """(max abs diff, ok) between two lists of tensors."""
    import torch

    worst, ok = 0.0, len(ref) == len(got)
    for a, b in zip(ref, got):
        if a.shape != b.shape:
            return float("inf"), False
        worst = max(worst, (a.double() - b.double()).abs().max().item())
        ok = ok and torch.allclose(a, b, rtol=1e-3, atol=1e-4)
    return worst, ok


def _steady(cases, address, quick):
    """Run time per call, interleaved. Returns rows of dicts."""
    import torch

    import kiln

    rounds = 5 if quick else 10
    budget = 0.06 if quick else 0.3  # seconds per variant per round
    out = []
    for name, mode in cases:
        _progress(f"run time: {name}/{mode}")
        module, inputs, grad_inputs = _make(name, mode, quick)
        runs = {b: _runner(module, b, address, inputs, grad_inputs, mode) for b in ("eager", "inductor", "kiln")}
        kiln.reset_stats()
        results = {b: r() for b, r in runs.items()}  # first calls (compiles)
        for b, r in runs.items():  # warm-up
            for _ in range(2):
                results[b] = r()
        s = kiln.stats()
        diff, ok = _check(results["eager"], results["kiln"])
        idiff, iok = _check(results["eager"], results["inductor"])
        est = {b: statistics.median(_time_calls(r, 3)) for b, r in runs.items()}
        times = {b: [] for b in runs}
        order = list(runs)
        for i in range(rounds):
            for b in order[i % 3:] + order[:i % 3]:
                n = max(2, min(200, int(budget / max(est[b], 1e-6))))
                times[b].extend(_time_calls(runs[b], n))
        med = {b: statistics.median(t) for b, t in times.items()}
        best = {b: min(t) for b, t in times.items()}
        during = kiln.stats()
        out.append({"name": name, "mode": mode, "med": med, "best": best, "n": {b: len(t) for b, t in times.items()},
                    "diff": diff, "ok": ok, "idiff": idiff, "iok": iok,
                    "fallbacks": s["graph_fallbacks"], "causes": s["fallbacks_by_cause"],
                    "op_fallbacks": s["op_fallbacks"], "plan_calls": during["plan_calls"],
                    "eager_calls": during["eager_calls"], "graphs": s["graphs"]})
        torch._dynamo.reset()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: "
                    f"{', '.join(QUICK_NAMES)} only, smaller sizes, fewer calls, cold compile for "
                    f"{', '.join(QUICK_COLD)} only")
    ap.add_argument("--only", default="", help="comma-separated workload names: " + ", ".join(WORKLOAD_NAMES))
    ap.add_argument("--skip_compile_times", action="store_true", help="only the run-time table")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    args = ap.parse_args()

    _VERBOSE[0] = args.verbose
    if args.child:
        args.cases = json.loads(args.cases)
        _child(args)
        return

    names = [n.strip() for n in args.only.split(",") if n.strip()] or (QUICK_NAMES if args.quick else WORKLOAD_NAMES)
    for n in names:
        if n not in WORKLOAD_NAMES:
            ap.error(f"unknown workload {n!r}; one of {', '.join(WORKLOAD_NAMES)}")
    cases = [(n, m) for n in names for m in MODES_BOTH]

    tmp = tempfile.mkdtemp(prefix="kbc-")  # short: unix socket paths are limited to 108 bytes
    # Everything this run compiles or caches lives under tmp, removed at exit.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor-main")
    os.environ["KILN_CACHE_DIR"] = os.path.join(tmp, "kiln-client")
    os.environ.pop("KILN_SERVER", None)
    os.makedirs(os.path.join(tmp, "inductor"))
    kilnd = None
    try:
        import warnings

        import kiln

        warnings.simplefilter("ignore")
        kilnd = Kilnd(tmp)
        _header(kilnd, [os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO) else
                        sys.executable, os.path.relpath(os.path.abspath(__file__), REPO)] + sys.argv[1:])
        t_start = time.time()

        compile_results = {}
        cold_cases = [c for c in cases if not args.quick or c[0] in QUICK_COLD]
        if not args.skip_compile_times and cold_cases:
            for child in ("cold", "warm"):
                out = os.path.join(tmp, f"{child}.json")
                cmd = [sys.executable, os.path.abspath(__file__), f"--child={child}", f"--server={kilnd.address}",
                       f"--state={os.path.join(tmp, 'state.json')}", f"--out={out}",
                       f"--tmp={os.path.join(tmp, 'inductor')}", f"--cases={json.dumps(cold_cases)}"]
                if args.quick:
                    cmd.append("--quick")
                _progress(f"{child} compile process")
                # kiln's graphs outside Inductor's fresh caches (option aot_cache keeps them in
                # AOTAutograd's cache): one dir for this run's cold and warm processes only.
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "torch-kiln"))
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
                if p.returncode != 0:
                    print(f"!!! {child} process failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
                    continue
                for backend, res in json.load(open(out)).items():
                    compile_results[f"{backend}-{child}"] = res

        import torch

        _progress("run time")
        steady = _steady(cases, kilnd.address, args.quick)

        # -- run time --------------------------------------------------------------------------------
        print(f"## Run time per call (ms, median; interleaved rounds; {'--quick sizes' if args.quick else 'full sizes'})")
        print()
        rows, mem_ratios, best_ratios, problems = [], [], [], []
        for r in steady:
            m = r["med"]
            ratio = m["inductor"] / m["kiln"]
            mem = _workloads()[r["name"]][0]
            if mem:
                mem_ratios.append(ratio)
                best_ratios.append(r["best"]["inductor"] / r["best"]["kiln"])
            flag = ""
            if not r["ok"]:
                flag = " **MISMATCH**"
                problems.append(f"{r['name']}/{r['mode']}: kiln differs from eager (max abs diff {r['diff']:.3g})")
            if r["fallbacks"] or r["eager_calls"]:
                flag += " **kiln ran graphs eagerly**"
                problems.append(f"{r['name']}/{r['mode']}: {r['fallbacks']} graph(s) ran eagerly: {r['causes']}")
            rows.append([r["name"] + (" *" if mem else ""), r["mode"], _ms(m["eager"]), _ms(m["inductor"]),
                         _ms(m["kiln"]), f"**{ratio:.2f}x**", f"{m['eager'] / m['kiln']:.2f}x",
                         f"{r['best']['inductor'] / r['best']['kiln']:.2f}x",
                         f"{r['diff']:.2g}{flag}", f"{r['idiff']:.2g}" + ("" if r["iok"] else " (!)"),
                         f"{r['graphs']}/{r['fallbacks']}/{r['op_fallbacks']}", r["n"]["kiln"]])
        _table(["workload", "mode", "eager", "Inductor", "kiln", "kiln speed vs Inductor", "kiln vs eager",
                "kiln vs Inductor (min times)", "kiln max abs diff", "Inductor max abs diff", "kiln graphs/eager/aten ops", "calls (kiln)"], rows)
        print(f"Geomean of kiln speed vs Inductor (Inductor time / kiln time) over the memory-bound set (*): "
              f"**{_geomean(mem_ratios):.2f}x** (target >= 1.0); over all rows: "
              f"{_geomean([r['med']['inductor'] / r['med']['kiln'] for r in steady]):.2f}x; memory-bound set "
              f"from the fastest call of each: {_geomean(best_ratios):.2f}x")
        print()
        print("Max abs diff: against eager, over outputs and (training) the gradients of inputs and parameters. "
              "kiln graphs/eager/aten ops: graphs kiln received / graphs that ran eagerly / ops inside kiln "
              "plans run by torch (aten steps, e.g. GEMMs). kiln vs Inductor (min times): the same ratio from "
              "each one's fastest call, less sensitive to other load on the machine than the median.")
        print()

        # -- compile times ---------------------------------------------------------------------------
        if compile_results:
            kc, kw = compile_results.get("kiln-cold", {}), compile_results.get("kiln-warm", {})
            ic, iw = compile_results.get("inductor-cold", {}), compile_results.get("inductor-warm", {})
            print("## Cold compile and warm start (s: first call minus a normal call, fresh process)")
            print()
            print("Inductor cold: torch._dynamo.reset() and torch._inductor.utils.fresh_cache() per function (new "
                  "empty TORCHINDUCTOR_CACHE_DIR, in-memory caches cleared); warm: a new process pointed at the "
                  "cache dir the function filled. kiln cold: a kilnd with an empty --cache_dir; warm: a new "
                  "process against the same kilnd (memory-tier hits). kiln server = phases kilnd reported.")
            print()
            rows, speedups, phases_seen = [], [], []
            keys = [f"{n}/{m}" for n, m in cases if f"{n}/{m}" in kc or f"{n}/{m}" in ic]
            for key in keys:
                k, i = kc.get(key), ic.get(key)
                for d in (k,):
                    if d:
                        for ph in d["server"]:
                            if ph not in phases_seen:
                                phases_seen.append(ph)
            for key in keys:
                k, i, k2, i2 = kc.get(key), ic.get(key), kw.get(key), iw.get(key)
                sp = i["compile"] / k["compile"] if k and i and k["compile"] > 0 else float("nan")
                # A graph identical to one of an earlier function (same key) is a kilnd cache hit even
                # in the cold pass: such rows are not cold and stay out of the geomean. A backward
                # compiled ahead (option prefetch_backward) is a hit of this function's own compile.
                not_cold = bool(k and (k["hits"] > k.get("prefetches", 0) or k["fallbacks"] or k["compiles"] == 0))
                if not math.isnan(sp) and not not_cold:
                    speedups.append(sp)
                server = ", ".join(f"{ph} {k['server'][ph] * 1e3:.1f}" for ph in phases_seen
                                   if ph in k["server"] and k["server"][ph] >= 5e-5) if k else "-"
                note = ""
                if not_cold:
                    note = (f", {k['hits']} cache hit(s)" if k["hits"] else "") + \
                        (f", {k['fallbacks']} ran eagerly" if k["fallbacks"] else "") + " (not cold: left out of the geomean)"
                rows.append([key, _sec(i["compile"]) if i else "-", _sec(k["compile"]) if k else "-",
                             f"{sp:.1f}x" if not math.isnan(sp) else "-",
                             (f"{k['compiles']} compiled" if k else "-") + note, server or "-",
                             _sec(i2["compile"]) if i2 else "-", _sec(k2["compile"]) if k2 else "-",
                             (f"{k2['hits']} hits" + (f", {k2['compiles']} compiled" if k2["compiles"] else ""))
                             if k2 else "-", f"{_split(i2)}; {_split(k2)}"])
            _table(["function", "Inductor cold", "kiln cold", "kiln faster by", "kiln graphs", "kiln server phases (ms)",
                    "Inductor warm", "kiln warm", "kiln warm graphs", "warm: Dynamo trace / backend, Ind.; kiln"], rows)
            print("Warm split: torch's compile-time records of the warm first call: Dynamo's frame compile "
                  "without the backend / the backend call (AOTAutograd and the compiler or cache behind it; "
                  "a backward's compile at the first backward is in neither).")
            print()
            print(f"Geomean cold compile speedup of kiln over Inductor: **{_geomean(speedups):.1f}x** (target >= 5x)")
            print()

        if problems:
            print("!!! PROBLEMS !!!")
            for p in problems:
                print(f"!!! {p}")
            print()
        print(f"Total run time {time.time() - t_start:.0f} s; load average at end "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.")
    finally:
        if kilnd:
            kilnd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
