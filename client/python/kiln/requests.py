"""What the kiln backend sends kilnd: a graph's CompileRequest (the serialized graph, the target it
runs on, the options every sender sets and who is asking), shared by the backend, its backward
prefetch, kiln.precompile and kiln.aot_cache's loaded graphs, so that their keys match."""

import os
import platform
import socket

import torch

from kiln import proto

_KIND_NAMES = {proto.GRAPH_KIND_FORWARD: "forward", proto.GRAPH_KIND_BACKWARD: "backward",
               proto.GRAPH_KIND_INFERENCE: "inference"}


def _compile_request(opts, fn, kind, gm, example_inputs):
    """The CompileRequest for graph `gm` of kind `kind` (GRAPH_KIND_*) of the function `fn`
    (_FunctionInfo): every graph's, and the backward prefetch's, so that both are the same bytes."""
    graph = serialize_aot_graph(gm, example_inputs, kind,
                                f"{_KIND_NAMES.get(kind, 'graph')} of {fn.location or 'graph'} {fn.compile_id}".strip(),
                                opts.training_layouts)
    return request_for_graph(opts, graph, target_for(example_inputs, opts), opts.timeout)


def serialize_aot_graph(gm, example_inputs, kind, debug_name, training_layouts=True):
    """An AOTAutograd graph as kiln sends it (the backend and kiln.precompile): its metadata
    follows the strides AOTAutograd gives its inputs (a backward's) and CUDA's convolutions on the
    meta device (kiln.layouts.repropagate); with option training_layouts, a forward with a
    convolution (the graphs whose layouts kilnd changes) lists its saved tensors as
    free_layout_outputs (kiln.layouts); every forward lists them as saved_outputs (not hashed; for
    kiln.cuda_graphs)."""
    from kiln import layouts
    from kiln.serialize import serialize_graph

    layouts.repropagate(gm, example_inputs)
    graph = serialize_graph(gm, example_inputs, kind=kind, debug_name=debug_name)
    if kind == proto.GRAPH_KIND_FORWARD:
        saved = layouts.saved_tensor_positions(gm)
        graph.saved_outputs.extend(saved)
        if training_layouts and any(n.target is torch.ops.aten.convolution.default for n in gm.graph.nodes):
            graph.free_layout_outputs.extend(saved)
    return graph


def request_for_graph(opts, graph, target, timeout):
    """The CompileRequest of a serialized graph with the options every sender sets (the backend,
    its backward prefetch and kiln.precompile: the hashed ones must match for keys to match)."""
    request = proto.CompileRequest(graph=graph, target=target)
    request.options.deterministic = opts.deterministic
    request.options.disable_fusion = opts.disable_fusion
    request.options.keep_source = opts.debug
    request.options.compile_timeout_ms = int(timeout * 1000)
    request.client.CopyFrom(_client_info())
    return request


def graph_device(graph):
    """The torch.device of a kiln.proto.Graph's first tensor placeholder (cuda:<index>; an unset
    index is the current device), or None."""
    for node in graph.nodes:
        if node.op == proto.Node.OP_PLACEHOLDER and node.meta.HasField("tensor"):
            device = node.meta.tensor.device
            if device.kind == proto.DEVICE_KIND_CUDA:
                return torch.device("cuda", device.index if device.index >= 0 else torch.cuda.current_device())
            if device.kind == proto.DEVICE_KIND_CPU:
                return torch.device("cpu")
    return None


def target_for(example_inputs, opts):
    """The kiln.v1.Target for a graph whose inputs are `example_inputs`."""
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return _device_target(t.device, opts)
    return _device_target(torch.device("cpu"), opts)


def target_for_graph(graph, opts):
    """The kiln.v1.Target for a serialized graph (kiln.proto.Graph), by its first tensor input."""
    return _device_target(graph_device(graph) or torch.device("cpu"), opts)


def _device_target(device, opts):
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device.index if device.index is not None else 0)
        return proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch=f"sm_{major}{minor}")
    return proto.Target(device=proto.DEVICE_KIND_CPU, cpu_isa=opts.cpu_isa or detect_cpu_isa())


_CPU_ISA = None
_X86_LEVELS = (
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
    ("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
)


def detect_cpu_isa():
    """The -march level this machine runs: x86-64-v2/v3/v4, armv8-a, else the machine name."""
    global _CPU_ISA
    if _CPU_ISA is not None:
        return _CPU_ISA
    machine = platform.machine().lower()
    isa = machine or "unknown"
    if machine in ("x86_64", "amd64"):
        flags = set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("flags"):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        isa = "x86-64"
        for level, needed in reversed(_X86_LEVELS):
            if needed <= flags:
                isa = level
            else:
                break
    elif machine in ("aarch64", "arm64"):
        isa = "armv8-a"
    _CPU_ISA = isa
    return isa


_CLIENT_INFO = None


def _client_info():
    global _CLIENT_INFO
    if _CLIENT_INFO is None:
        import kiln

        info = proto.ClientInfo(kiln_version=kiln.__version__, torch_version=torch.__version__,
                                python_version=platform.python_version(), hostname=socket.gethostname(),
                                pid=os.getpid())
        _CLIENT_INFO = info
    info = proto.ClientInfo()
    info.CopyFrom(_CLIENT_INFO)
    info.pid = os.getpid()
    rank = os.environ.get("RANK")
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
    except Exception:  # pragma: no cover
        pass
    if rank is not None:
        try:
            info.rank = int(rank)
        except ValueError:
            pass
    return info
