"""Row softmaxes through torch.compile, kiln next to eager and Inductor, on shapes that pick
different layouts in kilnd's CUDA emitter: vocabulary rows (32000, 50257), column-sliced inputs
(x[:, 1:] and x[:, :-1] into contiguous outputs: loads and stores at different alignments),
rows just either side of the register / shared-memory limit, and few long rows (fewer rows than
SMs: one thread-block cluster per row on sm_90, or a split into partials). Prints one table; exit 1 if a graph
ran eagerly or kiln's largest error against the fp32 result exceeds twice Inductor's plus 4 units
of the dtype's rounding at the largest result (f32 rows of 50257: errors of 2-4e-7 for both).

    python3 tests/gpu/softmax_shapes.py [--kilnd PATH] [--iters 50] [--only SUBSTRING]...
    python3 tests/gpu/softmax_shapes.py --device cpu --quick     # a smoke run: 3 cases, 4 rows each

Times: per call, CUDA events around each call enqueued back to back (gpu_models.time_calls), the
median of --iters calls after 5 warm-ups; each call's host overhead is in the figure when the GPU
is faster than the host. GPU us: the GPU's own busy time per call (torch.profiler over 20 calls,
gpu_models.kernel_table), without the host's time between a call's kernels.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_models as gm  # noqa: E402

# (name, dtype, rows, stored columns, view): view "" (whole rows), "head" (x[:, 1:]), "tail"
# (x[:, :-1]); "log" in the name: log_softmax.
CASES = [
    ("softmax bf16 4096 x 50257", "bfloat16", 4096, 50257, ""),
    ("softmax bf16 4096 x 50257 of x[:, 1:]", "bfloat16", 4096, 50258, "head"),
    ("softmax bf16 4096 x 50257 of x[:, :-1]", "bfloat16", 4096, 50258, "tail"),
    ("softmax f32 4096 x 50257 of x[:, 1:]", "float32", 4096, 50258, "head"),
    ("log_softmax fp16 2048 x 50257 of x[:, 1:]", "float16", 2048, 50258, "head"),
    ("softmax bf16 4096 x 32000", "bfloat16", 4096, 32000, ""),
    ("log_softmax bf16 8192 x 32000", "bfloat16", 8192, 32000, ""),
    ("softmax bf16 4096 x 32001", "bfloat16", 4096, 32001, ""),
    ("softmax bf16 4096 x 32001 of x[:, 1:]", "bfloat16", 4096, 32002, "head"),
    ("softmax fp16 4096 x 24000", "float16", 4096, 24000, ""),
    ("softmax f32 4096 x 32000", "float32", 4096, 32000, ""),
    ("softmax f32 8192 x 20000", "float32", 8192, 20000, ""),
    ("softmax f32 2048 x 32768", "float32", 2048, 32768, ""),
    ("softmax bf16 8192 x 16384", "bfloat16", 8192, 16384, ""),
    ("softmax bf16 8192 x 16001 of x[:, 1:]", "bfloat16", 8192, 16002, "head"),
    ("softmax f32 64 x 262144", "float32", 64, 262144, ""),
    ("log_softmax f32 64 x 262144", "float32", 64, 262144, ""),
    ("softmax f32 16 x 262144", "float32", 16, 262144, ""),
    ("softmax f32 100 x 131072", "float32", 100, 131072, ""),
    ("softmax bf16 64 x 262144", "bfloat16", 64, 262144, ""),
]


def make_fn(name, view):
    import torch

    log = name.startswith("log_softmax")

    def fn(t):
        if view == "head":
            t = t[:, 1:]
        elif view == "tail":
            t = t[:, :-1]
        return torch.log_softmax(t, -1) if log else torch.softmax(t, -1)
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kilnd", help="kilnd binary (default: $KILND, .bundle/kiln/kilnd, bazel-bin/server/kilnd)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--only", action="append", default=[],
                    help="run the cases whose name contains this text (repeatable: any of them), "
                         "e.g. --only '64 x' --only 'x 131072'")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --quick: a smoke run)")
    ap.add_argument("--quick", action="store_true", help="the first 3 cases, 4 rows each, 3 timed calls")
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("softmax_shapes: no CUDA device (--device cpu --quick for a smoke run)", file=sys.stderr)
        return 2
    cases = [(n.replace(f"{r} x", "4 x"), d, 4, c, v) for n, d, r, c, v in CASES[:3]] if args.quick else CASES
    iters = 3 if args.quick else args.iters
    gm.import_kiln()
    import kiln

    kilnd = gm.Kilnd(gm.find_kilnd(args.kilnd), tempfile.mkdtemp(prefix="kiln-softmax-"))
    bad = []
    try:
        print(f"# {gm.device_description(args.device)}")
        print("| case | eager us | Inductor us | kiln us | kiln vs Inductor | kiln vs eager | "
              "GPU us: Inductor / kiln | max error vs fp32: kiln / Inductor |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, dtype, rows, cols, view in cases:
            if args.only and not any(o in name for o in args.only):
                continue
            torch._dynamo.reset()
            torch.manual_seed(0)
            x = torch.randn(rows, cols, device=args.device, dtype=getattr(torch, dtype)) * 3
            fn = make_fn(name, view)
            runs = {"eager": fn, "inductor": torch.compile(fn), "kiln": gm.compile_kiln(fn, kilnd.address)}
            want = fn(x.float())
            err = {k: (f(x).float() - want).abs().max().item() for k, f in runs.items()}
            us = {k: gm.time_calls(lambda f=f: f(x), args.device, iters, warmup=5)[0] * 1e3
                  for k, f in runs.items()}
            gpu = {k: gm.kernel_table(lambda f=runs[k]: f(x), 20)[1] for k in ("inductor", "kiln")} \
                if args.device.startswith("cuda") else {}
            gpu_cell = f"{gpu['inductor']:.0f} / {gpu['kiln']:.0f}" if gpu else "-"
            ulp = torch.finfo(x.dtype).eps * float(want.abs().max())
            if not err["kiln"] <= 2 * err["inductor"] + 4 * ulp:
                bad.append(f"{name}: kiln's error {err['kiln']:.2e} against Inductor's {err['inductor']:.2e}")
            print(f"| {name} | {us['eager']:.0f} | {us['inductor']:.0f} | {us['kiln']:.0f} | "
                  f"{us['inductor'] / us['kiln']:.2f}x | {us['eager'] / us['kiln']:.2f}x | {gpu_cell} | "
                  f"{err['kiln']:.2e} / {err['inductor']:.2e} |", flush=True)
        s = kiln.stats()
        print(f"\nkiln: {s['graphs']} graphs, {s['graph_fallbacks']} ran eagerly, {s['kernel_steps']} kernel steps")
        if s["graph_fallbacks"]:
            bad.append(f"{s['graph_fallbacks']} graphs ran eagerly: {s['fallbacks_by_cause']}")
    finally:
        kilnd.stop()
    for b in bad:
        print("FAIL", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
