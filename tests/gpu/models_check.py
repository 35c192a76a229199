#!/usr/bin/env python3
"""Correctness of real models through torch.compile(backend="kiln") against eager torch.

    python3 tests/gpu/models_check.py [--device cuda|cpu] [--quick] [--only NAME[,NAME]]
                                      [--dtype fp32,bf16] [--mode inference,training] [--kilnd PATH]

Models (random weights, no dropout; tests/gpu/gpu_models.py):
  gpt_matmul  GPT-2 decoder block: LayerNorm, causal self-attention written as matmul + mask + softmax,
              MLP with tanh GELU, residuals (full size: B8 T512 d768 12 heads)
  gpt_sdpa    the same block with F.scaled_dot_product_attention(is_causal=True)
  resnet18, resnet50
              torchvision's models when torchvision imports, else a hand-written copy with the same
              layers, names and init (the header says which); full size: batch 8, 224x224
  bert        BERT encoder layer: post-LayerNorm (eps 1e-12), additive padding mask, erf GELU
              (full size: B8 T512 d768 12 heads, FFN 3072)
  llama       Llama-style decoder block: RMSNorm, rotary embeddings, grouped-query attention through
              causal SDPA, SwiGLU MLP, no biases (full size: B8 T512 d768 12 heads, 4 KV heads,
              FFN 2048)
--quick shrinks all of them (d 128, T 64, 64x64 images, batch 2).

Each model runs in each dtype and mode:
  dtype fp32       fp32 weights and inputs; TF32 is OFF (torch.backends.cuda.matmul.allow_tf32,
                   cudnn.allow_tf32 = False, matmul precision "highest") for eager and kiln alike, so
                   the two differ only by fp32 rounding in a different order.
        bf16       torch.autocast(bfloat16) around forward and loss, fp32 weights (mixed precision as
                   people train); bf16-cast: model and inputs .to(bfloat16) instead (opt-in).
  mode inference   eval(), no_grad: the output of two consecutive calls.
       training    train() (BatchNorm uses batch statistics and updates its running stats), the loss
                   inside the compiled module, backward, SGD(lr=0.01) step; two steps. Compared at
                   each step: the loss, every parameter's gradient and update, every floating buffer
                   (BatchNorm running stats). Before step 2 kiln's model gets eager's parameters and
                   buffers (copy_ in place): each step is compared from the same state (a big SGD
                   step on a tiny batch would otherwise amplify step-1 rounding differences ~100x),
                   and step 2 checks that compiled graphs read parameters updated in place.
Comparison: per tensor, relative L2 error ||kiln - eager|| / max(||eager||, floor) (NaNs at the same
places are equal; floor = 0.1 x the RMS of the category's eager values x sqrt(numel), so a tensor
that is ~0 in exact arithmetic, like attention's key-bias gradient, is judged against the scale of
its category, not its own rounding noise), worst per category, against these tolerances:
                  output/loss   grads/updates   buffers
  fp32 (no TF32)     1e-4          1e-3           1e-4     fp32 eps is 1.2e-7; a different summation
                                                             order through ~50 layers costs ~1e-6..1e-5;
                                                             gradients sum over batch x positions
                                                             (cuDNN/cuBLAS pick other algorithms too)
  bf16               2e-2          5e-2           2e-2     bf16 eps is 7.8e-3: eager rounds to bf16
                                                             after every op, a fused kernel keeps fp32
                                                             in registers, so a few bf16 ulps apart
A float64 copy of the model (eager, no autocast, same inputs, same state at each step) runs side by
side; a tensor over its tolerance still passes, marked PASS-REF, when kiln's error against float64 is
at most twice eager's own error against float64 (the criterion Inductor's accuracy checker uses).
Models with convolutions (4-D inputs) also run a second eager copy in channels-last memory format,
the layout kiln's convolutions use (cuDNN reduces in another order there); the allowance is twice
the larger of the two eager errors.
fp32 training also runs an eager copy whose parameters are multiplied by (1 + 1e-7 N(0,1)) at each
step (eager-jitter), because a training step of a ReLU network is not a continuous function of its
inputs at rounding scale: an activation that lands within rounding of 0 passes its gradient in one
fp32 implementation and not in another. One such element in ResNet-18's last ReLU (8 x 7 x 7
positions per channel) moves layer4's weight gradients by 1e-3..5e-3: a float64 run with
parameters perturbed by 1e-7 (relative) differs from the unperturbed one by up to 5e-3 in some
gradient (CPU, batch 8, 224x224), and eager fp32 differs from float64 by ~5e-3 at step 1. Which
tensors such a flip hits changes from run to run (cuDNN's weight-gradient algorithms are
nondeterministic, so step 2 starts from slightly different parameters), so for gradients and
updates the allowance is at least twice the largest error against float64 of any gradient of any
eager peer in that case (the training spread, printed with the tensor it came from); in smooth
models that spread stays near fp32 rounding and the rule changes nothing. Not in bf16, where
eager's own per-tensor errors against float64 are already far above what a flip adds (up to 1.3
for a BatchNorm weight's gradient in ResNet-50), so a case-wide allowance would excuse anything.
Because that allowance is loose where flips happen (~1e-2 for ResNet-18), fp32 training also has a
graph check that flips cannot reach: every kiln graph call's inputs and outputs are cloned (on the
stream) and, after the run, each call's FX module runs in torch on its cloned inputs; the worst
relative L2 difference of any float output (floor: 0.1 x the RMS of that call's outputs) must be
within the output tolerance (1e-4), or the case is a MISMATCH naming the call, the output and its
FX node. ReLU masks reach the backward graph as saved inputs, so both sides use the same ones (on
the H200 the worst is ~1e-5 for ResNet-18, forward and backward alike). Graphs with convolutions
run their FX module a second time with 4-D inputs in channels-last, the layout of kiln's
convolution steps, where cuDNN picks other algorithms; an output may then differ by up to twice
what torch's two layouts differ by, where that is more than 1e-4 (ResNet-50's deepest forward
outputs reached 9.8e-5 against the NCHW replay in two H200 runs: cuDNN's algorithms differ by that
much over ~50 layers).
--no-fp64-ref turns these off (and saves the float64, channels-last and jittered runs and the
clones).

kilnd: this script starts one (--kilnd PATH, default: $KILND, .bundle/kilnd, .bundle/kiln/kilnd,
bazel-bin/server/kilnd) with a fresh --cache_dir on a unix socket (--listen tcp: 127.0.0.1 port 0,
the port read from kilnd's "listening on" log line), and points the client at it
(options={"server": ...}, what KILN_SERVER does). KILN_NVRTC_PATH is set for kilnd from torch's
nvidia wheels when it is not set. --server ADDR uses a running kilnd instead (its cache is not fresh).

Each model runs in its own child process (a crash or a CUDA error in one model cannot take the
others down; a crashed case is reported and the rest of that model continues in a new process).
After each case: kiln.stats()-derived facts (graphs compiled / cache hits / run eagerly and why,
kernel, aten and library steps in the loaded plans, op fallbacks by op, plan vs eager calls) and
every kiln warning. Then a summary table.

Statuses: PASS (matched, every graph ran a kiln plan), PASS-EAGER (matched, but some graph ran
eagerly: that part did not test kiln), PASS-REF (passed through the fp64 reference), MISMATCH, ERROR
(an exception), CRASH (the process died), TIMEOUT (--case-timeout).
Exit status: 0 when every case passed (PASS-EAGER counts as passed unless --strict), 1 otherwise,
2 when the setup failed (no kilnd, no GPU).
"""

import argparse
import contextlib
import copy
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_models as gm  # noqa: E402

TOLERANCES = {  # dtype -> category -> relative L2 error
    "fp32": {"output": 1e-4, "loss": 1e-4, "grad": 1e-3, "update": 1e-3, "buffer": 1e-4},
    "bf16": {"output": 2e-2, "loss": 2e-2, "grad": 5e-2, "update": 5e-2, "buffer": 2e-2},
}
TOLERANCES["bf16-cast"] = dict(TOLERANCES["bf16"])
DTYPES = ["fp32", "bf16", "bf16-cast"]
MODES = ["inference", "training"]
LR = 0.01
STEPS = 2
PASSING = ("PASS", "PASS-EAGER", "PASS-REF")


def log(msg):
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------------
# one case (in the child)
# --------------------------------------------------------------------------------------------------


def autocast_ctx(dtype, device):
    import contextlib

    import torch

    if dtype == "bf16":  # "fp64" (the reference) and the others: no autocast
        return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
    return contextlib.nullcontext()


def prepare(case, dtype, channels_last=False):
    """Casts model and float inputs for `dtype` in place ("fp64" for the reference); with
    channels_last, the model's 4-D parameters and the 4-D inputs also take that memory format."""
    import torch

    target = {"bf16-cast": torch.bfloat16, "fp64": torch.float64}.get(dtype)
    if target is not None:
        case.model.to(target)
        case.inputs = [t.to(target) if i in case.float_inputs else t for i, t in enumerate(case.inputs)]
    if channels_last:
        case.model.to(memory_format=torch.channels_last)
        case.inputs = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in case.inputs]
    return case


def is_conv_case(case):
    """Whether the case takes an image batch (a 4-D float input): its convolutions have a
    channels-last eager peer (see the module doc)."""
    return any(t.dim() == 4 for i, t in enumerate(case.inputs) if i in case.float_inputs)


def run_lockstep(runs, mode, device):
    """Runs the procedure for every run in `runs` = [(label, case, dtype, wrap)] side by side (the
    first, eager, leads) and returns ({label: [(category, name, tensor)]}, {label: seconds}, the
    wrapped callables, kept alive for kiln_facts). Training: before step 2 every other run gets the
    leader's parameters and buffers (copy_ in place), so each step is compared from the same state
    (no amplification of step-1 rounding by the SGD step) and step 2 checks that compiled graphs
    read parameters updated in place."""
    import torch

    results = {label: [] for label, *_ in runs}
    seconds = {label: 0.0 for label, *_ in runs}
    fns = []
    if mode == "inference":
        for label, case, dtype, wrap in runs:
            t0 = time.time()
            model = case.model
            model.eval()
            model.requires_grad_(False)
            fn = wrap(model)
            fns.append(fn)
            with torch.no_grad():
                for call in range(2):
                    with autocast_ctx(dtype, device):
                        out = fn(*case.inputs)
                    results[label].append(("output", f"output (call {call + 1})", out.detach().clone()))
            gm.sync(device)
            seconds[label] += time.time() - t0
        return results, seconds, fns
    states = []
    for label, case, dtype, wrap in runs:
        model = case.model
        model.train()
        fn = wrap(gm.with_loss(model, case.loss_fn))
        fns.append(fn)
        params = list(model.named_parameters())
        states.append((label, case, dtype, fn, params, torch.optim.SGD([p for _, p in params], lr=LR)))
    leader = states[0][1].model
    for step in range(STEPS):
        if step > 0:
            with torch.no_grad():
                src_p = dict(leader.named_parameters())
                src_b = dict(leader.named_buffers())
                for _, case, _, _, params, _ in states[1:]:
                    for n, p in params:
                        p.copy_(src_p[n])
                    for n, b in case.model.named_buffers():
                        b.copy_(src_b[n])
        for label, _, _, _, params, _ in states:
            if label == JITTER_LABEL:
                jitter(params, step)
        for label, case, dtype, fn, params, opt in states:
            t0 = time.time()
            before = {n: p.detach().clone() for n, p in params}
            opt.zero_grad(set_to_none=True)
            with autocast_ctx(dtype, device):
                loss = fn(*case.inputs)
            loss.backward()
            res = results[label]
            res.append(("loss", f"loss (step {step + 1})", loss.detach().clone()))
            for n, p in params:
                g = p.grad if p.grad is not None else torch.full((1,), float("nan"))
                res.append(("grad", f"grad {n} (step {step + 1})" + (" is None" if p.grad is None else ""),
                            g.detach().clone()))
            opt.step()
            for n, p in params:
                res.append(("update", f"update {n} (step {step + 1})", (p.detach() - before[n]).clone()))
            for n, b in case.model.named_buffers():
                if b.is_floating_point():
                    res.append(("buffer", f"buffer {n} (after step {step + 1})", b.detach().clone()))
            gm.sync(device)
            seconds[label] += time.time() - t0
    return results, seconds, fns


def rel_err(test, ref, floor=0.0):
    """(relative L2 error, max abs diff) of test against ref: ||test - ref|| / max(||ref||, floor *
    sqrt(numel)); NaNs (and same-signed infinities) in the same places are equal."""
    import torch

    if tuple(test.shape) != tuple(ref.shape):
        return math.inf, math.inf
    a, b = test.detach().double(), ref.detach().double()
    same = (torch.isnan(a) & torch.isnan(b)) | (torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b)))
    a = torch.where(same, torch.zeros_like(a), a)
    b = torch.where(same, torch.zeros_like(b), b)
    diff = a - b
    if not torch.isfinite(diff).all():
        return math.inf, math.inf
    num = diff.norm().item()
    den = max(b.norm().item(), floor * math.sqrt(max(b.numel(), 1)))
    rel = num / den if den > 0 else (0.0 if num == 0 else math.inf)
    return rel, (diff.abs().max().item() if diff.numel() else 0.0)


FLOOR_FRACTION = 0.1


def category_floors(results):
    """category -> FLOOR_FRACTION x the RMS of every reference element of that category: the
    denominator's floor, so that a tensor that is ~0 in exact arithmetic (the gradient of the key
    bias in attention is exactly 0: softmax ignores a per-row constant) is judged against the scale
    of its category instead of its own rounding noise."""
    import torch

    sq, n = {}, {}
    for cat, _, t in results:
        t = t.detach().double()
        t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
        sq[cat] = sq.get(cat, 0.0) + float((t * t).sum())
        n[cat] = n.get(cat, 0) + t.numel()
    return {c: FLOOR_FRACTION * math.sqrt(sq[c] / n[c]) if n[c] else 0.0 for c in sq}


# fp32 training's eager peer with jittered parameters (see the module doc): every parameter times
# (1 + JITTER_REL * N(0, 1)), drawn again (seeded) after each state copy.
JITTER_LABEL = "eager-jitter"
JITTER_REL = 1e-7


def jitter(params, step):
    """Multiplies every parameter in place by (1 + JITTER_REL * N(0, 1)) (seeded by the step and
    the parameter's position; drawn on the CPU so that every device gets the same numbers)."""
    import torch

    with torch.no_grad():
        for k, (_, p) in enumerate(params):
            g = torch.Generator().manual_seed(1000 * step + k)
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.mul_((1 + JITTER_REL * noise).to(device=p.device, dtype=p.dtype))


def peer_spread(res, res_r):
    """(the largest error against float64 of any gradient of any eager peer: eager, eager-cl,
    eager-jitter; 'peer: tensor name'), or None without the jittered peer (inference, bf16,
    --no-fp64-ref): how far fp32 implementations that differ only by rounding land from float64
    somewhere in this training step. It bounds updates too (SGD's update is -lr x the gradient;
    an update's own error against float64 adds fp32 cancellation in p_after - p_before, which
    depends on the parameter's bits, so the jittered peer's updates are not a fair sample)."""
    if JITTER_LABEL not in res:
        return None
    floors = category_floors(res_r)
    worst = (0.0, "")
    for label in ("eager", "eager-cl", JITTER_LABEL):
        for (cat, name, t), (_, _, tr) in zip(res.get(label, ()), res_r):
            if cat == "grad":
                err, _ = rel_err(t, tr, floors.get(cat, 0.0))
                if math.isfinite(err) and err > worst[0]:
                    worst = (err, f"{label}: {name}")
    return worst


def graph_check_wanted(args, dtype, mode):
    """fp32 training with the float64 reference on: the end-to-end comparison allows the training
    spread there, the graph check keeps kiln's own error to fp32 rounding."""
    return mode == "training" and dtype == "fp32" and not args.no_fp64_ref


def noise_text(g):
    """The graph check's layout noise, when it raised the allowance."""
    if g.get("allowed", 0.0) > g.get("tol", 0.0):
        return f"; conv layout noise {g['noise']:.1e}, allowed {g['allowed']:.1e}"
    return ""


def output_names(gm_module):
    """The FX graph's outputs as 'node (target)', by position ('' where an output is no node)."""
    out = [n for n in gm_module.graph.nodes if n.op == "output"]
    if not out:
        return []
    args = out[0].args[0]
    args = args if isinstance(args, (list, tuple)) else [args]
    names = []
    for a in args:
        target = getattr(a, "target", None)
        names.append(f"{a.name} ({getattr(target, '__name__', target)})" if hasattr(a, "name") else "")
    return names


def has_convolutions(gm_module):
    return any(n.op == "call_function" and "convolution" in str(n.target) for n in gm_module.graph.nodes)


def check_graph_calls(records, tol):
    """fp32 training's graph check (see the module doc) over gm.GraphCallRecorder's records: each
    call's FX module runs in torch on its cloned inputs; relative L2 differences with the floor
    FLOOR_FRACTION x the RMS of that call's float outputs, as in category_floors. Graphs with
    convolutions also run once more with their 4-D inputs in channels-last (the layout kiln's
    convolution steps use, where cuDNN picks other algorithms): an output may differ from torch's
    by twice what torch's own two layouts differ by (the layout noise), if that is more than `tol`.
    Returns a dict: rel (the worst output's difference), allowed (its allowance), noise (its layout
    noise), where ('kind call N output I (node)'), calls; the worst is the largest rel / allowed."""
    import torch

    worst = {"rel": 0.0, "allowed": tol, "noise": 0.0, "where": "", "calls": len(records)}
    calls = {}
    for graph, inputs, outs in records:
        calls[graph.kind_name] = calls.get(graph.kind_name, 0) + 1
        peers = None
        with torch.no_grad():
            if has_convolutions(graph.gm):
                cl = [x.clone(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4
                      else (x.clone() if isinstance(x, torch.Tensor) else x) for x in inputs]
                peer = graph.gm(*cl)
                peers = peer if isinstance(peer, (list, tuple)) else [peer]
                del cl
            ref = graph.gm(*inputs)
        refs = ref if isinstance(ref, (list, tuple)) else [ref]
        names = output_names(graph.gm)
        pairs = [(i, k, e) for i, (k, e) in enumerate(zip(outs, refs))
                 if isinstance(k, torch.Tensor) and isinstance(e, torch.Tensor) and k.is_floating_point()
                 and k.numel()]
        floor = category_floors([("all", "", e) for _, _, e in pairs]).get("all", 0.0)
        for i, k, e in pairs:
            rel, _ = rel_err(k, e, floor)  # inf for non-finite differences
            noise = rel_err(peers[i], e, floor)[0] if peers is not None and i < len(peers) else 0.0
            allowed = max(tol, 2.0 * noise) if math.isfinite(noise) else tol
            if rel / allowed > worst["rel"] / worst["allowed"]:
                name = names[i] if i < len(names) and names[i] else ""
                worst.update(rel=rel, allowed=allowed, noise=noise,
                             where=f"{graph.kind_name} call {calls[graph.kind_name]} output {i}"
                                   + (f" {name}" if name else ""))
    return worst


def compare(res_k, res_e, tol):
    """Per tensor: [category, name, rel, maxabs, ok]. Names must line up."""
    floors = category_floors(res_e)
    rows = []
    for (cat, name, tk), (_, name_e, te) in zip(res_k, res_e):
        rel, mx = rel_err(tk, te, floors.get(cat, 0.0))
        rows.append([cat, name, rel, mx, rel <= tol[cat]])
    if len(res_k) != len(res_e):
        rows.append(["output", f"{len(res_k)} results vs {len(res_e)}", math.inf, math.inf, False])
    return rows


def run_case(args, name, dtype, mode, address):
    """One case in this (child) process; returns a JSON-able result dict."""
    import torch

    device = args.device
    tol = TOLERANCES[dtype]
    t_start = time.time()
    r = {"model": name, "dtype": dtype, "mode": mode, "status": "ERROR", "detail": "", "facts": None,
         "worst": None, "times": {}}
    gm.reset_kiln()
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    phase = "building the model"
    try:
        base = gm.make_case(name, args.quick, device, seed=0)
        runs = [("eager", prepare(copy.deepcopy(base), dtype), dtype, lambda m: m),
                ("kiln", prepare(copy.deepcopy(base), dtype), dtype,
                 lambda m: gm.compile_kiln(m, address, timeout=args.kiln_timeout))]
        if not args.no_fp64_ref:
            runs.append(("fp64", prepare(copy.deepcopy(base), "fp64"), "fp64", lambda m: m))
            if is_conv_case(base):
                runs.append(("eager-cl", prepare(copy.deepcopy(base), dtype, channels_last=True), dtype,
                             lambda m: m))
            if mode == "training" and dtype == "fp32":  # bf16's own rounding dwarfs the flips
                runs.append((JITTER_LABEL, prepare(copy.deepcopy(base), dtype), dtype, lambda m: m))
        phase = "running " + ", ".join(label for label, *_ in runs)
        gc.collect()
        before = gm.compiled_graph_ids()
        recorder = gm.GraphCallRecorder() if graph_check_wanted(args, dtype, mode) else None
        with gm.capture_kiln_warnings() as w:
            with recorder or contextlib.nullcontext():
                res, seconds, fns = run_lockstep(runs, mode, device)
            phase = "collecting kiln facts"
            facts = gm.kiln_facts(w.kiln, exclude=before)
        if recorder is not None:
            phase = "checking each graph call against its FX module"
            graph_check = check_graph_calls(recorder.records, tol["output"])
            del recorder
            r["graph_check"] = dict(graph_check, tol=tol["output"])
        del fns, runs
        r["times"].update(eager_s=seconds["eager"], kiln_s=seconds["kiln"])
        r["facts"] = facts
        phase = "comparing"
        res_e, res_k, res_r = res["eager"], res["kiln"], res.get("fp64")
        res_cl = res.get("eager-cl")
        rows = compare(res_k, res_e, tol)
        ref_used = False
        if res_r is not None and not all(row[4] for row in rows):
            spread = peer_spread(res, res_r)
            ref_floors = category_floors(res_r)
            for i, (row, (_, _, tk), (_, _, te), (cat, _, tr)) in enumerate(zip(rows, res_k, res_e, res_r)):
                if row[4]:
                    continue
                ref_used = True
                floor = ref_floors.get(cat, 0.0)
                k_err, _ = rel_err(tk, tr, floor)
                e_err, _ = rel_err(te, tr, floor)
                ref = {"kiln_vs_fp64": k_err, "eager_vs_fp64": e_err}
                if res_cl is not None:
                    ref["eager_cl_vs_fp64"], _ = rel_err(res_cl[i][2], tr, floor)
                allowed = max(e_err, ref.get("eager_cl_vs_fp64", 0.0))
                if spread is not None and cat in ("grad", "update"):
                    ref["peer_spread"], ref["peer_spread_of"] = spread
                    allowed = max(allowed, spread[0])
                row.append(ref)
                if math.isfinite(k_err) and k_err <= 2.0 * allowed + 1e-12:
                    row[4] = "ref"
        del res
        # worst per category (relative to its tolerance)
        worst = {}
        for row in rows:
            cat, nm, rel, mx, ok = row[:5]
            score = rel / tol[cat] if tol[cat] else rel
            if cat not in worst or score > worst[cat]["score"]:
                worst[cat] = {"name": nm, "rel": rel, "maxabs": mx, "tol": tol[cat], "ok": ok, "score": score,
                              "ref": row[5] if len(row) > 5 else None}
        r["worst"] = worst
        bad = [row for row in rows if row[4] is False]
        r["failing"] = [{"name": row[1], "rel": row[2], "maxabs": row[3], "tol": tol[row[0]],
                         "ref": row[5] if len(row) > 5 else None} for row in bad][:20]
        r["n_failing"] = len(bad)
        r["n_tensors"] = len(rows)
        eager_graphs = (facts.get("graph_fallbacks") or 0) > 0 or (facts.get("eager_calls") or 0) > 0
        graph_check = r.get("graph_check")
        if graph_check is not None and not graph_check["rel"] <= graph_check["allowed"]:
            r["status"] = "MISMATCH"
            r["detail"] = (f"graph check: {graph_check['where']} differs from its FX module run by torch on "
                           f"the same inputs by {graph_check['rel']:.2e} (rel L2, allowed "
                           f"{graph_check['allowed']:.1e}{noise_text(graph_check)})")
        elif bad:
            r["status"] = "MISMATCH"
        elif any(row[4] == "ref" for row in rows):
            r["status"] = "PASS-REF"
        elif eager_graphs or not facts.get("graphs"):
            r["status"] = "PASS-EAGER"
        else:
            r["status"] = "PASS"
        if not facts.get("graphs"):
            r["detail"] = "kiln received no graph (Dynamo did not compile anything?)"
        r["fp64_ref_used"] = ref_used
    except Exception as e:
        r["status"] = "ERROR"
        r["detail"] = f"{phase}: {type(e).__name__}: {str(e)[:2000]}"
        r["traceback"] = traceback.format_exc()[-6000:]
        try:
            r["facts"] = r["facts"] or gm.kiln_facts()
        except Exception:
            pass
    r["times"]["total_s"] = time.time() - t_start
    return r


def skipped(name, dtype, mode):
    return {"model": name, "dtype": dtype, "mode": mode, "status": "SKIPPED", "facts": None, "worst": None,
            "times": {}, "detail": "not started: past --time-budget; run it with --only/--dtype/--mode"}


def ref_text(ref):
    """' [vs fp64: kiln E, eager E(, eager channels-last E)]' of a row that went to the fp64
    reference, '' for the others."""
    if not ref:
        return ""
    cl = f", eager channels-last {ref['eager_cl_vs_fp64']:.2e}" if "eager_cl_vs_fp64" in ref else ""
    spread = (f"; training spread {ref['peer_spread']:.2e} ({ref['peer_spread_of']})"
              if "peer_spread" in ref else "")
    return f" [vs fp64: kiln {ref['kiln_vs_fp64']:.2e}, eager {ref['eager_vs_fp64']:.2e}{cl}{spread}]"


def print_case(r):
    head = f"--- {r['model']} / {r['dtype']} / {r['mode']}: {r['status']}"
    t = r.get("times", {})
    if t:
        head += f"  ({t.get('total_s', 0):.1f} s: eager {t.get('eager_s', 0):.1f} s, kiln {t.get('kiln_s', 0):.1f} s" \
                " incl. compiles)" if "kiln_s" in t else f"  ({t.get('total_s', 0):.1f} s)"
    log(head)
    if r.get("detail"):
        log(f"    {r['detail']}")
    if r.get("traceback"):
        log("    " + r["traceback"].rstrip().replace("\n", "\n    "))
    for cat, w in (r.get("worst") or {}).items():
        ok = {True: "ok", False: "OVER", "ref": "ok via fp64 ref"}[w["ok"]]
        extra = ref_text(w.get("ref"))
        log(f"    worst {cat:<6} rel {w['rel']:.2e} (tol {w['tol']:.0e}, {ok}) max abs {w['maxabs']:.2e}"
            f"  {w['name']}{extra}")
    g = r.get("graph_check")
    if g:
        ok = "ok" if g["rel"] <= g["allowed"] else "OVER"
        log(f"    graph check: {g['calls']} kiln graph calls against their FX modules on the same inputs: worst "
            f"rel {g['rel']:.2e} (tol {g['tol']:.0e}{noise_text(g)}, {ok})" + (f"  {g['where']}" if g["where"] else ""))
    if r.get("n_failing"):
        log(f"    {r['n_failing']} of {r['n_tensors']} tensors over tolerance, e.g.:")
        for f in r["failing"][:6]:
            extra = ref_text(f.get("ref"))
            log(f"      {f['name']}: rel {f['rel']:.2e} > {f['tol']:.0e}, max abs {f['maxabs']:.2e}{extra}")
    if r.get("facts"):
        log("    kiln: " + gm.facts_line(r["facts"]))
        for line in gm.facts_details(r["facts"]):
            log(line)


def set_numerics(args):
    """TF32 off (gm.set_fp32_precise) and, with --cudnn-deterministic, cuDNN's deterministic
    algorithms only: for eager, kiln's convolution steps and the fp64 reference alike."""
    import torch

    gm.set_fp32_precise()
    if args.cudnn_deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if args.fill_uninitialized:
        # torch.empty's results (kiln's outputs and workspaces among them) filled with NaN (floats)
        # or the largest value (integers); deterministic algorithms are what turns the fill on,
        # warn_only keeps the ops without a deterministic version running.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True


def install_saved_check():
    """--check-saved: every kiln forward call's outputs are cloned; at each backward call, the
    inputs that are those outputs (same data pointer and shape: the saved tensors) are compared
    bitwise with the clones, and the backward's outputs with its FX module run by torch on the same
    inputs. One line per backward call."""
    import torch
    from kiln import backend as kb

    original = kb.CompiledGraph.__call__
    saved = {}

    def checked(self, args_list):
        if self.kind_name == "forward":
            out = original(self, args_list)
            saved.clear()
            for o in (out if isinstance(out, (list, tuple)) else [out]):
                if isinstance(o, torch.Tensor) and o.numel():
                    saved[(o.data_ptr(), tuple(o.shape))] = o.detach().clone()
            return out
        if self.kind_name != "backward":
            return original(self, args_list)
        changed, checked_n, worst = [], 0, 0.0
        for i, a in enumerate(a for a in args_list if isinstance(a, torch.Tensor)):
            ref = saved.get((a.data_ptr(), tuple(a.shape))) if a.numel() else None
            if ref is None:
                continue
            checked_n += 1
            if not torch.equal(a, ref):
                changed.append(f"input {i} {list(a.shape)} max |diff| {rel_err(a, ref)[1]:.3g}")
        inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args_list]
        out = original(self, args_list)
        with torch.no_grad():
            fx = self.gm(*inputs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        fxs = fx if isinstance(fx, (list, tuple)) else [fx]
        for k, e in zip(outs, fxs):
            if isinstance(k, torch.Tensor) and isinstance(e, torch.Tensor) and k.is_floating_point() and k.numel():
                worst = max(worst, rel_err(k, e)[0])
        log(f"    check-saved: {self.kind_name} call: {len(changed)} of {checked_n} saved inputs changed since "
            f"the forward{': ' + '; '.join(changed[:5]) if changed else ''}; outputs vs its FX module on the "
            f"same inputs: worst rel L2 {worst:.3g}")
        return out

    kb.CompiledGraph.__call__ = checked


def child_main(args):
    import faulthandler

    faulthandler.enable()  # a crash in native code prints the Python stack to stderr (shown as CRASH)
    import torch

    gm.import_kiln()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("CUDA is not available in this process")
        sys.exit(2)
    set_numerics(args)
    if args.check_saved:
        install_saved_check()
    cases = json.loads(args.cases)
    with open(args.results, "a") as out:
        for name, dtype, mode in cases:
            out.write(json.dumps({"event": "begin", "case": [name, dtype, mode], "time": time.time()}) + "\n")
            out.flush()
            if args.deadline and time.time() > args.deadline:
                r = skipped(name, dtype, mode)
            else:
                r = run_case(args, name, dtype, mode, args.server)
            print_case(r)
            out.write(json.dumps({"event": "result", "case": [name, dtype, mode], "result": r},
                                 default=str) + "\n")
            out.flush()


# --------------------------------------------------------------------------------------------------
# the parent
# --------------------------------------------------------------------------------------------------


def run_children(args, model, cases, address, tmp):
    """Runs `cases` of one model in child processes, restarting after a crash. Returns results."""
    results = {}
    remaining = list(cases)
    attempt = 0
    while remaining:
        attempt += 1
        path = os.path.join(tmp, f"{model}-{attempt}.jsonl")
        err_path = os.path.join(tmp, f"{model}-{attempt}.stderr")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--cases", json.dumps(remaining),
               "--results", path, "--server", address, "--device", args.device,
               "--kiln-timeout", str(args.kiln_timeout), "--tol-scale", repr(args.tol_scale),
               "--deadline", repr(args.deadline)] + [f"--kiln-option={o}" for o in args.kiln_option]
        if args.quick:
            cmd.append("--quick")
        if args.no_fp64_ref:
            cmd.append("--no-fp64-ref")
        if args.cudnn_deterministic:
            cmd.append("--cudnn-deterministic")
        if args.fill_uninitialized:
            cmd.append("--fill-uninitialized")
        if args.check_saved:
            cmd.append("--check-saved")
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, stdout=None, stderr=err, start_new_session=True)
            current, began = None, time.time()
            timed_out = False
            while proc.poll() is None:
                time.sleep(0.5)
                events = _read_events(path)
                begun = [e for e in events if e["event"] == "begin"]
                done = {tuple(e["case"]) for e in events if e["event"] == "result"}
                if begun and tuple(begun[-1]["case"]) not in done:
                    if current != tuple(begun[-1]["case"]):
                        current, began = tuple(begun[-1]["case"]), begun[-1]["time"]
                    if time.time() - began > args.case_timeout:
                        timed_out = True
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        break
        events = _read_events(path)
        done = {}
        for e in events:
            if e["event"] == "result":
                done[tuple(e["case"])] = e["result"]
        results.update(done)
        begun = [tuple(e["case"]) for e in events if e["event"] == "begin"]
        remaining = [c for c in remaining if tuple(c) not in done]
        if not remaining:
            break
        stuck = begun[-1] if begun and begun[-1] not in done else tuple(remaining[0])
        rc = proc.returncode
        why = ("TIMEOUT", f"over --case-timeout={args.case_timeout:g} s; killed") if timed_out else \
            ("CRASH", f"the process died ({_describe_rc(rc)}) during this case")
        if rc == 2 and not begun:
            why = ("ERROR", "the child process could not start (exit 2)")
        tail = ""
        try:
            tail = "".join(open(err_path, errors="replace").readlines()[-25:])
        except OSError:
            pass
        begin_times = {tuple(e["case"]): e["time"] for e in events if e["event"] == "begin"}
        spent = time.time() - begin_times[tuple(stuck)] if tuple(stuck) in begin_times else 0.0
        r = {"model": stuck[0], "dtype": stuck[1], "mode": stuck[2], "status": why[0], "detail": why[1],
             "facts": None, "worst": None, "times": {"total_s": spent}, "traceback": "stderr tail:\n" + tail if tail else ""}
        print_case(r)
        results[tuple(stuck)] = r
        remaining = [c for c in remaining if tuple(c) != tuple(stuck)]
        if why[0] == "ERROR":  # nothing will start: do not loop
            for c in remaining:
                results[tuple(c)] = dict(r, model=c[0], dtype=c[1], mode=c[2])
            break
    return results


def _describe_rc(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit status {rc}"


def _read_events(path):
    events = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line being written
    except OSError:
        pass
    return events


def in_process(args, cases, address):
    """--no-isolate: every case in this process."""
    set_numerics(args)
    results = {}
    for name, dtype, mode in cases:
        if args.deadline and time.time() > args.deadline:
            r = skipped(name, dtype, mode)
        else:
            r = run_case(args, name, dtype, mode, address)
        print_case(r)
        results[(name, dtype, mode)] = r
    return results


def summary(results, order, strict):
    log("")
    log("## Summary")
    log("")
    rows = []
    for key in order:
        r = results.get(tuple(key))
        if r is None:
            continue
        f = r.get("facts") or {}
        worst = r.get("worst") or {}
        if worst:
            cat, w = max(worst.items(), key=lambda kv: kv[1]["score"])
            err = f"{w['rel']:.1e} / {w['tol']:.0e} ({cat})"
        else:
            err = "-"
        graphs = f"{f.get('graphs', '-')}/{f.get('compiles', '-')}/{f.get('hits', '-')}/{f.get('graph_fallbacks', '-')}" \
            if f else "-"
        causes = ",".join(sorted((f.get("fallbacks_by_cause") or {}).keys())) if f else ""
        rows.append([r["model"], r["dtype"], r["mode"], r["status"], err, graphs + (f" ({causes})" if causes else ""),
                     f.get("kernel_steps", "-") if f else "-", f.get("op_fallbacks", "-") if f else "-",
                     f"{r.get('times', {}).get('total_s', 0):.1f}"])
    gm.table(["model", "dtype", "mode", "status", "worst rel err / tol", "graphs/compiled/hits/eager (why)",
              "kernel steps", "op fallbacks", "s"], rows)
    statuses = [r["status"] for r in results.values()]
    bad = [s for s in statuses if s not in PASSING or (strict and s == "PASS-EAGER")]
    log("")
    log(f"{len(statuses)} cases: " + ", ".join(f"{s} {statuses.count(s)}" for s in
                                              ["PASS", "PASS-REF", "PASS-EAGER", "MISMATCH", "ERROR", "CRASH", "TIMEOUT", "SKIPPED"]
                                              if statuses.count(s)))
    if "PASS-EAGER" in statuses:
        log("PASS-EAGER: some graphs ran eagerly (see 'why' and the warnings above); those parts did not test kiln" +
            (" (--strict: counted as failures)" if strict else ""))
    if "SKIPPED" in statuses:
        log("SKIPPED: not started within --time-budget; run the rest in another command (--only, --dtype, --mode)")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__[__doc__.index("Models"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--only", default="", help="comma-separated models: " + ", ".join(gm.MODEL_NAMES))
    ap.add_argument("--dtype", default="fp32,bf16", help="comma-separated: fp32, bf16 (autocast), bf16-cast "
                    "(model .to(bfloat16)); default fp32,bf16")
    ap.add_argument("--mode", default="inference,training", help="comma-separated: inference, training")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke runs)")
    ap.add_argument("--kilnd", default=None, help="kilnd binary (default: $KILND, .bundle/kilnd, "
                    ".bundle/kiln/kilnd, bazel-bin/server/kilnd); runs in place")
    ap.add_argument("--kilnd-flag", action="append", default=[], help="extra kilnd flag (repeatable), "
                    "e.g. --kilnd-flag=--compile_workers=8")
    ap.add_argument("--kiln-option", action="append", default=[], metavar="KEY=VALUE",
                    help="extra torch.compile(backend='kiln') option (repeatable), e.g. cuda_graphs=1")
    ap.add_argument("--listen", choices=["unix", "tcp"], default="unix",
                    help="kilnd on a unix socket (default) or 127.0.0.1 port 0")
    ap.add_argument("--server", default=None, help="use this running kilnd (host:port or unix:/path) "
                    "instead of starting one")
    ap.add_argument("--kiln-timeout", type=float, default=300.0, help="kiln's per-Compile timeout (s)")
    ap.add_argument("--case-timeout", type=float, default=300.0, help="kill a case's process after this many s")
    ap.add_argument("--no-fp64-ref", action="store_true", help="no float64 second opinion on a mismatch")
    ap.add_argument("--fill-uninitialized", action="store_true",
                    help="fill every torch.empty result with NaN (integers: their largest value) in every "
                         "run (torch.use_deterministic_algorithms(True, warn_only=True)): a kernel that "
                         "reads memory nothing wrote gives NaN instead of a stale value")
    ap.add_argument("--check-saved", action="store_true",
                    help="diagnostics: at each kiln backward call, whether the tensors the forward saved "
                         "changed since the forward returned them, and the backward's outputs against its "
                         "FX module run by torch on the same inputs (one line per call)")
    ap.add_argument("--cudnn-deterministic", action="store_true",
                    help="torch.backends.cudnn.deterministic for every run (eager, kiln, fp64): "
                         "convolutions with deterministic algorithms only")
    ap.add_argument("--no-isolate", action="store_true", help="run every case in this process")
    ap.add_argument("--strict", action="store_true", help="graphs that ran eagerly fail the case")
    ap.add_argument("--tol-scale", type=float, default=1.0, help="multiply every tolerance by this "
                    "(e.g. 10 to see what passes looser; <1 to test the mismatch reporting)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (kilnd log, cache, child stderr)")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (default 540 on "
                    "cuda, none on cpu; 0: none): cases not started by then are SKIPPED (and fail the run)")
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    args = ap.parse_args()

    try:
        gm.EXTRA_KILN_OPTIONS.update(gm.parse_kiln_options(args.kiln_option))
    except ValueError as e:
        ap.error(str(e))
    if args.tol_scale != 1.0:
        for d in TOLERANCES.values():
            for c in d:
                d[c] *= args.tol_scale
    if args.child:
        child_main(args)
        return 0

    models = [m.strip() for m in args.only.split(",") if m.strip()] or gm.MODEL_NAMES
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in models:
        if m not in gm.MODEL_NAMES:
            ap.error(f"unknown model {m!r}; one of {', '.join(gm.MODEL_NAMES)}")
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}; one of {', '.join(DTYPES)}")
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; one of {', '.join(MODES)}")

    import torch

    kiln, kiln_from = gm.import_kiln()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("models_check: --device cuda but torch.cuda.is_available() is False "
              "(use --device cpu for a smoke run)", file=sys.stderr)
        return 2
    t_start = time.time()
    if args.time_budget is None:
        args.time_budget = 540.0 if args.device.startswith("cuda") else 0.0
    # a case is not started past the deadline (cases take up to ~1 min on the GPU: keep that margin)
    args.deadline = t_start + args.time_budget - 60.0 if args.time_budget else 0.0
    tmp = tempfile.mkdtemp(prefix="kiln-models-")
    os.environ["KILN_CACHE_DIR"] = os.path.join(tmp, "client-cache")  # the client's runtime library builds here
    os.environ.pop("KILN_SERVER", None)
    kilnd = None
    try:
        if args.server:
            address = args.server
            kilnd_desc = f"running kilnd at {address} (not started here; its cache may be warm)"
        else:
            try:
                binary = gm.find_kilnd(args.kilnd)
                kilnd = gm.Kilnd(binary, tmp, listen=args.listen, flags=args.kilnd_flag)
            except Exception as e:
                print(f"models_check: cannot start kilnd: {e}", file=sys.stderr)
                return 2
            address = kilnd.address
            kilnd_desc = (f"{kilnd.version()} at {binary}, fresh cache dir {kilnd.cache_dir}, listening on "
                          f"{address}; NVRTC {kilnd.nvrtc or 'not found here (kilnd searches its defaults)'}; "
                          f"flags: {' '.join(kilnd.cmd[1:])}")
        _, backend_note = gm.kiln_backend_handle()
        log("# kiln models check: torch.compile(backend=\"kiln\") vs eager")
        log("")
        log(f"- device: {args.device}: {gm.device_description(args.device)}")
        log(f"- kiln client {kiln.__version__} from {kiln_from}; {backend_note}" +
            (f"; extra options {gm.EXTRA_KILN_OPTIONS}" if gm.EXTRA_KILN_OPTIONS else ""))
        log(f"- kilnd: {kilnd_desc}")
        log(f"- ResNets: {gm.resnet_source()}")
        log(f"- sizes: {'--quick' if args.quick else 'full'}: " +
            "; ".join(f"{m} {gm.describe_size(m, args.quick)}" for m in models))
        log(f"- dtypes {', '.join(dtypes)}; modes {', '.join(modes)}; time budget {args.time_budget or 'none'} s; TF32 off; SGD lr {LR}, {STEPS} steps; "
            f"tolerances (rel L2): " + "; ".join(f"{d}: " + ", ".join(f"{c} {v:.0e}" for c, v in TOLERANCES[d].items())
                                               for d in dtypes))
        log("")
        order = [(m, d, mo) for m in models for d in dtypes for mo in modes]
        results = {}
        if args.no_isolate:
            results = in_process(args, order, address)
        else:
            for m in models:
                cases = [c for c in order if c[0] == m]
                if args.deadline and time.time() > args.deadline:
                    for c in cases:
                        results[c] = skipped(*c)
                    continue
                log(f"## {m} ({gm.describe_size(m, args.quick)})")
                results.update(run_children(args, m, cases, address, tmp))
                log("")
                if kilnd is not None and not kilnd.alive():
                    log(f"!!! kilnd died (status {kilnd.proc.returncode}); log tail:\n{kilnd.log_tail()}")
                    log("!!! restarting kilnd with a fresh cache dir")
                    try:
                        kilnd = gm.Kilnd(kilnd.binary, tmp, listen=args.listen, flags=args.kilnd_flag)
                        address = kilnd.address
                    except Exception as e:
                        log(f"!!! kilnd does not start again: {e}")
                        break
        rc = summary(results, order, args.strict)
        if kilnd is not None:
            problems = [ln.rstrip() for ln in open(kilnd.log_path, errors="replace")
                        if any(w in ln.lower() for w in ("[error]", "[warn", "[critical]", " e ", "error:"))]
            if problems:
                log("")
                log(f"kilnd log: {len(problems)} warning/error lines (full log: {kilnd.log_path}{'' if args.keep else ', removed at exit; --keep keeps it'}); last ones:")
                for ln in problems[-12:]:
                    log("    " + ln[:400])
        log("")
        log(f"Total {time.time() - t_start:.0f} s. Exit status {rc}.")
        return rc
    finally:
        if kilnd is not None:
            kilnd.stop()
        import shutil

        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
