"""The verdict cache: a verdict per mask tensor, scanned once (masklens._scan) and
reused while the tensor is unchanged.

A verdict is kept in a WeakIdKeyDictionary keyed by the mask tensor itself (the entry
dies with the tensor) and is reused only while the tensor's `_version`, data pointer,
shape, strides and dtype are unchanged: the CUDA caching allocator hands a freed
block's address to the next tensor, so a pointer and a shape alone would mistake a new
mask for an old one. `_version` counts in-place writes through torch (views
included). Writes torch does not see — through `mask.data` (a tensor with a version
counter of its own), through the storage (`mask.untyped_storage()[i] = x`, its `fill_`
or `copy_`: a storage has no version counter), through another tensor `set_()` onto the
mask's storage (its own version counter), a `.numpy()` alias, DLPack, or an external
kernel writing the storage — do not bump it, and nothing short of reading the mask
again (the scan the cache saves) tells them apart: after such a write, call
`masklens.forget(mask)` (or build a new tensor).

Inference-mode tensors have no `_version` (reading it raises). Their verdict is kept
for one forward only: from one call of the "masklens" transformers mask function to the
next, or inside `with masklens.forward():`; outside those every call scans.
"""
from __future__ import annotations

import contextlib
import threading
import weakref

from . import _scan

_lock = threading.Lock()
_epoch = 0          # bumped at every forward boundary
_in_forward = False  # whether inference-mode verdicts may be kept (see the module doc)
_entries = None      # WeakIdKeyDictionary, made on first use (torch is optional)
# (weak reference to the mask last found or stored, its entry): a model's layers pass one
# mask in turn, and one dereference is cheaper than a WeakIdKeyDictionary lookup (~2 µs).
_last = None

# The additive value at or below which the drop-in takes a key as masked (masklens.inspect's
# default, -1000, describes masks; the drop-in must compute torch's result). A dropped mask
# is exact where no logit of a row exceeds the row's best attended one by |value| - 104
# (exp underflows to 0 in float32 below -104): at -1e8 and below (finfo.min, -1e9, -inf)
# that holds for any logits of a finite result; -1e4 or -1000 stay additive values, the
# mask kept, since logit spreads in the thousands occur (large activations, scale=1e4).
DROPIN_MASKED_THRESHOLD = -1e8


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


def tensor_key(mask, threshold):
    try:
        version = mask._version
    except RuntimeError:  # an inference-mode tensor: valid for this forward only
        if not _in_forward:
            return None
        version = ("forward", _epoch)
    return (version, mask.data_ptr(), tuple(mask.shape), tuple(mask.stride()), mask.dtype, mask.device, threshold)


def _remember(mask, entry) -> None:
    global _last

    def dropped(ref):  # the mask died: its entry (and what was derived from it) goes too
        global _last
        last = _last
        if last is not None and last[0] is ref:
            _last = None
    _last = (weakref.ref(mask, dropped), entry)


def cached_entry(mask, view_shape: tuple, masked_threshold: float = -1000.0) -> Entry | None:
    """The entry of `mask` when it holds the verdict of the mask as it is now, seen
    through a view of `view_shape` (what entry_for would return without scanning);
    None otherwise."""
    last = _last
    if last is not None and last[0]() is mask:
        entry = last[1]
    else:
        entry = _entries.get(mask) if _entries is not None else None
        if entry is None:
            return None
        _remember(mask, entry)
    key = tensor_key(mask, masked_threshold)
    if key is None or entry.key != key + (view_shape,):
        return None
    _scan.timing["scanned"] = False
    return entry


def entry_for(mask, masked_threshold: float = -1000.0, view=None) -> Entry:
    """The cache entry of a torch mask tensor, scanning it (or `view`, the mask broadcast
    to the call's shape) when it is new or changed."""
    global _entries

    mask = _scan.readable(mask, True)  # a sparse tensor has no data pointer for the key; a CausalBias is read dense
    key = tensor_key(mask, masked_threshold)
    target = mask if view is None else view
    if key is None:
        return Entry(None, _scan.scan(target, masked_threshold))
    key += (tuple(target.shape),)
    if _entries is None:
        from torch.utils.weak import WeakIdKeyDictionary
        _entries = WeakIdKeyDictionary()
    entry = _entries.get(mask)
    if entry is not None and entry.key == key:
        _scan.timing["scanned"] = False
        return entry
    entry = Entry(key, _scan.scan(target, masked_threshold))
    _entries[mask] = entry
    _remember(mask, entry)
    return entry


def forget(mask=None) -> None:
    """Drops the cached verdict of `mask` (all of them when None): after writing a mask
    through an alias torch does not track, or before torch.utils.swap_tensors on it (the
    cache holds a weak reference to the tensor, which swap_tensors refuses)."""
    global _last
    if mask is not None:
        _check_forgettable(mask)
    last = _last
    if last is not None and (mask is None or last[0]() is mask):
        _last = None
    if _entries is None:
        return
    if mask is None:
        _entries.clear()
    else:
        _entries.pop(mask, None)


def _check_forgettable(mask) -> None:
    """forget() takes the torch tensor the cache keys, or None: anything else was never
    cached (a numpy array is read again at every scan), and is named as such."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(mask, torch.Tensor):
        return
    kind = type(mask).__module__ + "." + type(mask).__qualname__ if type(mask).__module__ != "builtins" \
        else type(mask).__name__
    raise TypeError(f"masklens.forget takes the torch tensor whose verdict is cached, or nothing (every verdict), "
                    f"got {kind}: only torch tensors are cached (a numpy array or another array is read again at "
                    "every call, so there is nothing to forget)")


def outside_graph(fn, reason):
    """fn run eagerly where torch.compile traces a call of it: a graph break, which
    fullgraph=True refuses naming `reason` (torch 2.8 and later take a reason; an older
    torch breaks without one)."""
    try:
        import torch
    except ImportError:
        return fn
    try:
        return torch.compiler.disable(fn, reason=reason)
    except TypeError:
        return torch.compiler.disable(fn)


# The cache is Python state a graph cannot hold.
forget = outside_graph(forget, "masklens.forget changes the verdict cache, Python state outside the graph: call it "
                               "outside the compiled function")


def scan(mask, masked_threshold: float = -1000.0):
    """Scans and classifies a mask (torch tensor of any device, or numpy array), cached per
    torch tensor (the module doc says what the cache can and cannot see). A CUDA
    tensor is scanned on its device where has_cuda_scan()."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(mask, torch.Tensor):
        return entry_for(mask, masked_threshold).verdict
    return _scan.scan(mask, masked_threshold)
