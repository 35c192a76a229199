"""What kiln.executor's modules share: PlanError, the warning-once helper, and the small builders of
per-call instructions (_getter, _raiser, ...) that _Program and its mixins (kiln._exec_workspace,
kiln._exec_aten, kiln._exec_kernels) use. Nothing here imports those modules."""

import logging
import operator
import threading

import torch

from kiln import proto

log = logging.getLogger("kiln")

_PV = proto.PlanValue
_warned = set()
_warned_lock = threading.Lock()


def _warn_once(key, message):
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("kiln: %s", message)


class PlanError(RuntimeError):
    """The plan is malformed or does not match the tensors it runs on."""


PlanError.__module__ = "kiln.executor"  # public as kiln.executor.PlanError (tracebacks, pickling)


def _itemsize(dtype):
    return dtype.itemsize


_Tensor = torch.Tensor
_data_ptr = torch.Tensor.data_ptr


def _span(sizes, strides):
    """Elements a tensor of these sizes and (non-negative) strides spans from its first: 0 when
    it has none."""
    return sum((s - 1) * st for s, st in zip(sizes, strides)) + 1 if all(sizes) else 0


def _poison_value(dtype):
    """What option poison_buffers fills a fresh buffer of `dtype` with: NaN for floats (and complex),
    True for bool, the largest value for integers (as torch's fill_uninitialized_memory does; the
    workspace's uint8 bytes thus become 0xFF, a NaN in every float width)."""
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return torch.iinfo(dtype).max


def _poisoned(alloc):
    """alloc (-> a fresh tensor) wrapped so that its result is filled with _poison_value first."""
    def poisoned():
        t = alloc()
        return t.fill_(_poison_value(t.dtype))

    return poisoned


def _getter(indices):
    """env -> the tuple (env[i] for i in indices)."""
    if len(indices) == 1:
        i = indices[0]
        return lambda env: (env[i],)
    return operator.itemgetter(*indices)


def _raiser(make_error):
    """An instruction that raises make_error() (a fresh exception per call)."""

    def fail(env):
        raise make_error()

    return fail


def _again(error):
    """A factory of copies of `error` (raising one instance on every call would grow its traceback)."""
    return lambda: type(error)(*error.args)


def _plan_error(message):
    return lambda: PlanError(message)
