#!/usr/bin/env python3
"""Registers and spills of kilnd's generated CUDA kernels, without a GPU.

Compiles every source of a cache entry (`kilnctl show KEY --source`: graph_N.cu sections) with
NVRTC as kilnd's worker does (--std=c++17 -default-device, cubin for --arch) plus ptxas -v, and
prints one row per kernel: its layout and vector width (from the emitter's comment above it), its
block size (__launch_bounds__), the registers ptxas gave each thread, the bytes it spilled to
local memory and the size of its machine code (the cubin's .text section). A spill in a
memory-bound kernel costs bandwidth: use it after changing the emitter to see that no kernel of a
real graph spills (kiln.precompile or a training run fills the cache). Code size matters for
kernels that run a few microseconds: on the H200 their time followed it
(docs/benchmarks-gpu-sessions.md, session 27: 7.3 us at 103 KB, 4.2 us at 16 KB for the same batch
norm merge).

Examples:
  kilnctl --server=ADDR show KEY --source > dump.txt; scripts/cuda_registers.py dump.txt
  scripts/cuda_registers.py --server=127.0.0.1:7878 KEY --layout column --spills-only
  scripts/cuda_registers.py dump.txt --sort code        (the largest kernels first)
Exit status: 0; 1 when --fail-on-spill and a listed kernel spills; 2 when a source does not compile.
"""

import argparse
import ctypes
import glob
import os
import re
import struct
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import gpu_models as gm  # noqa: E402


def find_nvrtc(explicit):
    """The NVRTC library: --nvrtc, else the one kilnd's checks use (gpu_models.find_nvrtc:
    $KILN_NVRTC_PATH, torch's nvidia wheels), else the CUDA toolkit's."""
    found = explicit or gm.find_nvrtc()
    if found:
        return found
    toolkit = sorted(p for p in glob.glob("/usr/local/cuda/lib64/libnvrtc.so.*") if "builtins" not in p)
    return toolkit[0] if toolkit else None


def load_nvrtc(path):
    # NVRTC opens its builtins library by name: load the one beside it first (RTLD_GLOBAL), so that
    # no LD_LIBRARY_PATH is needed.
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
        break
    return ctypes.CDLL(path)


def compile_log(lib, name, source, arch):
    """NVRTC's result code, its log of compiling `source` for `arch` with ptxas -v, and the cubin
    (b"" when the compile failed)."""
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != 0:
        return rc, f"nvrtcCreateProgram failed ({rc})", b""
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-default-device", b"--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    cubin = b""
    if rc == 0 and lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) == 0:
        buf = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(prog, buf) == 0:
            cubin = buf.raw
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace"), cubin


def code_bytes(cubin):
    """{kernel: bytes of its machine code}: the sizes of the cubin's `.text.<kernel>` sections (a
    64-bit little-endian ELF)."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF":
        return {}
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]  # sh_offset of the section-name table
    out = {}
    for h in headers:
        start = names + h[0]
        section = cubin[start:cubin.index(b"\0", start)].decode(errors="replace")
        if section.startswith(".text."):
            out[section[len(".text."):]] = h[5]  # sh_size
    return out


def sources(dump):
    """(name, source) of each `--- source: graph_N.cu ---` section of a kilnctl dump."""
    parts = re.split(r"^--- source: (\S+\.cu) ---$", dump, flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2]):
        yield name, re.split(r"^--- ", body, maxsplit=1, flags=re.M)[0]


def kernels(name, source, log, code=None):
    """One dict per kernel of a compiled source: name, layout, vector width, block, registers, spills,
    and its code's size in bytes (from `code`, code_bytes of the cubin; 0 when unknown)."""
    facts = {}
    for m in re.finditer(r"^// (kiln_\w+): (\w+), .*?vector width (\d+)", source, flags=re.M):
        facts[m.group(1)] = {"layout": m.group(2), "width": int(m.group(3))}
    for m in re.finditer(r"__launch_bounds__\((\d+)[^)]*\)\s+(kiln_\w+)\(", source):
        facts.setdefault(m.group(2), {})["block"] = int(m.group(1))
    current, spill = None, (0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current, spill = m.group(1), (0, 0)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            f = facts.get(current, {})
            yield {"kernel": current, "source": name, "layout": f.get("layout", "?"), "width": f.get("width", 0),
                   "block": f.get("block", 0), "registers": int(m.group(1)), "spill_stores": spill[0],
                   "spill_loads": spill[1], "code": (code or {}).get(current, 0)}
            current = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", help="a `kilnctl show KEY --source` dump file, or with --server a cache key")
    ap.add_argument("--server", help="fetch KEY's sources from this kilnd with kilnctl")
    ap.add_argument("--kilnctl", default=None, help="default: bazel-bin/client/kilnctl/kilnctl, else kilnctl on PATH")
    ap.add_argument("--arch", default="sm_90", help="the cubin's target (default sm_90)")
    ap.add_argument("--nvrtc", default=None, help="libnvrtc.so path (default: KILN_NVRTC_PATH, torch's nvidia wheel, /usr/local/cuda)")
    ap.add_argument("--layout", default=None, help="only kernels of this layout (column, pointwise, warp_per_row, ...)")
    ap.add_argument("--spills-only", action="store_true", help="only kernels that spill")
    ap.add_argument("--fail-on-spill", action="store_true", help="exit 1 when a listed kernel spills")
    ap.add_argument("--sort", choices=["source", "code"], default="source",
                    help="row order: by source and kernel (default), or largest code first")
    args = ap.parse_args()

    if args.server:
        kilnctl = args.kilnctl or os.path.join(REPO, "bazel-bin/client/kilnctl/kilnctl")
        if not os.access(kilnctl, os.X_OK):
            kilnctl = "kilnctl"
        shown = subprocess.run([kilnctl, f"--server={args.server}", "show", args.what, "--source"],
                               capture_output=True, text=True, timeout=120)
        if shown.returncode != 0:
            sys.exit(f"cuda_registers: kilnctl show failed: {shown.stderr.strip()}")
        dump = shown.stdout
    else:
        with open(args.what) as f:
            dump = f.read()
    path = find_nvrtc(args.nvrtc)
    if path is None:
        sys.exit("cuda_registers: no NVRTC found (pass --nvrtc or set KILN_NVRTC_PATH; "
                 "`pip install nvidia-cuda-nvrtc` provides one)")
    lib = load_nvrtc(path)
    rows, failed = [], 0
    listed = list(sources(dump))
    if not listed:
        sys.exit("cuda_registers: no `--- source: graph_N.cu ---` sections (was the entry compiled with "
                 "keep_source, e.g. the client option debug=True?)")
    for i, (name, source) in enumerate(listed):
        print(f"[{i + 1}/{len(listed)}] {name}: NVRTC {args.arch}...", file=sys.stderr, flush=True)
        rc, log, cubin = compile_log(lib, name, source, args.arch)
        if rc != 0:
            failed += 1
            print(f"{name}: NVRTC failed ({rc}):\n{log[:4000]}", file=sys.stderr)
            continue
        rows += list(kernels(name, source, log, code_bytes(cubin)))
    if args.layout:
        rows = [r for r in rows if r["layout"] == args.layout]
    spilling = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    shown_rows = spilling if args.spills_only else rows
    print("| kernel | source | layout | vector width | block | registers | spill stores / loads (bytes) | code KB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    order = (lambda r: -r["code"]) if args.sort == "code" else (lambda r: (r["source"], r["kernel"]))
    for r in sorted(shown_rows, key=order):
        print(f"| {r['kernel']} | {r['source']} | {r['layout']} | {r['width']} | {r['block']} | {r['registers']} | "
              f"{r['spill_stores']} / {r['spill_loads']} | {r['code'] / 1024:.1f} |")
    print(f"\n{len(rows)} kernels, {len(spilling)} spill, {sum(r['code'] for r in rows) / 1024:.0f} KB of code "
          f"(largest {max((r['code'] for r in rows), default=0) / 1024:.1f} KB); NVRTC {path}", file=sys.stderr)
    if failed:
        sys.exit(2)
    sys.exit(1 if args.fail_on_spill and spilling else 0)


if __name__ == "__main__":
    main()
