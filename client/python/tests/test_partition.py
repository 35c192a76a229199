"""kiln's AOTAutograd partition (backend.make_aot): min-cut may recompute a softmax in the
backward, as it does Inductor's decomposed softmax, so a bf16 attention saves its bf16 scores
instead of the f32 probabilities; min-cut's op lists are unchanged outside kiln's partitions."""
import torch
from torch._functorch.aot_autograd import make_boxed_func

from kiln import backend, proto


def attention(q, k, mask):
    s = (q @ k.transpose(-2, -1)) * 0.125
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), -1).to(torch.bfloat16).sum()


def captured_graphs(fn, *args):
    graphs = {}

    def compiler(kind):
        def compile_fn(gm, example_inputs):
            graphs[kind] = gm
            return make_boxed_func(gm)
        return compile_fn

    compiled = torch.compile(fn, backend=lambda gm, ex: backend.make_aot(compiler)(gm, ex), dynamic=False)
    compiled(*args).float().backward()
    torch._dynamo.reset()
    return graphs


def test_softmax_is_recomputed_in_the_backward_from_bf16_scores():
    q = torch.randn(2, 2, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.tril(torch.ones(16, 16, dtype=torch.bool))
    graphs = captured_graphs(attention, q, k, mask)
    backward = graphs[proto.GRAPH_KIND_BACKWARD]
    saved = [n.meta["val"] for n in backward.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]
    scores = [t for t in saved if isinstance(t, torch.Tensor) and t.numel() == 2 * 2 * 16 * 16]
    assert scores and all(t.dtype == torch.bfloat16 for t in scores), [(t.dtype, t.shape) for t in scores]
    ops = {n.target for n in backward.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten._softmax.default in ops


def test_min_cut_op_lists_are_unchanged_outside_kiln_partitions():
    import torch._functorch.partitioners as partitioners

    backend.make_aot(lambda kind: None)  # installs the wrapper
    types = partitioners.get_default_op_list()
    assert torch.ops.aten._softmax not in types.recomputable_ops
