"""Process-wide counters of the kiln backend: ``kiln.stats()`` and ``kiln.reset_stats()``.

Counted once per graph (not per call):
  graphs           AOTAutograd graphs handed to kiln (forward, backward, inference, re-specializations)
  requests         Compile/Lookup calls sent to kilnd (retries included)
  hits             replies served from a cache tier; ``hits_by_tier`` splits them (memory/disk/shared)
  compiles         replies that compiled the graph (``joined``: joined a compile already in flight)
  misses           Lookup misses in cache-only mode
  graph_fallbacks  graphs run eagerly by torch; ``fallbacks_by_cause`` says why
  op_fallbacks     ops run by torch inside compiled plans (AtenStep.fallback), per loaded plan
  kernel_steps     compiled kernel steps (KernelStep) in the loaded plans, per loaded plan;
                   ``kernel_steps_by_device`` splits them (cpu/cuda)
  library_steps    vendor-library steps (LibraryStep: cuBLASLt GEMMs of CUDA plans), per loaded plan
  eager_calls      calls of graphs that ran eagerly (every call)
  plan_calls       calls that ran a compiled plan (every call)
  cuda_graph_captures, cuda_graph_replays, cuda_graph_busy
                   CUDA-graph mode (option cuda_graphs): graphs captured, plan calls served by a
                   replay (the capturing call included), and calls that ran without their graph
                   because what its previous replay left in its memory was still in use
  backward_prefetches
                   backward graphs sent to Compile ahead of their first backward (option
                   prefetch_backward; for symbolic graphs, once more per new shape); not counted in graphs or requests: the backward compiler's
                   own request is, and usually finds that compile in flight (joined) or done (hits)
  packages         kiln.compile (kiln.packages): packages loaded from kilnd, captured here, stored
                   in kilnd, misses (kilnd had none), stale (traced sources changed), guard_misses
                   (kilnd's package did not fit these inputs), errors; ``package_fallbacks``: functions
                   that went to torch.compile's path instead, by cause
  prewarm          option prewarm (kiln.prewarm): warm-up threads started for loaded CUDA plans,
                   convolution calls they ran, steps skipped (symbolic sizes, too large), errors
Times, in seconds, summed over requests: ``client_time_s`` (serialize, rpc, load; program: building
a loaded plan's program for a device and symbol values, at the first call that needs it; package_load:
kiln.compile's GetPackage, unpickling and guard building of the packages it used; prewarm: the
warm-up threads' seconds, in the background, not part of any call; prewarm_wait: what the calls
that loaded packages spent waiting for their warm-ups to end, part of those calls) and
``server_time_s`` (the phases of CompileResponse.timings).
Does not import torch.
"""

import copy
import threading

_LOCK = threading.Lock()


def _fresh():
    return {
        "graphs": 0,
        "requests": 0,
        "hits": 0,
        "hits_by_tier": {"memory": 0, "disk": 0, "shared": 0},
        "compiles": 0,
        "joined": 0,
        "misses": 0,
        "graph_fallbacks": 0,
        "fallbacks_by_cause": {},
        "op_fallbacks": 0,
        "kernel_steps": 0,
        "kernel_steps_by_device": {"cpu": 0, "cuda": 0},
        "library_steps": 0,
        "eager_calls": 0,
        "plan_calls": 0,
        "cuda_graph_captures": 0,
        "cuda_graph_replays": 0,
        "cuda_graph_busy": 0,
        "backward_prefetches": 0,
        "packages": {"loaded": 0, "captured": 0, "stored": 0, "misses": 0, "stale": 0,
                     "guard_misses": 0, "errors": 0},
        "package_fallbacks": {},
        "prewarm": {"threads": 0, "calls": 0, "skipped": 0, "errors": 0},
        "client_time_s": {"serialize": 0.0, "rpc": 0.0, "load": 0.0, "program": 0.0, "package_load": 0.0,
                          "prewarm": 0.0, "prewarm_wait": 0.0},
        "server_time_s": {},
        "keys": [],  # keys of the graphs seen, in order (for tests and debugging), bounded
    }


_STATS = _fresh()
_MAX_KEYS = 4096


def stats():
    """A copy of the counters (see the module docstring)."""
    with _LOCK:
        return copy.deepcopy(_STATS)


def reset_stats():
    """Sets every counter back to zero."""
    global _STATS
    with _LOCK:
        _STATS = _fresh()


def add(name, n=1):
    with _LOCK:
        _STATS[name] += n


def add_to(group, name, n=1):
    with _LOCK:
        table = _STATS[group]
        table[name] = table.get(name, 0) + n


def add_key(key):
    with _LOCK:
        if len(_STATS["keys"]) < _MAX_KEYS:
            _STATS["keys"].append(key)


def graph_fallback(cause):
    with _LOCK:
        _STATS["graph_fallbacks"] += 1
        table = _STATS["fallbacks_by_cause"]
        table[cause] = table.get(cause, 0) + 1
