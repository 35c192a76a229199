"""Child process of test_cuda_backend.py's prewarm test: a small conv net wrapped in kiln.compile,
one no-grad call on CUDA compared with eager; prints one JSON line (package and prewarm counters,
whether the result matched).

    prewarm_child.py ADDRESS
"""
import json
import sys

import torch

import kiln
import kiln.prewarm


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.b = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.c = torch.nn.Conv2d(16, 32, 1, stride=2)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x))))).mean((2, 3))


def main():
    torch.manual_seed(0)
    model = ConvNet().cuda().eval()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    compiled = kiln.compile(model, options={"server": sys.argv[1]})
    with torch.no_grad():
        got = compiled(x)
        want = model(x)
    kiln.prewarm.wait(60)
    s = kiln.stats()
    print(json.dumps({
        # cuDNN may use TF32 for convolutions (torch's default), in both runs, maybe other algorithms
        "match": bool(torch.allclose(got, want, rtol=1e-3, atol=1e-3)),
        "packages": s["packages"], "prewarm": s["prewarm"], "fallbacks": s["graph_fallbacks"],
    }))


if __name__ == "__main__":
    main()
