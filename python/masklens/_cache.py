"""Scanning masks, and remembering the verdict per mask tensor.

A verdict is kept in a WeakIdKeyDictionary keyed by the mask tensor itself (the entry
dies with the tensor) and is reused only while the tensor's `_version`, data pointer,
shape, strides and dtype are unchanged: the CUDA caching allocator hands a freed
block's address to the next tensor, so a pointer and a shape alone would mistake a new
mask for an old one. `_version` counts in-place writes through torch (views
included). Writes torch does not see — through a `.numpy()` alias, DLPack, or an
external kernel writing the storage — do not bump it: after such a write, call
`masklens.forget(mask)` (or build a new tensor).

Inference-mode tensors have no `_version` (reading it raises). Their verdict is kept
for one forward only: from one call of the "masklens" transformers mask function to the
next, or inside `with masklens.forward():`; outside those every call scans.
"""
from __future__ import annotations

import contextlib
import threading
import warnings

from . import _core

_lock = threading.Lock()
_scans = 0
_epoch = 0          # bumped at every forward boundary
_in_forward = False  # whether inference-mode verdicts may be kept (see the module doc)
_cache = None        # WeakIdKeyDictionary, made on first use (torch is optional)
_warned_cuda = False


def scan_count() -> int:
    """How many masks have been scanned since the process started (tests count these)."""
    return _scans


def begin_forward() -> None:
    """A new forward starts: inference-mode verdicts of the previous one are dropped."""
    global _epoch, _in_forward
    with _lock:
        _epoch += 1
        _in_forward = True


def end_forward() -> None:
    global _epoch, _in_forward
    with _lock:
        _epoch += 1
        _in_forward = False


@contextlib.contextmanager
def forward():
    """Marks one forward pass: inference-mode masks are scanned once inside it."""
    begin_forward()
    try:
        yield
    finally:
        end_forward()


class Entry:
    """What masklens knows about one mask tensor: the verdict, and what was derived from
    it (policies per call, rows that attend, block masks, index tensors)."""

    __slots__ = ("key", "verdict", "policies", "derived")

    def __init__(self, key, verdict):
        self.key = key
        self.verdict = verdict
        self.policies = {}
        self.derived = {}


def _tensor_key(mask, threshold):
    try:
        version = mask._version
    except RuntimeError:  # an inference-mode tensor: valid for this forward only
        if not _in_forward:
            return None
        version = ("forward", _epoch)
    return (version, mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype, mask.device, threshold)


def _host_array(mask):
    """A host view of `mask` that DLPack can carry: detached, on the CPU (copying only the
    distinct elements of a broadcast CUDA mask, once-warned)."""
    global _warned_cuda
    import torch

    if mask.requires_grad:
        mask = mask.detach()
    if mask.device.type == "cpu":
        return mask
    if mask.device.type != "cuda":
        raise _core.MaskError(f"unsupported_device: cannot scan a mask on {mask.device} (cpu or cuda)")
    if not _warned_cuda:
        _warned_cuda = True
        warnings.warn("masklens was built without its CUDA scanner: CUDA masks are copied to the host to be "
                      "scanned (once per mask tensor; the verdict is cached)", RuntimeWarning, stacklevel=4)
    # Stride-0 (broadcast) dims are copied once, then expanded again on the host.
    distinct = mask
    for d in range(mask.dim()):
        if mask.stride(d) == 0 and mask.shape[d] > 1:
            distinct = distinct.narrow(d, 0, 1)
    host = distinct.to("cpu", non_blocking=False)
    return host.expand(mask.shape) if host.shape != mask.shape else host


def scan(mask, masked_threshold: float = -1000.0):
    """Scans and classifies `mask` (a torch tensor or a numpy array) without the cache."""
    global _scans
    try:
        import torch
    except ImportError:
        torch = None
    array = _host_array(mask) if torch is not None and isinstance(mask, torch.Tensor) else mask
    verdict = _core.scan(array, masked_threshold)
    with _lock:
        _scans += 1
    return verdict


def entry_for(mask, masked_threshold: float = -1000.0, view=None) -> Entry:
    """The cache entry of a torch mask tensor, scanning it (or `view`, the mask broadcast
    to the call's shape) when it is new or changed."""
    global _cache

    key = _tensor_key(mask, masked_threshold)
    target = mask if view is None else view
    if key is None:
        return Entry(None, scan(target, masked_threshold))
    key += (tuple(target.shape),)
    if _cache is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _cache = WeakIdKeyDictionary()
    entry = _cache.get(mask)
    if entry is not None and entry.key == key:
        return entry
    entry = Entry(key, scan(target, masked_threshold))
    _cache[mask] = entry
    return entry


def forget(mask=None) -> None:
    """Drops the cached verdict of `mask` (all of them when None): after writing a mask
    through an alias torch does not track."""
    if _cache is None:
        return
    if mask is None:
        _cache.clear()
    else:
        _cache.pop(mask, None)
