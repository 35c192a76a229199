"""Checks the op registry against torch: every aten/prims/_c10d_functional op kiln registers must
exist in torch with the same argument names, keyword-only markers and defaults (FX graphs spell
keyword arguments with torch's names, so a mismatch would refuse real graphs).

    bazel build //server/graph:prepare_graph
    .venv/bin/python server/graph/testdata/check_schemas.py bazel-bin/server/graph/prepare_graph
"""
import re
import subprocess
import sys

import torch

try:
    import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)
except Exception:  # pragma: no cover
    pass


def split_args(schema):
    inner = re.match(r"[^(]*\((.*)\) -> .*", schema).group(1)
    parts, cur, depth = [], "", 0
    for ch in inner:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    out, kw = [], False
    for p in (p.strip() for p in parts):
        if p == "*":
            kw = True
            continue
        name = p.split("=")[0].split()[-1]
        out.append((name, kw, p.split("=", 1)[1] if "=" in p else None))
    return out


def same_default(mine, value):
    if value is None:
        return mine == "None"
    if isinstance(value, bool):
        return mine == str(value)
    if isinstance(value, (int, float)):
        try:
            return float(mine) == float(value)
        except ValueError:
            return False
    if isinstance(value, str):
        return mine == '"%s"' % value
    if isinstance(value, (list, tuple)):
        return mine.replace(" ", "") == str(list(value)).replace(" ", "")
    return True  # memory formats and the like: not compared


def main():
    listing = subprocess.run([sys.argv[1], "--schemas"], check=True, capture_output=True, text=True).stdout
    bad = checked = 0
    for line in listing.splitlines():
        target, _, schema = line.split("\t")
        ns, rest = target.split(".", 1)
        if ns not in ("aten", "prims", "_c10d_functional", "c10d_functional"):
            continue
        name, overload = rest.rsplit(".", 1)
        try:
            op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        except (AttributeError, RuntimeError) as e:
            print(f"MISSING {target}: {e}")
            bad += 1
            continue
        checked += 1
        mine = split_args(schema)
        theirs = op._schema.arguments
        if [(n, k, d is not None) for n, k, d in mine] != [(a.name, a.kwarg_only, a.has_default_value()) for a in theirs]:
            print(f"DIFF {target}\n  kiln:  {schema}\n  torch: {op._schema}")
            bad += 1
            continue
        for (n, _, d), a in zip(mine, theirs):
            if d is not None and not same_default(d, a.default_value):
                print(f"DEFAULT {target} {n}: kiln {d}, torch {a.default_value!r}")
                bad += 1
    print(f"{checked} ops checked against torch {torch.__version__}, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
