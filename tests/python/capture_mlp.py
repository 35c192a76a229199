"""Captures the forward and backward graphs of one MLP training step as torch.compile would, and
writes them serialized (graph0.binpb, graph1.binpb) with their node names (names.json).
--rename gives every node another name first. Run as a subprocess by test_graph_key.py, so that
each capture comes from a fresh Python process (its own PYTHONHASHSEED)."""
import json
import pathlib
import sys

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

import kiln
from kiln import proto


def main():
    out = pathlib.Path(sys.argv[1])
    rename = "--rename" in sys.argv
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    graphs = []

    def compiler(kind):
        def compile_fn(gm, example_inputs):
            if rename:
                for i, node in enumerate(gm.graph.nodes):
                    if node.op != "output":
                        node.name = f"renamed_{kind}_{i}_{node.name}"
                gm.recompile()
            graphs.append((kind, gm))
            return make_boxed_func(gm)
        return compile_fn

    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           partition_fn=min_cut_rematerialization_partition)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    compiled(torch.randn(4, 8)).sum().backward()
    names = []
    kinds = {"forward": proto.GRAPH_KIND_FORWARD, "backward": proto.GRAPH_KIND_BACKWARD}
    for i, (kind, gm) in enumerate(graphs):
        (out / f"graph{i}.binpb").write_bytes(kiln.serialize_graph(gm, kind=kinds[kind]).SerializeToString())
        names.append([n.name for n in gm.graph.nodes])
    (out / "names.json").write_text(json.dumps(names))


if __name__ == "__main__":
    main()
