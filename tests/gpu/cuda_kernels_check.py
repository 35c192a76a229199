#!/usr/bin/env python3
"""GPU check of kiln's CUDA kernels: correctness against torch and bandwidth against the device.

Runs on a machine with an NVIDIA GPU, torch (CUDA) and g++, without Bazel:

    python3 tests/gpu/cuda_kernels_check.py --cubins DIR [--iters 50] [--no-compile] [--only NAME]

DIR is what `bazel run //server/codegen:emit_cuda_fixtures -- DIR` wrote on a build machine:
manifest.json, kernels_<arch>.cubin and kernels.cu. The script builds the runtime with g++
(runtime/build.sh, the same command the Python client uses), loads the cubin through the
runtime's C API (runtime/kiln_cuda.h) with ctypes, runs every kernel of the manifest on random
torch CUDA tensors on torch's current stream, compares with torch at the tolerances in
TOLERANCES, and times each with CUDA events (median of --iters runs, after warm-up) next to torch
eager and torch.compile (Inductor) for the same op. Bandwidth is the ideal traffic (every buffer
read or written once) over the time, and is compared with a measured device-to-device copy.

Exit status: 0 when every kernel matches torch, 1 when one does not or fails to run, 2 when the
setup fails (no GPU, no manifest, runtime does not build or load).
"""

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_models as gm  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (rtol, atol) per op: fp32 math in a different order than torch's (tree reductions, Welford,
# online softmax), bf16 output rounding for the bf16 chain.
TOLERANCES = {
    "add": (0.0, 0.0),
    "bf16_chain": (1e-2, 1e-2),
    "broadcast_add_transposed": (0.0, 0.0),
    "softmax": (1e-5, 1e-6),
    "log_softmax": (1e-5, 1e-5),
    "layer_norm": (1e-4, 1e-4),
    "column_sum": (1e-4, 1e-2),
    "row_sum": (1e-4, 1e-2),
    "layer_norm_out": (2e-2, 2e-2),
    "rms_norm": (1e-4, 1e-4),
    "add_transposed_rhs": (0.0, 0.0),
    "cat_transposed": (0.0, 0.0),
}
# bf16 outputs: one rounding step of bf16 whatever the op.
BF16_TOLERANCE = (1.6e-2, 1e-2)

KILN_OK = 0


def die(message):
    print(f"cuda_kernels_check: {message}", file=sys.stderr)
    sys.exit(2)


class Launch(ctypes.Structure):
    _fields_ = [
        ("kernel", ctypes.c_int32),
        ("grid_x", ctypes.c_uint32),
        ("block_x", ctypes.c_uint32),
        ("shared_bytes", ctypes.c_uint32),
        ("num_buffers", ctypes.c_int32),
        ("num_scalars", ctypes.c_int32),
        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
        ("scalars", ctypes.POINTER(ctypes.c_int64)),
    ]


class Runtime:
    """ctypes bindings for runtime/kiln_cuda.h."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        lib = self.lib
        lib.kiln_cuda_last_error.restype = ctypes.c_char_p
        lib.kiln_cuda_init.restype = ctypes.c_int
        lib.kiln_cuda_driver_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.kiln_cuda_module_load.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_void_p)]
        lib.kiln_cuda_module_add_kernel.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                    ctypes.POINTER(ctypes.c_int32)]
        lib.kiln_cuda_run_launches.argtypes = [ctypes.c_void_p, ctypes.POINTER(Launch),
                                               ctypes.c_int32, ctypes.c_void_p]
        lib.kiln_cuda_stream_synchronize.argtypes = [ctypes.c_void_p]
        lib.kiln_cuda_module_unload.argtypes = [ctypes.c_void_p]

    def check(self, rc, what):
        if rc != KILN_OK:
            raise RuntimeError(f"{what}: error {rc}: {self.lib.kiln_cuda_last_error().decode()}")

    def driver_version(self):
        v = ctypes.c_int(0)
        self.check(self.lib.kiln_cuda_driver_version(ctypes.byref(v)), "kiln_cuda_driver_version")
        return v.value

    def load(self, data, device):
        module = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(data, len(data))
        self.check(self.lib.kiln_cuda_module_load(buf, len(data), device, ctypes.byref(module)),
                   "kiln_cuda_module_load")
        return module

    def add_kernel(self, module, symbol):
        index = ctypes.c_int32(-1)
        self.check(self.lib.kiln_cuda_module_add_kernel(module, symbol.encode(), ctypes.byref(index)),
                   f"kiln_cuda_module_add_kernel({symbol})")
        return index.value


def build_runtime(out_dir):
    out = os.path.join(out_dir, "libkiln_runtime.so")
    script = os.path.join(REPO, "runtime", "build.sh")
    r = subprocess.run(["sh", script, out], capture_output=True, text=True)
    if r.returncode != 0:
        die(f"runtime/build.sh failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return out


def cuda_time_ms(torch, fn, iters, warmup=3):
    """Median GPU time of fn() in ms: events around each call, enqueued back to back."""
    return gm.time_calls(fn, "cuda", iters, warmup)[0]


def torch_op(torch, spec):
    """(reference function of the inputs returning the outputs, list of output dtypes)."""
    F = torch.nn.functional
    op = spec["op"]
    if op == "add":
        return lambda a, b: (a + b,)
    if op == "bf16_chain":
        return lambda a, b: ((F.silu(a.float() * b.float()) + 1).bfloat16(),)
    if op == "broadcast_add_transposed":
        return lambda a, b: (a.t() + b,)
    if op == "softmax":
        return lambda x: (torch.softmax(x, -1),)
    if op == "log_softmax":
        return lambda x: (torch.log_softmax(x, -1),)
    if op == "layer_norm":
        eps = spec["eps"]

        def ln(x, w, b):
            out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, eps)
            return out, mean.reshape(-1), rstd.reshape(-1)
        return ln
    if op == "column_sum":
        return lambda x: (x.sum(0),)
    if op == "row_sum":  # bf16: summed in fp32, rounded once (as torch)
        return lambda x: (x.sum(-1),)
    if op == "layer_norm_out":
        eps = spec["eps"]
        return lambda x, w, b: (torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps),)
    if op == "rms_norm":  # bf16: LLaMA's (statistics in fp32, scale in bf16)
        eps = spec["eps"]

        def rms(x, w):
            xf = x.float()
            return ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w,)
        return rms
    if op == "add_transposed_rhs":  # a.t() + b stored column-major, read back row-major
        return lambda a, b: (a + b.t(),)
    if op == "cat_transposed":  # q, k, v gradients into a fused projection's (k transposed)
        return lambda q, k, v: (torch.cat([q, k.transpose(1, 2), v], -1),)
    raise ValueError(f"unknown op {op}")


def layout_of(spec):
    """The layout, with the blocks per thread-block cluster when there is one ("cluster_row x4") and
    the dynamic shared memory when there is some ("shared_row 104K")."""
    layout = spec.get("layout", "?")
    if spec.get("cluster", 1) > 1:
        layout = f"{layout} x{spec['cluster']}"
    if spec.get("shared_bytes", 0) > 0:
        layout = f"{layout} {spec['shared_bytes'] // 1024}K"
    return layout


def make_inputs(torch, spec, gen):
    tensors = []
    for b in spec["buffers"]:
        dtype = getattr(torch, b["dtype"])
        if b["role"] == "in":
            t = torch.randn(b["shape"], device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        else:
            t = torch.full(b["shape"], float("nan"), device="cuda", dtype=dtype)
        tensors.append(t)
    return tensors


def compare(torch, name, got, want, rtol, atol):
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    g, w = got.float(), want.float()
    bad = ~torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    n = int(bad.sum())
    if n == 0:
        return None
    idx = int(bad.flatten().nonzero()[0])
    diff = (g - w).abs()
    return (f"{name}: {n} of {g.numel()} elements differ (max abs diff {float(diff[~diff.isnan()].max()) if (~diff.isnan()).any() else float('nan'):.3g}; "
            f"first at flat index {idx}: got {float(g.flatten()[idx])!r}, want {float(w.flatten()[idx])!r})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cubins", required=True, help="directory with manifest.json and the cubin")
    parser.add_argument("--iters", type=int, default=50, help="timed runs per kernel (median)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile timings")
    parser.add_argument("--only", action="append", default=[], help="run only this kernel (repeatable)")
    parser.add_argument("--runtime-lib", help="use this libkiln_runtime.so instead of building one")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()

    try:
        import torch
    except ImportError as e:
        die(f"torch is not importable: {e}")
    if not torch.cuda.is_available():
        die("torch sees no CUDA device")
    manifest_path = os.path.join(args.cubins, "manifest.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
        with open(os.path.join(args.cubins, manifest["cubin"]), "rb") as f:
            cubin = f.read()
    except (OSError, ValueError, KeyError) as e:
        die(f"cannot read the fixtures in {args.cubins}: {e}")

    torch.cuda.set_device(args.device)
    torch.cuda.init()
    torch.empty(1, device="cuda")  # torch's primary context is now current on this thread
    props = torch.cuda.get_device_properties(args.device)
    tmp = tempfile.mkdtemp(prefix="kiln-gpu-check-")
    lib_path = args.runtime_lib or build_runtime(tmp)
    try:
        rt = Runtime(lib_path)
        rt.check(rt.lib.kiln_cuda_init(), "kiln_cuda_init")
        module = rt.load(cubin, args.device)
    except (OSError, RuntimeError) as e:
        die(str(e))
    print(f"device: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs), "
          f"driver CUDA {rt.driver_version()}, torch {torch.__version__}, cubin {manifest['cubin']} "
          f"({len(cubin)} bytes)")
    cap = f"sm_{props.major}{props.minor}"
    if manifest.get("arch") and manifest["arch"] != cap:
        print(f"WARNING: the cubin is for {manifest['arch']}, the device is {cap}")

    # The ceiling: a device-to-device copy of 1 GiB (reads and writes count).
    src = torch.empty(1 << 28, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_ms = cuda_time_ms(torch, lambda: dst.copy_(src), args.iters)
    copy_tbs = 2 * src.numel() * 4 / (copy_ms * 1e-3) / 1e12
    del src, dst
    print(f"device-to-device copy: {copy_tbs:.2f} TB/s (1 GiB, median of {args.iters})\n")

    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    rows = []
    failures = 0
    for spec in manifest["kernels"]:
        name = spec["name"]
        if args.only and name not in args.only:
            continue
        try:
            index = rt.add_kernel(module, spec["symbol"])
            tensors = make_inputs(torch, spec, gen)
            inputs = [t for t, b in zip(tensors, spec["buffers"]) if b["role"] == "in"]
            outputs = [t for t, b in zip(tensors, spec["buffers"]) if b["role"] == "out"]
            ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
            scalars = (ctypes.c_int64 * max(1, len(spec["scalars"])))(*spec["scalars"])
            launch = Launch(index, spec["grid"], spec["block"], spec["shared_bytes"], len(tensors),
                            len(spec["scalars"]), ptrs, scalars)

            def run_kiln():
                rc = rt.lib.kiln_cuda_run_launches(module, ctypes.byref(launch), 1, stream)
                if rc != KILN_OK:
                    raise RuntimeError(f"kiln_cuda_run_launches: {rt.lib.kiln_cuda_last_error().decode()}")

            run_kiln()
            rt.check(rt.lib.kiln_cuda_stream_synchronize(stream), "kiln_cuda_stream_synchronize")
            ref = torch_op(torch, spec)
            want = ref(*inputs)
            rtol, atol = TOLERANCES[spec["op"]]
            if any(b["dtype"] == "bfloat16" for b in spec["buffers"] if b["role"] == "out"):
                rtol, atol = max(rtol, BF16_TOLERANCE[0]), max(atol, BF16_TOLERANCE[1])
            errors = [e for e in (compare(torch, f"{name} output {i}", g, w, rtol, atol)
                                  for i, (g, w) in enumerate(zip(outputs, want))) if e]
            ok = not errors
            for e in errors:
                print("MISMATCH", e)
            failures += 0 if ok else 1
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            kiln_ms = cuda_time_ms(torch, run_kiln, args.iters)
            eager_ms = cuda_time_ms(torch, lambda: ref(*inputs), args.iters)
            compiled_ms = None
            if not args.no_compile:
                try:
                    compiled = torch.compile(ref, dynamic=False)
                    compiled(*inputs)
                    compiled_ms = cuda_time_ms(torch, lambda: compiled(*inputs), args.iters)
                except Exception as e:  # Inductor may be unavailable: report, keep going
                    print(f"{name}: torch.compile failed: {type(e).__name__}: {str(e)[:200]}")
            tbs = nbytes / (kiln_ms * 1e-3) / 1e12
            rows.append((name, layout_of(spec), spec.get("vector_width", 1), nbytes / 1e9, kiln_ms, tbs,
                         100 * tbs / copy_tbs, eager_ms, compiled_ms, "ok" if ok else "MISMATCH"))
            del tensors, inputs, outputs, want
            torch.cuda.empty_cache()
        except Exception as e:
            failures += 1
            print(f"FAILED {name}: {type(e).__name__}: {e}")
            traceback.print_exc()
            rows.append((name, layout_of(spec), spec.get("vector_width", 1), float("nan"),
                         float("nan"), float("nan"), float("nan"), float("nan"), None, "FAILED"))

    if not rows:
        die(f"no kernel of the manifest matched --only {args.only}")
    header = ("kernel", "layout", "vec", "GB", "kiln ms", "TB/s", "% copy", "eager ms", "compile ms",
              "kiln/ind", "result")
    print()
    print("{:<26} {:<14} {:>3} {:>7} {:>9} {:>6} {:>7} {:>9} {:>10} {:>8}  {}".format(*header))
    for (name, layout, vec, gb, kms, tbs, pct, ems, cms, result) in rows:
        speed = f"{cms / kms:.2f}x" if cms and kms and not math.isnan(kms) else "n/a"
        print("{:<26} {:<14} {:>3} {:>7.3f} {:>9.4f} {:>6.2f} {:>6.1f}% {:>9.4f} {:>10} {:>8}  {}".format(
            name, layout, vec, gb, kms, tbs, pct, ems, f"{cms:.4f}" if cms else "n/a", speed, result))
    print(f"\n(kiln/ind > 1: kiln faster than Inductor. GB = every buffer read or written once. "
          f"Copy ceiling {copy_tbs:.2f} TB/s.)")
    rt.check(rt.lib.kiln_cuda_module_unload(module), "kiln_cuda_module_unload")
    if failures:
        print(f"\n{failures} kernel(s) FAILED or MISMATCHED")
        return 1
    print("\nall kernels match torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
