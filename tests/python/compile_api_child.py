"""Child process of test_compile_api.py: a small block wrapped in kiln.compile, one training step
and one no-grad call, compared with eager; prints one JSON line (kiln's package and graph counters,
Dynamo's frame counters, whether the results matched).

    compile_api_child.py ADDRESS MODEL_DIR    (MODEL_DIR holds blockmod.py, the model's source)
"""
import json
import sys

import torch

import kiln


def main():
    from torch._dynamo.utils import counters

    address, model_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, model_dir)
    import blockmod  # the test rewrites it between processes

    torch.manual_seed(0)
    model = blockmod.Block()
    x = torch.randn(8, 32, requires_grad=True)
    compiled = kiln.compile(model, options={"server": address})
    out = compiled(x)
    out.sum().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    want = model(x)
    want.sum().backward()
    expected = [x.grad] + [p.grad for p in model.parameters()]
    with torch.no_grad():
        y = torch.randn(8, 32)
        inference_ok = torch.allclose(compiled(y), model(y), atol=1e-5, rtol=1e-5)
    s = kiln.stats()
    print(json.dumps({
        "match": bool(torch.allclose(out, want, atol=1e-5, rtol=1e-5) and inference_ok
                      and all(torch.allclose(a, b, atol=1e-5, rtol=1e-5) for a, b in zip(got, expected))),
        "packages": s["packages"], "package_fallbacks": s["package_fallbacks"],
        "dynamo_frames": counters["stats"].get("unique_graphs", 0),
        "compiles": s["compiles"], "hits": s["hits"], "fallbacks": s["graph_fallbacks"], "plan_calls": s["plan_calls"],
        "prewarm": s["prewarm"],
    }))


if __name__ == "__main__":
    main()
