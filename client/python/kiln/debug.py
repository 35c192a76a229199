"""KILN_DEBUG=1: one folder per graph with what kiln sent, what kilnd answered and what ran.

Folder: ``<KILN_DEBUG_DIR or ./kiln_debug>/<pid>/<n>_<kind>`` (n counts the graphs of the process).
Files (those that apply):
  fx_graph.txt      the FX graph as torch holds it (GraphModule.print_readable)
  request.binpb     the serialized kiln.v1.CompileRequest (replay it, or feed it to kilnctl)
  key.txt           the cache key, and the fields it hashes (Admin.GetEntry key_record) when cached
  source/<name>     the generated source (Admin.GetEntry include_source; kept when KILN_DEBUG is on)
  plan.txt          the plan, readable
  timings.txt       client phases (serialize, rpc, load) and the server's phases
  outcome.txt       how the graph runs: the cache source, or why it runs eagerly
"""

import itertools
import logging
import os
import threading

from kiln import proto

log = logging.getLogger("kiln")

_COUNTER = itertools.count()
_LOCK = threading.Lock()
_ANNOUNCED = set()


def graph_dir(opts, kind_name):
    root = os.path.abspath(os.path.join(opts.debug_dir, str(os.getpid())))
    with _LOCK:
        n = next(_COUNTER)
        if root not in _ANNOUNCED:
            _ANNOUNCED.add(root)
            log.warning("kiln: KILN_DEBUG is on; writing a folder per graph under %s", root)
    path = os.path.join(root, f"{n}_{kind_name}")
    os.makedirs(path, exist_ok=True)
    return path


def _write(path, name, data):
    full = os.path.join(path, name)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(full, mode) as f:
        f.write(data)


def _safe_name(name):
    keep = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return keep.lstrip(".") or "source"


def dump(opts, kind_name, *, gm=None, request=None, response=None, client=None, outcome="",
         client_times=None, plan_text=None):
    """Writes the folder; never raises (a debugging aid must not break training). Returns its path."""
    try:
        path = graph_dir(opts, kind_name)
    except OSError as e:
        log.warning("kiln: cannot create the debug folder under %s: %s", opts.debug_dir, e)
        return None
    try:
        if gm is not None:
            try:
                text = gm.print_readable(print_output=False)
            except Exception:  # older torch or an unusual module
                text = str(gm.graph)
            _write(path, "fx_graph.txt", text)
        if request is not None:
            _write(path, "request.binpb", request.SerializeToString())
        key_lines = []
        entry = None
        if response is not None and response.key:
            key_lines.append(f"key: {response.key}")
            if client is not None and response.HasField("artifact"):
                try:
                    entry = client.get_entry(proto.GetEntryRequest(
                        key=response.key, include_key_record=True, include_source=True,
                        include_timings=True), timeout=30)
                except Exception as e:  # grpc.RpcError, e.g. NOT_FOUND for an evicted entry
                    key_lines.append(f"(Admin.GetEntry failed: {e})")
            if entry is not None and entry.key_record:
                key_lines.append("hashed fields:")
                key_lines.extend(f"  {f.path} = {f.value}" for f in entry.key_record)
            elif entry is not None:
                key_lines.append("(kilnd keeps no key record for this entry)")
            else:
                key_lines.append("(not cached on the server, so its hashed fields are not available; "
                                 "`kilnctl explain-miss` compares keys)")
        if key_lines:
            _write(path, "key.txt", "\n".join(key_lines) + "\n")
        if entry is not None:
            for src in entry.sources:
                _write(path, os.path.join("source", _safe_name(src.name)), src.text)
        if plan_text is not None:
            _write(path, "plan.txt", plan_text)
        lines = []
        for phase, seconds in (client_times or {}).items():
            lines.append(f"client {phase}: {seconds * 1000:.3f} ms")
        if response is not None:
            for t in response.timings:
                lines.append(f"server {t.phase}: {t.micros / 1000:.3f} ms")
        if lines:
            _write(path, "timings.txt", "\n".join(lines) + "\n")
        if outcome:
            _write(path, "outcome.txt", outcome + "\n")
        log.info("kiln: debug files for the %s graph are in %s", kind_name, path)
    except Exception as e:  # pragma: no cover
        log.warning("kiln: writing debug files to %s failed: %s", path, e)
    return path


def format_plan(plan, artifact=None):
    """A readable rendering of a kiln.v1.Plan."""
    pv = proto.PlanValue

    def sym(s):
        if s.WhichOneof("value") == "expr":
            return _expr(s.expr)
        return str(s.constant)

    lines = [f"plan: {plan.num_inputs} inputs, {len(plan.values)} values, {len(plan.steps)} steps, "
             f"workspace {plan.workspace_bytes} bytes"]
    for i, v in enumerate(plan.values):
        m = v.meta
        where = {
            pv.STORAGE_INPUT: f"input[{v.index}]",
            pv.STORAGE_OUTPUT: "output",
            pv.STORAGE_WORKSPACE: f"workspace+{v.offset}",
            pv.STORAGE_VIEW: f"view(v{v.index}, +{v.offset})",
            pv.STORAGE_CONSTANT: f"constant[{v.index}]",
            pv.STORAGE_STEP: "step",
        }.get(v.storage, f"storage {v.storage}")
        dtype = proto.DType.Name(m.dtype).replace("DTYPE_", "").lower()
        lines.append(f"v{i} = {where:<22} {dtype}[{', '.join(sym(s) for s in m.sizes)}] "
                     f"strides [{', '.join(sym(s) for s in m.strides)}]")
    for i, step in enumerate(plan.steps):
        kind = step.WhichOneof("kind")
        if kind == "aten":
            a = step.aten
            args = ", ".join(_arg(x) for x in a.args)
            kw = ", ".join(f"{k.name}={_arg(k.value)}" for k in a.kwargs)
            outs = ", ".join(f"v{o}" for o in a.outputs)
            flags = " [fallback]" if a.fallback else ""
            lines.append(f"step {i}: aten {a.target}({args}{', ' if args and kw else ''}{kw}) -> {outs}"
                         f"{flags}{' (node ' + a.node + ')' if a.node else ''}")
        elif kind == "kernel":
            k = step.kernel
            launch = (f" grid {list(k.grid)} block {list(k.block)}"
                      f"{f' shared {k.shared_bytes}' if k.shared_bytes else ''}" if k.grid or k.block else "")
            lines.append(f"step {i}: kernel {k.symbol}@binary{k.binary}("
                         f"{', '.join(f'v{x}' for x in k.args)}; scalars {list(k.scalar_args)}){launch}")
        elif kind == "library":
            lib = step.library
            lines.append(f"step {i}: library {lib.function}({list(lib.args)}; params {list(lib.int_params)}; "
                         f"alpha, beta {list(lib.float_params)})")
    lines.append("outputs: " + ", ".join(f"v{o}" for o in plan.outputs))
    if artifact is not None:
        for i, b in enumerate(artifact.binaries):
            lines.append(f"binary {i}: {proto.Binary.Kind.Name(b.kind)}, {len(b.data)} bytes, {b.compiler}")
    return "\n".join(lines) + "\n"


_EXPR_OPS = {"OP_ADD": "+", "OP_MUL": "*", "OP_FLOOR_DIV": "//", "OP_MOD": "%"}


def _expr(e):
    name = proto.SymExpr.Op.Name(e.op)
    if name == "OP_CONSTANT":
        return str(e.constant)
    if name == "OP_SYMBOL":
        return f"s{e.symbol}"
    if name == "OP_NEG":
        return f"-({_expr(e.args[0])})"
    if name in _EXPR_OPS:
        return "(" + f" {_EXPR_OPS[name]} ".join(_expr(a) for a in e.args) + ")"
    return f"{name[3:].lower()}({', '.join(_expr(a) for a in e.args)})"


def _arg(a):
    kind = a.WhichOneof("value")
    if kind == "node":
        return a.node
    if kind == "list":
        inner = ", ".join(_arg(x) for x in a.list.items)
        return f"({inner})" if a.list.is_tuple else f"[{inner}]"
    if kind == "none":
        return "None"
    if kind == "sym_int":
        return _expr(a.sym_int)
    if kind == "dtype":
        return proto.DType.Name(a.dtype)
    if kind == "device":
        return f"{proto.DeviceKind.Name(a.device.kind)}:{a.device.index}"
    if kind is None:
        return "?"
    return repr(getattr(a, kind))
