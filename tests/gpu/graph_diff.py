#!/usr/bin/env python3
"""Which compiled graph, and which of its outputs, makes kiln differ from eager on a real model.

    python3 tests/gpu/graph_diff.py [--model resnet18] [--device cuda|cpu] [--mode training|inference]
                                    [--steps 1] [--quick] [--batch N] [--top 20] [--kilnd PATH]
                                    [--defer] [--inference-first]

models_check.py says whether a model matches; this says where it stops matching. The model (from
tests/gpu/gpu_models.py, fp32, TF32 off) runs through torch.compile(backend="kiln"). Every call of a
compiled graph (forward and backward) is also run, on the same inputs, by torch on the graph's own
FX module in fp32 (eager) and in float64 (the reference). Per float output: kiln's relative L2
error against float64 and eager's, and their ratio. Because each graph gets kiln's inputs, an
error shows up in the graph that makes it, not in every graph downstream. The table lists the
outputs with the largest kiln/eager ratio first (outputs whose float64 value is all zeros are
judged by absolute L2 norm).

Read a ratio of a few units as rounding order; a ratio of 100+ on one output is a kernel to look at
(its graph's source: run kilnd with --dump, or KILN_DEBUG=1). Exit status 0 (a report, not a test).
"""

import argparse
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_models as gm  # noqa: E402


def rel_err(x, ref):
    import torch

    d = (x.double() - ref).norm().item()
    n = ref.norm().item()
    return d / n if n > 0 else d, n == 0 or not math.isfinite(n)


def float64_module(gm_):
    """A copy of an FX module whose float32 dtype arguments (full, _to_copy, ...) say float64, so
    that a run on float64 inputs stays float64 throughout."""
    import copy

    import torch

    m = copy.deepcopy(gm_)
    for node in m.graph.nodes:
        if node.kwargs.get("dtype") == torch.float32:
            node.kwargs = {**node.kwargs, "dtype": torch.float64}
        node.args = tuple(torch.float64 if a == torch.float32 else a for a in node.args)
    m.recompile()
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18", choices=gm.MODEL_NAMES)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mode", default="training", choices=["training", "inference"])
    ap.add_argument("--steps", type=int, default=1, help="training steps (or inference calls) to check")
    ap.add_argument("--quick", action="store_true", help="small sizes (tests/gpu/gpu_models.py SIZES)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--top", type=int, default=20, help="rows of the table")
    ap.add_argument("--kilnd", default=None)
    ap.add_argument("--defer", action="store_true",
                    help="clone each call's inputs and outputs on the stream and check them all after the "
                         "run (no synchronization between calls; the check itself otherwise waits for the "
                         "GPU after every call), then run kiln's graph again on the cloned inputs and list "
                         "the outputs that come out different (on CUDA cuDNN's nondeterministic weight-"
                         "gradient algorithms alone differ by ~1e-7..1e-6 relative; far more points at a race)")
    ap.add_argument("--inference-first", action="store_true",
                    help="before a training run, run another instance of the model twice in inference "
                         "through kiln in the same process (unchecked), as models_check.py's child does")
    args = ap.parse_args()

    import torch

    kiln, _ = gm.import_kiln()

    gm.set_fp32_precise()
    records = []  # (graph name, call, output index, shape, kiln err, eager err, zero ref)
    calls = {}
    replays = []  # (label, call, output index, relative L2 difference between kiln's run and its replay)

    def check(graph, inputs, outs):
        """One call's outputs against its FX module in fp32 (eager) and float64; returns (label, call)."""
        label = graph.kind_name + (f" [{graph.session.fn.compile_id}]" if graph.session.fn.compile_id else "")
        n = calls[label] = calls.get(label, 0) + 1
        with torch.no_grad():
            eager = graph.gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in inputs])
            if not hasattr(graph, "_f64"):
                graph._f64 = float64_module(graph.gm)
            ref = graph._f64(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                               for a in inputs])
        eagers = eager if isinstance(eager, (list, tuple)) else [eager]
        refs = ref if isinstance(ref, (list, tuple)) else [ref]
        for i, (k, e, r) in enumerate(zip(outs, eagers, refs)):
            if not isinstance(k, torch.Tensor) or not k.is_floating_point() or not isinstance(r, torch.Tensor):
                continue
            r = r.double()
            ek, zero = rel_err(k, r)
            ee, _ = rel_err(e, r)
            records.append((label, n, i, tuple(k.shape), ek, ee, zero))
        return label, n

    # Without --defer each call is checked as it returns (rel_err waits for the GPU).
    recorder = gm.GraphCallRecorder(on_call=None if args.defer else check)

    with tempfile.TemporaryDirectory(prefix="kiln-graph-diff-") as tmp:
        kilnd = gm.Kilnd(gm.find_kilnd(args.kilnd), tmp)
        try:
            if args.inference_first and args.mode == "training":  # before the check is installed
                first = gm.make_case(args.model, args.quick, args.device, batch=args.batch)
                first.model.eval().requires_grad_(False)
                compiled = gm.compile_kiln(first.model, kilnd.address)
                with torch.no_grad():
                    for _ in range(2):
                        compiled(*first.inputs)
                gm.sync(args.device)
            case = gm.make_case(args.model, args.quick, args.device, batch=args.batch)
            with recorder:
                if args.mode == "training":
                    module = gm.with_loss(case.model, case.loss_fn).train()
                    compiled = gm.compile_kiln(module, kilnd.address)
                    opt = torch.optim.SGD(case.model.parameters(), lr=0.01)
                    for _ in range(args.steps):
                        opt.zero_grad()
                        compiled(*case.inputs).backward()
                        opt.step()
                else:
                    case.model.eval()
                    compiled = gm.compile_kiln(case.model, kilnd.address)
                    with torch.no_grad():
                        for _ in range(args.steps):
                            compiled(*case.inputs)
                gm.sync(args.device)
            for graph, inputs, outs in recorder.records:  # --defer
                label, n = check(graph, inputs, outs)
                for i, (o, r) in enumerate(zip(outs, recorder.replay(graph, inputs))):
                    if isinstance(o, torch.Tensor) and o.is_floating_point():
                        replays.append((label, n, i, rel_err(o, r.double())[0]))
        finally:
            kilnd.stop()

    def ratio(rec):
        ek, ee = rec[4], rec[5]
        return ek / ee if ee > 0 else (math.inf if ek > 0 else 1.0)

    print(f"{args.model} {args.mode} on {args.device}: {len(records)} float outputs checked over "
          f"{sum(calls.values())} graph calls ({', '.join(f'{k} x{v}' for k, v in calls.items())})")
    print()
    print("| graph | call | output | shape | kiln err vs f64 | eager err vs f64 | kiln / eager |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for rec in sorted(records, key=ratio, reverse=True)[:args.top]:
        name, n, i, shape, ek, ee, zero = rec
        print(f"| {name} | {n} | {i} | {'x'.join(map(str, shape)) or 'scalar'} | {ek:.2e}{' (abs)' if zero else ''} "
              f"| {ee:.2e} | {ratio(rec):.3g} |")
    differing = [r for r in replays if r[3] != 0]
    if args.defer:
        print()
        differing.sort(key=lambda r: r[3], reverse=True)
        print(f"replays: {len(replays)} float outputs run again by kiln on the same inputs, {len(differing)} differ"
              + "".join(f"\n  {label} call {n} output {i}: relative L2 difference {d:.3g}"
                        for label, n, i, d in differing[:args.top]))
    worst = max(records, key=lambda r: r[4], default=None)
    if worst:
        print()
        print(f"largest kiln error: {worst[0]} call {worst[1]} output {worst[2]}: {worst[4]:.2e} "
              f"(eager {worst[5]:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
