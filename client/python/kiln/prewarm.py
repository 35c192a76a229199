"""Option prewarm: a CUDA plan loaded without tracing (kiln.compile's packages) runs its
convolutions and other library-backed aten steps (WARM_OPS), and its cuBLASLt GEMM steps
(through kiln's runtime: cuBLASLt opened, each shape's algorithm found and cached, its kernels
loaded), once, on scratch tensors, in background threads (up to MAX_THREADS a graph) while the
process goes on loading.

Why: the first convolution of each kind in a process costs cuDNN's one-time work (its libraries
and kernels loaded into the CUDA context, engines chosen), about 0.3 s for ResNet-50 fp16 on an
H200 (a whole eager forward 0.645 s, then 0.004 s). Most of that work is shared by every thread of
the process: after a forward in another thread, the main thread's first forward took 0.056 s. A
package's graphs are loaded before torch builds the package's guards (3,000 of them for
ResNet-50, about 0.2 s of Python), so the convolutions can warm meanwhile.

The same holds, smaller, for torch's kernels that a plan runs as aten steps (CUDA loads their
modules at first use: a layer norm backward that kilnd had left to torch took 9 ms at its first
call in a training block's first backward).

What runs: each distinct WARM_OPS step of the plan (same op, shapes, strides, dtypes and
constant arguments once) and each distinct library GEMM (same params), with inputs from
torch.empty_strided (never read back) on the device and stream that were current when the graph
loaded, under no_grad. Skipped: steps with symbolic sizes or needing more than MAX_SCRATCH_BYTES
of inputs; matrix multiplies of more than MAX_GEMM_FLOPS (their GPU time, ahead of the first
call's on the same stream, outweighs what warming them saves; attention steps are warmed at any
size, their first call's one-time work being far larger); convolutions under
torch.backends.cudnn.benchmark (its timing runs would compete with the main thread's). Nothing
here can fail a load: a call that raises is counted as an error, logged (logger "kiln", debug
level) and passed over.

No warm-up outlives the kiln.compile call that loaded its package (the call waits for it before
returning; normally it is long done by then): a CUDA graph capture made afterwards, by kiln's
option cuda_graphs (from the second call) or by the caller (torch.cuda.graph's default "global"
mode fails captures while another thread allocates or loads modules), never overlaps one.
Counted in kiln.stats()["prewarm"] and client_time_s["prewarm"]."""

import atexit
import logging
import threading
import time

from kiln import counters as stats_mod

log = logging.getLogger("kiln")

# aten ops whose first call in a process does one-time work worth overlapping (cuDNN's and cuBLAS's
# setup; torch's own kernels, which CUDA loads module by module at first use) and that read their
# tensor inputs as plain numbers only: no indices, so the garbage in a scratch tensor cannot
# address memory (max_pool2d_with_indices_backward, embeddings, gathers... are not here).
WARM_OPS = frozenset({
    "aten.convolution.default",
    "aten._convolution.default",
    "aten.convolution_backward.default",
    "aten.cudnn_convolution.default",
    "aten.native_layer_norm.default",
    "aten.native_layer_norm_backward.default",
    "aten.native_group_norm.default",
    "aten.native_group_norm_backward.default",
    "aten._softmax.default",
    "aten._softmax_backward_data.default",
    "aten._log_softmax.default",
    "aten._log_softmax_backward_data.default",
    "aten.mm.default",
    "aten.addmm.default",
    "aten.bmm.default",
    "aten.baddbmm.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_flash_attention_backward.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_efficient_attention_backward.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_cudnn_attention_backward.default",
})
MAX_SCRATCH_BYTES = 256 << 20  # inputs of one warm call (its outputs and workspace come on top)
# A matrix multiply's one-time work (cuBLASLt's algorithm lookup, its kernels loaded) is well under
# a millisecond, and a warm-up runs on the caller's stream: the first call's own kernels queue
# behind it. A GEMM of more floating-point operations than this (2 x batch x m x n x k) costs the
# first call more GPU time than its warm-up saves (an fp32 8192 x 1024 x 4096 one, 69 GFLOP, takes
# about 1.4 ms of an H200: six of them made a training block's first call 4 ms slower): not warmed.
# Attention steps are warmed whatever their size: their first call's one-time work is far larger
# than their GPU time (H200, bf16 causal flash attention of 8 x 16 x 2048 x 64, 137 GFLOP forward:
# first forward 67-914 ms, then 0.28 ms; forward and backward 159-1289 ms, then 1.3 ms; after a
# warm-up with 128 queries, the 2048-query first forward still took 41-46 ms), by
# tests/gpu/attention_first_call.py.
MAX_GEMM_FLOPS = 8e9
# A graph's warm-ups run on this many threads at most. Most of a warm-up is cuDNN's or cuBLASLt's
# C++ (the GIL released). On one thread ResNet-50 fp16's 25 were still running when its package had
# loaded (0.2-0.3 s): the first call's convolutions and GEMMs took 87-158 ms, against 30-43 ms with
# four threads (H200; the whole warm first call 0.32-0.39 s against 0.25-0.32 s).
MAX_THREADS = 4
_MATMULS = {  # aten op: positions of its two matrix operands (batched or not)
    "aten.mm.default": (0, 1),
    "aten.addmm.default": (1, 2),
    "aten.bmm.default": (0, 1),
    "aten.baddbmm.default": (1, 2),
}

_threads = []
_threads_lock = threading.Lock()


def calls(executor, device):
    """[(op, args, kwargs)] of `executor`'s distinct warmable aten steps, with scratch-tensor specs
    ("t", sizes, strides, dtype, on the CPU) where the plan reads a value (materialize() makes
    them); steps it cannot describe statically are counted as skipped."""
    import torch

    # cudnn.benchmark times candidate algorithms on the GPU: a warm-up timing them beside the
    # main thread's own timing could make either pick a slower one. Convolutions are left alone then.
    benchmark = torch.backends.cudnn.benchmark
    out, seen = [], set()
    for step in getattr(executor, "_steps", ()):
        if step[0] == "library":
            call = _gemm_call(executor, step[1], device)
            key = ("gemm", call[0].args[2:])  # params, alpha, beta
            batch, m, n, k = step[1][2][:4]
            if _scratch_bytes(call[1]) > MAX_SCRATCH_BYTES or 2.0 * batch * m * n * k > MAX_GEMM_FLOPS:
                stats_mod.add_to("prewarm", "skipped")
            elif key not in seen:
                seen.add(key)
                out.append(call)
            continue
        if step[0] != "aten" or str(step[1]) not in WARM_OPS:
            continue
        if benchmark and "convolution" in str(step[1]):
            stats_mod.add_to("prewarm", "skipped")
            continue
        _, op, args, kwargs, _, _ = step
        try:
            a = tuple(_spec(executor, x, device) for x in args)
            kw = tuple((k, _spec(executor, x, device)) for k, x in kwargs.items())
            key = (str(op), repr(a), repr(kw))
        except Exception:
            stats_mod.add_to("prewarm", "skipped")
            continue
        if key in seen:
            continue
        seen.add(key)
        if (_scratch_bytes(a) + _scratch_bytes(tuple(x for _, x in kw)) > MAX_SCRATCH_BYTES
                or _matmul_flops(str(op), a) > MAX_GEMM_FLOPS):
            stats_mod.add_to("prewarm", "skipped")
            continue
        out.append((op, a, dict(kw)))
    return out


def _matmul_flops(op, specs):
    """2 x batch x m x n x k of an aten matrix multiply (`specs`: _spec's of its arguments); 0 for
    any other op."""
    where = _MATMULS.get(op)
    if where is None:
        return 0
    a, b = (specs[i][1] for i in where)  # sizes: (m, k) and (k, n), or (batch, m, k) and (batch, k, n)
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def _gemm_call(executor, spec, device):
    """A calls() entry for one cuBLASLt library step (kiln.executor's spec: where, args, params,
    alpha, beta): scratch D, A, B (and C, workspace) big enough for the params' strides, and the
    GEMM run through kiln's runtime as the plan will run it (its params: gemm_run_params)."""
    import functools

    import torch

    from kiln._exec_kernels import gemm_run_params

    _, args, p, alpha, beta = spec
    dtype = executor._dtypes[args[0]]
    params = gemm_run_params(p)
    batch, m, n, k = p[:4]

    def flat(rows, cols, row_stride, col_stride, batch_stride):  # a 1-D buffer spanning the matrix
        return ("t", ((batch - 1) * batch_stride + (rows - 1) * row_stride + (cols - 1) * col_stride + 1,), (1,),
                dtype, False)

    none = ("c", None)
    specs = (flat(m, n, p[12], 1, p[11]), flat(m, k, p[6], p[7], p[5]), flat(k, n, p[9], p[10], p[8]),
             ("t", (n,), (1,), dtype, False) if p[13] == 1 else flat(m, n, p[15], 1, p[14]) if p[13] == 2 else none,
             ("t", (p[17],), (1,), torch.uint8, False) if p[17] > 0 else none)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (functools.partial(_gemm_warmup, executor, index, tuple(params), alpha, beta), specs, {})


def _gemm_warmup(executor, index, params, alpha, beta, d, a, b, c, workspace):
    """One GEMM of a plan's shape through kiln's runtime (cuBLASLt opened, its handle made, the
    algorithm for these params found and cached, its kernels loaded), on scratch tensors, on the
    current stream. Nothing when the runtime cannot run GEMMs (the plan then uses torch)."""
    import torch

    runtime = executor._cublas()
    if runtime is None:
        return
    call = runtime.gemm_call(index, list(params), alpha, beta)
    for slot, t in enumerate((d, a, b, c, workspace)):
        call.buffers[slot] = t.data_ptr() if t is not None else 0
    call.run(torch.cuda.current_stream(d.device).cuda_stream)


def materialize(call, device):
    """(args, kwargs) of one of calls()'s calls, with scratch tensors on `device`."""
    _, args, kwargs = call
    return [_build(s, device) for s in args], {k: _build(v, device) for k, v in kwargs.items()}


def start_for_graph(graph):
    """Starts warming `graph`'s (a CompiledGraph just loaded) CUDA plans, its calls dealt round-robin
    over up to MAX_THREADS threads; returns the threads, or None (nothing to warm, or starting
    failed: logged)."""
    try:
        work, device = [], None
        for spec in getattr(graph, "specs", ()):
            executor = getattr(spec.executor, "executor", spec.executor)  # CudaGraphRunner wraps one
            d = _device_of(executor)
            found = calls(executor, d) if d is not None else []
            if found and device is None:
                device = d
            work += found
        if not work:
            return None
        n = min(MAX_THREADS, len(work))
        return [_spawn(work[i::n], device) for i in range(n)]
    except Exception as e:
        stats_mod.add_to("prewarm", "errors")
        log.debug("kiln prewarm: not started: %s: %s", type(e).__name__, e)
        return None


_library_init_started = False


def start_library_init(module):
    """At a package's first load, before anything is fetched: when `module` holds a convolution
    whose weight is on a CUDA device, one tiny convolution there in a background thread, so that
    cuDNN's libraries load (about 0.18 s on the H200, once per process) while the package is
    fetched and unpickled. Returns the thread or None (nothing to do, or done before)."""
    global _library_init_started
    try:
        import torch

        if _library_init_started or not torch.backends.cudnn.enabled:
            return None
        weight = next((m.weight for m in module.modules()
                       if isinstance(m, torch.nn.modules.conv._ConvNd) and m.weight.is_cuda), None)
        if weight is None:
            return None
        _library_init_started = True
        x = ("t", (1, 8, 8, 8), (512, 64, 8, 1), weight.dtype, False)
        w = ("t", (8, 8, 3, 3), (72, 9, 3, 1), weight.dtype, False)
        conv = (torch.ops.aten.convolution.default,
                (x, w, ("c", None), ("c", [1, 1]), ("c", [0, 0]), ("c", [1, 1]), ("c", False),
                 ("c", [0, 0]), ("c", 1)), {})
        return _spawn([conv], weight.device)
    except Exception as e:
        stats_mod.add_to("prewarm", "errors")
        log.debug("kiln prewarm: library init not started: %s: %s", type(e).__name__, e)
        return None


def wait(timeout=None):
    """Waits for the warm-up threads started so far (kiln.compile, at the end of the call that
    loaded a package; tests; the exit handler)."""
    with _threads_lock:
        threads = list(_threads)
    for t in threads:
        t.join(timeout)
    with _threads_lock:
        _threads[:] = [t for t in _threads if t.is_alive()]


def _spawn(work, device):
    """A thread running `work` (calls()'s calls) on `device`'s current stream (the caller's)."""
    import torch

    stream = torch.cuda.current_stream(device)
    thread = threading.Thread(target=_run, args=(work, device, stream), name="kiln-prewarm", daemon=True)
    with _threads_lock:
        if not _threads:
            atexit.register(_join_all)
        _threads.append(thread)
    stats_mod.add_to("prewarm", "threads")
    thread.start()
    return thread


def _run(work, device, stream):
    import torch

    start = time.perf_counter()
    done = 0
    try:
        with torch.no_grad(), torch.cuda.device(device), torch.cuda.stream(stream):
            for call in work:
                try:
                    args, kwargs = materialize(call, device)
                    call[0](*args, **kwargs)
                    done += 1
                except Exception as e:  # e.g. an attention kernel refusing these sizes: the next one
                    stats_mod.add_to("prewarm", "errors")
                    log.debug("kiln prewarm: %s: %s: %s", call[0], type(e).__name__, e)
    finally:
        stats_mod.add_to("prewarm", "calls", done)
        stats_mod.add_to("client_time_s", "prewarm", time.perf_counter() - start)


def _spec(executor, tree, device):
    """One loader tree of a plan step (kiln.executor) -> a scratch spec; raises for an argument
    known only at run time (a symbolic size)."""
    import torch

    from kiln import proto
    from kiln.guards import eval_symint

    tag = tree[0]
    if tag == "c":
        return tree
    if tag == "v":
        meta = executor.values[tree[1]].meta
        sizes = tuple(eval_symint(s, {}) for s in meta.sizes)
        strides = tuple(eval_symint(s, {}) for s in meta.strides)
        if len(strides) != len(sizes):  # as kiln.executor reads such a value: contiguous
            strides = tuple(torch.empty(sizes, device="meta").stride())
        on_cpu = meta.HasField("device") and meta.device.kind == proto.DEVICE_KIND_CPU
        return ("t", sizes, strides, executor._dtypes[tree[1]], on_cpu)
    if tag == "device":
        return ("c", device)
    if tag == "list":
        return ("list", tuple(_spec(executor, x, device) for x in tree[1]), tree[2])
    raise ValueError(f"argument kind {tag}")


def _build(s, device):
    import torch

    tag = s[0]
    if tag == "c":
        return s[1]
    if tag == "t":  # (sizes, strides, dtype, on the CPU: e.g. an attention's random seed)
        return torch.empty_strided(s[1], s[2], dtype=s[3], device="cpu" if s[4] else device)
    items = [_build(x, device) for x in s[1]]
    return tuple(items) if s[2] else items


def _device_of(executor):
    """The CUDA device a loaded plan runs on (its graph's inputs'), or None for a CPU plan."""
    import torch

    from kiln.requests import graph_device

    if not getattr(executor, "cuda", False):
        return None
    device = graph_device(executor.graph)
    return device if device is not None and device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())


def _scratch_bytes(specs):
    from kiln._exec_common import _span

    total = 0
    for s in specs:
        if s[0] == "t" and not s[4]:
            total += _span(s[1], s[2]) * s[3].itemsize
        elif s[0] == "list":
            total += _scratch_bytes(s[1])
    return total


def _join_all():
    wait(timeout=30)
