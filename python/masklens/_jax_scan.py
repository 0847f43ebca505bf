"""Scanning JAX masks: a NumPy or jax array, read as jax.nn.dot_product_attention reads
it (broadcast to [B, N, T, S]), on the host, or on its CUDA device through DLPack where
masklens._cuda is there (no copy to the host: only the span runs cross). Verdicts of jax
arrays are cached per array (jax arrays are immutable); NumPy arrays are scanned each
time (they can be written in place). The layer under masklens.jax."""
from __future__ import annotations

import ctypes
import threading
import time
import warnings
import weakref

import numpy as np

from . import _core, _scan

_lock = threading.RLock()  # reentrant: a weakref callback may run inside it
_cache: dict = {}  # id(jax array) -> {(target shape, threshold): Verdict}, dropped with the array
_warned_host_copy = False


def is_jax_array(x) -> bool:
    try:
        import jax
    except ImportError:
        return False
    return isinstance(x, jax.Array)


def is_tracer(x) -> bool:
    try:
        import jax
    except ImportError:
        return False
    return isinstance(x, jax.core.Tracer)


def device_of(x):
    """The one jax device an array lives on (None: a NumPy array, or several devices)."""
    devices = getattr(x, "devices", None)
    if devices is None:
        return None
    try:
        found = devices()
    except Exception:
        return None
    return next(iter(found)) if len(found) == 1 else None


def is_cuda(device) -> bool:
    return device is not None and str(getattr(device, "platform", "")).lower() in ("gpu", "cuda")


def mask_shape_for(shape, target):
    """The mask's shape made 4-D as jax's _ensure_4d makes it (leading 1s), or None where it
    does not broadcast to `target` [B, N, T, S] (jax raises there)."""
    shape = tuple(int(d) for d in shape)
    if len(shape) > 4:
        return None
    shape = (1,) * (4 - len(shape)) + shape
    if not all(m in (t, 1) for m, t in zip(shape, target)):
        return None
    return shape


# DLPack's C structs (dlpack.h, the unversioned DLManagedTensor a `dltensor` capsule holds).
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def dlpack_view(array):
    """(capsule, data pointer, shape, strides in elements) of an array's DLPack export; the
    capsule keeps the buffer alive, and is never consumed (its deleter runs when it goes)."""
    capsule = array.__dlpack__()
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
    else:  # compact row-major
        strides, step = [0] * t.ndim, 1
        for i in reversed(range(t.ndim)):
            strides[i] = step
            step *= max(shape[i], 1)
    return capsule, t.data + t.byte_offset, shape, strides


def broadcast_strides(shape4, strides4, target):
    """Strides of the 4-D mask read at `target`: 0 where a dim of 1 broadcasts."""
    return [0 if m == 1 and t != 1 else s for m, s, t in zip(shape4, strides4, target)]


def _empty_device_bytes(n, device):
    import jax
    import jax.numpy as jnp
    try:
        block = jnp.zeros((n,), dtype=jnp.uint8, device=device)
    except TypeError:  # a jax without device= on creation functions
        block = jax.device_put(jnp.zeros((n,), dtype=jnp.uint8), device)
    return block.block_until_ready()


def device_scan(mask, target, masked_threshold):
    """A CUDA jax array scanned on its device by masklens._cuda (which must be loaded): the
    mask's buffer read through DLPack at the broadcast strides, one block of device memory
    (a jax array) for the spans, runs and temporary storage, on the legacy default stream
    once the mask is ready, synchronised once by the scan (twice past 256 runs)."""
    cuda = _scan.cuda_module()
    t0 = time.perf_counter()
    mask.block_until_ready()
    dtype = _scan.element_name(mask.dtype)
    if dtype is None:
        raise _core.MaskError(f"unsupported_dtype: mask dtype {mask.dtype} is not a mask type ({_scan._MASK_TYPES})")
    try:
        capsule, ptr, shape, strides = dlpack_view(mask)
    except Exception:  # no DLPack export for this dtype here: the buffer, row-major as jax lays it out
        capsule, ptr, shape = None, mask.unsafe_buffer_pointer(), list(mask.shape)
        strides, step = [0] * len(shape), 1
        for i in reversed(range(len(shape))):
            strides[i] = step
            step *= max(shape[i], 1)
    shape4 = (1,) * (4 - len(shape)) + tuple(shape)
    strides4 = [0] * (4 - len(strides)) + list(strides)
    args = (ptr, dtype, list(target), broadcast_strides(shape4, strides4, target), masked_threshold)
    runs = cuda.plan_runs(*args)
    device = device_of(mask)
    index = getattr(device, "local_hardware_id", None)
    index = int(device.id if index is None else index)
    block = _empty_device_bytes(runs.block_bytes, device)
    base = block.unsafe_buffer_pointer()
    stream = 0
    answer = cuda.scan_runs(runs, base, runs.block_bytes, stream, index, classify_up_to=runs.eager)
    t1 = time.perf_counter()
    if isinstance(answer, int):  # more runs than the head brought: the rest, then classified
        more = _empty_device_bytes(answer * 64, device) if answer > runs.room else None
        cuda.copy_rest(runs, base, runs.block_bytes, 0 if more is None else more.unsafe_buffer_pointer(), stream,
                       index)
        t1 = time.perf_counter()
        answer = runs.finish()
    verdict = answer
    del capsule, block
    _scan.timing.update(scanned=True, device="cuda", scan_ms=(t1 - t0) * 1e3,
                        classify_ms=(time.perf_counter() - t1) * 1e3)
    return verdict


def host_scan(mask, target, masked_threshold):
    """The mask on the host (a NumPy array as it is; a CPU jax array through NumPy, without
    a copy where jax allows it; a GPU one copied, warned once), broadcast with stride 0."""
    global _warned_host_copy
    if is_jax_array(mask) and is_cuda(device_of(mask)) and not _warned_host_copy:
        _warned_host_copy = True
        warnings.warn(f"masklens.jax: a CUDA mask is copied to the host to be scanned: {_scan.cuda_reason()}",
                      stacklevel=4)
    host = np.asarray(mask)
    host = _scan.readable(host.reshape((1,) * (4 - host.ndim) + host.shape))  # jax's leading dims first
    t0 = time.perf_counter()
    verdict = _core.scan(np.broadcast_to(host, target), masked_threshold)
    _scan.host_timing(t0)
    return verdict


def scan(mask, target, masked_threshold: float = -1000.0):
    """The Verdict of `mask` read at `target` [B, N, T, S]; a jax array's is cached for as
    long as the array lives."""
    key = (tuple(target), float(masked_threshold))
    cacheable = is_jax_array(mask)
    if cacheable:
        with _lock:
            hit = _cache.get(id(mask))
            if hit is not None and hit[0]() is mask and key in hit[1]:
                _scan.timing.update(scanned=False)
                return hit[1][key]
    if cacheable and is_cuda(device_of(mask)) and _scan.cuda_module() is not None:
        verdict = device_scan(mask, target, masked_threshold)
    else:
        verdict = host_scan(mask, target, masked_threshold)
    _scan.counted_scan()
    if cacheable:
        with _lock:
            hit = _cache.get(id(mask))
            if hit is None or hit[0]() is not mask:
                ident = id(mask)
                try:
                    ref = weakref.ref(mask, lambda r, ident=ident: _drop(ident, r))
                except TypeError:  # not weakly referenceable: never cached
                    return verdict
                hit = _cache[ident] = (ref, {})
            hit[1][key] = verdict
    return verdict


def _drop(ident, ref) -> None:
    with _lock:
        if _cache.get(ident, (None,))[0] is ref:
            del _cache[ident]


def forget() -> None:
    """Drops every cached verdict."""
    with _lock:
        _cache.clear()
