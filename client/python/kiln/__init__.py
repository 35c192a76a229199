"""kiln: client of kilnd, the out-of-process compiler and shared compile cache for torch.compile.

``torch.compile(model, backend="kiln")`` uses it (registered through the ``torch_dynamo_backends``
entry point). ``import kiln`` does not import torch (kilnctl and health checks run without it);
the serializer functions, the backend and ``kiln.precompile`` import it on first use.

``kiln.precompile(model, example_inputs, target="cuda:sm_90", training=False)`` captures a model's
graphs as ``torch.compile(backend="kiln")`` would and has kilnd compile them for a target without
running anything (a CPU-only job can fill the cache for GPU nodes); see kiln.precompiler.

``kiln.compile(model)`` (experimental) is ``torch.compile(model, backend="kiln", fullgraph=True)``
whose Dynamo capture kilnd keeps as well, so a new process skips Dynamo's trace; see kiln.packages.
"""

from kiln.errors import KilnError, KilnWarning, SerializeError
from kiln.counters import reset_stats, stats

__version__ = "0.1.0"

__all__ = ["KilnError", "KilnWarning", "PrecompileRecord", "SerializeError", "__version__",
           "compile", "deserialize_graph", "precompile", "reset_stats", "serialize_graph", "stats"]


def __getattr__(name):  # PEP 562: load the torch-dependent modules lazily
    if name == "serialize_graph":
        from kiln.serialize import serialize_graph

        return serialize_graph
    if name == "deserialize_graph":
        from kiln.deserialize import deserialize_graph

        return deserialize_graph
    if name == "compile":
        from kiln import packages

        return packages.compile
    if name in ("precompile", "PrecompileRecord"):
        from kiln import precompiler

        return getattr(precompiler, name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
