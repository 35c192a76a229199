"""_Program's workspace and pointer logic (a mixin of kiln.executor._Program): the call's workspace
and the values that live in it (_workspace, _ws_tensor, _ws_place), the values kernels and cuBLASLt
GEMMs read by pointer only (_tensor_reads, _pointer, _view_pointer, _view_tensor) and the per-call
fill of a launch table's data pointers (_buffer_fill, _pointer_filler). _is_cuda_device, which
_pointer reads when the program is built, is this module's (tests patch it here)."""

import functools
import itertools
import operator

import torch

from kiln._exec_common import _PV, _data_ptr, _getter, _itemsize, _plan_error, _poisoned, _raiser, _span

# The storages a view's pointer may be computed from (_Program._view_pointer).
_VIEW_POINTER_ROOTS = (_PV.STORAGE_INPUT, _PV.STORAGE_OUTPUT, _PV.STORAGE_CONSTANT, _PV.STORAGE_STEP)
_MISSING = object()


def _is_cuda_device(device):
    """Whether tensors on `device` (a torch.device) are CUDA tensors (is_cuda): the build-time
    check of the workspace, whose values kernels read by pointer."""
    return device.type == "cuda"


class _WorkspaceMixin:
    """_Program's methods for the workspace and for values read by pointer (the state is
    _Program.__init__'s: _ws_*, tensor_reads, WS/WSPTR slots)."""

    def _workspace_view(self, i, dtype, meta):
        ws_bytes = self.ex.plan.workspace_bytes
        sizes, strides = meta
        size = _itemsize(dtype)
        offset = self.ex.values[i].offset
        extent = _span(sizes, strides)
        if offset + extent * size > ws_bytes:
            return _raiser(_plan_error(f"value v{i}: {extent * size} bytes at workspace offset {offset} "
                                       f"overflow the {ws_bytes}-byte workspace"))
        return self._ws_tensor(i, (i, dtype, size, offset // size, sizes, strides))

    def _workspace(self, root):
        """env -> the call's workspace (a uint8 tensor in env[WS], its data pointer in env[WSPTR]),
        allocated by the first call of it, on the device of `root`, the first workspace value used."""
        if self._ws_alloc is None:
            ws_bytes, WS, WSPTR = self.ex.plan.workspace_bytes, self.WS, self.WSPTR
            ws_device = self._ws_device = self._device_of(root)
            alloc = functools.partial(torch.empty, ws_bytes, dtype=torch.uint8, device=ws_device)
            if self.ex.poison:
                alloc = _poisoned(alloc)

            def workspace(env):
                ws = env[WS]
                if ws is None:
                    ws = env[WS] = alloc()
                    env[WSPTR] = ws.data_ptr()
                return ws

            self._ws_alloc = workspace
        return self._ws_alloc

    def _ws_tensor(self, i, place=None):
        """The instruction that makes value i's tensor: the workspace viewed as its root's dtype,
        as_strided to i's place (a WORKSPACE value, or a view of one: _ws_place)."""
        root, dtype, size, element, sizes, strides = place or self._ws_place(i)
        workspace = self._workspace(root)
        if self.ex.plan.workspace_bytes % size:  # cannot be viewed as `dtype` as a whole
            ws_device = self._ws_device

            def instruction(env):
                t = torch.empty(0, dtype=dtype, device=ws_device)
                t.set_(workspace(env).untyped_storage(), element, sizes, strides)
                env[i] = t

            return instruction
        slot = self._ws_slots.get(dtype)
        if slot is None:
            slot = self._ws_slots[dtype] = self.num_slots
            self.num_slots += 1

        def instruction(env):
            base = env[slot]
            if base is None:
                base = env[slot] = workspace(env).view(dtype)
            env[i] = base.as_strided(sizes, strides, element)

        return instruction

    def _ws_place(self, i):
        """(root, root's dtype, its size, storage offset in elements of that dtype, sizes, strides)
        of value i when it lies in the workspace: a WORKSPACE value or a chain of views of one,
        every value of the chain with its metadata, non-negative strides and its elements inside
        the workspace. Else None (such a value takes the chain of instructions, which raise)."""
        place = self._ws_places.get(i, _MISSING)
        if place is not _MISSING:
            return place
        values, chain = self.ex.values, self.ex._view_chain(i)
        root = chain[-1]
        place = None
        if values[root].storage == _PV.STORAGE_WORKSPACE:
            dtype = self.ex._dtypes[root]
            size, ws_bytes = _itemsize(dtype), self.ex.plan.workspace_bytes
            element = values[root].offset // size
            fits = True
            for j in reversed(chain):  # the root, then each view down to i
                if j != root:
                    element += values[j].offset
                meta = self.metas[j]
                if isinstance(meta, Exception) or element < 0 or any(st < 0 for st in meta[1]):
                    fits = False
                    break
                if all(meta[0]) and (element + _span(*meta)) * size > ws_bytes:
                    fits = False
                    break
            if fits:
                place = (root, dtype, size, element, *self.metas[i])
        self._ws_places[i] = place
        return place

    def _tensor_reads(self):
        """The values that need a tensor wherever they are read: those aten steps read or write,
        the graph's outputs, GEMM operands when torch runs the GEMMs. Kernel steps and cuBLASLt
        GEMMs read only data pointers."""
        ex = self.ex
        reads = {o for o in ex.plan.outputs if o >= 0}

        def walk(tree):
            if tree[0] == "v":
                reads.add(tree[1])
            elif tree[0] == "list":
                for x in tree[1]:
                    walk(x)

        for entry in ex._steps:
            if entry[0] == "aten":
                for tree in itertools.chain(entry[2], entry[3].values()):
                    walk(tree)
                reads.update(o for o in entry[4] if o >= 0 and ex.values[o].storage != _PV.STORAGE_STEP)
            elif entry[0] == "library" and self.gemm_runtime is None:
                reads.update(a for a in entry[1][1][:4] if a >= 0)
            elif entry[0] == "copies":
                reads.update(i for d, s, _, _ in entry[1] for i in (d, s))
        return reads

    def _pointer(self, i, cuda=False):
        """The byte offset of value i's data in the workspace when kernels and GEMMs may take its
        pointer as the call's workspace pointer (env[WSPTR]) plus that offset, with no tensor made
        per call: a workspace value (or a view of one) that nothing reads as a tensor, that has
        elements (an empty tensor's data_ptr() is 0), and (cuda) whose workspace is on a CUDA
        device. Emits the workspace's allocation before the reading instruction. Else None."""
        if i in self.tensor_reads:
            return None
        place = self._ws_place(i)
        if place is None or not all(place[4]):
            return None
        root, _, size, element, _, _ = place
        self._workspace(root)
        if cuda and not _is_cuda_device(self._ws_device):
            return None  # the tensor path: the per-call check names the value
        if not self._ws_allocated:
            self.code.append(self._ws_alloc)
            self._ws_allocated = True
        return element * size

    def _view_pointer(self, i):
        """(root, byte offset) when a kernel may take view i's pointer as its root's data_ptr() plus
        that offset, with no tensor made per call (what `as_strided` would give, without making
        it): i is a chain of views, every link with its metadata, non-negative offsets and strides
        and elements, down to an input, output, constant or aten result (a workspace root is
        _pointer's), and its elements lie inside its root's. Emits the root's instructions.
        Else None."""
        values, chain = self.ex.values, self.ex._view_chain(i)
        root, views = chain[-1], chain[:-1]
        if not views or values[root].storage not in _VIEW_POINTER_ROOTS:
            return None
        metas = [self.metas[k] for k in chain]
        if any(isinstance(m, Exception) or not all(m[0]) or any(st < 0 for st in m[1]) for m in metas):
            return None
        if any(values[k].offset < 0 for k in views):
            return None
        element = sum(values[k].offset for k in views)
        if element + _span(*metas[0]) > _span(*metas[-1]):
            return None
        self._need(root)
        return (root, element * _itemsize(self.ex._dtypes[root]))

    def _view_tensor(self, i, root, byte_offset):
        """The instruction that gives view i its tensor straight from its root (what the chain of
        views would give), for a value otherwise read by pointer (_view_pointer)."""
        sizes, strides = self.metas[i]
        element = byte_offset // _itemsize(self.ex._dtypes[root])

        def instruction(env):
            r = env[root]
            env[i] = r.as_strided(sizes, strides, r.storage_offset() + element)

        return instruction

    def _buffer_fill(self, args, offsets):
        """env -> the data pointers of `args` (a sequence of ints, in order): env[WSPTR] + offset
        where `offsets` has an int (workspace values, see _pointer), env[root].data_ptr() + offset
        where it has (root, offset) (views, see _view_pointer), else the value's tensor's
        data_ptr() (at least one is not a tensor's); a None or non-tensor among those raises what
        explains it."""
        tensor_args = [a for a, off in zip(args, offsets) if off is None]
        roots = [off[0] for off in offsets if isinstance(off, tuple)]
        root_offs = tuple(off[1] for off in offsets if isinstance(off, tuple))
        offs = tuple(off for off in offsets if isinstance(off, int))
        WSPTR = self.WSPTR
        if not tensor_args and not roots:
            return lambda env: list(map(env[WSPTR].__add__, offs))
        get, explain = self._pointer_filler(tensor_args + roots)
        order, counts = [], [0, len(tensor_args), len(tensor_args) + len(roots)]
        for off in offsets:
            kind = 0 if off is None else 1 if isinstance(off, tuple) else 2
            order.append(counts[kind])
            counts[kind] += 1
        arrange = operator.itemgetter(*order)  # tensors', roots' + offsets, workspace pointers -> in order
        t = len(tensor_args)
        add = operator.add

        def fill(env):
            try:
                ptrs = list(map(_data_ptr, get(env)))
            except TypeError as e:
                explain(env, e)
            if root_offs:
                ptrs[t:] = map(add, ptrs[t:], root_offs)
            if offs:
                ptrs += map(env[WSPTR].__add__, offs)
            return arrange(ptrs)

        return fill

    def _pointer_filler(self, args):
        """(env -> the tensors of `args`, (env, error) -> raises: a PlanError when one of them is a
        STEP value its aten step returned None for, else `error`)."""
        get = _getter(args)
        none_used, NONES = self._none_used, self.NONES

        def explain(env, error):
            for a in args:
                if env[a] is None and a in (env[NONES] or {}):
                    none_used(env, a)
            raise error

        return get, explain
