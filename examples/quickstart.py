"""kiln quickstart: a small MLP + layer norm + softmax block through torch.compile(backend="kiln").

Run it twice (scripts/demo.sh does): the first process has kilnd compile the graph, the second gets
it from kilnd's cache. Each run checks the result against eager PyTorch and prints what kiln did.
"""
import sys
import time

import torch

import kiln


class Block(torch.nn.Module):
    def __init__(self, dim=256, hidden=1024):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return torch.softmax(x + h, dim=-1)


def main():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(64, 256)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend="kiln")
        start = time.perf_counter()
        got = compiled(x)
        first_call = time.perf_counter() - start
    err = (got - expected).abs().max().item()
    ok = torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    s = kiln.stats()
    print(f"[kiln] check against eager: max abs error {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    print(f"[kiln] first call (capture + kiln) took {first_call * 1e3:.0f} ms")
    tiers = ", ".join(f"{k} {v}" for k, v in s["hits_by_tier"].items() if v)
    print(f"[kiln] graphs sent to kilnd: {s['requests']}; compiled by kilnd: {s['compiles']}; "
          f"cache hits: {s['hits']}{f' ({tiers})' if tiers else ''}; run eagerly: {s['graph_fallbacks']}; "
          f"ops run by torch inside compiled graphs: {s['op_fallbacks']}")
    if s["graph_fallbacks"]:
        print(f"[kiln] why graphs ran eagerly: {s.get('fallbacks_by_cause')}")
    if s["hits"] and not s["compiles"]:
        print("[kiln] status: CACHE HIT (kilnd served the compiled graph from its cache)")
    elif s["compiles"]:
        print("[kiln] status: COMPILED by kilnd (the next run will be a cache hit)")
    else:
        print("[kiln] status: EAGER FALLBACK (kiln could not compile this graph; see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
