"""Shared pieces of tests/gpu/models_check.py and scripts/bench_gpu.py.

- The models (random weights): a GPT-style decoder block (causal attention written out as
  matmul + mask + softmax, or through F.scaled_dot_product_attention), ResNet-18 and ResNet-50
  (torchvision's when it can be imported, else the hand-written copy below with the same layer
  structure, parameter names and initialization), and a BERT-style encoder layer (post-LayerNorm,
  padding mask, erf GELU), and a Llama-style decoder block (RMSNorm, rotary position embeddings,
  grouped-query attention through F.scaled_dot_product_attention, SwiGLU MLP, no biases).
  `make_case` builds one with its inputs and the training loss.
- `Kilnd`: a kilnd child process with a fresh cache dir, on a unix socket (or TCP port 0, the port
  read from its "listening on" log line), with NVRTC located for CUDA compiles.
- `compile_kiln`: torch.compile(..., backend="kiln") pointed at that kilnd; `kiln_facts`: what
  kiln.stats() and the loaded plans say about a run; timing and table helpers.

Works with torch 2.4+ (tested on 2.11 CUDA and 2.13 CPU), Python 3.11/3.12, and nothing but torch
and the kiln client installed (torchvision optional).
"""

import collections
import functools
import gc
import glob
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL_NAMES = ["gpt_matmul", "gpt_sdpa", "resnet18", "resnet50", "bert", "llama"]

# --------------------------------------------------------------------------------------------------
# kiln import (installed package, else the checkout's client/python)
# --------------------------------------------------------------------------------------------------


def import_kiln():
    """(kiln module, where it came from). Prefers the installed package (PYTHONPATH=/tmp/site on the
    GPU machine); falls back to this checkout's client/python."""
    try:
        import kiln  # noqa: F401
        return sys.modules["kiln"], os.path.dirname(sys.modules["kiln"].__file__)
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "client", "python"))
        import kiln  # noqa: F401
        return sys.modules["kiln"], os.path.dirname(kiln.__file__) + " (checkout, not installed)"


def kiln_backend_handle():
    """("kiln", note) when the entry point registers the backend, else (the callable, note)."""
    import torch

    try:
        if "kiln" in torch._dynamo.list_backends():
            return "kiln", 'backend="kiln" (entry point)'
    except Exception:
        pass
    from kiln.backend import kiln_backend

    return kiln_backend, "kiln.backend.kiln_backend (the 'kiln' entry point is not registered)"


EXTRA_KILN_OPTIONS = {}  # --kiln-option KEY=VALUE of the scripts (e.g. cuda_graphs=1)


def parse_kiln_options(items):
    """["cuda_graphs=1", ...] -> {"cuda_graphs": "1"} (the client converts and checks the values)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--kiln-option {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def compile_kiln(module, address, timeout=180.0, extra=None):
    import torch

    backend, _ = kiln_backend_handle()
    options = {"server": address, "timeout": timeout}
    options.update(EXTRA_KILN_OPTIONS)
    options.update(extra or {})
    return torch.compile(module, backend=backend, options=options)


# --------------------------------------------------------------------------------------------------
# kilnd
# --------------------------------------------------------------------------------------------------


def find_kilnd(explicit=None):
    """--kilnd, else $KILND, else .bundle/kilnd, .bundle/kiln/kilnd, bazel-bin/server/kilnd."""
    candidates = [explicit] if explicit else []
    if os.environ.get("KILND"):
        candidates.append(os.environ["KILND"])
    candidates += [os.path.join(REPO, ".bundle", "kilnd"), os.path.join(REPO, ".bundle", "kiln", "kilnd"),
                   os.path.join(REPO, "bazel-bin", "server", "kilnd")]
    if explicit:  # an explicit path that does not work must not silently become another binary
        candidates = [explicit]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise FileNotFoundError("kilnd not found (tried: " + ", ".join(c for c in candidates if c) +
                            "); pass --kilnd PATH or set KILND")


def find_nvrtc():
    """A libnvrtc for kilnd's NVRTC worker: $KILN_NVRTC_PATH, else the one in torch's nvidia wheels,
    else None (kilnd then tries /usr/local/cuda and the soname)."""
    if os.environ.get("KILN_NVRTC_PATH"):
        return os.environ["KILN_NVRTC_PATH"]
    roots = []
    for p in sys.path:
        if p and os.path.isdir(os.path.join(p, "nvidia")):
            roots.append(os.path.join(p, "nvidia"))
    patterns = ["cu13/lib/libnvrtc.so.13*", "cuda_nvrtc/lib/libnvrtc.so.13*", "cu12/lib/libnvrtc.so.12*",
                "cuda_nvrtc/lib/libnvrtc.so.12*", "*/lib/libnvrtc.so*"]
    for root in roots:
        for pat in patterns:
            hits = sorted(h for h in glob.glob(os.path.join(root, pat)) if "builtins" not in h and "alt" not in h)
            if hits:
                return hits[0]
    return None


def _has_flag(binary, name):
    try:
        text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10)
        return f"--{name} (" in (text.stdout + text.stderr)
    except Exception:
        return False


class Kilnd:
    """A kilnd child process with a fresh (or given) cache dir.

    listen="unix": a socket in a temp dir (default); "tcp": 127.0.0.1:0, the port read from the
    "listening on HOST:PORT" line kilnd logs. The binary runs in place (a bundle's libraries sit next
    to it, rpath $ORIGIN)."""

    def __init__(self, binary, tmp, cache_dir=None, listen="unix", flags=(), log_level="info", env=None):
        self.binary = binary
        self.tmp = tmp
        os.makedirs(tmp, exist_ok=True)
        self.cache_dir = cache_dir or tempfile.mkdtemp(prefix="kiln-cache-", dir=tmp)
        self.log_path = os.path.join(tmp, f"kilnd-{int(time.time() * 1000) % 10**8}.log")
        self._log = open(self.log_path, "w")
        sock_dir = tempfile.mkdtemp(prefix="kd-")  # short path: unix socket paths are limited to 108 bytes
        self._sock_dir = sock_dir
        want = f"unix:{sock_dir}/kilnd.sock" if listen == "unix" else "127.0.0.1:0"
        self.env = dict(os.environ if env is None else env)
        self.nvrtc = find_nvrtc()
        extra = []
        if self.nvrtc and not any(f.startswith("--nvrtc=") for f in flags):
            self.env.setdefault("KILN_NVRTC_PATH", self.nvrtc)  # older kilnd: the environment only
            if _has_flag(binary, "nvrtc"):
                extra.append(f"--nvrtc={self.nvrtc}")
        cmd = [binary, f"--listen={want}", f"--cache_dir={self.cache_dir}", f"--log_level={log_level}", *extra,
               *flags]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        self.address = want if listen == "unix" else None
        deadline = time.time() + 60
        from kiln.server import health as server_health

        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kilnd exited at startup (status {self.proc.returncode}):\n{self.log_tail()}")
            if self.address is None:
                self.address = self._listening_address()
            if self.address is not None and server_health(self.address) == "SERVING":
                break
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"kilnd did not become SERVING within 60 s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _listening_address(self):
        try:
            for line in open(self.log_path):
                if "listening on " in line:
                    return line.rsplit("listening on ", 1)[1].strip()
        except OSError:
            pass
        return None

    def version(self):
        try:
            return subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                                  env=self.env, timeout=10).stdout.strip()
        except Exception as e:  # pragma: no cover
            return f"unknown ({e})"

    def log_tail(self, lines=30):
        try:
            return "".join(open(self.log_path).readlines()[-lines:])
        except OSError:
            return ""

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            self._log.close()
        except Exception:
            pass
        shutil.rmtree(self._sock_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# what kiln did
# --------------------------------------------------------------------------------------------------


def reset_kiln():
    """Dynamo's caches, kiln's per-function state (warn-once sets) and counters."""
    import torch

    import kiln
    import kiln.backend

    torch._dynamo.reset()
    try:
        kiln.backend.reset()
    except Exception:
        pass
    kiln.reset_stats()


def _plan_of(spec):
    ex = getattr(spec, "executor", None)
    plan = getattr(ex, "plan", None)
    if plan is None:
        plan = getattr(getattr(ex, "artifact", None), "plan", None)
    return plan


def _compiled_graphs():
    from kiln.backend import CompiledGraph

    # issubclass(type(o)): weak proxies must not raise; kiln.aot_cache's LoadedGraph (graphs from
    # AOTAutograd's cache) is a subclass.
    return [o for o in gc.get_objects() if issubclass(type(o), CompiledGraph)]


def compiled_graph_ids():
    """ids of the kiln graphs alive now (pass to kiln_facts(exclude=...) to leave them out)."""
    try:
        return {id(o) for o in _compiled_graphs()}
    except Exception:
        return set()


def kiln_facts(captured_warnings=(), exclude=()):
    """What kiln did since the last reset: kiln.stats() plus the loaded plans (found through the
    live kiln.backend.CompiledGraph objects, less those in `exclude`). Returns a dict; the plan
    fields are None when the client's internals differ from what this expects."""
    import kiln

    s = kiln.stats()
    facts = {
        "graphs": s.get("graphs"), "compiles": s.get("compiles"), "hits": s.get("hits"),
        "graph_fallbacks": s.get("graph_fallbacks"), "fallbacks_by_cause": dict(s.get("fallbacks_by_cause", {})),
        "op_fallbacks": s.get("op_fallbacks"), "plan_calls": s.get("plan_calls"),
        "eager_calls": s.get("eager_calls"), "server_time_s": dict(s.get("server_time_s", {})),
        "client_time_s": dict(s.get("client_time_s", {})),
        "kernel_steps_by_device": s.get("kernel_steps_by_device"),
        "cuda_graph_captures": s.get("cuda_graph_captures"), "cuda_graph_replays": s.get("cuda_graph_replays"),
        "cuda_graph_busy": s.get("cuda_graph_busy"),
        "plans": None, "kernel_steps": None, "aten_steps": None, "library_steps": None,
        "fallback_ops": {}, "eager_graphs": [],
        "warnings": [str(w.message) for w in captured_warnings],
    }
    try:
        exclude = set(exclude)
        graphs = [o for o in _compiled_graphs() if id(o) not in exclude]
        plans = kernel = aten = library = 0
        fb_ops = collections.Counter()
        for g in graphs:
            if getattr(g, "eager_cause", None):
                facts["eager_graphs"].append(f"{getattr(g, 'name', '?')}: {g.eager_cause}")
            for spec in getattr(g, "specs", []) or []:
                plan = _plan_of(spec)
                if plan is None:
                    continue
                plans += 1
                for step in plan.steps:
                    kind = step.WhichOneof("kind")
                    if kind == "kernel":
                        kernel += 1
                    elif kind == "aten":
                        aten += 1
                        if step.aten.fallback:
                            fb_ops[step.aten.target] += 1
                    elif kind == "library":
                        library += 1
        facts.update(plans=plans, kernel_steps=kernel, aten_steps=aten, library_steps=library,
                     fallback_ops=dict(fb_ops))
    except Exception as e:  # the client's internals changed: stats() alone still says a lot
        facts["plans_error"] = f"{type(e).__name__}: {e}"
    return facts


def facts_line(f):
    """One line: graphs compiled/hit/eager, plan steps, op fallbacks."""
    parts = [f"graphs {f['graphs']} (compiled {f['compiles']}, cache hits {f['hits']}, "
             f"ran eagerly {f['graph_fallbacks']})"]
    if f.get("plans") is not None:
        parts.append(f"plans loaded {f['plans']}: kernel steps {f['kernel_steps']}, aten steps {f['aten_steps']}"
                     f" (op fallbacks {f['op_fallbacks']}), library steps {f['library_steps']}")
    else:
        parts.append(f"op fallbacks {f['op_fallbacks']}")
    by_dev = {k: v for k, v in (f.get("kernel_steps_by_device") or {}).items() if v}
    if by_dev:
        parts.append("kernel steps by device: " + ", ".join(f"{k} {v}" for k, v in by_dev.items()))
    calls = f"calls: plan {f['plan_calls']}, eager {f['eager_calls']}"
    if f.get("cuda_graph_captures") or f.get("cuda_graph_replays"):
        calls += (f", CUDA graph captures {f['cuda_graph_captures']} / replays {f['cuda_graph_replays']}"
                  f" / busy {f.get('cuda_graph_busy') or 0}")
    parts.append(calls)
    return "; ".join(parts)


def facts_details(f, indent="    "):
    lines = []
    if f["fallbacks_by_cause"]:
        lines.append("graphs run eagerly, by cause: " +
                     ", ".join(f"{k} x{v}" for k, v in sorted(f["fallbacks_by_cause"].items())))
    for g in f["eager_graphs"][:8]:
        lines.append(f"eager: {g}")
    if f["fallback_ops"]:
        ops = sorted(f["fallback_ops"].items(), key=lambda kv: -kv[1])
        lines.append("op fallbacks: " + ", ".join(f"{k} x{v}" for k, v in ops[:12]) +
                     (f", ... ({len(ops)} ops)" if len(ops) > 12 else ""))
    for w in dict.fromkeys(f["warnings"]):  # unique, in order
        lines.append("warning: " + (w if len(w) <= 400 else w[:400] + "..."))
    if f.get("plans_error"):
        lines.append(f"(plan details unavailable: {f['plans_error']})")
    return [indent + x for x in lines]


class capture_kiln_warnings(warnings.catch_warnings):
    """Records every warning (kiln's KilnWarning and torch's) while active; `.kiln` lists kiln's."""

    def __init__(self):
        super().__init__(record=True)

    def __enter__(self):
        self.log = super().__enter__()
        warnings.simplefilter("always")
        return self

    @property
    def kiln(self):
        try:
            from kiln.errors import KilnWarning
        except ImportError:  # pragma: no cover
            KilnWarning = Warning
        return [w for w in self.log if issubclass(w.category, KilnWarning) or "kiln" in str(w.message)[:6]]


class GraphCallRecorder:
    """While active (a `with` block), every kiln graph call (kiln.backend.CompiledGraph.__call__)
    runs as usual, and its inputs and outputs are cloned on the stream (no synchronization):
    appended to `records` as (graph, cloned inputs, cloned outputs), or passed to on_call(graph,
    inputs, outputs) right away when that is given. replay(graph, inputs) runs a graph again,
    unrecorded, on clones of `inputs`. Used by models_check.py (its graph check) and
    graph_diff.py."""

    def __init__(self, on_call=None):
        self.records, self.on_call, self._original = [], on_call, None

    def __enter__(self):
        import torch
        from kiln import backend as kb

        original = self._original = kb.CompiledGraph.__call__

        def recorded(graph, args_list):
            inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args_list]
            out = original(graph, args_list)
            outs = [o.detach().clone() if isinstance(o, torch.Tensor) else o
                    for o in (out if isinstance(out, (list, tuple)) else [out])]
            if self.on_call is not None:
                self.on_call(graph, inputs, outs)
            else:
                self.records.append((graph, inputs, outs))
            return out

        kb.CompiledGraph.__call__ = recorded
        return self

    def __exit__(self, *exc):
        from kiln import backend as kb

        kb.CompiledGraph.__call__ = self._original

    def replay(self, graph, inputs):
        """[outputs] of kiln's graph run again on clones of `inputs` (after the `with` block)."""
        import torch

        with torch.no_grad():
            out = (self._original or type(graph).__call__)(
                graph, [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs])
        return list(out) if isinstance(out, (list, tuple)) else [out]


# --------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------


def _nn():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    return torch, nn, F


def build_gpt_block(d, heads, max_t, sdpa):
    torch, nn, F = _nn()

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.n_head = heads
            self.register_buffer("mask", torch.tril(torch.ones(max_t, max_t, dtype=torch.bool))
                                 .view(1, 1, max_t, max_t), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            hs = C // self.n_head
            q = q.view(B, T, self.n_head, hs).transpose(1, 2)
            k = k.view(B, T, self.n_head, hs).transpose(1, 2)
            v = v.view(B, T, self.n_head, hs).transpose(1, 2)
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
                att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
                att = torch.softmax(att, dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(d, 4 * d)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        """GPT-2 block (pre-LayerNorm, residuals), no dropout."""

        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    return Block()


def build_bert_layer(d, heads, ffn):
    torch, nn, F = _nn()

    class BertLayer(nn.Module):
        """BERT encoder layer (post-LayerNorm, eps 1e-12, erf GELU, additive padding mask), no dropout."""

        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.attn_out = nn.Linear(d, d)
            self.attn_ln = nn.LayerNorm(d, eps=1e-12)
            self.intermediate = nn.Linear(d, ffn)
            self.output = nn.Linear(ffn, d)
            self.out_ln = nn.LayerNorm(d, eps=1e-12)
            self.heads = heads

        def forward(self, x, mask):
            B, T, C = x.shape
            hs = C // self.heads

            def split(y):
                return y.view(B, T, self.heads, hs).permute(0, 2, 1, 3)

            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hs) + mask
            probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(B, T, C)
            x = self.attn_ln(x + self.attn_out(ctx))
            x = self.out_ln(x + self.output(F.gelu(self.intermediate(x))))
            return x

    return BertLayer()


def build_llama_block(d, heads, kv_heads, ffn, max_t, theta=10000.0, eps=1e-6):
    torch, nn, F = _nn()
    hd = d // heads

    class RMSNorm(nn.Module):
        """As Llama's: the mean square in fp32, the normalized value cast back, then the weight."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * h.to(x.dtype)

    def rotate_half(x):
        return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)

    class LlamaBlock(nn.Module):
        """Llama-style decoder block (pre-RMSNorm, residuals): rotary embeddings on q and k from
        cos/sin tables, grouped-query attention (kv_heads shared by heads / kv_heads query heads
        each, expanded as Llama's repeat_kv does) through causal SDPA, SwiGLU MLP; no biases."""

        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(d, d, bias=False)
            self.k_proj = nn.Linear(d, kv_heads * hd, bias=False)
            self.v_proj = nn.Linear(d, kv_heads * hd, bias=False)
            self.o_proj = nn.Linear(d, d, bias=False)
            self.gate_proj = nn.Linear(d, ffn, bias=False)
            self.up_proj = nn.Linear(d, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, d, bias=False)
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
            freqs = torch.outer(torch.arange(max_t).float(), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            h = self.attn_norm(x)
            q = self.q_proj(h).view(B, T, heads, hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, kv_heads, hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, kv_heads, hd).transpose(1, 2)
            cos, sin = self.cos[:T].to(q.dtype), self.sin[:T].to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            rep = heads // kv_heads
            k = k[:, :, None].expand(B, kv_heads, rep, T, hd).reshape(B, heads, T, hd)
            v = v[:, :, None].expand(B, kv_heads, rep, T, hd).reshape(B, heads, T, hd)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, C))
            h = self.mlp_norm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    return LlamaBlock()


@functools.lru_cache(maxsize=None)
def _resnet_classes():
    """torchvision.models.resnet's BasicBlock, Bottleneck and ResNet (v1.5: stride on the 3x3 conv of
    the bottleneck), same module names (conv1, bn1, layerN.M.convK/bnK/downsample.{0,1}, fc) and the
    same initialization. Made once per process and named at module level (kiln.compile's packages
    pickle modules by their qualified name; classes local to a function cannot be found again)."""
    torch, nn, F = _nn()

    def conv3x3(i, o, stride=1):
        return nn.Conv2d(i, o, kernel_size=3, stride=stride, padding=1, bias=False)

    def conv1x1(i, o, stride=1):
        return nn.Conv2d(i, o, kernel_size=1, stride=stride, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv3x3(inplanes, planes, stride)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv1x1(inplanes, planes)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = conv3x3(planes, planes, stride)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = conv1x1(planes, planes * 4)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self, blk, layers, num_classes=1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(blk, 64, layers[0])
            self.layer2 = self._make_layer(blk, 128, layers[1], stride=2)
            self.layer3 = self._make_layer(blk, 256, layers[2], stride=2)
            self.layer4 = self._make_layer(blk, 512, layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * blk.expansion, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def _make_layer(self, blk, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * blk.expansion:
                downsample = nn.Sequential(conv1x1(self.inplanes, planes * blk.expansion, stride),
                                           nn.BatchNorm2d(planes * blk.expansion))
            mods = [blk(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * blk.expansion
            mods += [blk(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*mods)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    classes = {"BasicBlock": BasicBlock, "Bottleneck": Bottleneck, "ResNet": ResNet}
    for name, cls in classes.items():
        cls.__qualname__ = name
        globals()[name] = cls
    return classes


def _resnet_handwritten(block, layers, num_classes=1000):
    c = _resnet_classes()
    return c["ResNet"](c[{"basic": "BasicBlock", "bottleneck": "Bottleneck"}[block]], layers, num_classes)


def resnet_source():
    try:
        import torchvision  # noqa: F401

        return f"torchvision {torchvision.__version__}"
    except Exception:
        return "hand-written copy of torchvision's ResNet (torchvision not importable)"


def build_resnet(depth):
    cfg = {18: ("basic", [2, 2, 2, 2]), 50: ("bottleneck", [3, 4, 6, 3])}[depth]
    try:
        import torchvision

        return getattr(torchvision.models, f"resnet{depth}")(weights=None)
    except Exception:
        return _resnet_handwritten(*cfg)


# Sizes. "quick": tiny (smoke runs, CPU); "full": GPT-2-small-sized blocks (d 768, 12 heads, T 512)
# and 224x224 images. batch=None takes the profile's default; the benchmark passes larger batches.
SIZES = {
    "quick": {"gpt": dict(B=2, T=64, d=128, h=4), "bert": dict(B=2, T=64, d=128, h=4, ffn=512),
              "resnet": dict(B=2, hw=64), "llama": dict(B=2, T=64, d=128, h=4, kv=2, ffn=352)},
    "full": {"gpt": dict(B=8, T=512, d=768, h=12), "bert": dict(B=8, T=512, d=768, h=12, ffn=3072),
             "resnet": dict(B=8, hw=224), "llama": dict(B=8, T=512, d=768, h=12, kv=4, ffn=2048)},
}


def describe_size(name, quick, batch=None):
    s = SIZES["quick" if quick else "full"]
    if name.startswith("gpt"):
        g = s["gpt"]
        return f"B{batch or g['B']} T{g['T']} d{g['d']} h{g['h']}"
    if name == "bert":
        g = s["bert"]
        return f"B{batch or g['B']} T{g['T']} d{g['d']} h{g['h']} ffn{g['ffn']}"
    if name == "llama":
        g = s["llama"]
        return f"B{batch or g['B']} T{g['T']} d{g['d']} h{g['h']} kv{g['kv']} ffn{g['ffn']}"
    g = s["resnet"]
    return f"B{batch or g['B']} 3x{g['hw']}x{g['hw']}"


class Case:
    """A model with its inputs. `model(*inputs)` is the inference call; `loss(model_output)` the
    training loss (its targets are fixed here)."""

    def __init__(self, name, model, inputs, loss_fn, float_inputs):
        self.name, self.model, self.inputs, self.loss_fn = name, model, inputs, loss_fn
        self.float_inputs = float_inputs  # indices of inputs that follow the model's dtype


def _loss_precision(out):
    """The loss in fp32 for half/bf16 outputs, else in the output's own dtype (float64 stays float64
    for the reference run)."""
    import torch

    return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out


def _mse_loss_to(target, device):
    """The transformer blocks' training loss: MSE against a fixed target, in _loss_precision."""
    _, _, F = _nn()
    target = target.to(device)

    def loss_fn(out):
        o = _loss_precision(out)
        return F.mse_loss(o, target.to(o.dtype))
    return loss_fn


def make_case(name, quick, device, seed=0, batch=None):
    """A fresh Case (fp32 weights, seeded) on `device`."""
    torch, nn, F = _nn()
    torch.manual_seed(seed)
    s = SIZES["quick" if quick else "full"]
    if name in ("gpt_matmul", "gpt_sdpa"):
        g = s["gpt"]
        B = batch or g["B"]
        model = build_gpt_block(g["d"], g["h"], g["T"], sdpa=(name == "gpt_sdpa"))
        x = torch.randn(B, g["T"], g["d"])
        target = torch.randn(B, g["T"], g["d"])
        inputs = [x]
        float_inputs = [0]
        loss_fn = _mse_loss_to(target, device)
    elif name == "bert":
        g = s["bert"]
        B = batch or g["B"]
        model = build_bert_layer(g["d"], g["h"], g["ffn"])
        x = torch.randn(B, g["T"], g["d"])
        lengths = torch.randint(g["T"] // 2, g["T"] + 1, (B,))
        valid = (torch.arange(g["T"])[None, :] < lengths[:, None]).float()
        mask = ((1.0 - valid) * -10000.0).view(B, 1, 1, g["T"])  # BERT's additive padding mask
        target = torch.randn(B, g["T"], g["d"])
        inputs = [x, mask]
        float_inputs = [0, 1]
        loss_fn = _mse_loss_to(target, device)
    elif name == "llama":
        g = s["llama"]
        B = batch or g["B"]
        model = build_llama_block(g["d"], g["h"], g["kv"], g["ffn"], g["T"])
        x = torch.randn(B, g["T"], g["d"])
        target = torch.randn(B, g["T"], g["d"])
        inputs = [x]
        float_inputs = [0]
        loss_fn = _mse_loss_to(target, device)
    elif name in ("resnet18", "resnet50"):
        g = s["resnet"]
        B = batch or g["B"]
        model = build_resnet(int(name[len("resnet"):]))
        x = torch.randn(B, 3, g["hw"], g["hw"])
        labels = torch.randint(0, 1000, (B,))
        inputs = [x]
        float_inputs = [0]

        def loss_fn(out, labels=labels.to(device)):
            return F.cross_entropy(_loss_precision(out), labels)
    else:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(MODEL_NAMES)}")
    model = model.to(device)
    inputs = [t.to(device) for t in inputs]
    return Case(name, model, inputs, loss_fn, float_inputs)


def with_loss(model, loss_fn):
    """model + loss as one module, so that the loss is inside the compiled graph."""
    torch, nn, F = _nn()

    class WithLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return loss_fn(self.model(*inputs))

    return WithLoss()


# --------------------------------------------------------------------------------------------------
# numerics, timing, tables
# --------------------------------------------------------------------------------------------------


def set_fp32_precise():
    """No TF32 anywhere: fp32 comparisons then see fp32 rounding only."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:
        pass


def sync(device):
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def dynamo_seconds():
    """torch's own compile-time records so far, summed: {"dynamo": Dynamo's frame compiles,
    "backend": of which the backend calls (AOTAutograd and the compiler behind it)}; {} where this
    torch keeps none. The difference of two calls around a first call splits its time."""
    try:
        from torch._dynamo.utils import compilation_time_metrics as m
    except Exception:
        return {}
    return {"dynamo": sum(m.get("_compile.compile_inner", [])),
            "backend": sum(m.get("OutputGraph.call_user_compiler", []))}


def split_seconds(before, after):
    """{"trace_s": Dynamo without the backend, "backend_s": the backend} between two
    dynamo_seconds() records, or {} when either is empty."""
    if not before or not after:
        return {}
    backend = after["backend"] - before["backend"]
    return {"trace_s": after["dynamo"] - before["dynamo"] - backend, "backend_s": backend}


def time_calls(fn, device, iters, warmup=3):
    """Median and min ms per call. CUDA: events recorded around each call, enqueued back to back
    (host overhead shows whenever the host is slower than the GPU); CPU: perf_counter per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = call_times(fn, device, iters)
    return statistics.median(times), min(times)


def interleaved_medians(fns, device, iters, rounds, warmup=3):
    """{name: median ms per call} of fns ({name: fn}) timed in `rounds` rounds of iters / rounds
    calls each, the functions taking turns within a round (in reverse order every other round), so
    that a change in the host's load over the run reaches every function alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    rounds = max(1, min(rounds, iters))
    samples = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        per = iters // rounds + (1 if r < iters % rounds else 0)
        for name in (order if r % 2 == 0 else order[::-1]):
            samples[name] += call_times(fns[name], device, per)
    return {name: statistics.median(t) for name, t in samples.items()}


def call_times(fn, device, iters):
    """ms of each of `iters` calls of fn (see time_calls)."""
    import torch

    if str(device).startswith("cuda"):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends):
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def kernel_table(run, calls):
    """({GPU activity name: [count, total us]}, GPU busy us per call) over `calls` calls of `run`,
    from a torch.profiler trace (kernels, copies and memsets: everything the GPU ran for them,
    without the host's time between them)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(ev, "device_time", None)
        if us is None:
            us = ev.cuda_time
        by_name[ev.name][0] += 1
        by_name[ev.name][1] += us
    return by_name, sum(v[1] for v in by_name.values()) / calls


def geomean(xs):
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def table(header, rows, out=None):
    out = out or sys.stdout
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(header)]
    print("| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |", file=out)
    print("| " + " | ".join("-" * w for w in widths) + " |", file=out)
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |", file=out)
    out.flush()


class StreamTable(list):
    """A markdown table printed as it fills: the header at once, each row when appended (a run
    killed half way still shows the rows it finished)."""

    def __init__(self, header, out=None):
        super().__init__()
        self.out = out or sys.stdout
        print("| " + " | ".join(str(h) for h in header) + " |", file=self.out)
        print("|" + "|".join(" --- " for _ in header) + "|", file=self.out, flush=True)

    def append(self, row):
        super().append(row)
        print("| " + " | ".join(str(c) for c in row) + " |", file=self.out, flush=True)


def fmt_ms(ms):
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "-"
    return f"{ms:.4f}" if ms < 1 else f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def device_description(device):
    import platform

    import torch

    parts = [f"torch {torch.__version__}", f"Python {platform.python_version()}"]
    if str(device).startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        parts.insert(0, f"{p.name} ({p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB), "
                        f"CUDA {torch.version.cuda}")
        try:
            import triton

            parts.append(f"triton {triton.__version__}")
        except Exception:
            pass
    else:
        parts.insert(0, f"CPU ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})")
    return ", ".join(parts)
