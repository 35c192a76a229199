#!/usr/bin/env python3
"""Per-call host overhead of kiln's plan executor: tiny inputs, so that the time is the client's.

Each model runs at a size where its kernels take next to nothing (ResNet-50's structure with 4
channels where it has 64, "resnet50n", at B1 3x32x32; a GPT block at B1 T8 d32; a small MLP; and on
request the real "resnet50" at B1 3x32x32, whose convolutions dominate on a CPU), compiled with torch.compile(backend="kiln") against a kilnd
started here, and eagerly. Prints one row per model: the plan's steps per call (kernel + aten), the
median eager and kiln microseconds per call, and kiln's microseconds per step (call / steps).

  .venv/bin/python scripts/bench_overhead.py --kilnd /tmp/kilnd            # CPU
  python scripts/bench_overhead.py --device cuda --dtype bf16               # GPU machine

CPU: perf_counter around each call. CUDA: the median of per-call wall times with one synchronize
after each batch of `--batch` calls (the host time per call when the host is the bottleneck, which
it is at these sizes); --sync-each synchronizes after every call instead.
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))

import gpu_models as gm  # noqa: E402

MODELS = ["resnet50n", "gpt", "mlp"]


def narrow_resnet50(width=4):
    """ResNet-50's structure (bottlenecks [3, 4, 6, 3], BatchNorm, downsample branches) with
    `width` channels where torchvision has 64: the same plan steps, next to no arithmetic."""
    import torch.nn as nn

    def bn(c):
        return nn.BatchNorm2d(c)

    class Bottleneck(nn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), bn(planes)
            self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), bn(planes)
            self.conv3, self.bn3 = nn.Conv2d(planes, planes * 4, 1, bias=False), bn(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != planes * 4:
                self.downsample = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False), bn(planes * 4))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), bn(width), nn.ReLU(inplace=True),
                                      nn.MaxPool2d(3, 2, 1))
            layers, cin = [], width
            for i, n in enumerate([3, 4, 6, 3]):
                planes = width << i
                for j in range(n):
                    layers.append(Bottleneck(cin, planes, 2 if i and not j else 1))
                    cin = planes * 4
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, 10)

        def forward(self, x):
            return self.fc(self.layers(self.stem(x)).mean((2, 3)))

    return Net()


def build(name, device):
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    if name == "resnet50":  # real widths: for GPUs (its convolutions dominate on a CPU)
        model, inputs = gm.build_resnet(50), [torch.randn(1, 3, 32, 32)]
    elif name == "resnet50n":
        model, inputs = narrow_resnet50(), [torch.randn(1, 3, 32, 32)]
    elif name == "gpt":
        model, inputs = gm.build_gpt_block(32, 2, 8, sdpa=False), [torch.randn(1, 8, 32)]
    elif name == "mlp":
        model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(),
                              nn.Linear(32, 8))
        inputs = [torch.randn(4, 16)]
    else:
        raise ValueError(name)
    return model.to(device).eval(), [t.to(device) for t in inputs]


def plan_steps(exclude):
    """(kernel steps, aten steps) of the plans loaded since `exclude` was taken."""
    kernel = aten = 0
    for g in gm._compiled_graphs():
        if id(g) in exclude:
            continue
        for spec in g.specs:
            plan = gm._plan_of(spec)
            for step in plan.steps if plan is not None else ():
                kind = step.WhichOneof("kind")
                kernel += kind == "kernel"
                aten += kind == "aten"
    return kernel, aten


def time_us(fn, device, iters, batch, sync_each):
    import torch

    cuda = device.startswith("cuda")
    for _ in range(max(5, iters // 20)):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    if not cuda or sync_each:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    else:
        for _ in range(max(1, iters // batch)):
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / batch)
    return statistics.median(times) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--batch", type=int, default=20, help="CUDA: calls per synchronize")
    ap.add_argument("--sync-each", action="store_true")
    ap.add_argument("--kilnd", default=None)
    ap.add_argument("--cache-dir", default=None, help="kilnd's cache dir (reuse it to skip compiles)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    ap.add_argument("--kiln-option", action="append", default=[], help="KEY=VALUE (e.g. cuda_graphs=1)")
    args = ap.parse_args()

    kiln, where = gm.import_kiln()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    extra = gm.parse_kiln_options(args.kiln_option)
    tmp = tempfile.mkdtemp(prefix="kiln-overhead-")
    server = gm.Kilnd(gm.find_kilnd(args.kilnd), tmp, cache_dir=args.cache_dir)
    print(f"kiln from {where}; torch {torch.__version__}; device {args.device}; {args.dtype}; "
          f"threads {torch.get_num_threads()}; {args.iters} calls")
    rows = []
    try:
        for name in args.models.split(","):
            gm.reset_kiln()
            model, inputs = build(name, args.device)
            ac = (torch.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16)
                  if args.dtype == "bf16" else contextlib.nullcontext())
            before = gm.compiled_graph_ids()
            compiled = gm.compile_kiln(model, server.address, extra=extra)
            with torch.inference_mode(), ac, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expect = model(*inputs)
                got = compiled(*inputs)
                err = (got.float() - expect.float()).abs().max().item()
                s = kiln.stats()
                kernel, aten = plan_steps(before)
                steps = kernel + aten
                eager_us = time_us(lambda: model(*inputs), args.device, args.iters, args.batch, args.sync_each)
                kiln_us = time_us(lambda: compiled(*inputs), args.device, args.iters, args.batch,
                                  args.sync_each)
            note = "" if not s["graph_fallbacks"] else f" (graph fallbacks {s['fallbacks_by_cause']})"
            rows.append([name, f"{steps} ({kernel}k+{aten}a)", f"{eager_us:.0f}", f"{kiln_us:.0f}",
                         f"{kiln_us / steps:.2f}" if steps else "-", f"{err:.1e}{note}"])
            print(f"  {name}: done", file=sys.stderr)
    finally:
        server.stop()
    gm.table(["model", "steps", "eager us/call", "kiln us/call", "kiln us/step", "max |err|"], rows)


if __name__ == "__main__":
    main()
