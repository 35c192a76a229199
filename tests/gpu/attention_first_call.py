"""What the first F.scaled_dot_product_attention call of a process costs, against later calls:
the measurement behind kiln.prewarm warming attention steps at any size
(docs/benchmarks-gpu-sessions.md, session 19). Plain torch on a CUDA GPU; kiln is not involved.

Each mode runs in a new process (run the script once per mode and repeat it: the very first run
on a machine also reads the libraries from disk). CUDA and cuBLAS are brought up first (a matrix
multiply), so the figures are attention's own one-time work: CUDA loading its kernels.

  python3 tests/gpu/attention_first_call.py big-only
  python3 tests/gpu/attention_first_call.py small-first

big-only: the 2048-query attention's first and second forward, then forward and backward.
small-first: the same, each after a first call with 128 queries (does a small warm-up cover it?).
"""

import argparse
import time

import torch
import torch.nn.functional as F


def timed_ms(batch, heads, length, dim, backward):
    q = torch.randn(batch, heads, length, dim, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    torch.cuda.synchronize()
    start = time.perf_counter()
    y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    if backward:
        y.sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["big-only", "small-first"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--length", type=int, default=2048, help="queries and keys of the big call")
    parser.add_argument("--small-length", type=int, default=128)
    parser.add_argument("--dim", type=int, default=64)
    a = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    x = torch.randn(1024, 1024, device="cuda")
    (x @ x).sum().item()  # CUDA context and cuBLAS up
    shape = (a.batch, a.heads)
    rows = []
    for backward in (False, True):
        what = "forward and backward" if backward else "forward"
        if a.mode == "small-first":
            rows.append((f"{what}, {a.small_length} queries, first", timed_ms(*shape, a.small_length, a.dim, backward)))
        rows.append((f"{what}, {a.length} queries, first", timed_ms(*shape, a.length, a.dim, backward)))
        rows.append((f"{what}, {a.length} queries, second", timed_ms(*shape, a.length, a.dim, backward)))
    flops = 4.0 * a.batch * a.heads * a.length * a.length * a.dim
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 causal attention "
          f"{a.batch} x {a.heads} x {a.length} x {a.dim} ({flops / 1e9:.0f} GFLOP forward, unmasked count); mode {a.mode}")
    for name, ms in rows:
        print(f"  {name:<48} {ms:9.2f} ms")


if __name__ == "__main__":
    main()
