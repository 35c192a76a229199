#!/usr/bin/env python3
"""PyTorch's own OpInfo sample inputs through kilnd, for every op kiln compiles.

  KILND=/tmp/kilnd-corpus .venv/bin/python scripts/opinfo_check.py [--samples=6] [--ops=add,mul] [-v]

Each sample (torch.testing._internal.common_methods_invocations.op_db, CPU; float32, and float64 /
bfloat16 / int64 where the OpInfo supports them) is captured as an aten graph (make_fx, fake
tensors), compiled by a kilnd started here (or --server), run through kiln's executor and compared
with the same graph run eagerly (tests/python/corpus_util.py: per-dtype tolerances, NaN positions
must match). Prints a per-op table and the pass rate: samples passed / attempted. Samples whose
plan ran an op by torch (an op fallback) are counted separately; samples that make_fx cannot capture
or whose result has no tensor are skipped (not attempted). Exit status 1 when any sample fails.
"""
import argparse
import collections
import concurrent.futures
import os
import pathlib
import sys
import time
import warnings

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

from corpus_util import OK_SOURCES, compare, plan_counts, request_for, run_plan, upcast  # noqa: E402

# OpInfo names (name or name.variant_test_name) of the ops kiln lowers or runs as extern steps.
OPS = """
neg abs exp exp2 expm1 log log1p log2 sqrt rsqrt reciprocal sin cos tanh sigmoid erf nn.functional.relu
nn.functional.silu floor ceil round trunc sign bitwise_not isnan isinf logical_not
add sub rsub mul div.no_rounding_mode div.trunc_rounding div.floor_rounding true_divide pow maximum minimum
remainder fmod floor_divide eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or
bitwise_xor where masked_fill clamp clamp_min clamp_max nn.functional.hardtanh nn.functional.leaky_relu
nn.functional.gelu addcmul addcdiv lerp clone zeros_like ones_like full_like new_full new_zeros new_ones
sum mean prod amax amin max.reduction_no_dim max.reduction_with_dim min.reduction_no_dim
min.reduction_with_dim argmax argmin any all var std var_mean softmax log_softmax nn.functional.layer_norm
nn.functional.batch_norm cat stack constant_pad_nd tril triu mm bmm addmm nn.functional.conv2d
permute transpose t expand view reshape squeeze unsqueeze narrow select split unbind as_strided
index_select gather nn.functional.embedding cumsum repeat slice_scatter select_scatter nn.functional.mse_loss
""".split()
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64)


def opinfo_name(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def capture(op, sample):
    """(graph module, flat tensor inputs) for one sample, or None when it cannot be captured."""
    tree = (sample.input, sample.args, sample.kwargs)
    leaves, spec = pytree.tree_flatten(tree)
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    tensors = [leaves[i] for i in where]

    def fn(*ts):
        items = list(leaves)
        for i, t in zip(where, ts):
            items[i] = t
        inp, args, kwargs = pytree.tree_unflatten(items, spec)
        return op.op(inp, *args, **kwargs)

    gm = make_fx(fn, tracing_mode="fake")(*tensors)
    return gm, tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=6, help="samples per op and dtype")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all of OPS)")
    ap.add_argument("--server", default="", help="a running kilnd (default: start one)")
    ap.add_argument("-v", action="store_true", help="print every failure")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    from kiln.rpc import KilnClient

    wanted = a.ops.split(",") if a.ops else OPS
    infos = [op for op in op_db if opinfo_name(op) in wanted]
    missing = sorted(set(wanted) - {opinfo_name(op) for op in infos})
    server = None
    if not a.server:
        from kilnd_server import Kilnd

        server = Kilnd(f"--compile_workers={max(2, os.cpu_count() or 2)}")
    address = a.server or server.address
    stats = collections.defaultdict(collections.Counter)
    failures = []
    try:
        with KilnClient(address) as client, concurrent.futures.ThreadPoolExecutor(4) as pool:
            jobs = []
            start = time.time()
            for op in infos:
                name = opinfo_name(op)
                for dtype in DTYPES:
                    if dtype not in op.supported_dtypes("cpu"):
                        continue
                    try:
                        samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:a.samples]
                    except Exception:
                        continue
                    for k, sample in enumerate(samples):
                        try:
                            gm, tensors = capture(op, sample)
                            request = request_for(gm, f"opinfo {name} {dtype} #{k}")
                        except Exception:
                            stats[name]["skipped"] += 1
                            continue
                        future = pool.submit(client.compile, request, timeout=300)
                        jobs.append((name, dtype, k, gm, tensors, request, future))
            captured = time.time()
            for name, dtype, k, gm, tensors, request, future in jobs:
                where = f"{name} {str(dtype)[6:]} #{k}"
                try:
                    want = gm(*[t.clone() for t in tensors])
                except Exception:
                    stats[name]["skipped"] += 1
                    continue
                if not any(isinstance(w, torch.Tensor) for w in pytree.tree_leaves(want)):
                    stats[name]["skipped"] += 1
                    continue
                s = stats[name]
                s["attempted"] += 1
                try:
                    response = future.result()
                    assert response.source in OK_SOURCES, f"source {response.source}"
                    _, _, fallbacks, _ = plan_counts(response.artifact.plan)
                    got = run_plan(response, request, [t.clone() for t in tensors])
                    wide = upcast(tensors)
                    compare(got, want, where, gold=(lambda: gm(*wide)) if wide is not None else None)
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    s["failed"] += 1
                    text = e.details() if hasattr(e, "details") else str(e)
                    failures.append(f"{where}: {type(e).__name__}: {' '.join(text.split())[:400]}")
                    continue
                s["passed"] += 1
                if fallbacks:
                    s["fell back"] += 1
        print(f"captured {len(jobs)} graphs in {captured - start:.0f} s; compiled and ran them in "
              f"{time.time() - captured:.0f} s more")
    finally:
        if server is not None:
            server.stop()
    print(f"{'op':34} {'attempted':>9} {'passed':>7} {'failed':>7} {'fell back':>9} {'skipped':>8}")
    total = collections.Counter()
    for name in sorted(stats):
        s = stats[name]
        total.update(s)
        print(f"{name:34} {s['attempted']:9} {s['passed']:7} {s['failed']:7} {s['fell back']:9} {s['skipped']:8}")
    if missing:
        print("no OpInfo entry: " + ", ".join(missing))
    shown = failures if a.v else failures[:40]
    for f in shown:
        print("FAIL " + f)
    if len(shown) < len(failures):
        print(f"... {len(failures) - len(shown)} more failures (-v shows all)")
    rate = 100.0 * total["passed"] / max(total["attempted"], 1)
    print(f"\nOpInfo pass rate: {total['passed']}/{total['attempted']} samples ({rate:.1f}%) over {len(stats)} ops; "
          f"{total['fell back']} passing samples had op fallbacks; {total['skipped']} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
