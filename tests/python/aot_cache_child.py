"""Child process of test_backend_aot_cache.py (and, on CUDA, of tests/gpu/test_cuda_backend.py):
one training step and one inference call of a small block through torch.compile(backend="kiln")
with the option aot_cache, compared with eager; prints one JSON line (AOTAutograd's cache counters,
kiln's stats, whether the results matched).

    aot_cache_child.py ADDRESS [DEVICE] [dynamic]      DEVICE: cpu (default) or cuda

With `dynamic`: torch.compile(dynamic=True) (symbolic graphs, compiled per shape), and the training
step runs again with another batch size.
"""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln


def make_block():
    class Inner(nn.Module):  # a local class in the graphs' nn_module_stack: must still pickle
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 32)

        def forward(self, x):
            return F.gelu(self.fc(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(32)
            self.inner = Inner()

        def forward(self, x):
            return self.inner(self.ln(x)).softmax(-1)

    return Block()


def main():
    from torch._dynamo.utils import counters

    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    dynamic = sys.argv[3:] == ["dynamic"]
    tol = 1e-5 if device == "cpu" else 1e-4  # CUDA: cuBLASLt's GEMMs against torch's
    torch.manual_seed(0)
    model = make_block().to(device)
    x = torch.randn(8, 32, device=device, requires_grad=True)
    compiled = torch.compile(model, backend="kiln", options={"server": sys.argv[1], "aot_cache": True},
                             dynamic=True if dynamic else None)
    same = True
    for batch in ((8, 5) if dynamic else (8,)):
        x = torch.randn(batch, 32, device=device, requires_grad=True)
        out = compiled(x)
        out.sum().backward()
        grad = x.grad.clone()
        x.grad = None
        want = model(x)
        want.sum().backward()
        same = (same and torch.allclose(out, want, atol=tol, rtol=tol)
                and torch.allclose(grad, x.grad, atol=tol, rtol=tol))
    with torch.no_grad():
        y = torch.randn(8, 32, device=device)
        inference_ok = torch.allclose(compiled(y), model(y), atol=tol, rtol=tol)
    s = kiln.stats()
    print(json.dumps({
        "aot": dict(counters["aot_autograd"]),
        "match": bool(same and inference_ok),
        "compiles": s["compiles"], "hits": s["hits"], "fallbacks": s["graph_fallbacks"], "plan_calls": s["plan_calls"],
        "kernel_steps": s["kernel_steps"], "eager_calls": s["eager_calls"],
        "fallbacks_by_cause": s["fallbacks_by_cause"],
    }))


if __name__ == "__main__":
    main()
