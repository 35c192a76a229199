"""Captures the aten graphs that torch.compile would hand to a backend, with the real inputs they ran on.

A torch.compile backend built from aot_autograd with the min-cut partitioner (as torch.compile's
default backend uses). Each compiled graph is recorded together with the inputs it receives when
the compiled model actually runs (cloned before the call), so a test can re-run the original and
the round-tripped graph on identical real data.
"""

import dataclasses
import logging

import torch
import torch._dynamo
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import min_cut_rematerialization_partition

# torch's structured-trace logger ("torch.__trace", always at DEBUG) would flood pytest's failure
# reports with thousands of empty records; these tests do not use TORCH_TRACE.
logging.getLogger("torch.__trace").addFilter(lambda record: False)


@dataclasses.dataclass
class Captured:
    kind: str  # "forward", "backward" or "inference"
    gm: torch.fx.GraphModule
    example_inputs: list  # what the compiler saw (FakeTensors, SymInts)
    real_inputs: list = None  # what the graph ran on (set once it has run)


def _clone(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def capture(model, inputs, *, dynamic=False, train=False, decompositions=None):
    """Runs `model(*inputs)` (and backward of its sum when `train`) under torch.compile and returns
    the graphs that AOTAutograd produced, in compile order, each run at least once.
    decompositions: passed to AOTAutograd (e.g. Inductor's table, which yields prims ops)."""
    torch._dynamo.reset()
    captured = []

    def compiler(kind):
        def compile_fn(gm, example_inputs):
            rec = Captured(kind if kind != "forward" or train else "inference", gm, list(example_inputs))
            captured.append(rec)

            def run(*args):
                if rec.real_inputs is None:
                    rec.real_inputs = [_clone(a) for a in args]
                return gm(*args)

            return make_boxed_func(run)

        return compile_fn

    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                           partition_fn=min_cut_rematerialization_partition,
                           decompositions=decompositions or {})
    compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=True)
    out = compiled(*inputs)
    if train:
        out.sum().backward()
    torch._dynamo.reset()
    return captured


def assert_same_outputs(got, want):
    """`got` (a graph's outputs as kiln ran them) equals `want` (the FX graph's): tensors within
    torch.testing.assert_close's default tolerances, anything else (sizes, None) exactly."""
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b)
        else:
            assert a == b
