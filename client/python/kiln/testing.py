"""Test helpers: artifacts made by hand, and how to plant them in a kilnd's cache.

``aten_plan(graph)`` turns a serialized graph into a plan that runs every op with torch (AtenSteps
only), so the client's whole hit path (Lookup/Compile -> artifact -> guards -> executor) can be
exercised before kilnd compiles anything. ``make_artifact`` adds the checksum kilnd computes, and
``import_artifact`` stores it under the graph's key through Admin.Import (a bundle holding one
entry record), which re-verifies it as kilnd verifies its own entries.
``CpuGraphs`` stands in for CUDA graphs (kiln.cuda_graphs._DEVICE), so that the CUDA-graph mode's
bookkeeping runs with CPU plans on machines without a GPU.
Symbolic sizes are kept as the graph has them (SymInt inputs and size computations become SymInt
arguments of the steps); a node result that is neither a tensor, a list of them nor a SymInt raises
NotImplementedError.
"""

import hashlib
import struct

from kiln import proto

_PV = proto.PlanValue
ARTIFACT_FORMAT_VERSION = 1


def aten_plan(graph, *, fallback=True, preallocate_outputs=False):
    """kiln.proto.Graph -> kiln.proto.Plan running each call_function node as an AtenStep.

    fallback: mark the steps as op fallbacks. preallocate_outputs: graph outputs produced by steps
    get STORAGE_OUTPUT (allocated by the client, results copied in) instead of STORAGE_STEP."""
    plan = proto.Plan()
    value_of = {}  # node name -> value index, or list of indices (multi-output), or None
    constants = {c.name: i for i, c in enumerate(graph.constants)}
    output_names = set()
    for node in graph.nodes:
        if node.op == proto.Node.OP_OUTPUT and node.args:
            output_names = {a.node for a in node.args[0].list.items if a.WhichOneof("value") == "node"}

    def add_value(meta, storage, index=0):
        v = plan.values.add(storage=storage, index=index)
        v.meta.CopyFrom(meta)
        return len(plan.values) - 1

    def arg(a, out):
        kind = a.WhichOneof("value")
        if kind == "node":
            ref = value_of.get(a.node)
            if isinstance(ref, tuple):  # a SymInt node: its expression
                if ref[1].WhichOneof("value") == "expr":
                    out.sym_int.CopyFrom(ref[1].expr)
                else:
                    out.int_value = ref[1].constant
                return
            if not isinstance(ref, int):
                raise NotImplementedError(f"argument {a.node}: not a single tensor value")
            out.node = f"v{ref}"
        elif kind == "list":
            out.list.SetInParent()
            out.list.is_tuple = a.list.is_tuple
            for item in a.list.items:
                arg(item, out.list.items.add())
        else:
            out.CopyFrom(a)

    num_inputs = 0
    for node in graph.nodes:
        kind = node.meta.WhichOneof("kind")
        if node.op == proto.Node.OP_PLACEHOLDER:
            if kind == "tensor":
                value_of[node.name] = add_value(node.meta.tensor, _PV.STORAGE_INPUT, num_inputs)
            elif kind == "sym_int":
                value_of[node.name] = ("sym", node.meta.sym_int)
            else:
                raise NotImplementedError(f"placeholder {node.name}: a {kind}")
            num_inputs += 1
        elif node.op == proto.Node.OP_GET_ATTR:
            value_of[node.name] = add_value(node.meta.tensor, _PV.STORAGE_CONSTANT, constants[node.target])
        elif node.op == proto.Node.OP_CALL_FUNCTION:
            if node.target == "operator.getitem":
                base = value_of.get(node.args[0].node)
                value_of[node.name] = base[node.args[1].int_value]
                continue
            if kind == "sym_int":  # a size computation: the plan evaluates the expression instead
                value_of[node.name] = ("sym", node.meta.sym_int)
                continue
            step = plan.steps.add().aten
            step.target, step.fallback, step.node = node.target, fallback, node.name
            for a in node.args:
                arg(a, step.args.add())
            for k in node.kwargs:
                arg(k.value, step.kwargs.add(name=k.name).value)
            if kind == "tensor":
                storage = (_PV.STORAGE_OUTPUT if preallocate_outputs and node.name in output_names
                           else _PV.STORAGE_STEP)
                value_of[node.name] = add_value(node.meta.tensor, storage)
                step.outputs.append(value_of[node.name])
            elif kind == "list":
                items = []
                for item in node.meta.list.items:
                    if item.WhichOneof("kind") == "tensor":
                        items.append(add_value(item.tensor, _PV.STORAGE_STEP))
                    else:
                        items.append(None)
                    step.outputs.append(items[-1] if items[-1] is not None else -1)
                value_of[node.name] = items
            else:
                raise NotImplementedError(f"node {node.name}: result of kind {kind}")
        elif node.op == proto.Node.OP_OUTPUT:
            for a in node.args[0].list.items:
                ref = value_of.get(a.node) if a.WhichOneof("value") == "node" else None
                plan.outputs.append(ref if isinstance(ref, int) else -1)
    plan.num_inputs = num_inputs
    return plan


def artifact_checksum(artifact):
    copy = proto.Artifact()
    copy.CopyFrom(artifact)
    copy.ClearField("checksum")
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()


def make_artifact(plan, target, binaries=()):
    """An Artifact as kilnd stores it: format version, target, binaries, plan and checksum."""
    artifact = proto.Artifact(format_version=ARTIFACT_FORMAT_VERSION, target=target, plan=plan)
    for b in binaries:
        artifact.binaries.add().CopyFrom(b)
    artifact.checksum = artifact_checksum(artifact)
    return artifact


def entry_record(artifact, request, sections=()):
    """kilnd's entry record encoding (server/cache/entry_record.h): "KILNREC1", u32 version,
    u64-length artifact, u32 section count, then (u32-length name, u64-length data) pairs."""
    stored = proto.CompileRequest()
    stored.CopyFrom(request)
    stored.ClearField("client")
    all_sections = [("request", stored.SerializeToString())] + list(sections)
    data = artifact.SerializeToString()
    out = [b"KILNREC1", struct.pack("<I", 1), struct.pack("<Q", len(data)), data,
           struct.pack("<I", len(all_sections))]
    for name, body in all_sections:
        name_bytes = name.encode()
        body = body.encode() if isinstance(body, str) else body
        out += [struct.pack("<I", len(name_bytes)), name_bytes, struct.pack("<Q", len(body)), body]
    return b"".join(out)


def bundle(entries):
    """kilnd's bundle format (server/bundle.h) for [(EntrySummary, record bytes)]."""
    out = [b"KILNBNDL", struct.pack("<I", 1)]
    for summary, record in entries:
        s = summary.SerializeToString()
        out += [struct.pack("<Q", len(s)), s, struct.pack("<Q", len(record)), record,
                hashlib.sha256(s + record).digest()]
    out.append(struct.pack("<Q", 0))
    return b"".join(out)


def import_artifact(client, request, artifact):
    """Stores `artifact` in the kilnd behind `client` (a kiln.rpc.KilnClient) under the key of
    `request`'s graph; returns (key, ImportResponse)."""
    key = client.lookup(request, timeout=30).key
    summary = proto.EntrySummary(key=key, target=request.target, debug_name=request.graph.debug_name,
                                 graph_summary="hand-made aten plan (kiln.testing)")
    data = bundle([(summary, entry_record(artifact, request))])
    response = client.import_bundle([proto.BundleChunk(data=data)], timeout=60)
    return key, response


class CpuGraphs:
    """Stands in for torch.cuda in kiln.cuda_graphs: install it with
    ``monkeypatch.setattr(kiln.cuda_graphs, "_DEVICE", CpuGraphs())``. kiln.backend then wraps CPU
    plans in CudaGraphRunner too (option cuda_graphs). A "graph" re-runs the captured executor at
    replay, on the capture's static buffers and the replaying call's static-address inputs (what
    a real graph reads at their addresses), and writes its results into the captured outputs, as
    a replay writes the same memory. Like a real graph, it holds no static-address input.
    Counts its captures and replays. replays_run=False: a replay does nothing (the outputs keep
    the capture's values; wrong results by design), to time the host work around replays alone."""

    def __init__(self, replays_run=True):
        self.captures, self.replays = 0, 0
        self.replays_run = replays_run

    def wraps(self, executor):
        return True

    def applies(self, device):
        return True

    def capturing(self, device):
        return False

    def capture(self, executor, static_inputs, symbols, static, device):
        executor(static_inputs, symbols)  # the warm-up
        outputs = executor(static_inputs, symbols)  # (a real capture runs nothing)
        self.captures += 1
        held = [None if s else t for t, s in zip(static_inputs, static)]
        return (executor, held, static, symbols, outputs), outputs

    def replay(self, graph, device, inputs):
        import torch

        self.replays += 1
        if not self.replays_run:
            return
        executor, held, static, symbols, outputs = graph
        args = [t if s else h for t, h, s in zip(inputs, held, static)]
        with torch.no_grad():
            for o, n in zip(outputs, executor(args, symbols)):
                if isinstance(o, torch.Tensor):  # (a replay does not bump version counters)
                    with torch.autograd._unsafe_preserve_version_counter(o):
                        o.copy_(n)

    def order(self, last, device):
        return last
