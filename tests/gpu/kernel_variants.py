#!/usr/bin/env python3
"""Times hand-edited variants of one generated CUDA kernel, side by side, on the GPU.

When a profile (profile_model.py --bytes) points at a slow kernel, this measures where its time
goes: copy the kernel out of a kilnctl dump (`profile_model.py --sources-out DIR`, or `kilnctl
show KEY --source`), make variants in the same file (a stage left out, loads moved, a helper
changed; each a kernel of its own name), and time them all with the same launch and buffers.
Each kernel runs `--reps` times in two conditions, each time after the other variants:
  warm  back to back (its code and data in L2 from the previous round);
  cold  each launch after a copy of 1 GiB (L2 flushed: code and data come from memory).
Times are CUPTI kernel durations (torch.profiler), medians. An empty kernel in the list gives the
launch's floor (0.8 us warm on the H200). Buffers are random values in [0, 1) (integer buffers:
zeros) of the given types and element counts, in parameter order; scalar parameters are not
supported.

Example (session 28: a ResNet-18 batch norm merge and four variants of it):
  tests/gpu/kernel_variants.py k9.cu --kernels kiln_967d5fd3_9,kiln_B,kiln_C --grid 8 --block 128 \\
      --buffers f32:16384,f32:16384,f32:64,f32:64,f32:64,f32:64,f32:64,f32:64
Needs CuPy (compiles with NVRTC: -std=c++17 -default-device, as kilnd's worker) and torch with CUDA.
"""

import argparse
import statistics
import sys

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "uint16", "i64": "int64", "i32": "int32", "u8": "uint8"}


def parse_buffers(spec):
    """[(cupy dtype name, element count)] of "f32:16384,bf16:64,...": dtype names as DTYPES' keys
    (bf16 buffers hold 16-bit patterns, as generated kernels read them)."""
    out = []
    for item in spec.split(","):
        name, sep, count = item.strip().partition(":")
        if not sep or name not in DTYPES or not count.isdigit() or int(count) <= 0:
            raise ValueError(f"buffer {item!r}: want TYPE:COUNT with TYPE one of {', '.join(DTYPES)} "
                             f"and COUNT > 0")
        out.append((DTYPES[name], int(count)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a .cu file of kernels (kiln's helpers included, as in a dump)")
    p.add_argument("--kernels", required=True, help="comma-separated kernel names to time")
    p.add_argument("--grid", type=int, required=True)
    p.add_argument("--block", type=int, required=True)
    p.add_argument("--buffers", required=True, help="TYPE:COUNT per pointer parameter, in order")
    p.add_argument("--reps", type=int, default=100)
    args = p.parse_args(argv)
    try:
        buffers = parse_buffers(args.buffers)
    except ValueError as e:
        p.error(str(e))

    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile

    mod = cp.RawModule(code=open(args.source).read(), options=("-std=c++17", "-default-device"))
    names = args.kernels.split(",")
    fns = {n: mod.get_function(n) for n in names}
    rng = cp.random.default_rng(0)
    bufs = []
    for dtype, count in buffers:
        if dtype == "uint16":  # bf16 patterns of values in [0, 1)
            bufs.append((rng.random(count, dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16))
        elif dtype.startswith("float"):
            bufs.append(rng.random(count, dtype=cp.float32).astype(dtype))
        else:
            bufs.append(cp.zeros(count, dtype=dtype))
    flush_src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    flush_dst = torch.empty_like(flush_src)

    def rounds(cold, reps):
        for _ in range(reps):
            for n in names:
                if cold:
                    flush_dst.copy_(flush_src)
                fns[n]((args.grid,), (args.block,), tuple(bufs))

    rows = {}
    for mode in ("warm", "cold"):
        rounds(mode == "cold", 3)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            rounds(mode == "cold", args.reps)
            torch.cuda.synchronize()
        times = {}
        for e in prof.events():
            if e.device_type.name == "CUDA" and e.name in fns:
                times.setdefault(e.name, []).append(e.device_time)
        for n in names:
            rows.setdefault(n, {})[mode] = statistics.median(times[n]) if n in times else float("nan")
    print(f"{args.source}: grid {args.grid} x block {args.block}, {args.reps} launches each, median us (CUPTI)")
    print("| kernel | warm us | cold us (L2 flushed) |")
    print("| --- | --- | --- |")
    for n in names:
        print(f"| {n} | {rows[n]['warm']:.2f} | {rows[n]['cold']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
