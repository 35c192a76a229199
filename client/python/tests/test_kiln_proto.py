"""kiln.proto builds every message class and enum of the shipped descriptor set."""

import os
import subprocess
import sys

from google.protobuf import descriptor_pb2, descriptor_pool

from kiln import proto


def _shipped_files():
    with open(proto.DESCRIPTOR_SET_PATH, "rb") as f:
        return descriptor_pb2.FileDescriptorSet.FromString(f.read()).file


def test_every_message_and_enum_is_exposed():
    messages, enums = 0, 0
    for fd in _shipped_files():
        if fd.package not in ("kiln.v1", "grpc.health.v1"):
            continue
        for m in fd.message_type:
            cls = getattr(proto, m.name)
            assert cls.DESCRIPTOR.full_name == f"{fd.package}.{m.name}"
            assert [f.name for f in cls.DESCRIPTOR.fields] == [f.name for f in m.field]
            messages += 1
        for e in fd.enum_type:
            wrapper = getattr(proto, e.name)
            for v in e.value:
                assert getattr(proto, v.name) == v.number
                assert wrapper.Name(v.number) == v.name
            enums += 1
    assert messages >= 50 and enums >= 6
    assert proto.DTYPE_BFLOAT16 == 4 and proto.DType.Value("DTYPE_FLOAT32") == 1
    assert proto.Node.OP_CALL_FUNCTION == 3 and proto.SymExpr.Op.Name(proto.SymExpr.OP_NEG) == "OP_NEG"
    assert proto.HealthCheckResponse.ServingStatus.Name(proto.HealthCheckResponse.SERVING) == "SERVING"


def test_messages_round_trip_on_the_wire():
    req = proto.CompileRequest(target=proto.Target(device=proto.DEVICE_KIND_CUDA, cuda_arch="sm_90"))
    node = req.graph.nodes.add(name="x", op=proto.Node.OP_PLACEHOLDER, target="x")
    node.meta.tensor.sizes.add().expr.op = proto.SymExpr.OP_SYMBOL
    req.graph.symbols.add(name="s0", hint=4, min_value=2, max_value=(1 << 63) - 1)
    req.graph.constants.add(name="c", data=b"\x00\x01")
    wire = req.SerializeToString()
    back = proto.CompileRequest.FromString(wire)
    assert back == req and back.graph.nodes[0].meta.WhichOneof("kind") == "tensor"
    stats = proto.Stats(requests={"memory_hit": 3})
    assert proto.Stats.FromString(stats.SerializeToString()).requests["memory_hit"] == 3


def test_private_pool():
    assert proto.POOL is not descriptor_pool.Default()
    assert proto.Graph.DESCRIPTOR.file.pool is proto.POOL
    assert proto.service("kiln.v1.Compiler").methods_by_name["Compile"].input_type.name == "CompileRequest"


def _run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_pure_python_protobuf_runtime():
    # The GPU machines may run another protobuf backend; the pure-python one is the most different.
    code = ("from google.protobuf.internal import api_implementation as a; assert a.Type() == 'python'\n"
            "from kiln import proto\n"
            "g = proto.Graph(kind=proto.GRAPH_KIND_FORWARD); g.nodes.add(name='x')\n"
            "assert proto.Graph.FromString(g.SerializeToString()) == g\n"
            "print('ok')")
    result = _run_python(code, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_import_without_torch():
    result = _run_python("import sys, kiln, kiln.proto, kiln.rpc\n"
                         "assert 'torch' not in sys.modules, 'kiln imported torch'\nprint('ok')")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
