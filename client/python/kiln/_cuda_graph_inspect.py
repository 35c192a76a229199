"""What kiln.cuda_graphs needs to know about a graph before capturing it: inspect_graph finds the
graph inputs its ops write into (kept input updates, captured with the rest) and the graphs that
must not be captured (collectives, writes into a view of an input)."""

from kiln import proto


def inspect_graph(graph):
    """(refusal, updated) for a kiln.proto.Graph: why it must not be captured (a string, or None),
    and the positions of the graph inputs its ops write into (a tuple)."""
    from kiln.deserialize import resolve_target

    placeholders = {}
    producers = {}  # node name -> (the op's schema or None, the node)
    for node in graph.nodes:
        if node.op == proto.Node.OP_PLACEHOLDER:
            placeholders[node.name] = len(placeholders)
    updated = set()
    for node in graph.nodes:
        if node.op != proto.Node.OP_CALL_FUNCTION:
            continue
        if "c10d" in node.target:
            return f"node {node.name} is a collective ({node.target})", ()
        schema = None
        if node.target.startswith("aten.") or node.target.startswith("prims."):
            try:
                schema = getattr(resolve_target(node.target), "_schema", None)
            except Exception:
                schema = None
        producers[node.name] = (schema, node)
        if schema is None or not schema.is_mutable:
            continue
        for name in _written_nodes(schema, node):
            if name in placeholders:
                updated.add(placeholders[name])
                continue
            viewed = _viewed_input(name, producers, placeholders)
            if viewed is not None:
                return (f"node {node.name} ({node.target}) writes into {name}, a view of input "
                        f"{viewed}"), ()
    return None, tuple(sorted(updated))


def _arg_nodes(arg):
    kind = arg.WhichOneof("value")
    if kind == "node":
        return [arg.node]
    if kind == "list":
        return [n for item in arg.list.items for n in _arg_nodes(item)]
    return []


def _written_nodes(schema, node):
    """Names of the nodes passed to `node` where its schema writes (`Tensor(a!)` arguments)."""
    kwargs = {kw.name: kw.value for kw in node.kwargs}
    names = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        if i < len(node.args) and not a.kwarg_only:
            names += _arg_nodes(node.args[i])
        elif a.name in kwargs:
            names += _arg_nodes(kwargs[a.name])
    return names


def _viewed_input(name, producers, placeholders):
    """The name of the graph input that node `name` is a view of (through ops whose first result
    aliases an argument: views, in-place ops), or None if it is memory of its own."""
    for _ in range(10000):
        if name in placeholders:
            return name
        schema, node = producers.get(name, (None, None))
        if node is None:
            return None
        if node.target == "operator.getitem" and node.args:
            sources = _arg_nodes(node.args[0])
        elif schema is not None and schema.returns and schema.returns[0].alias_info is not None:
            alias_set = schema.returns[0].alias_info.before_set
            sources = [n for a, v in zip(schema.arguments, node.args)
                       if a.alias_info is not None and a.alias_info.before_set & alias_set
                       for n in _arg_nodes(v)]
        else:
            return None
        if not sources:
            return None
        name = sources[0]
    return None
