"""Round trips of graphs captured on a CUDA device (skipped where there is none)."""

import pytest
import torch

from kiln_capture import capture
from kiln import deserialize_graph, proto, serialize_graph
from test_serialize_models import MODELS, roundtrip

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_training_step(name):
    torch.manual_seed(0)
    make, inputs = MODELS[name]
    captured = capture(make().cuda(), [x.cuda() for x in inputs()], train=True)
    assert [c.kind for c in captured] == ["forward", "backward"]
    for c in captured:
        graph = roundtrip(c, name)
        devices = {(n.meta.tensor.device.kind, n.meta.tensor.device.index) for n in graph.nodes
                   if n.meta.WhichOneof("kind") == "tensor"}
        assert (proto.DEVICE_KIND_CUDA, torch.cuda.current_device()) in devices


def test_cuda_constants_and_bf16():
    root = torch.nn.Module()
    root.register_buffer("w", torch.randn(3, 5, device="cuda").to(torch.bfloat16).t())
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (x, g.get_attr("w"))),))
    gm = torch.fx.GraphModule(root, g)
    graph = proto.Graph.FromString(serialize_graph(gm).SerializeToString())
    c = graph.constants[0]
    assert c.meta.device.kind == proto.DEVICE_KIND_CUDA and len(c.data) == 15 * 2
    back = deserialize_graph(graph)
    assert back.w.device.type == "cuda" and back.w.stride() == root.w.stride()
    x = torch.randn(5, 3, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(back(x)[0], gm(x)[0])
