"""Message classes of the kiln.v1 protocol (and grpc.health.v1), built at import time.

No generated ``_pb2`` modules: the package ships ``_proto/kiln_v1.binpb``, a serialized
FileDescriptorSet written by ``scripts/gen_proto.sh``. This module loads it into a private
DescriptorPool (so it never clashes with anything else in the process) and builds one class per
message. That works with every protobuf runtime from 3.20 to 7.x (python, cpp and upb).

Exposed as module attributes:
  * every top-level message of kiln.v1 and grpc.health.v1: ``Graph``, ``CompileRequest``,
    ``HealthCheckRequest``, ...; nested enums through their message (``Node.OP_PLACEHOLDER``,
    ``SymExpr.Op.Name(4)``, ``HealthCheckResponse.SERVING``);
  * every top-level enum as an EnumTypeWrapper (``DType.Name(1)``, ``DType.Value("DTYPE_INT8")``)
    and each of its values as an int (``DTYPE_FLOAT32``, ``GRAPH_KIND_FORWARD``);
  * ``POOL`` (the DescriptorPool) and ``service(full_name)`` for service descriptors.
"""

import os

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

DESCRIPTOR_SET_PATH = os.path.join(os.path.dirname(__file__), "_proto", "kiln_v1.binpb")
PACKAGES = ("kiln.v1", "grpc.health.v1")

POOL = descriptor_pool.DescriptorPool()


def _load_files(pool, path):
    with open(path, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    by_name = {fd.name: fd for fd in fds.file}
    added = []

    def add(name):  # dependencies first; protoc already orders them, but do not rely on it
        if name in added or name not in by_name:
            return
        for dep in by_name[name].dependency:
            add(dep)
        pool.AddSerializedFile(by_name[name].SerializeToString())
        added.append(name)

    for fd in fds.file:
        add(fd.name)
    return [pool.FindFileByName(name) for name in added]


def _class_maker(pool):
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
    if get_class is not None:
        return get_class
    factory = message_factory.MessageFactory(pool)  # protobuf 3.20 .. 4.21
    return factory.GetPrototype


def _export(namespace):
    make_class = _class_maker(POOL)
    exported = []
    for file_desc in _load_files(POOL, DESCRIPTOR_SET_PATH):
        if file_desc.package not in PACKAGES:
            continue
        for name, desc in file_desc.message_types_by_name.items():
            if name in namespace:
                raise ImportError(f"kiln.proto: duplicate name {name} in {DESCRIPTOR_SET_PATH}")
            namespace[name] = make_class(desc)
            exported.append(name)
        for name, desc in file_desc.enum_types_by_name.items():
            namespace[name] = enum_type_wrapper.EnumTypeWrapper(desc)
            exported.append(name)
            for value in desc.values:
                if value.name in namespace:
                    raise ImportError(f"kiln.proto: duplicate enum value {value.name}")
                namespace[value.name] = value.number
                exported.append(value.name)
    return exported


def service(full_name):
    """The ServiceDescriptor of e.g. "kiln.v1.Compiler"."""
    return POOL.FindServiceByName(full_name)


__all__ = _export(globals())
