"""kiln: client of kilnd, the out-of-process compiler and shared compile cache for torch.compile.

``import kiln`` does not import torch (kilnctl and health checks run without it); the serializer
functions import it on first use.
"""

from kiln.errors import SerializeError

__version__ = "0.1.0"

__all__ = ["SerializeError", "__version__", "deserialize_graph", "serialize_graph"]


def __getattr__(name):  # PEP 562: load the torch-dependent modules lazily
    if name == "serialize_graph":
        from kiln.serialize import serialize_graph

        return serialize_graph
    if name == "deserialize_graph":
        from kiln.deserialize import deserialize_graph

        return deserialize_graph
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
