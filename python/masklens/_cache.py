"""Scanning masks, and remembering the verdict per mask tensor.

A verdict is kept in a WeakIdKeyDictionary keyed by the mask tensor itself (the entry
dies with the tensor) and is reused only while the tensor's `_version`, data pointer,
shape, strides and dtype are unchanged: the CUDA caching allocator hands a freed
block's address to the next tensor, so a pointer and a shape alone would mistake a new
mask for an old one. `_version` counts in-place writes through torch (views
included). Writes torch does not see — through `mask.data` (a tensor with a version
counter of its own), a `.numpy()` alias, DLPack, or an external kernel writing the
storage — do not bump it: after such a write, call `masklens.forget(mask)` (or build a
new tensor).

Inference-mode tensors have no `_version` (reading it raises). Their verdict is kept
for one forward only: from one call of the "masklens" transformers mask function to the
next, or inside `with masklens.forward():`; outside those every call scans.

A CUDA mask is scanned on its device by masklens._cuda where that module was built: on
the tensor's current stream, into one block from torch's caching allocator; the row
spans are reduced to runs there and only the runs cross to the host (one
synchronisation of that stream; two past 256 runs). device_scan_tiles() does the same
from a read that also counts the mask's tiles and writes torch BlockMask's tensors on
the device (masklens.torch.block_mask and the flex runner use it for arbitrary CUDA
masks). Without masklens._cuda the mask is copied to the host (once-warned).
"""
from __future__ import annotations

import contextlib
import functools
import threading
import math
import time
import warnings
import weakref

from . import _core

_lock = threading.Lock()
_scans = 0
_epoch = 0          # bumped at every forward boundary
_in_forward = False  # whether inference-mode verdicts may be kept (see the module doc)
_cache = None        # WeakIdKeyDictionary, made on first use (torch is optional)
# (weak reference to the mask last found or stored, its entry): a model's layers pass one
# mask in turn, and one dereference is cheaper than a WeakIdKeyDictionary lookup (~2 µs).
_last = None
_warned_cuda = False
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


def _host_array(mask, warn=True):
    """A host view of `mask` that DLPack can carry: detached, on the CPU (copying only the
    distinct elements of a broadcast CUDA mask, once-warned unless asked for)."""
    global _warned_cuda
    import torch

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


def _counted_scan() -> None:
    """A scan ran (not the cache): masklens.scan_count() and last_timing()["scanned"]."""
    global _scans
    with _lock:
        _scans += 1
    timing["scanned"] = True


def _host_timing(t0) -> None:
    """last_timing() of a host scan begun at perf_counter() t0 (it classifies too; no
    device steps)."""
    timing["device"] = "host"
    timing["scan_ms"] = (time.perf_counter() - t0) * 1e3
    timing["classify_ms"] = timing["prepare_ms"] = timing["kernels_ms"] = 0.0


def _cuda_device(device):
    """A torch CUDA device with its index (the current device's where none is given)."""
    import torch
    device = torch.device(device)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def reserve_staging(device):
    """Allocates `device`'s pinned upload staging (masklens._cuda.reserve_uploads;
    masklens.load_kernels does, at start-up), so a first BlockMask does not allocate it."""
    module = cuda_module()
    if module is not None and hasattr(module, "reserve_uploads"):
        module.reserve_uploads(_cuda_device(device).index)


_torch_dtypes = {}  # numpy dtype -> torch dtype, as torch.from_numpy maps it


def to_device(array, device):
    """A numpy array (or a nested list of ints) as a tensor on `device`. To a CUDA device with
    masklens._cuda it crosses through the module's pinned staging (_cuda.upload), enqueued
    on the device's current stream without waiting: a copy from pageable memory is staged
    by the driver and can wait, and torch's pinned host blocks were measured to stall
    copies now and then by milliseconds on an H200 host (bench/README.md, tiles_torch)."""
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
    device = _cuda_device(device)
    out = torch.empty(host.shape, dtype=dtype, device=device)
    module.upload(host.ctypes.data, host.nbytes, out.data_ptr(), _stream_of(device), device.index)
    return out


def _stream_of(device) -> int:
    """The cudaStream_t of the device's current stream, as an int (0: the legacy default).
    Through torch's raw-stream getter where there is one (the one compiled kernels use):
    torch.cuda.current_stream() builds a Stream object through several Python layers,
    tens of microseconds of host time on each device read (bench/README.md)."""
    import torch
    device = torch.device(device)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None or device.type != "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return raw(device.index if device.index is not None else torch.cuda.current_device())


# torch BlockMask's eight tensors, in the order masklens._cuda.scan_runs_tiles takes them.
BLOCK_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def _device_dtype(mask):
    dtype = _ELEMENTS.get(str(mask.dtype))
    if dtype is None:
        raise _core.MaskError(f"unsupported_dtype: mask dtype {mask.dtype} is not a mask type ({_MASK_TYPES})")
    return dtype


# Runs past which a BlockMask's scan skips the verdict (classify_many_runs=False): one run
# for every 8 rows or more. Exact structures stay far below (a run per document, a few
# per padded batch slice); block-sparse masks reach about one run per row, whose copy to
# the host and classification cost ~10x the device read at 65536^2 (bench/README.md).
_MANY_RUNS = 8


def _device_runs(mask, masked_threshold, sizes, scan_call, tiles=(0, 0), classify_many_runs=True, spans_out=None):
    """The device scan both entry points share: the block laid out by a _core.DeviceRuns from
    `sizes` (scan temporary bytes, run reduction temporary bytes), scan_call(block address,
    runs, stream, device) scanning into it and returning the run count, the runs past the
    first copy brought, the runs classified. Returns the Verdict; None where
    classify_many_runs is False and the runs are more than one in _MANY_RUNS rows (a
    mask that is arbitrary or close to it: its runs would cost more than the scan; a NaN
    / +inf row is still an error, found on the device). spans_out (a list): a function is
    appended to it that gives the scan's RowSpans, an int64 [rows, 4] view of the block
    (first, last, count, flags | reserved), made only if asked for."""
    import torch

    t0 = time.perf_counter()
    cuda = _cuda
    dtype = _device_dtype(mask)
    shape, strides, ptr = list(mask.shape), list(mask.stride()), mask.data_ptr()
    runs = _core.DeviceRuns(ptr, dtype, shape, strides, masked_threshold, *sizes)
    # The allocator's blocks are 512-byte aligned; the layout's parts start 256-aligned.
    block = torch.empty(runs.block_bytes, dtype=torch.uint8, device=mask.device)
    base = block.data_ptr()
    stream = _stream_of(mask.device)
    device = mask.device.index
    t_call = time.perf_counter()
    count = scan_call(base, runs, stream, device)
    # The launches, the head's copy, the synchronisation (and the host work done meanwhile).
    timing["kernels_ms"] = (time.perf_counter() - t_call) * 1e3
    if spans_out is not None:
        def spans():
            spans_at = runs.layout["spans"]
            return block[spans_at:spans_at + runs.rows * 32].view(torch.int64).view(runs.rows, 4)
        spans_out.append(spans)
    if not classify_many_runs and count * _MANY_RUNS > runs.rows:
        # No verdict, yet a NaN / +inf row is an error: the run reduction found the first
        # one on the device, and it came back in the head with the count.
        runs.check_rows()
        timing["device"] = "cuda"
        timing["scan_ms"] = (time.perf_counter() - t0) * 1e3
        timing["classify_ms"] = 0.0
        return None
    if count > runs.eager:  # rare: more runs than the first copy brings
        more = None
        if count > runs.room:  # the run reduction runs again, into room for them all
            more = torch.empty(count * 64, dtype=torch.uint8, device=mask.device)
        address, nbytes = runs.rest_buffer(count)
        layout = {"block_q": tiles[0], "block_k": tiles[1]} if tiles[0] else {}  # the tile scan's block
        cuda.copy_rest(ptr, dtype, shape, strides, masked_threshold, base, runs.block_bytes,
                       0 if more is None else more.data_ptr(), count, address, nbytes, stream, device, **layout)
    t1 = time.perf_counter()
    verdict = runs.finish()
    timing["device"] = "cuda"
    timing["scan_ms"] = (t1 - t0) * 1e3  # the device part: allocation, kernels, copies, synchronisation
    timing["classify_ms"] = (time.perf_counter() - t1) * 1e3
    return verdict


def device_scan(mask, masked_threshold: float = -1000.0):
    """Scans a CUDA tensor on its device with masklens._cuda (which must be loaded), on the
    tensor's current stream, into one block of torch's caching allocator laid out by a
    _core.DeviceRuns (run count, runs, spans, the scan's and the run reduction's
    temporary storage): the spans are reduced to runs on the device, the count and the
    first 256 runs come back in one copy with one synchronisation of that stream (the
    rest, if any, with a second), and the runs are classified in O(runs)."""
    t0 = time.perf_counter()
    dtype = _device_dtype(mask)
    args = (mask.data_ptr(), dtype, list(mask.shape), list(mask.stride()), masked_threshold)
    sizes = _cuda.query_runs(*args)
    timing["prepare_ms"] = (time.perf_counter() - t0) * 1e3  # the size query

    def scan_call(base, runs, stream, device):
        return _cuda.scan_runs(*args, base, runs.block_bytes, runs.head_address, runs.head_bytes, stream, device)
    return _device_runs(mask, masked_threshold, sizes, scan_call)


def has_device_tiles() -> bool:
    """Whether CUDA masks get their tiles (and BlockMask tensors) on the device."""
    module = cuda_module()
    return module is not None and hasattr(module, "scan_runs_tiles")


def has_device_writer() -> bool:
    """Whether a host tile summary's BlockMask tensors can be written on a CUDA device."""
    module = cuda_module()
    return module is not None and hasattr(module, "write_block_mask")


def has_structure_writer() -> bool:
    """Whether an exact structure's BlockMask tensors can be written on a CUDA device from its
    tile ranges."""
    module = cuda_module()
    return module is not None and hasattr(module, "write_block_mask_from_ranges")


@functools.lru_cache(maxsize=64)
def _block_mask_layout(distinct_batch, distinct_heads, nq, nk, extra_bytes):
    """_block_mask_storage's layout of a grid, worked out once: (fields [(name, shape)],
    their sizes, the parts' int32 sizes (padded to 16 bytes; the extra part last), the
    parts' byte offsets)."""
    shapes = {"kv_num_blocks": (distinct_batch, distinct_heads, nq),
              "kv_indices": (distinct_batch, distinct_heads, nq, nk),
              "q_num_blocks": (distinct_batch, distinct_heads, nk),
              "q_indices": (distinct_batch, distinct_heads, nk, nq)}
    fields = tuple((name, shapes[name.replace("full_", "")]) for name in BLOCK_MASK_FIELDS)
    sizes = tuple(math.prod(shape) for _, shape in fields)
    padded = tuple(-(-n // 4) * 4 for n in sizes)
    extra = -(-extra_bytes // 16) * 4  # int32 elements
    parts = padded + ((extra,) if extra else ())
    offsets = tuple(4 * sum(parts[:k]) for k in range(len(parts)))
    return fields, sizes, parts, offsets


def _block_mask_storage(device, distinct_batch, distinct_heads, nq, nk, extra_bytes=0):
    """The storage of torch BlockMask's eight int32 tensors of a grid: one allocation (one
    block of the caching allocator instead of eight), each field 16-byte aligned in it.
    ([address], [bytes], views) in BLOCK_MASK_FIELDS order, the addresses by arithmetic;
    views() makes the {name: tensor} views. Torch ops cost microseconds each on the host
    (the views, 40-60 us on an H200 host): a caller that launches kernels into the
    storage makes them while the device works. extra_bytes > 0: a ninth address, of that
    many bytes after the fields (16-byte aligned; kept with the tensors, in no view)."""
    import torch
    fields, sizes, parts, offsets = _block_mask_layout(distinct_batch, distinct_heads, nq, nk, extra_bytes)
    block = torch.empty(sum(parts), dtype=torch.int32, device=device)
    base = block.data_ptr()
    pointers = [base + at for at in offsets]

    def views():
        # One split (a single op), then a view per field (the extra part has none).
        return {name: (part if n == p else part[:n]).view(shape)
                for (name, shape), part, n, p in zip(fields, block.split(parts), sizes, parts)}
    return pointers, [4 * n for n in sizes], views


def _block_mask_tensors(device, distinct_batch, distinct_heads, nq, nk):
    """torch BlockMask's eight int32 tensors of a grid, empty, as views of one allocation
    (_block_mask_storage). ({name: tensor}, [address], [bytes]) in BLOCK_MASK_FIELDS order."""
    pointers, nbytes, views = _block_mask_storage(device, distinct_batch, distinct_heads, nq, nk)
    return views(), pointers, nbytes


def device_block_mask_tensors(tiles, device):
    """torch BlockMask's eight int32 tensors of a host tile summary (a _core.TileSummary),
    written on the CUDA `device` by masklens._cuda (which must be there): the summary's
    states (one byte a tile) cross once, and the writer kernel runs on the device's current
    stream; no host writer, no synchronisation. {name: tensor} as device_scan_tiles()."""
    import torch
    device = torch.device(device)
    db, dh, nq, nk = tiles.shape
    states = to_device(tiles.states, device)
    arrays, pointers, nbytes = _block_mask_tensors(device, db, dh, nq, nk)
    grid = [tiles.batch, tiles.heads, tiles.q_len, tiles.k_len, *tiles.block_size, db, dh]
    index = _cuda_device(device).index if device.type == "cuda" else 0  # 0: a host stand-in (tests)
    _cuda.write_block_mask(states.data_ptr(), states.numel(), grid, pointers, nbytes, _stream_of(device), index)
    return arrays


def device_block_mask_from_structure(structure, size, device):
    """torch BlockMask's eight int32 tensors of an exact structure at `size` (q, k), written
    on the CUDA `device` by masklens._cuda (which must be there) from the structure's tile
    ranges (_core.structure_tile_ranges: 32 bytes a q tile, copied over through the
    module's pinned staging into 16-byte-aligned room after the tensors, kept with them)
    on the device's current stream: no host writer, no tile states, no synchronisation.
    ({name: tensor}, (q_len, k_len))."""
    import torch
    device = _cuda_device(device)
    grid, ranges = _core.structure_tile_ranges(structure, *size)
    batch, heads, q_len, k_len, bq, bk, db, dh = grid
    nq, nk = -(-q_len // bq), -(-k_len // bk)
    pointers, nbytes, views = _block_mask_storage(device, db, dh, nq, nk, extra_bytes=ranges.nbytes)
    _cuda.write_block_mask_from_ranges(ranges.ctypes.data, ranges.nbytes, pointers[-1], grid, pointers[:-1], nbytes,
                                       _stream_of(device), device.index)
    return views(), (q_len, k_len)


def device_scan_tiles(mask, size, masked_threshold: float = -1000.0, classify_many_runs: bool = True, states=None,
                      spans_out=None):
    """device_scan() whose one read of the mask also counts its tiles of `size` (q, k) and
    writes torch BlockMask's eight int32 tensors on the mask's device (masklens._cuda.
    scan_runs_tiles, which must be there): (Verdict, {name: tensor}) with counts
    [B', H', q tiles], indices [B', H', q tiles, k tiles] and the q side [B', H', k tiles]
    / [B', H', k tiles, q tiles], B' and H' the distinct batch and heads (1 where the mask
    broadcasts them, as BlockMask broadcasts a dimension of 1). Allocated here, from
    torch's caching allocator (one block, eight views); written on the mask's current
    stream before the one synchronisation. classify_many_runs=False: the Verdict is None
    where the spans reduce to more than one run in _MANY_RUNS rows (a BlockMask needs no
    verdict: a mask_mod reading the mask is exact for any mask; a block-sparse mask's
    ~one run per row would cost more on the host than the read on the device). `states`: a
    contiguous uint8 tensor of one byte a tile on the mask's device, written with each
    tile's state ([B', H', q tiles, k tiles], 0 empty, 1 partial, 2 full) in the same pass.
    `spans_out` (a list): a function giving the read's RowSpans appended, as _device_runs()
    gives it."""
    t0 = time.perf_counter()
    dtype = _device_dtype(mask)
    q, k = size
    args = (mask.data_ptr(), dtype, list(mask.shape), list(mask.stride()), masked_threshold)
    sizes, (db, dh, nq, nk) = _cuda.query_runs_tiles(*args, q, k)
    pointers, nbytes, views = _block_mask_storage(mask.device, db, dh, nq, nk)

    extra = {} if states is None else {"d_states": states.data_ptr(), "states_bytes": states.numel()}
    timing["prepare_ms"] = (time.perf_counter() - t0) * 1e3  # the size query and the tensors' allocation
    arrays = {}

    def scan_call(base, runs, stream, device):
        # Enqueued without waiting: the tensors' views are made while the device reads the
        # mask, then the one synchronisation (whatever happens between: the pending scan
        # would refuse the thread's next one). A launch that raises leaves none pending.
        _cuda.scan_runs_tiles(*args, q, k, base, runs.block_bytes, runs.head_address, runs.head_bytes,
                              pointers, nbytes, stream, device, wait=False, **extra)
        try:
            arrays.update(views())
        finally:
            count = _cuda.wait_runs(runs.head_address)
        return count
    verdict = _device_runs(mask, masked_threshold, sizes, scan_call, tiles=(q, k),
                           classify_many_runs=classify_many_runs, spans_out=spans_out)
    _counted_scan()
    return verdict, arrays


def device_tile_summary(mask, size, masked_threshold: float = -1000.0):
    """(Verdict, TileSummary) of a CUDA mask from one device read (device_scan_tiles): the
    BlockMask writer stores each tile's state beside the tensors, and the states cross to
    the host at one byte a tile. An arbitrary verdict's structure carries the tiles'
    fractions, as scan_with_tiles() gives it."""
    import torch
    _, (db, dh, nq, nk) = _cuda.query_runs_tiles(mask.data_ptr(), _device_dtype(mask), list(mask.shape),
                                                 list(mask.stride()), masked_threshold, *size)
    states = torch.empty((db, dh, nq, nk), dtype=torch.uint8, device=mask.device)
    verdict, _ = device_scan_tiles(mask, size, masked_threshold, states=states)
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    summary = _core.tile_summary_from_states(states.cpu().numpy(), *shape, *size)
    if verdict.structure.kind == "arbitrary":
        verdict.structure.tile_fractions = summary.fractions()
    return verdict, summary


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


def readable(mask, is_tensor=None):
    """`mask` as the scanners read it, or a MaskError naming what they cannot read: a torch
    tensor of a mask dtype and the strided layout; a numpy array of a mask dtype (one of
    another byte order is read as its values, through a native copy); any other object
    that carries DLPack. A list, None, an object, string or structured array would
    otherwise meet nanobind's list of the signatures it accepts."""
    if is_tensor is None:
        try:
            import torch
            is_tensor = isinstance(mask, torch.Tensor)
        except ImportError:
            is_tensor = False
    if is_tensor:
        import torch
        if type(mask) not in (torch.Tensor, torch.nn.Parameter):
            mask = _plain_tensor(mask)
        if mask.layout != torch.strided:
            raise _core.MaskError(f"invalid_argument: a mask of layout {mask.layout} cannot be scanned: masklens reads "
                                  "dense (strided) tensors; pass mask.to_dense()")
        _device_dtype(mask)
        return mask
    import numpy as np
    if isinstance(mask, np.ndarray):
        if mask.dtype.name not in _NUMPY_ELEMENTS:
            raise _core.MaskError(f"unsupported_dtype: mask dtype {mask.dtype} (numpy) is not a mask type "
                                  f"({_MASK_TYPES})")
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
    if is_tensor and mask.device.type == "cuda" and device and cuda_module() is not None:
        verdict = device_scan(mask.detach(), masked_threshold)
    else:
        t0 = time.perf_counter()
        # device=False is asked for (tests compare both scanners): no warning then.
        verdict = _core.scan(_host_array(mask, warn=device) if is_tensor else mask, masked_threshold)
        _host_timing(t0)
    _counted_scan()
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
    t0 = time.perf_counter()
    verdict, tiles = _core.scan_with_tiles(_host_array(mask, warn=False) if is_tensor else mask, size[0], size[1],
                                           masked_threshold)
    _host_timing(t0)
    _counted_scan()
    return verdict, tiles


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
        entry = _cache.get(mask) if _cache is not None else None
        if entry is None:
            return None
        _remember(mask, entry)
    key = _tensor_key(mask, masked_threshold)
    if key is None or entry.key != key + (view_shape,):
        return None
    timing["scanned"] = False
    return entry


def entry_for(mask, masked_threshold: float = -1000.0, view=None) -> Entry:
    """The cache entry of a torch mask tensor, scanning it (or `view`, the mask broadcast
    to the call's shape) when it is new or changed."""
    global _cache

    mask = readable(mask, True)  # a sparse tensor has no data pointer for the key; a CausalBias is read dense
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
        timing["scanned"] = False
        return entry
    entry = Entry(key, scan(target, masked_threshold))
    _cache[mask] = entry
    _remember(mask, entry)
    return entry


def forget(mask=None) -> None:
    """Drops the cached verdict of `mask` (all of them when None): after writing a mask
    through an alias torch does not track."""
    global _last
    last = _last
    if last is not None and (mask is None or last[0]() is mask):
        _last = None
    if _cache is None:
        return
    if mask is None:
        _cache.clear()
    else:
        _cache.pop(mask, None)
