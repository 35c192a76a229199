#!/usr/bin/env python3
"""Does kiln.precompile on a machine without a GPU fill the cache for a GPU process?

Usage (on the GPU machine, from the repository root; kiln client on PYTHONPATH):
    python3 tests/gpu/precompile_check.py [--kilnd .bundle/kiln/kilnd]

1. Starts a kilnd with an empty cache.
2. In a child process with CUDA hidden (CUDA_VISIBLE_DEVICES=""), runs kiln.precompile for the
   GPU's sm_NN on CPU example inputs: a GPT block (matmul attention) for inference
   and training (forward + backward), and an MLP for training.
3. In a second child process on the GPU, runs the same models through torch.compile(backend="kiln")
   against that kilnd (one inference call, one training step) and reads kiln.stats().
Passes (exit 0) when the GPU process got only cache hits (no compiles) for every graph the
precompile sent. Prints each model's keys, hits and compiles.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODELS = ["mlp", "gpt"]


def build(name):
    import torch
    import gpu_models
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)), (8, 256)
    if name == "gpt":
        return gpu_models.build_gpt_block(256, 4, 128, sdpa=False), (4, 128, 256)
    return gpu_models.build_bert_layer(256, 4, 1024), (4, 128, 256)


def child(mode, address, arch):
    import torch
    import kiln
    out = {}
    for name in MODELS:
        torch.manual_seed(0)
        model, shape = build(name)
        if mode == "precompile":
            x = torch.randn(*shape)
            inf = [] if name == "mlp" else kiln.precompile(model, (x,), target=f"cuda:{arch}",
                                                           options={"server": address})
            tr = kiln.precompile(model, (x,), target=f"cuda:{arch}", training=True, options={"server": address})
            out[name] = {"keys": sorted(r.key for r in inf + tr), "kernels": sum(r.kernels for r in inf + tr)}
        else:
            kiln.reset_stats()
            model = model.cuda()
            x = torch.randn(*shape, device="cuda")
            compiled = torch.compile(model, backend="kiln", options={"server": address})
            if name != "mlp":
                with torch.no_grad():
                    compiled(x)
            compiled(x).float().pow(2).mean().backward()
            torch.cuda.synchronize()
            s = kiln.stats()
            out[name] = {"hits": s["hits"], "compiles": s["compiles"], "graphs": s["graphs"],
                         "fallbacks": s["graph_fallbacks"], "keys": sorted(set(s["keys"]))}
            torch._dynamo.reset()
    print("RESULT " + json.dumps(out), flush=True)


def run_child(mode, address, arch, env):
    p = subprocess.run([sys.executable, __file__, "--child", mode, "--address", address, "--arch", arch],
                       env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        print(p.stdout[-3000:], p.stderr[-6000:])
        raise SystemExit(f"{mode} child failed (exit {p.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kilnd", default=None)
    ap.add_argument("--child", choices=["precompile", "gpu"])
    ap.add_argument("--address")
    ap.add_argument("--arch")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.address, a.arch)
    import torch
    import gpu_models
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    server = gpu_models.Kilnd(gpu_models.find_kilnd(a.kilnd), tempfile.mkdtemp(prefix="kiln-pc-"))
    try:
        cpu_env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        pre = run_child("precompile", server.address, arch, cpu_env)
        gpu = run_child("gpu", server.address, arch, dict(os.environ))
    finally:
        server.stop()
    ok = True
    print(f"{'model':6} {'precompiled graphs':>18} {'kernels':>8} {'GPU graphs':>10} {'hits':>5} {'compiles':>8}")
    for name in MODELS:
        p, g = pre[name], gpu[name]
        good = g["compiles"] == 0 and g["fallbacks"] == 0 and set(g["keys"]) <= set(p["keys"]) and len(p["keys"]) > 0
        ok &= good
        print(f"{name:6} {len(p['keys']):>18} {p['kernels']:>8} {g['graphs']:>10} {g['hits']:>5} {g['compiles']:>8}"
              f"  {'ok' if good else 'MISS: the GPU process compiled graphs the precompile did not fill'}")
    print("precompile filled the cache for the GPU process" if ok else "precompile did NOT fill the cache")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
