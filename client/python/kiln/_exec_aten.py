"""_Program's aten steps (a mixin of kiln.executor._Program): argument lists with constants
prebound (_arg, _filler, _list_builder), the op's call (_invoker), where its results go (_store) and
the step's instruction (_emit_aten); runs of copy_ steps as one torch._foreach_copy_ (merge_copies,
_emit_copies)."""

import torch

from kiln._exec_common import _PV, PlanError, _Tensor, _again, _raiser
from kiln.guards import eval_expr

_OpOverload = getattr(torch._ops, "OpOverload", None)
_COPY = getattr(getattr(torch.ops.aten, "copy_", None), "default", None)
_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)

# Ops whose only overload (besides .out) has a public binding in torch._C._VariableFunctions with
# the same schema: it parses its arguments in C++ and calls the op unboxed, where an OpOverload
# makes a boxed call (convolution: 2.3 against 4.9 us a call on the development VM; ResNet-50 runs
# 53 a step). Such bindings honour __torch_function__, which an OpOverload does not: programs run
# with torch functions disabled (kiln.executor._Program.__call__), so both behave alike.
_BOUND = ("convolution", "cudnn_convolution", "native_layer_norm", "native_group_norm",
          "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_cudnn_attention")


def _callable_of(op):
    """What calling an AtenStep's op amounts to: its binding (_BOUND), else the OpOverload's
    `self._op(*args, **kwargs)`."""
    if _OpOverload is None or type(op) is not _OpOverload:
        return op
    packet = getattr(op, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if name in _BOUND and op._overloadname == "default" and set(packet.overloads()) <= {"default", "out"}:
        bound = getattr(torch._C._VariableFunctions, name, None)
        if bound is not None:
            return bound
    if callable(getattr(op, "_op", None)):
        return op._op
    return op


def _copy_pair(entry, values):
    """(dst, src) of an aten step `copy_(dst, src)` whose outputs are unused or the step's own
    (STORAGE_STEP), else None."""
    if entry[0] != "aten" or _COPY is None or entry[1] is not _COPY:
        return None
    _, _, args, kwargs, outputs, _ = entry
    if len(args) not in (2, 3) or args[0][0] != "v" or args[1][0] != "v":
        return None
    if args[2:] not in ([], [("c", False)]) or kwargs not in ({}, {"non_blocking": ("c", False)}):
        return None
    if any(o >= 0 and values[o].storage != _PV.STORAGE_STEP for o in outputs):
        return None
    return args[0][1], args[1][1]


def merge_copies(steps, values, root):
    """steps (PlanExecutor._steps) with each run of two or more consecutive `copy_(dst, src)` aten
    steps as one ("copies", [(dst, src, outputs, where)]) entry: the updates AOTAutograd leaves at
    the end of a graph that mutates its inputs (batch norm's running statistics: 159 in a
    ResNet-50 training forward). A run is cut where a copy's destination is another's destination
    or source (by root value), so running them at once reads what running them in order would."""
    if _FOREACH_COPY is None:
        return steps
    out, run, dsts, srcs = [], [], set(), set()

    def flush():
        if len(run) >= 2:
            out.append(("copies", [(d, s, entry[4], entry[5]) for entry, d, s in run]))
        else:
            out.extend(entry for entry, _, _ in run)
        run.clear()
        dsts.clear()
        srcs.clear()

    for entry in steps:
        pair = _copy_pair(entry, values)
        if pair is None:
            flush()
            out.append(entry)
            continue
        d, s = root[pair[0]], root[pair[1]]
        if d == s or d in dsts or d in srcs or s in dsts:
            flush()
        run.append((entry, *pair))
        dsts.add(d)
        srcs.add(s)
    flush()
    return out


class _AtenMixin:
    """_Program's methods that emit aten steps."""

    def _arg(self, tree):
        """A loader tree -> ("c", constant) | ("v", value index) | ("f", env -> argument)."""
        tag = tree[0]
        if tag == "c":
            return tree
        if tag == "v":
            self._need(tree[1])
            return tree
        if tag == "sym":
            try:
                return ("c", eval_expr(tree[1], self.symbols))
            except Exception as e:
                return ("f", _raiser(_again(e)))
        if tag == "device":
            device = self.device
            if device is not None and device.type == tree[1]:
                return ("c", device)
            return ("c", torch.device(tree[1], tree[2]) if tree[2] >= 0 else torch.device(tree[1]))
        if tag == "list":
            items = [self._arg(x) for x in tree[1]]
            if all(item[0] == "c" for item in items):
                out = [item[1] for item in items]
                return ("c", tuple(out) if tree[2] else out)
            return ("f", self._list_builder(items, tree[2]))
        raise PlanError(f"bad argument tree {tag}")

    def _filler(self, items):
        """env -> the list of `items` (constants prebound, values read from env, nested builders
        called), or None when every item is a constant (then `template` is the list itself).
        Returns (fill, template)."""
        template = [item[1] if item[0] == "c" else None for item in items]
        values = [(p, item[1]) for p, item in enumerate(items) if item[0] == "v"]
        calls = [(p, item[1]) for p, item in enumerate(items) if item[0] == "f"]
        if not values and not calls:
            return None, template
        none_used = self._none_used

        def fill(env):
            out = template.copy()
            for p, i in values:
                x = env[i]
                if x is None:
                    none_used(env, i)
                out[p] = x
            for p, f in calls:
                out[p] = f(env)
            return out

        return fill, template

    def _list_builder(self, items, is_tuple):
        fill, _ = self._filler(items)  # not all constants: _arg folds those
        if is_tuple:
            return lambda env: tuple(fill(env))
        return fill

    def _invoker(self, op, args, kwargs):
        """env -> the op's result, with the arguments' constants prebound."""
        call = _callable_of(op)
        fill, template = self._filler([self._arg(a) for a in args])
        kw_items = [(k, self._arg(a)) for k, a in kwargs.items()]
        kw_const = {k: a[1] for k, a in kw_items if a[0] == "c"}
        kw_dynamic = [(k, a) for k, a in kw_items if a[0] != "c"]
        none_used = self._none_used
        if kw_dynamic:
            fill_args = fill or (lambda env: template)

            def invoke(env):
                a = fill_args(env)  # positional arguments first, as torch would see them
                kw = dict(kw_const)
                for k, (tag, x) in kw_dynamic:
                    if tag == "f":
                        kw[k] = x(env)
                    elif env[x] is None:
                        none_used(env, x)
                    else:
                        kw[k] = env[x]
                return call(*a, **kw)
        elif fill is None:
            template = tuple(template)

            def invoke(env):
                return call(*template, **kw_const)
        elif kw_const:
            def invoke(env):
                return call(*fill(env), **kw_const)
        else:
            def invoke(env):
                return call(*fill(env))
        return invoke

    def _store(self, o, where):
        """(env, item of the op's result) -> None: the result becomes value o, or is copied into it."""
        ex = self.ex
        if ex.values[o].storage != _PV.STORAGE_STEP:
            post = []  # the destination gets its tensor after the op ran, as before
            self._need(o, post)
            post = tuple(post)

            def store(env, r):
                if not isinstance(r, _Tensor):
                    raise PlanError(f"{where}: output v{o} is a {type(r).__name__}, not a tensor")
                for instruction in post:
                    instruction(env)
                env[o].copy_(r)

            return store
        NONES, meta, dtype = self.NONES, self.metas[o], ex._dtypes[o]
        fix = o in ex._kernel_consumers
        if isinstance(meta, Exception):
            sizes = strides = None
        else:
            sizes, strides = meta

        def store(env, r):
            if r is None:
                # Some ops return None for tuple items they did not compute (e.g. the debug mask of
                # _scaled_dot_product_cudnn_attention), though the capture's metadata said tensor.
                # Fine unless a later step or the graph's outputs read that value.
                nones = env[NONES]
                if nones is None:
                    nones = env[NONES] = {}
                nones[o] = where
                return
            if not isinstance(r, _Tensor):
                raise PlanError(f"{where}: output v{o} is a {type(r).__name__}, not a tensor")
            if sizes is None:
                raise _again(meta)()
            if r.shape != sizes or r.dtype is not dtype:
                raise PlanError(f"{where}: output v{o} is {r.dtype}{list(r.shape)}, the plan "
                                f"says {dtype}{list(sizes)}")
            if fix and r.stride() != strides and r.numel() > 1:
                fixed = torch.empty_strided(sizes, strides, dtype=r.dtype, device=r.device)
                fixed.copy_(r)
                r = fixed
            env[o] = r

        return store

    def _emit_aten(self, op, args, kwargs, outputs, where):
        invoke = self._invoker(op, args, kwargs)
        stores = [(k, self._store(o, where)) for k, o in enumerate(outputs) if o >= 0]
        for o in outputs:
            if o >= 0 and self.ex.values[o].storage == _PV.STORAGE_STEP:
                self.ready.add(o)
                self.maybe_none.add(o)
        count = len(outputs)
        if count == 1:
            store = stores[0][1] if stores else None

            def instruction(env):
                r = invoke(env)
                if isinstance(r, (tuple, list)):
                    if not r:
                        raise PlanError(f"{where}: returned 0 values for 1 outputs")
                    r = r[0]
                if store is not None:
                    store(env, r)
        else:
            def instruction(env):
                r = invoke(env)
                if not isinstance(r, (tuple, list)):
                    raise PlanError(f"{where}: returned one value for {count} outputs")
                if len(r) < count:
                    raise PlanError(f"{where}: returned {len(r)} values for {count} outputs")
                for k, store in stores:
                    store(env, r[k])
        self.code.append(instruction)

    def _emit_copies(self, copies):
        """One instruction for a run of copy_ steps (merge_copies): a torch._foreach_copy_ of their
        destinations from their sources per (devices, dtypes) group (torch's multi-tensor kernel
        takes one dtype and device; a mixed list copies tensor by tensor: 159 copies took 1.4 ms of
        host time a ResNet-50 step, f32 statistics and int64 counters), then each step's output is
        its destination."""
        groups = {}
        for d, s, _, _ in copies:
            self._need(d)
            self._need(s)
            key = tuple((self._device_of(i).type, self.ex._dtypes[i]) for i in (d, s))
            groups.setdefault(key, ([], []))
            groups[key][0].append(d)
            groups[key][1].append(s)
        groups = tuple((tuple(d), tuple(s)) for d, s in groups.values())
        aliases = tuple((o, d) for d, _, outputs, _ in copies for o in outputs if o >= 0)
        for o, _ in aliases:
            self.ready.add(o)
        none_used = self._none_used

        def instruction(env):
            for dst, src in groups:
                try:
                    _FOREACH_COPY([env[i] for i in dst], [env[i] for i in src])
                except TypeError:
                    for i in dst + src:
                        if env[i] is None:
                            none_used(env, i)
                    raise
            for o, d in aliases:
                env[o] = env[d]

        self.code.append(instruction)
