"""Copies of a captured CUDA graph's outputs (kiln.cuda_graphs): every replay overwrites them in
place, so a call returns copies that keep their sizes, strides and aliasing (CopyOut, planned once
per capture), and the spans of input bytes a replay's static buffers are filled from."""

import torch

# 0: no overlap, 1: overlap, 2: too hard to tell (gaps, among others)
_HAS_INTERNAL_OVERLAP = getattr(torch, "_debug_has_internal_overlap", lambda t: 2)


def _extent(t):
    return sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1


def _span_of(t):
    """The elements of t's storage from its first to its last element, as a 1-d contiguous view
    (any strides, overlapping ones too: a plain memcpy)."""
    return t.as_strided((_extent(t),), (1,), t.storage_offset())


def storage_owners(outputs, skip=()):
    """{storage data pointer: how many of `outputs` (a list that may hold non-tensors) whose index
    is not in `skip` have elements there}."""
    owners = {}
    for i, o in enumerate(outputs):
        if isinstance(o, torch.Tensor) and i not in skip and o.numel() > 0:
            ptr = o.untyped_storage().data_ptr()
            owners[ptr] = owners.get(ptr, 0) + 1
    return owners


def copy_out(outputs, keep=(), alloc=None):
    """New tensors with the values of `outputs` (a list that may hold non-tensors), laid out as
    they are: same sizes and strides, outputs that share a storage share one new storage at the
    same relative offsets. Items whose index is in `keep` and non-tensors are returned as they are.
    alloc(sizes, strides, dtype), if given, allocates on the outputs' device (see CopyOut)."""
    return CopyOut(outputs, keep)(alloc)


class CopyOut:
    """copy_out's work for a fixed list of outputs (a captured graph's, which every replay
    overwrites in place), sorted out once:
      * an output with a storage of its own and no internal overlap gets a tensor of its own,
        and those are filled by one torch._foreach_copy_ per (device, dtype);
      * the others (outputs that share a storage, expanded ones) are copied with the bytes their
        storage spans, into one new buffer per device, by one torch._foreach_copy_ of the spans.
    Calling it makes the copies: alloc(sizes, strides, dtype) is torch's allocation function for
    compiled code on the outputs' (current) device, or None for torch.empty_strided."""

    def __init__(self, outputs, keep=()):
        self.template = list(outputs)
        owners = storage_owners(outputs, keep)
        self.empty = []  # (index, sizes, strides, dtype, device)
        alone = {}  # (device, dtype) -> ([index], [(sizes, strides)], [output])
        groups = {}  # (device, storage) -> [index]
        for i, o in enumerate(outputs):
            if not isinstance(o, torch.Tensor) or i in keep:
                continue
            if o.numel() == 0:
                self.empty.append((i, tuple(o.shape), o.stride(), o.dtype, o.device))
                continue
            ptr = o.untyped_storage().data_ptr()
            if owners[ptr] == 1 and _HAS_INTERNAL_OVERLAP(o) == 0:
                idx, metas, srcs = alone.setdefault((o.device, o.dtype), ([], [], []))
                idx.append(i)
                metas.append((tuple(o.shape), o.stride()))  # plain tuples, as alloc needs
                srcs.append(o)
            else:
                groups.setdefault((o.device, ptr), []).append(i)
        self.alone = [(device, dtype, *lists) for (device, dtype), lists in alone.items()]
        self.spans = []  # (device, total bytes, [uint8 source spans], [(offset, end)], [(index, dtype, offset, sizes, strides)])
        by_device = {}
        for (device, _), idxs in groups.items():
            lo = min(outputs[i].storage_offset() * outputs[i].element_size() for i in idxs)
            hi = max((outputs[i].storage_offset() + _extent(outputs[i])) * outputs[i].element_size() for i in idxs)
            lo -= lo % 16  # keeps every element-size-aligned offset aligned
            by_device.setdefault(device, []).append((idxs, lo, hi))
        for device, spans in by_device.items():
            total, srcs, places, views = 0, [], [], []
            for idxs, lo, hi in spans:
                src = torch.empty(0, dtype=torch.uint8, device=device)
                src.set_(outputs[idxs[0]].untyped_storage(), lo, (hi - lo,), (1,))
                srcs.append(src)
                places.append((total, total + hi - lo))
                for i in idxs:
                    o = outputs[i]
                    size = o.element_size()
                    views.append((i, o.dtype, (total + o.storage_offset() * size - lo) // size, o.size(), o.stride()))
                total += -(-(hi - lo) // 64) * 64  # each span starts 64-byte aligned in the buffer
            self.spans.append((device, total, srcs, places, views))

    def __call__(self, alloc=None):
        result = list(self.template)
        for i, sizes, strides, dtype, device in self.empty:
            result[i] = torch.empty_strided(sizes, strides, dtype=dtype, device=device)
        for device, dtype, idx, metas, srcs in self.alone:
            if alloc is not None:
                dsts = [alloc(sizes, strides, dtype) for sizes, strides in metas]
            else:
                dsts = [torch.empty_strided(sizes, strides, dtype=dtype, device=device) for sizes, strides in metas]
            if len(dsts) == 1:
                dsts[0].copy_(srcs[0])
            else:
                torch._foreach_copy_(dsts, srcs)
            for i, t in zip(idx, dsts):
                result[i] = t
        for device, total, srcs, places, views in self.spans:
            buffer = torch.empty(total, dtype=torch.uint8, device=device)
            dsts = [buffer[a:b] for a, b in places]
            if len(dsts) == 1:
                dsts[0].copy_(srcs[0])
            else:
                torch._foreach_copy_(dsts, srcs)
            storage = buffer.untyped_storage()
            for i, dtype, offset, sizes, strides in views:
                t = torch.empty(0, dtype=dtype, device=device)
                t.set_(storage, offset, sizes, strides)
                result[i] = t
        return result
