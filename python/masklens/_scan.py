"""Scanning masks: the host scanner (masklens._core) and the device scanner
(masklens._cuda), without any cache. The bottom of the package: every other module
reads masks through this one.

A CUDA mask is scanned on its device by masklens._cuda where that module was built: on
the tensor's current stream, into one block from torch's caching allocator; the row
spans are reduced to runs there and only the runs cross to the host (one
synchronisation of that stream; two past 256 runs). Without masklens._cuda the mask is
copied to the host (once-warned). What the last scan cost is kept in `timing`
(masklens.last_timing()).
"""
from __future__ import annotations

import threading
import time
import warnings

from . import _core

_lock = threading.Lock()
_scans = 0
_warned_cuda = False
# The mask element types, by torch dtype (str) and by numpy dtype name.
_ELEMENTS = {"torch.bool": "bool", "torch.uint8": "uint8", "torch.int8": "int8", "torch.float16": "float16",
             "torch.bfloat16": "bfloat16", "torch.float32": "float32"}
_NUMPY_ELEMENTS = frozenset({"bool", "uint8", "int8", "float16", "bfloat16", "float32"})  # bfloat16: ml_dtypes
_MASK_TYPES = "bool, uint8, int8, float16, bfloat16, float32"
_cuda = None          # masklens._cuda once loaded
_cuda_reason = None   # why it is not there (None: not looked for yet)

# What the last scan or cache lookup cost (masklens.last_timing()); updated in place, a
# few perf_counter() calls per scan.
timing = {"scanned": False, "device": None, "scan_ms": 0.0, "classify_ms": 0.0, "decide_ms": 0.0, "prepare_ms": 0.0,
          "kernels_ms": 0.0}


def scan_count() -> int:
    """How many masks have been scanned since the process started (tests count these)."""
    return _scans


def last_timing() -> dict:
    """What the last scan or drop-in call cost, in milliseconds: `scanned` (False: the
    verdict came from the cache), `device` ("cuda" or "host": where the last scan ran),
    `scan_ms` (device: allocation, kernel, copy of the spans and the one synchronisation;
    host: scan and classify), `classify_ms` (device scans), `decide_ms` (0 when the
    policy was cached); device scans also `prepare_ms` (the size query, and a BlockMask's
    tensors allocated, before scan_ms) and `kernels_ms` (within scan_ms: the call that
    enqueues the kernels and copies and synchronises, host work done meanwhile included);
    0 after a host scan. Timers are taken around each step, so they cost ~1 µs."""
    return dict(timing)


def element_name(dtype) -> str | None:
    """The mask element name of a torch or numpy dtype ('bool', 'bfloat16', ...), or None."""
    name = str(dtype)
    return _ELEMENTS.get(name) or (name if name in _NUMPY_ELEMENTS else None)


def cuda_module():
    """masklens._cuda, or None (then `cuda_reason()` says why). Looked for once."""
    global _cuda, _cuda_reason
    if _cuda is not None or _cuda_reason is not None:
        return _cuda
    try:
        from . import _build
        built = _build.CUDA_MODULE
    except ImportError:
        built = False
    if not built:
        _cuda_reason = "masklens was built without its CUDA scanner (-Dcuda=disabled, or no nvcc at build time)"
        return None
    try:
        # torch first: it loads the CUDA runtime (libcudart) that _cuda links by the same
        # name, so both use one runtime and torch's streams pass as they are.
        import torch  # noqa: F401
    except ImportError:
        pass
    try:
        from . import _cuda as module
    except ImportError as e:
        _cuda_reason = f"masklens._cuda could not be loaded: {e}"
        return None
    if not module.built_with_cuda():
        _cuda_reason = "masklens._cuda was built without CUDA"
        return None
    _cuda = module
    return _cuda


def cuda_reason() -> str | None:
    """Why CUDA masks are not scanned on the device (None where they are)."""
    cuda_module()
    return _cuda_reason


def has_cuda_scan() -> bool:
    """Whether CUDA masks are scanned on their device (masklens._cuda, built where Meson
    found nvcc). Where not, they are copied to the host once, with a warning;
    `cuda_scan_unavailable()` says why."""
    return cuda_module() is not None


def cuda_scan_unavailable() -> str | None:
    """Why CUDA masks are not scanned on the device, or None where they are."""
    return cuda_reason()


def has_device_tiles() -> bool:
    """Whether CUDA masks get their tiles (and BlockMask tensors) on the device."""
    module = cuda_module()
    return module is not None and hasattr(module, "plan_runs")


def has_device_writer() -> bool:
    """Whether a host tile summary's BlockMask tensors can be written on a CUDA device."""
    module = cuda_module()
    return module is not None and hasattr(module, "write_block_mask")


def has_structure_writer() -> bool:
    """Whether an exact structure's BlockMask tensors can be written on a CUDA device from its
    tile ranges."""
    module = cuda_module()
    return module is not None and hasattr(module, "write_block_mask_from_ranges")


def load_kernels(device=None) -> bool:
    """Loads masklens' CUDA kernels on a device now, so that the process's first scan of a
    CUDA mask does not also pay for loading them (CUDA loads a kernel at its first launch:
    0.7-1.0 ms once per process on an H200, bench/README.md's device_step). A framework
    calls it at start-up, once its CUDA context exists (masklens.transformers' mask
    function calls it on a background thread the first time it sees a CUDA device;
    importing masklens.transformers initialises no CUDA). `device`: a torch.device,
    "cuda:N", an index, or None for torch's current CUDA device. Returns True once every
    kernel of the device scanner (scan, run reduction, tile scan, BlockMask writer, a
    definition's table reader) is loaded there (a second call finds them loaded); False,
    with no error and nothing done, where there is no masklens._cuda
    (`cuda_scan_unavailable()` says why), no CUDA device, or `device` is not a CUDA device.
    A failure on a CUDA device (an index past the device count, a GPU the build has no code
    for) is a MaskError naming the CUDA call. It also allocates the pinned host memory a
    BlockMask's tables cross to the device through (a few MiB)."""
    module = cuda_module()
    if module is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return False
    index = torch.cuda.current_device() if device.index is None else device.index
    module.load_kernels(index)
    reserve_staging(torch.device("cuda", index))
    return True


def host_array(mask, warn=True):
    """A host view of `mask` that DLPack can carry: detached, on the CPU (copying only the
    distinct elements of a broadcast CUDA mask, once-warned unless asked for)."""
    global _warned_cuda
    if mask.requires_grad:
        mask = mask.detach()
    if mask.device.type == "cpu":
        return mask
    if mask.device.type != "cuda":
        raise _core.MaskError(f"unsupported_device: cannot scan a mask on {mask.device} (cpu or cuda)")
    if warn and not _warned_cuda:
        _warned_cuda = True
        warnings.warn(f"{cuda_reason()}: CUDA masks are copied to the host to be scanned (once per mask tensor; "
                      "the verdict is cached)", RuntimeWarning, stacklevel=4)
    # Stride-0 (broadcast) dims are copied once, then expanded again on the host.
    distinct = mask
    for d in range(mask.dim()):
        if mask.stride(d) == 0 and mask.shape[d] > 1:
            distinct = distinct.narrow(d, 0, 1)
    host = distinct.to("cpu", non_blocking=False)
    return host.expand(mask.shape) if host.shape != mask.shape else host


def counted_scan() -> None:
    """A scan ran (not the cache): masklens.scan_count() and last_timing()["scanned"]."""
    global _scans
    with _lock:
        _scans += 1
    timing["scanned"] = True


def host_timing(t0) -> None:
    """last_timing() of a host scan begun at perf_counter() t0 (it classifies too; no
    device steps)."""
    timing["device"] = "host"
    timing["scan_ms"] = (time.perf_counter() - t0) * 1e3
    timing["classify_ms"] = timing["prepare_ms"] = timing["kernels_ms"] = 0.0


def cuda_device(device):
    """A torch CUDA device with its index (the current device's where none is given)."""
    import torch
    device = torch.device(device)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def reserve_staging(device):
    """Allocates `device`'s pinned upload staging (masklens._cuda.reserve_uploads;
    masklens.load_kernels does, at start-up), so a first BlockMask does not allocate it."""
    module = cuda_module()
    if module is not None and hasattr(module, "reserve_uploads"):
        module.reserve_uploads(cuda_device(device).index)


_torch_dtypes = {}  # numpy dtype -> torch dtype, as torch.from_numpy maps it


def to_device(array, device):
    """A numpy array (or a nested list of ints) as a tensor on `device`. To a CUDA device with
    masklens._cuda it crosses through the module's pinned staging (_cuda.upload), enqueued
    on the device's current stream without waiting: a copy from pageable memory is staged
    by the driver and can wait, and torch's pinned host blocks were measured to stall
    copies now and then by milliseconds on an H200 host (bench/HISTORY.md, tiles_torch)."""
    import numpy as np
    import torch
    host = np.ascontiguousarray(array)
    device = torch.device(device)
    module = cuda_module() if device.type == "cuda" else None
    if module is None or not hasattr(module, "upload"):
        return torch.from_numpy(host if host.flags.writeable else host.copy()).to(device)
    dtype = _torch_dtypes.get(host.dtype)
    if dtype is None:
        dtype = _torch_dtypes[host.dtype] = torch.from_numpy(np.empty(0, host.dtype)).dtype
    device = cuda_device(device)
    out = torch.empty(host.shape, dtype=dtype, device=device)
    module.upload(host.ctypes.data, host.nbytes, out.data_ptr(), stream_of(device), device.index)
    return out


_device_types = {}  # torch.device -> its type ("cpu", "cuda", ...)


def device_type(device) -> str:
    """A torch.device's type, remembered per device: torch.device.type builds its string
    through a C++ stream at each call, several times a dictionary lookup's cost where a
    training step has left the host's caches cold (the mask function's path and the
    layers ask it a few times a forward)."""
    known = _device_types.get(device)
    if known is None:
        known = _device_types[device] = device.type
    return known


def is_cuda(device) -> bool:
    """Whether a torch.device is a CUDA device (device_type, remembered)."""
    return device_type(device) == "cuda"


def stream_of(device) -> int:
    """The cudaStream_t of the device's current stream, as an int (0: the legacy default).
    Through torch's raw-stream getter where there is one (the one compiled kernels use):
    torch.cuda.current_stream() builds a Stream object through several Python layers,
    tens of microseconds of host time on each device read (bench/HISTORY.md, tiles_torch)."""
    import torch
    if type(device) is not torch.device:
        device = torch.device(device)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None or not is_cuda(device):
        return torch.cuda.current_stream(device).cuda_stream
    return raw(device.index if device.index is not None else torch.cuda.current_device())


def device_dtype(mask):
    dtype = _ELEMENTS.get(str(mask.dtype))
    if dtype is None:
        raise _core.MaskError(f"unsupported_dtype: mask dtype {mask.dtype} is not a mask type ({_MASK_TYPES})")
    return dtype


# Runs past which a BlockMask's scan skips the verdict (classify_many_runs=False): one run
# for every 8 rows or more. Exact structures stay far below (a run per document, a few
# per padded batch slice); block-sparse masks reach about one run per row, whose copy to
# the host and classification cost ~10x the device read at 65536^2 (bench/HISTORY.md).
MANY_RUNS = 8


def device_runs(mask, runs, scan_call, classify_many_runs=True, spans_out=None):
    """The device scan both entry points share, after its size query (`runs`, the
    _core.DeviceRuns masklens._cuda.plan_runs gave): the block allocated from torch's
    caching allocator, scan_call(block address, stream, device, classify_up_to) scanning
    into it (the one call) and returning the run count, or the runs' Verdict where they are
    at most classify_up_to and all came with the head (the common case: the scan and its
    classification in one crossing); otherwise the runs past the first copy brought where
    there are, and the runs classified. Returns the Verdict; None where
    classify_many_runs is False and the runs are more than one in MANY_RUNS rows (a mask
    that is arbitrary or close to it: its runs would cost more than the scan; a NaN / +inf
    row is still an error, found on the device). spans_out (a list): a function is
    appended to it that gives the scan's RowSpans, an int64 [rows, 4] view of the block
    (first, last, count, flags | reserved), made only if asked for."""
    import torch

    t0 = time.perf_counter()
    # The allocator's blocks are 512-byte aligned; the layout's parts start 256-aligned.
    block = torch.empty(runs.block_bytes, dtype=torch.uint8, device=mask.device)
    base = block.data_ptr()
    stream = stream_of(mask.device)
    device = mask.device.index
    # Classified in the scan's call: up to the head's runs, or fewer where many runs would
    # not be classified at all.
    up_to = runs.eager if classify_many_runs else min(runs.eager, runs.rows // MANY_RUNS)
    t_call = time.perf_counter()
    answer = scan_call(base, stream, device, up_to)
    # The launches, the head's copy, the synchronisation (and the host work done meanwhile).
    timing["kernels_ms"] = (time.perf_counter() - t_call) * 1e3
    if spans_out is not None:
        def spans():
            spans_at = runs.layout["spans"]
            return block[spans_at:spans_at + runs.rows * 32].view(torch.int64).view(runs.rows, 4)
        spans_out.append(spans)
    timing["device"] = "cuda"
    if not isinstance(answer, int):  # the Verdict: classified in the call (its time in kernels_ms)
        timing["scan_ms"] = (time.perf_counter() - t0) * 1e3
        timing["classify_ms"] = 0.0
        return answer
    count = answer
    if not classify_many_runs and count * MANY_RUNS > runs.rows:
        # No verdict, yet a NaN / +inf row is an error: the run reduction found the first
        # one on the device, and it came back in the head with the count.
        runs.check_rows()
        timing["scan_ms"] = (time.perf_counter() - t0) * 1e3
        timing["classify_ms"] = 0.0
        return None
    if count > runs.eager:  # rare: more runs than the first copy brings
        # Past the block's room the run reduction runs again, into room for them all.
        more = torch.empty(count * 64, dtype=torch.uint8, device=mask.device) if count > runs.room else None
        _cuda.copy_rest(runs, base, runs.block_bytes, 0 if more is None else more.data_ptr(), stream, device)
    t1 = time.perf_counter()
    verdict = runs.finish()
    timing["scan_ms"] = (t1 - t0) * 1e3  # the device part: allocation, kernels, copies, synchronisation
    timing["classify_ms"] = (time.perf_counter() - t1) * 1e3
    return verdict


def device_args(mask, masked_threshold):
    """How masklens._cuda.plan_runs takes a CUDA tensor: its address, element type, shape,
    strides in elements and the threshold of an additive mask."""
    return mask.data_ptr(), device_dtype(mask), list(mask.shape), list(mask.stride()), masked_threshold


def device_scan(mask, masked_threshold: float = -1000.0):
    """Scans a CUDA tensor on its device with masklens._cuda (which must be loaded), on the
    tensor's current stream: the library's protocol (include/masklens/cuda/runs.hpp) in
    two crossings: plan_runs (the size query) and scan_runs (launches, the head's one copy,
    one synchronisation of that stream, the runs classified in O(runs)); the block (run
    count, runs, spans, temporary storage) is one allocation of torch's caching allocator.
    Runs past the first 256 come with a second copy and are classified by finish()."""
    t0 = time.perf_counter()
    runs = _cuda.plan_runs(*device_args(mask, masked_threshold))
    timing["prepare_ms"] = (time.perf_counter() - t0) * 1e3  # the size query

    def scan_call(base, stream, device, up_to):
        return _cuda.scan_runs(runs, base, runs.block_bytes, stream, device, classify_up_to=up_to)
    return device_runs(mask, runs, scan_call)


def _plain_tensor(mask):
    """A tensor subclass as the dense mask it stands for, or a MaskError: torch's CausalBias
    (an empty tensor whose meaning is its variant and lengths; its storage is never
    written) as its boolean [Q, K]; any other subclass (a DTensor, a FakeTensor) has no
    dense mask masklens could read as it is."""
    import torch
    from torch.nn.attention import bias
    if isinstance(mask, bias.CausalBias):
        q_len, k_len = mask.seq_len_q, mask.seq_len_kv
        diagonal = 0 if mask.variant == bias.CausalVariant.UPPER_LEFT else k_len - q_len
        return torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril_(diagonal)
    raise _core.MaskError(f"invalid_argument: a mask of type {type(mask).__name__} (a tensor subclass) cannot be "
                          "scanned: masklens reads plain tensors (for a sharded sequence, masklens.distributed)")


def _check_dims(mask):
    """A mask has 2 to 4 dims ([Q, K], [H, Q, K], [B, H, Q, K]), as torch's
    scaled_dot_product_attention and the masklens command read it."""
    if not 2 <= mask.ndim <= 4:
        dims = f"{mask.ndim} dim" + ("" if mask.ndim == 1 else "s")
        raise _core.MaskError(f"invalid_shape: mask of shape {list(mask.shape)} has {dims}; a mask has 2 to 4 ([Q, K], "
                              "[H, Q, K] or [B, H, Q, K]); a row of keys for every query is mask[None, :] (shape "
                              "[1, K], broadcast over the queries)")
    return mask


def threshold_value(value) -> float:
    """A masked threshold as a float, or a MaskError naming what it is (a string would
    otherwise meet nanobind's list of signatures); its range is checked in C++."""
    import numbers
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _core.MaskError(f"invalid_argument: masked_threshold must be a negative number (an additive value at or "
                              f"below it masks a key), got {type(value).__name__} {value!r}")
    return float(value)


def readable(mask, is_tensor=None, check_dims=True):
    """`mask` as the scanners read it, or a MaskError naming what they cannot read: a torch
    tensor of a mask dtype and the strided layout; a numpy array of a mask dtype (one of
    another byte order is read as its values, through a native copy); any other object
    that carries DLPack. A list, None, an object, string or structured array would
    otherwise meet nanobind's list of the signatures it accepts. A mask has 2 to 4 dims
    (check_dims=False: the caller checks them against a call, naming it)."""
    if is_tensor is None:
        try:
            import torch
            is_tensor = isinstance(mask, torch.Tensor)
        except ImportError:
            is_tensor = False
    if is_tensor:
        import torch
        if mask.is_nested:  # before anything reads its sizes (a nested tensor has none)
            raise _core.MaskError("invalid_argument: a nested tensor (torch.nested) cannot be scanned: masklens reads "
                                  "dense masks of 2 to 4 dims; pass each sequence's mask, or "
                                  "mask.to_padded_tensor(False) with the padding masked")
        if type(mask) not in (torch.Tensor, torch.nn.Parameter):
            mask = _plain_tensor(mask)
        if mask.layout != torch.strided:
            raise _core.MaskError(f"invalid_argument: a mask of layout {mask.layout} cannot be scanned: masklens reads "
                                  "dense (strided) tensors; pass mask.to_dense()")
        device_dtype(mask)
        return _check_dims(mask) if check_dims else mask
    import numpy as np
    if isinstance(mask, np.ndarray):
        if mask.dtype.name not in _NUMPY_ELEMENTS:
            raise _core.MaskError(f"unsupported_dtype: mask dtype {mask.dtype} (numpy) is not a mask type "
                                  f"({_MASK_TYPES})")
        if check_dims:
            _check_dims(mask)
        return mask if mask.dtype.isnative else mask.astype(mask.dtype.newbyteorder("="))
    if not hasattr(mask, "__dlpack__"):
        raise _core.MaskError(f"invalid_argument: a mask is a torch tensor or a numpy array (or another DLPack "
                              f"array), got {type(mask).__name__}")
    return mask


def scan(mask, masked_threshold: float = -1000.0, device: bool = True):
    """Scans and classifies `mask` (a torch tensor or a numpy array) without the cache:
    a CUDA tensor on its device where masklens._cuda is there (device=False: on the host)."""
    try:
        import torch
    except ImportError:
        torch = None
    is_tensor = torch is not None and isinstance(mask, torch.Tensor)
    mask = readable(mask, is_tensor)
    masked_threshold = threshold_value(masked_threshold)
    if is_tensor and mask.device.type == "cuda" and device and cuda_module() is not None:
        verdict = device_scan(mask.detach(), masked_threshold)
    else:
        t0 = time.perf_counter()
        # device=False is asked for (tests compare both scanners): no warning then.
        verdict = _core.scan(host_array(mask, warn=device) if is_tensor else mask, masked_threshold)
        host_timing(t0)
    counted_scan()
    return verdict


def tile_size(tiles) -> tuple[int, int]:
    """A tile size as inspect(tiles=...) and block_mask() take it: N (N x N) or (q, k)."""
    if isinstance(tiles, int) and not isinstance(tiles, bool):
        return tiles, tiles
    try:
        q, k = tiles
        if isinstance(q, int) and isinstance(k, int) and not isinstance(q, bool) and not isinstance(k, bool):
            return q, k
    except (TypeError, ValueError):
        pass
    raise _core.MaskError(f"invalid_argument: tiles must be a tile size N or (q, k), integers >= 1, got {tiles!r}")


def scan_with_tiles(mask, size, masked_threshold: float = -1000.0):
    """(Verdict, TileSummary) of a host-readable mask at `size` (q, k), from one read on
    the host (a CUDA tensor is copied there first; no warning: the caller asked for host
    tiles). An arbitrary verdict's structure carries its tile fractions."""
    try:
        import torch
    except ImportError:
        torch = None
    is_tensor = torch is not None and isinstance(mask, torch.Tensor)
    mask = readable(mask, is_tensor)
    masked_threshold = threshold_value(masked_threshold)
    t0 = time.perf_counter()
    verdict, tiles = _core.scan_with_tiles(host_array(mask, warn=False) if is_tensor else mask, size[0], size[1],
                                           masked_threshold)
    host_timing(t0)
    counted_scan()
    return verdict, tiles
