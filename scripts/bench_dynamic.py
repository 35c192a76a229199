#!/usr/bin/env python3
"""Changing input shapes: kiln vs eager vs Inductor on a GPT block whose sequence length changes
from step to step (as with unpadded batches), in one run.

    python3 scripts/bench_dynamic.py [--lengths 256,384,512,320] [--dtype bf16|fp32] [--quick]
                                     [--device cuda|cpu] [--skip-inductor] [--kilnd PATH]

What happens per backend (torch.compile's defaults otherwise): Dynamo compiles the first length
statically; at the second it marks the sequence dimension dynamic and compiles a symbolic graph.
Inductor compiles that graph once, with kernels that take the length as an argument. kilnd
compiles static shapes, so kiln compiles the symbolic graph once per length met (kiln.specialize:
one Compile round trip and a plan per length, reused when the length comes back, up to option
max_graphs_per_function lengths per graph).

Each backend runs in this process after torch._dynamo.reset(), with a fresh kilnd (empty cache)
and a fresh Inductor cache dir:
  first pass   one training step (forward + MSE loss + backward) per length, in order, each
               synchronized: what new lengths cost (Dynamo, AOTAutograd, the compiles, the first runs);
  steady       per length, the median step over --iters steps after warm-up (CUDA events around
               each step; perf_counter on CPU), lengths interleaved as --rounds rounds so that each
               backend runs its shapes alternately as in training.
The kiln row also says how many graphs ran eagerly (should be none) and how many plans it loaded.
Every backend's loss and gradients are checked against eager's at the same step (bf16: rtol/atol
5e-2 on the loss, gradients by relative norm 5e-2; fp32 1e-3). --device cpu --quick is a smoke test.
Exit status: 0; 1 when a result did not match eager; 2 when the setup failed.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--lengths", default=None,
                    help="comma-separated sequence lengths, in the order the steps meet them "
                         "(default 256,384,512,320; --quick: 16,24,32,20)")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast (default) or fp32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="a small block (smoke test)")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per length and round (default 10; quick 3)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the lengths for the steady figures (default 3)")
    ap.add_argument("--skip-inductor", action="store_true")
    ap.add_argument("--kilnd", default=None, help="kilnd binary (default: $KILND, .bundle, bazel-bin)")
    args = ap.parse_args()
    args.lengths = [int(x) for x in (args.lengths or ("16,24,32,20" if args.quick else "256,384,512,320")).split(",")]
    if len(args.lengths) < 2 or min(args.lengths) < 1:
        ap.error("--lengths: at least two positive lengths")
    args.iters = args.iters or (3 if args.quick else 10)
    return args


def build(args, device):
    """(model, reference copy, step(model_fn, length) -> (loss, grads), inputs per length)."""
    import copy

    import torch
    import torch.nn.functional as F

    import gpu_models as gm

    torch.manual_seed(0)
    d, heads, batch = (64, 4, 2) if args.quick else (768, 12, 8)
    model = gm.build_gpt_block(d, heads, max(args.lengths), sdpa=False).to(device)
    inputs = {t: (torch.randn(batch, t, d, device=device), torch.randn(batch, t, d, device=device))
              for t in args.lengths}
    autocast = args.dtype == "bf16" and device.startswith("cuda")

    def step(fn, params, t):
        x, target = inputs[t]
        for p in params:
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = fn(x)
        loss = F.mse_loss(out.float(), target)
        loss.backward()
        return loss

    return model, copy.deepcopy, step, inputs


def main():
    args = parse_args()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench-dynamic-inductor-"))
    import torch

    import gpu_models as gm

    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_dynamic: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    gm.import_kiln()
    import kiln

    try:
        binary = gm.find_kilnd(args.kilnd)
    except FileNotFoundError as e:
        print(f"bench_dynamic: {e}", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="bench-dynamic-")
    model, clone, step, inputs = build(args, device)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    tol = 5e-2 if args.dtype == "bf16" else 1e-3

    # eager's loss and gradients per length: the reference for every backend
    ref = clone(model)
    want = {}
    for t in args.lengths:
        loss = step(ref, list(ref.parameters()), t)
        want[t] = (loss.detach().float(), [p.grad.detach().float().clone() for p in ref.parameters()])

    print(f"# Changing sequence lengths: GPT block training step ({gm.device_description(device)})\n")
    print(f"- command: `python {' '.join(sys.argv)}`")
    precision = "bf16 autocast" if args.dtype == "bf16" and device.startswith("cuda") else "fp32"
    print(f"- kilnd {binary}; {precision}; lengths in order: "
          f"{', '.join(map(str, args.lengths))}\n", flush=True)

    backends = ["eager"] + ([] if args.skip_inductor else ["inductor"]) + ["kiln"]
    rows, problems = {}, []
    for name in backends:
        model.load_state_dict(base_state)
        torch._dynamo.reset()
        gm.reset_kiln()
        server = None
        if name == "kiln":
            server = gm.Kilnd(binary, tmp)
            fn = gm.compile_kiln(model, server.address)
        elif name == "inductor":
            fn = torch.compile(model)
        else:
            fn = model
        params = list(model.parameters())
        try:
            first = []
            with gm.capture_kiln_warnings() as w:
                for t in args.lengths:
                    gm.sync(device)
                    t0 = time.perf_counter()
                    loss = step(fn, params, t)
                    gm.sync(device)
                    first.append(time.perf_counter() - t0)
                    problem = compare(name, t, loss, params, want[t], tol)
                    if problem:
                        problems.append(problem)
                steady = {t: [] for t in args.lengths}
                for _ in range(args.rounds):
                    for t in args.lengths:
                        steady[t].append(gm.time_calls(lambda: step(fn, params, t), device, args.iters,
                                                       warmup=1)[0])
            facts = ""
            if name == "kiln":
                s = kiln.stats()
                facts = (f"{s['plan_calls']} plan calls, {s['eager_calls']} eager calls, "
                         f"{s['graph_fallbacks']} graphs eager, {s['compiles']} compiles + {s['hits']} hits")
                if s["eager_calls"] or s["graph_fallbacks"]:
                    said = "; ".join(_shorter(str(x.message)) for x in w.kiln[:3])
                    problems.append(f"kiln ran graphs eagerly: {facts}; {said}")
            rows[name] = (first, {t: statistics.median(v) for t, v in steady.items()}, facts)
        finally:
            if server is not None:
                server.stop()

    header = (["backend", "first pass s (per length)"] + [f"T={t} ms" for t in args.lengths]
              + ["geomean vs Inductor", "notes"])
    out = []
    ind = rows.get("inductor")
    for name in backends:
        first, steady, facts = rows[name]
        ratio = "-"
        if ind is not None:
            ratio = f"{gm.geomean([ind[1][t] / steady[t] for t in args.lengths]):.2f}x"
        out.append([name, f"{sum(first):.2f} ({', '.join(f'{x:.2f}' for x in first)})"]
                   + [gm.fmt_ms(steady[t]) for t in args.lengths] + [ratio, facts])
    gm.table(header, out)
    print("\nsteady: median step (forward + loss + backward) per length over "
          f"{args.rounds} rounds x {args.iters} steps; geomean vs Inductor = Inductor's time / the "
          "row's (> 1: faster).")
    if problems:
        print("\nMISMATCH / problems:\n- " + "\n- ".join(problems))
        return 1
    print("\nAll backends matched eager at every length.")
    return 0


def _shorter(text, keep=400):
    """A long warning's start and end (the middle is often a list of inputs)."""
    return text if len(text) <= 2 * keep else text[:keep] + " ... " + text[-keep:]


def compare(name, t, loss, params, want, tol):
    import torch

    want_loss, want_grads = want
    if not torch.allclose(loss.detach().float(), want_loss, rtol=tol, atol=tol):
        return f"{name} T={t}: loss {loss.item():.6g} vs eager {want_loss.item():.6g}"
    for k, (p, g) in enumerate(zip(params, want_grads)):
        if p.grad is None:
            return f"{name} T={t}: parameter {k} has no gradient"
        rel = ((p.grad.float() - g).norm() / g.norm().clamp_min(1e-12)).item()
        if rel > tol:
            return f"{name} T={t}: parameter {k} gradient off by {rel:.3g} (relative norm)"
    return None


if __name__ == "__main__":
    sys.exit(main())
