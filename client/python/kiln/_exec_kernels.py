"""_Program's kernel and library steps (a mixin of kiln.executor._Program): CPU kernel runs through
the runtime's step tables (_emit_kernels), CUDA launches (_emit_cuda) and cuBLASLt GEMM steps
(_gemm_views, _emit_gemm, with _torch_gemm where torch runs them). _IS_CUDA and _current_stream,
which the launches read per call, are this module's (tests patch them here)."""

import operator

import torch

from kiln import proto
from kiln._exec_common import (_PV, PlanError, _again, _data_ptr, _getter, _plan_error, _raiser,
                               _warn_once)
from kiln.runtime import GemmUnsupported

_IS_CUDA = operator.attrgetter("is_cuda")


def _current_stream(device):
    """The CUstream (an int) torch enqueues work for `device` on."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


def gemm_run_params(p):
    """A library GEMM's params (gemm_step.h's encoding) as the runtime runs them: the plan's, with
    the TF32 bit (kGemmFlags bit 0) set for f32 when torch's matmul precision allows TF32."""
    params = list(p)
    if p[4] == proto.DTYPE_FLOAT32 and torch.get_float32_matmul_precision() != "highest":
        params[16] |= 1
    return params


def _torch_gemm(views, batch, c_kind, alpha, beta):
    """env -> None: the GEMM of a library step computed by torch into D (views: from _gemm_views)."""
    (d, d_sizes, d_strides), (a, a_sizes, a_strides), (b, b_sizes, b_strides) = views[:3]
    c = views[3] if len(views) == 4 else None
    batched = batch > 1

    def run(env):
        dt, at, bt = env[d], env[a], env[b]
        out = dt.as_strided(d_sizes, d_strides, dt.storage_offset())
        x = at.as_strided(a_sizes, a_strides, at.storage_offset())
        y = bt.as_strided(b_sizes, b_strides, bt.storage_offset())
        if c is None:
            if alpha == 1.0:
                (torch.bmm if batched else torch.mm)(x, y, out=out)
            else:  # beta = 0: the first operand is ignored
                (torch.baddbmm if batched else torch.addmm)(out, x, y, beta=0, alpha=alpha, out=out)
            return
        ct = env[c[0]]
        z = ct.as_strided(c[1], c[2], ct.storage_offset())
        (torch.baddbmm if batched else torch.addmm)(z, x, y, beta=beta, alpha=alpha, out=out)

    return run


class _KernelMixin:
    """_Program's methods that emit kernel steps (CPU and CUDA) and cuBLASLt GEMM steps."""

    def _scalars(self, scalars):
        out = []
        for s in scalars:
            if s not in self.symbols:
                return None, _raiser(_plan_error(f"kernel scalar argument: symbol {s} has no value"))
            out.append(self.symbols[s])
        return out, None

    def _emit_kernels(self, batch):
        entries, args, offsets = [], [], []
        for module, kernel, step_args, scalars in batch:
            for a in step_args:
                off = self._pointer(a)
                if off is None:
                    off = self._view_pointer(a)
                if off is None:
                    self._need(a)
                offsets.append(off)
            values, fail = self._scalars(scalars)
            if fail is not None:
                self.code.append(fail)
                return
            args.extend(step_args)
            entries.append((module, kernel, len(step_args), values))
        runtime, b, TABLES = self.ex._runtime, len(self.table_builders), self.TABLES
        self.table_builders.append(lambda: runtime.step_table(entries))
        if not args:
            def instruction(env):
                env[TABLES][b].run()

            self.code.append(instruction)
            return
        count = len(args)
        if any(off is not None for off in offsets):
            fill = self._buffer_fill(args, offsets)

            def instruction(env):
                table = env[TABLES][b]
                table.buffers[:count] = fill(env)
                table.run()
        else:
            get, explain = self._pointer_filler(args)

            def instruction(env):
                table = env[TABLES][b]
                try:
                    table.buffers[:count] = list(map(_data_ptr, get(env)))
                except TypeError as e:  # a None (or a non-tensor) among them
                    explain(env, e)
                table.run()

        self.code.append(instruction)

    def _emit_cuda(self, batch):
        device = self.device
        if device is None or device.type != "cuda":
            self.code.append(_raiser(_plan_error(f"a plan compiled for CUDA runs on {device or 'no'} tensors")))
            return
        modules = self.ex.cuda_modules(device)
        entries, args, offsets, check = [], [], [], []
        for spec in batch:
            module = modules[spec.binary]
            values, fail = self._scalars(spec.scalars)
            for a in spec.args:
                off = self._pointer(a, cuda=True)  # on the device: no per-call check
                if off is None:
                    off = self._view_pointer(a)
                    if off is not None and off[0] not in check and not self._on_device(off[0]):
                        check.append(off[0])  # the root is what is checked then
                if off is None:
                    self._need(a)
                    if a not in check and not self._on_device(a):
                        check.append(a)
                offsets.append(off)
            if fail is not None:
                self.code.append(fail)
                return
            args.extend(spec.args)
            entries.append((module, module.add_kernel(spec.symbol), spec.grid_x, spec.block_x,
                            spec.shared_bytes, len(spec.args), values))
        runtime, b, TABLES, STREAM = self.ex._runtime, len(self.table_builders), self.TABLES, self.STREAM
        self.table_builders.append(lambda: runtime.cuda_launch_table(entries))
        count = len(args)
        fill = get = None
        if any(off is not None for off in offsets):
            fill = self._buffer_fill(args, offsets)
        elif count:
            get, explain = self._pointer_filler(args)
        symbols = {}
        for spec in batch:
            for a in spec.args:
                symbols.setdefault(a, spec.symbol)
                symbols.setdefault(self.ex._root[a], spec.symbol)
        on_cuda = _getter(check) if check else None

        def off_device(env):
            for a in check:
                t = env[a]
                if not _IS_CUDA(t):
                    raise PlanError(f"kernel {symbols[a]}: argument v{a} is on {t.device}, not on {device}")

        def instruction(env):
            table = env[TABLES][b]
            if fill is not None:
                table.buffers[:count] = fill(env)
            elif get is not None:
                try:
                    table.buffers[:count] = list(map(_data_ptr, get(env)))
                except TypeError as e:
                    explain(env, e)
            if on_cuda is not None and not all(map(_IS_CUDA, on_cuda(env))):
                off_device(env)
            stream = env[STREAM]
            if stream is None:
                stream = env[STREAM] = _current_stream(device)
            table.run(stream)

        self.code.append(instruction)

    def _gemm_views(self, spec):
        """[(value, sizes, strides)] of the GEMM's D, A, B and C (if any) as the step sees them, or a
        PlanError when a view reaches past its value (or a dtype differs)."""
        where, args, p, _, _ = spec
        batch, m, n, k, dtype = p[:5]
        shapes = [((m, n), (p[12], 1)), ((m, k), (p[6], p[7])), ((k, n), (p[9], p[10]))]
        strides_b = [p[11], p[5], p[8]]
        if p[13] == 1:
            shapes.append(((n,), (1,)))
            strides_b.append(None)
        elif p[13] == 2:
            shapes.append(((m, n), (p[15], 1)))
            strides_b.append(p[14])
        views = []
        for slot, (sizes, strides) in enumerate(shapes):
            v = args[slot]
            if self.ex.values[v].meta.dtype != dtype:
                raise PlanError(f"{where}: v{v} is not of the step's dtype")
            if batch > 1 and strides_b[slot] is not None:
                sizes, strides = (batch, *sizes), (strides_b[slot], *strides)
            meta = self.metas[v]
            if isinstance(meta, Exception):
                raise _again(meta)()
            reach = sum((s - 1) * st for s, st in zip(sizes, strides))
            extent = sum((s - 1) * st for s, st in zip(*meta)) if all(meta[0]) else -1
            if min(strides) < 0 or reach > extent or any(st < 0 for st in meta[1]):
                raise PlanError(f"{where}: operand {slot} (v{v}) reaches element {reach}, past its value "
                                f"(sizes {list(meta[0])}, strides {list(meta[1])})")
            views.append((v, sizes, strides))
        return views

    def _emit_gemm(self, spec):
        where, args, p, alpha, beta = spec
        try:
            views = self._gemm_views(spec)
        except Exception as e:
            self.code.append(_raiser(_again(e)))
            return
        run_torch = _torch_gemm(views, p[0], p[13], alpha, beta)
        device, runtime = self.device, self.gemm_runtime
        if runtime is None:
            for v, _, _ in views:
                self._need(v)
            self.code.append(run_torch)
            return
        operands = [v for v, _, _ in views]
        materialize = []  # what gives the operands read by pointer their tensors, for torch
        pointers = []
        for v in operands:
            off = self._pointer(v, cuda=True)
            if off is not None:
                materialize.append(self._ws_tensor(v))
            elif self.ex.values[self.ex._root[v]].storage != _PV.STORAGE_STEP:
                off = self._view_pointer(v)  # e.g. a transposed weight: its input's pointer
                if off is not None:
                    materialize.append(self._view_tensor(v, *off))
            if off is None:
                self._need(v)
            pointers.append(off)
        ws = args[4]
        if ws >= 0:
            meta = self.metas[ws]
            if isinstance(meta, Exception) or self.ex._dtypes[ws] != torch.uint8 or meta[0] != (p[17],):
                self.code.append(_raiser(_plan_error(f"{where}: workspace v{ws} is not {p[17]} bytes of uint8")))
                return
            off = self._pointer(ws, cuda=True)
            if off is None:
                self._need(ws)
            operands.append(ws)
            pointers.append(off)
        params = gemm_run_params(p)
        index = device.index if device.index is not None else torch.cuda.current_device()
        b, TABLES, STREAM = len(self.table_builders), self.TABLES, self.STREAM
        self.table_builders.append(lambda: runtime.gemm_call(index, params, alpha, beta))
        slots = [0, 1, 2] + ([3] if len(views) == 4 else []) + ([4] if ws >= 0 else [])
        # Per call: the tensors' pointers (operands, and roots of views read by pointer, plus
        # their offsets: _view_pointer), then the workspace's.
        tensor_slots = tuple((s, 0) for s, off in zip(slots, pointers) if off is None)
        tensor_slots += tuple((s, off[1]) for s, off in zip(slots, pointers) if isinstance(off, tuple))
        tensor_values = [v for v, off in zip(operands, pointers) if off is None]
        tensor_values += [off[0] for off in pointers if isinstance(off, tuple)]
        get = _getter(tensor_values) if tensor_slots else None
        ws_slots = tuple((s, off) for s, off in zip(slots, pointers) if isinstance(off, int))
        WSPTR = self.WSPTR

        def instruction(env):
            call = env[TABLES][b]
            buffers = call.buffers
            if get is not None:
                tensors = get(env)
                if not all(map(_IS_CUDA, tensors)):
                    raise PlanError(f"{where}: an operand is not on {device}")
                for (slot, off), t in zip(tensor_slots, tensors):
                    buffers[slot] = t.data_ptr() + off
            if ws_slots:
                ws = env[WSPTR]
                for slot, off in ws_slots:
                    buffers[slot] = ws + off
            stream = env[STREAM]
            if stream is None:
                stream = env[STREAM] = _current_stream(device)
            try:
                call.run(stream)
            except GemmUnsupported as e:
                _warn_once(("unsupported", where), f"{where} runs with torch: {e}")
                for make in materialize:
                    make(env)
                run_torch(env)

        self.code.append(instruction)

    def _on_device(self, i):
        """Whether value i is known to live on the program's device: allocated here (OUTPUT,
        WORKSPACE, CONSTANT, or a view of one) on it. INPUT and STEP values are checked per call."""
        root = self.ex._root[i]
        kind = self.ex.values[root].storage
        if kind in (_PV.STORAGE_INPUT, _PV.STORAGE_STEP):
            return False
        return self._device_of(root) == self.device and (root == i or self._device_of(i) == self.device)
