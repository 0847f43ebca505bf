"""torch FlexAttention BlockMasks from masklens' tiles: the eight int32 tensors in one
allocation, written on the device in the same read that scans a CUDA mask
(device_scan_tiles), from an exact structure's tile ranges, or from a host tile summary;
the mask_mod of a structure's rule, of a read's row bounds, or of the mask itself; and
masklens.torch.block_mask(), which picks among them. Uses the scanners and the verdict
cache below it.
"""
from __future__ import annotations

import functools
import inspect as _pyinspect
import math
import time

import numpy as np
import torch

from . import _core, _report, _scan, _verdicts


# torch BlockMask's eight tensors, in the order masklens._cuda.scan_runs_tiles takes them.
BLOCK_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def block_mask_shapes(batch, heads, nq, nk):
    """The shapes of torch BlockMask's eight tensors (BLOCK_MASK_FIELDS order) over a grid
    of nq x nk tiles in batch x heads slices (sizes may be symbolic)."""
    kv, q = ((batch, heads, nq), (batch, heads, nq, nk)), ((batch, heads, nk), (batch, heads, nk, nq))
    return [*kv, *kv, *q, *q]


@functools.lru_cache(maxsize=64)
def _block_mask_layout(distinct_batch, distinct_heads, nq, nk, extra_bytes):
    """_block_mask_storage's layout of a grid, worked out once: (fields [(name, shape)],
    their sizes, the parts' int32 sizes (padded to 16 bytes; the extra part last), the
    parts' byte offsets)."""
    fields = tuple(zip(BLOCK_MASK_FIELDS, block_mask_shapes(distinct_batch, distinct_heads, nq, nk)))
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
    device = torch.device(device)
    db, dh, nq, nk = tiles.shape
    states = _scan.to_device(tiles.states, device)
    arrays, pointers, nbytes = _block_mask_tensors(device, db, dh, nq, nk)
    grid = [tiles.batch, tiles.heads, tiles.q_len, tiles.k_len, *tiles.block_size, db, dh]
    index = _scan.cuda_device(device).index if device.type == "cuda" else 0  # 0: a host stand-in (tests)
    _scan._cuda.write_block_mask(states.data_ptr(), states.numel(), grid, pointers, nbytes, _scan.stream_of(device),
                                 index)
    return arrays


def device_block_mask_from_structure(structure, size, device):
    """torch BlockMask's eight int32 tensors of an exact structure at `size` (q, k), written
    on the CUDA `device` by masklens._cuda (which must be there) from the structure's tile
    ranges (_core.structure_tile_ranges: 32 bytes a q tile, copied over through the
    module's pinned staging into 16-byte-aligned room after the tensors, kept with them)
    on the device's current stream: no host writer, no tile states, no synchronisation.
    ({name: tensor}, (q_len, k_len))."""
    device = _scan.cuda_device(device)
    grid, ranges = _core.structure_tile_ranges(structure, *size)
    batch, heads, q_len, k_len, bq, bk, db, dh = grid
    nq, nk = -(-q_len // bq), -(-k_len // bk)
    pointers, nbytes, views = _block_mask_storage(device, db, dh, nq, nk, extra_bytes=ranges.nbytes)
    _scan._cuda.write_block_mask_from_ranges(ranges.ctypes.data, ranges.nbytes, pointers[-1], grid, pointers[:-1],
                                             nbytes, _scan.stream_of(device), device.index)
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
    where the spans reduce to more than one run in _scan.MANY_RUNS rows (a BlockMask needs no
    verdict: a mask_mod reading the mask is exact for any mask; a block-sparse mask's
    ~one run per row would cost more on the host than the read on the device). `states`: a
    contiguous uint8 tensor of one byte a tile on the mask's device, written with each
    tile's state ([B', H', q tiles, k tiles], 0 empty, 1 partial, 2 full) in the same pass.
    `spans_out` (a list): a function giving the read's RowSpans appended, as _scan.device_runs()
    gives it."""
    t0 = time.perf_counter()
    dtype = _scan.device_dtype(mask)
    q, k = size
    args = (mask.data_ptr(), dtype, list(mask.shape), list(mask.stride()), masked_threshold)
    sizes, (db, dh, nq, nk) = _scan._cuda.query_runs_tiles(*args, q, k)
    pointers, nbytes, views = _block_mask_storage(mask.device, db, dh, nq, nk)

    extra = {} if states is None else {"d_states": states.data_ptr(), "states_bytes": states.numel()}
    _scan.timing["prepare_ms"] = (time.perf_counter() - t0) * 1e3  # the size query and the tensors' allocation
    arrays = {}

    def scan_call(base, runs, stream, device):
        # Enqueued without waiting: the tensors' views are made while the device reads the
        # mask, then the one synchronisation (whatever happens between: the pending scan
        # would refuse the thread's next one). A launch that raises leaves none pending.
        _scan._cuda.scan_runs_tiles(*args, q, k, base, runs.block_bytes, runs.head_address, runs.head_bytes,
                                    pointers, nbytes, stream, device, wait=False, **extra)
        try:
            arrays.update(views())
        finally:
            count = _scan._cuda.wait_runs(runs.head_address)
        return count
    verdict = _scan.device_runs(mask, masked_threshold, sizes, scan_call, tiles=(q, k),
                                classify_many_runs=classify_many_runs, spans_out=spans_out)
    _scan.counted_scan()
    return verdict, arrays


def device_tile_summary(mask, size, masked_threshold: float = -1000.0):
    """(Verdict, TileSummary) of a CUDA mask from one device read (device_scan_tiles): the
    BlockMask writer stores each tile's state beside the tensors, and the states cross to
    the host at one byte a tile. An arbitrary verdict's structure carries the tiles'
    fractions, as scan_with_tiles() gives it."""
    _, (db, dh, nq, nk) = _scan._cuda.query_runs_tiles(mask.data_ptr(), _scan.device_dtype(mask), list(mask.shape),
                                                       list(mask.stride()), masked_threshold, *size)
    states = torch.empty((db, dh, nq, nk), dtype=torch.uint8, device=mask.device)
    verdict, _ = device_scan_tiles(mask, size, masked_threshold, states=states)
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    summary = _core.tile_summary_from_states(states.cpu().numpy(), *shape, *size)
    if verdict.structure.kind == "arbitrary":
        verdict.structure.tile_fractions = summary.fractions()
    return verdict, summary


def mask_mod_for(structure, device, mask=None):
    """FlexAttention's mask_mod: the structure's rule from its fields, or (for a kept
    mask) a lookup into the dense mask."""
    if mask is not None:
        m = mask if mask.dtype == torch.bool else (mask > -1000) if mask.is_floating_point() else mask != 0
        mb, mh = m.shape[:2]

        def lookup(b, h, qi, ki):
            # create_block_mask evaluates whole tiles: indices past the last row or key
            # reach here when a length is not a multiple of the block; clamp them (flex
            # masks those positions itself). The bounds are the mask's own sizes, not
            # Python ints: a compiled flex traces them as the lengths, without a guard.
            return m[b if mb > 1 else 0, h if mh > 1 else 0, qi.clamp(max=m.shape[2] - 1), ki.clamp(max=m.shape[3] - 1)]
        return lookup
    s = structure
    Q, K = s.q_len, s.k_len
    d = K - Q if s.alignment == "bottom_right" else 0
    kind = s.kind
    W, C, P = s.window, max(s.chunk, 1), s.prefix
    # The closure holds Python ints, and a tensor only for a rule or modifier that reads
    # one: torch.compile traces exactly the terms the structure has (no dead clamp, no
    # `+ 0`), the graph a hand-written mask_mod of the same rule gives. The window, chunk
    # and prefix are a model's constants; the bottom-right offset K - Q changes with the
    # lengths (prefill over a cache), so it is a 0-d tensor: a compiled flex of dynamic
    # lengths then serves every offset in its bucket without compiling again.
    offset = _scan.to_device(np.asarray([d], dtype=np.int64), device).view(()) if d else None
    blocks = None
    if kind == "causal_blocks":
        table = np.full((max(K, Q + d, 1),), -1, dtype=np.int32)
        for n, (start, end) in enumerate(s.blocks):
            table[start:end] = n
        blocks = _scan.to_device(table, device)
    docs = None
    if s.segments is not None:
        docs = document_table(s.segments, Q, device)
    kv = _scan.to_device(np.asarray(s.kv_valid, dtype=np.int64), device) if s.kv_valid is not None else None
    qv = _scan.to_device(np.asarray(s.q_valid, dtype=np.int64), device) if s.q_valid is not None else None
    # Modifiers hold one entry per batch, or one for every batch (a broadcast mask).
    docs_batch = docs is not None and docs.shape[0] > 1
    kv_batch = kv is not None and kv.shape[0] > 1
    qv_batch = qv is not None and qv.shape[0] > 1

    def mask_mod(b, h, qi, ki):
        # create_block_mask evaluates whole tiles: indices past Q or K reach here when a
        # length is not a multiple of the block. Lookups use clamped indices (flex masks
        # those positions itself); comparisons use the real ones. The branches test
        # Python values: a trace keeps only the structure's own terms. Clamps read the
        # tables' sizes, not Q or K: a compiled flex of dynamic lengths is not guarded on them.
        p = qi + offset if offset is not None else qi
        if kind == "full":
            ok = ki >= 0
        elif kind == "causal":
            ok = ki <= p
        elif kind == "sliding_window":
            ok = (ki <= p) & (p - ki < W)
        elif kind == "chunked":
            ok = (ki <= p) & (p >= 0) & (ki // C == p // C)
        elif kind == "prefix_lm":
            ok = (ki <= p) | (ki < P)
        else:  # causal_blocks: p's block, when p lies in one
            last = blocks.shape[0] - 1  # the table spans every key (positions past K hold -1)
            kc = ki.clamp(max=last)
            ok = (ki <= p) | ((blocks[kc] >= 0) & (blocks[kc] == blocks[p.clamp(min=0, max=last)]) & (p >= 0))
        if docs is not None:
            db = b if docs_batch else 0
            last = docs.shape[1] - 1  # documents are of square masks: Q = K
            ok = ok & (docs[db, qi.clamp(max=last)] == docs[db, ki.clamp(max=last)])
        if kv is not None:
            kb = b if kv_batch else 0
            ok = ok & (ki >= kv[kb, 0]) & (ki < kv[kb, 1])
        if qv is not None:  # rows outside q_valid attend nothing: their tiles are empty
            qb = b if qv_batch else 0
            ok = ok & (qi >= qv[qb, 0]) & (qi < qv[qb, 1])
        return ok
    return mask_mod


def rule_reads_tables(structure) -> bool:
    """Whether mask_mod_for's rule of an exact structure reads device tables (built or
    uploaded when the mask_mod is made): documents, VLM blocks, padding."""
    s = structure
    return (s.kind == "causal_blocks" or s.segments is not None or s.kv_valid is not None
            or s.q_valid is not None)


def span_mask_mod(spans, distinct_batch: int, distinct_heads: int):
    """FlexAttention's mask_mod of a mask whose every row attends one interval of keys (every
    exact structure's rows do: row_span.hpp), from the RowSpans a device read left
    ([distinct_batch * distinct_heads * Q, 4] int64: first, last, count, flags): key kv
    attends row q iff first[q] <= kv <= last[q] (an empty row's first is past every key).
    One copy of the bounds on the device, no upload: where a structure's rule needs tables
    (a document id per position...), this is the same mask with nothing else to build.
    The copy (16 bytes a row) lets the read's block go: a view would keep its runs, spans
    and tile counts alive with the BlockMask (~4.9 MB at 69632^2). A broadcast batch or
    head (distinct 1) reads slice 0."""
    return bounds_mask_mod(span_bounds(spans, distinct_batch, distinct_heads))


def span_bounds(spans, distinct_batch: int, distinct_heads: int):
    """[distinct_batch, distinct_heads, Q, 2] int64: the first and last key of each row, a
    copy of the RowSpans a device read left ([distinct_batch * distinct_heads * Q, 4])."""
    Q = spans.shape[0] // (distinct_batch * distinct_heads)
    return spans[:, :2].contiguous().view(distinct_batch, distinct_heads, Q, 2)


def bounds_mask_mod(table):
    """FlexAttention's mask_mod of row bounds: table [B', H', Q, 2] (first, last key of
    each row, first past last for a row that attends nothing), B' or H' of 1 broadcast:
    key kv attends row q iff first <= kv <= last."""
    distinct_batch, distinct_heads = table.shape[0] > 1, table.shape[1] > 1

    def mask_mod(b, h, qi, ki):
        # Past Q (a ragged last tile) the row is clamped; flex masks those positions itself.
        # The table's own size bounds it: no guard on Q in a compiled flex.
        bb, hh, qc = b if distinct_batch else 0, h if distinct_heads else 0, qi.clamp(max=table.shape[2] - 1)
        return (ki >= table[bb, hh, qc, 0]) & (ki <= table[bb, hh, qc, 1])
    return mask_mod


def document_table(segments, Q: int, device) -> torch.Tensor:
    """[len(segments), Q] int32: the document of each position of each batch, from the
    documents' starts alone (segments[b] = [0, e1, ..., Q]). The ids only need to be equal
    within a document and distinct across two of one batch, so one search over every
    batch's interior starts as flat positions (b * Q + start) numbers them all at once:
    the positions, one upload of a few dozen integers and one bucketize, three launches
    and no synchronisation (marks, index_fill_ and cumsum took four; a Q-long table built
    on the host cost 0.7-1.1 ms a BlockMask at 65536 on an H200 host). A tensor, not
    Python ints: new document boundaries then reuse the compiled flex_attention (Dynamo
    guards ints as constants and would compile again for each packing)."""
    n = len(segments) * Q
    # Batch b's ids are offset by the starts of the batches before it: the same within
    # the batch, which is all that a comparison inside one batch sees.
    starts = [b * Q + start for b, seg in enumerate(segments) for start in seg[1:-1]]
    if not starts:
        return torch.zeros((len(segments), Q), dtype=torch.int32, device=device)
    wide = n >= 2**31
    bounds = _scan.to_device(np.asarray(starts, dtype=np.int64 if wide else np.int32), device)
    positions = torch.arange(n, dtype=torch.int64 if wide else torch.int32, device=bounds.device)
    return torch.bucketize(positions, bounds, out_int32=True, right=True).view(len(segments), Q)


_BLOCK_MASK_TAKES_Q_SIDE = None


def block_mask_takes_q_side() -> bool:
    """Whether torch's BlockMask constructor takes the q side (torch 2.11's does). Worked
    out once; a caller that builds BlockMasks inside a traced graph asks first, eagerly."""
    global _BLOCK_MASK_TAKES_Q_SIDE
    if _BLOCK_MASK_TAKES_Q_SIDE is None:
        from torch.nn.attention.flex_attention import BlockMask
        _BLOCK_MASK_TAKES_Q_SIDE = "q_num_blocks" in _pyinspect.signature(BlockMask.__init__).parameters
    return _BLOCK_MASK_TAKES_Q_SIDE


def block_mask_from_arrays(arrays, seq_lengths, block_size, mask_mod):
    """A torch BlockMask over its eight int32 tensors ({name: tensor}, [B', H', ...] with B'
    and H' the distinct batch and heads, 1 broadcasting): through BlockMask's constructor
    where it takes the q side (torch 2.11 does), else BlockMask.from_kv_blocks deriving it.
    A broadcast dimension stays 1: flex_attention reads a dimension of 1 for every batch or
    head, while an expanded (stride-0) tensor would meet its contiguous offset arithmetic."""
    from torch.nn.attention.flex_attention import BlockMask
    if block_mask_takes_q_side():
        return BlockMask(seq_lengths=tuple(seq_lengths), BLOCK_SIZE=tuple(block_size), mask_mod=mask_mod, **arrays)
    return BlockMask.from_kv_blocks(arrays["kv_num_blocks"], arrays["kv_indices"], arrays["full_kv_num_blocks"],
                                    arrays["full_kv_indices"], BLOCK_SIZE=tuple(block_size), mask_mod=mask_mod,
                                    seq_lengths=tuple(seq_lengths))


def block_mask_from_tiles(tiles, mask_mod, device):
    """A torch BlockMask over masklens' tile summary (a _core.TileSummary): its eight int32
    tensors (the kv side, and the q side torch would derive for the backward). On a CUDA
    device with masklens._cuda, written there from the summary's states (one byte a tile
    crosses); otherwise written on the host and shared from numpy (moved to `device`)."""
    if torch.device(device).type == "cuda" and _scan.has_device_writer():
        arrays = device_block_mask_tensors(tiles, device)
        return block_mask_from_arrays(arrays, (tiles.q_len, tiles.k_len), tiles.block_size, mask_mod)
    t = tiles.block_mask()
    arrays = {name: _scan.to_device(getattr(t, name), device) for name in t.fields}
    return block_mask_from_arrays(arrays, t.seq_lengths, t.block_size, mask_mod)


def block_mask_from_structure(structure, size, mask_mod, device):
    """torch's BlockMask of an exact structure at `size` (q, k), from its fields (no mask is
    read): on a CUDA device with masklens._cuda, written there from the structure's tile
    ranges (a few bytes a q tile cross; no host writer, no tile states); otherwise from
    its tile summary (tiles_from_structure) as block_mask_from_tiles writes it."""
    if torch.device(device).type == "cuda" and _scan.has_structure_writer():
        arrays, seq_lengths = device_block_mask_from_structure(structure, size, device)
        return block_mask_from_arrays(arrays, seq_lengths, size, mask_mod)
    return block_mask_from_tiles(_core.tiles_from_structure(structure, *size), mask_mod, device)


def device_block_mask(mask, size, mask_mod, masked_threshold=-1000.0, classify_many_runs=True):
    """The BlockMask of a CUDA mask ([B, H, Q, K]) from masklens._cuda's device tile summary:
    one read on the device, the eight tensors written there (masklens._block_mask.
    device_scan_tiles). (Verdict, BlockMask); the Verdict is None where classify_many_runs
    is False and the mask's runs are many (masklens._scan.MANY_RUNS)."""
    verdict, arrays = device_scan_tiles(mask.detach(), size, masked_threshold, classify_many_runs=classify_many_runs)
    return verdict, block_mask_from_arrays(arrays, mask.shape[-2:], size, mask_mod)


def flex_block_mask(structure, mask, a, device):
    """The BlockMask of a flex call (FlexArgs `a`) from masklens' tiles, or None where they
    are not at hand: an exact structure's tiles from its fields (no read of the mask), a
    kept CPU mask's from one host read, a kept CUDA mask's from one device read where
    masklens._cuda summarises tiles (else None: create_block_mask then evaluates the
    mask_mod on the device). `mask`: the dense [B, H, Q, K] mask the call keeps."""
    size = (a.block_q, a.block_k)
    if not a.mask_mod_reads_mask:
        return block_mask_from_structure(structure, size, mask_mod_for(structure, device), device)
    if mask.device.type == "cpu":
        _, tiles = _core.scan_with_tiles(mask.detach(), *size)
        return block_mask_from_tiles(tiles, mask_mod_for(structure, device, mask), device)
    if mask.device.type == "cuda" and mask.device == device and _scan.has_device_tiles():
        _, block_mask = device_block_mask(mask, size, mask_mod_for(structure, device, mask),
                                          classify_many_runs=False)  # the verdict is known: only the tiles are new
        return block_mask
    return None


def structure_tiles_as_stored(structure, size, mask):
    """An exact structure's tiles (tiles_from_structure, no read) laid out over the slices
    `mask` stores, as a scan of the mask lays them out: a batch or head dimension of the
    mask that is absent, 1 or of stride 0 holds one slice, any other one each (the
    structure alone would store one wherever its rule is the same for all), so that
    Report.tiles is the same whichever way it was counted."""
    summary = _core.tiles_from_structure(structure, *size)
    dims, strides = list(mask.shape), list(mask.stride())
    while len(dims) < 4:
        dims.insert(0, 1)
        strides.insert(0, 0)
    stored = tuple(n if n > 1 and stride != 0 else 1 for n, stride in zip(dims[:2], strides[:2]))
    if tuple(summary.shape[:2]) == stored:
        return summary
    states = np.ascontiguousarray(np.broadcast_to(summary.states, stored + tuple(summary.shape[2:])))
    return _core.tile_summary_from_states(states, dims[0], dims[1], summary.q_len, summary.k_len, *summary.block_size)


def attends(mask, masked_threshold: float = -1000.0):
    """The keys a mask lets attend, as a bool tensor (an additive mask's above the threshold)."""
    return mask if mask.dtype == torch.bool else (mask > masked_threshold if mask.is_floating_point() else mask != 0)


def _tiles_on_device(mask, device):
    """Whether a mask's tiles are written on its device (masklens._cuda's tile scan) for a
    BlockMask wanted there."""
    return mask.device.type == "cuda" and torch.device(device) == mask.device and _scan.has_device_tiles()


def _structure_slices(structure):
    """(distinct batch, distinct heads) of an exact structure's own tiles, as
    structure_tile_grid (structure_tiles.hpp) tiles it: one slice per batch where its
    modifiers differ by batch, else one; the heads are alike."""
    differ = any(len(f or ()) > 1 for f in (structure.segments, structure.kv_valid, structure.q_valid))
    return (structure.batch if differ else 1, 1)


def _device_block_mask(mask, size, masked_threshold):
    """(structure, BlockMask over the tensors one device read wrote, or None). Its mask_mod
    is the structure's rule where the structure is exact (nothing holds the mask), else a
    lookup into the mask. The tensors are the mask's tiles either way: for an exact
    structure the very tiles tiles_from_structure would give (the CUDA suite holds the two
    equal), so nothing is tiled again, where they have the structure's own slices; a mask
    that stores more ([B, H, Q, K] materialised, every head alike) gets None: its fields
    give the BlockMask, B x H times smaller. The structure is None where the spans reduce
    to more than one run in 8 rows (block-sparse masks: about one run per row): the
    lookup is exact for any mask, and the runs are never brought to the host. A structure
    whose rule reads device tables (documents, VLM blocks, padding) takes the read's own
    spans' bounds instead (span_mask_mod): no table is built after the read."""
    view = mask
    while view.dim() < 4:
        view = view.unsqueeze(0)
    spans = []
    verdict, arrays = device_scan_tiles(view.detach(), size, masked_threshold, classify_many_runs=False,
                                               spans_out=spans)
    structure = None if verdict is None else verdict.structure
    if structure is not None and structure.kind != "arbitrary":
        slices = tuple(arrays["kv_num_blocks"].shape[:2])
        if slices != _structure_slices(structure):
            return structure, None
        if rule_reads_tables(structure):
            mask_mod = span_mask_mod(spans[0](), *slices)
        else:
            mask_mod = mask_mod_for(structure, view.device)
    else:
        mask_mod = mask_mod_for(structure, view.device, attends(view, masked_threshold))
    return structure, block_mask_from_arrays(arrays, view.shape[-2:], size, mask_mod)


def _mask_tensor(mask, name):
    """A mask block_mask() reads, as a torch tensor: a torch tensor, or a numpy array (or
    another DLPack array) shared by torch; anything else a MaskError naming it, as
    masklens.inspect names it."""
    if isinstance(mask, torch.Tensor):
        return _scan.readable(mask, True)  # a layout, dtype, subclass or dims it cannot read: a MaskError
    if mask is None or not (isinstance(mask, np.ndarray) or hasattr(mask, "__dlpack__")):
        raise _core.MaskError(f"invalid_argument: block_mask's {name} is a mask (a torch tensor or a numpy array) "
                              f"{'or a masklens.Report' if name == 'mask_or_report' else ''}, got "
                              f"{type(mask).__name__}")
    mask = _scan.readable(mask, False)
    return _scan.readable(torch.from_dlpack(mask) if not isinstance(mask, np.ndarray) else torch.from_numpy(mask), True)


def _check_against_report(mask, structure) -> None:
    """mask= of a Report must be a mask of the report's shape: 2 to 4 dims broadcasting to
    its [B, H, Q, K] (each dim the report's or 1; its query and key lengths the report's),
    as the mask it was made of did."""
    target = (structure.batch, structure.heads, structure.q_len, structure.k_len)
    shape = tuple(mask.shape)
    if shape[-2:] != target[-2:] or not all(m in (t, 1) for m, t in zip(shape[:-2][::-1], target[:-2][::-1])):
        raise _core.MaskError(f"invalid_shape: mask= of shape {list(shape)} is not the mask of the report's "
                              f"[B, H, Q, K] = {list(target)} (its query and key lengths, and a batch and heads "
                              "equal or 1); pass the mask the report was made of")


def block_mask(mask_or_report, block_size=128, *, mask=None, device=None, masked_threshold: float = -1000.0):
    """A torch FlexAttention BlockMask from masklens' tiles (BlockMask.from_kv_blocks' layout,
    with the q side masklens writes too), at block_size = N or (q, k).

    `mask_or_report` is a mask (torch tensor or numpy array, 2-4 dims) or a masklens.Report;
    `mask=` goes with a Report only, and must have the report's shape (its query and key
    lengths; batch and heads the report's or 1), and, where it is read for its tiles,
    read as the report's arbitrary structure.
    A CUDA mask (with `device` its own) is read once on the device by masklens._cuda,
    which proves the structure and writes the BlockMask's tensors there in that read.
    Otherwise an exact structure's tiles come from its fields (no read of the mask past
    the scan), an arbitrary mask's from a host scan (a CUDA mask without masklens._cuda
    is copied to the host for them). An exact structure's mask_mod comes from its fields
    (from one device read, a rule that needs tables takes the read's row bounds instead);
    an arbitrary mask's reads the mask (`mask[b, h, q, kv]`): a Report of an arbitrary
    mask needs `mask=` (its tiles are reused when inspect(tiles=...) counted them at this
    size). The tensors are on `device` (default: the mask's, else the CPU)."""
    size = _scan.tile_size(block_size)
    masked_threshold = _scan.threshold_value(masked_threshold)
    tiles = None
    if isinstance(mask_or_report, _report.Report):
        structure = mask_or_report.structure
        have = mask_or_report.tiles
        if have is not None and tuple(have.block_size) == size:
            tiles = have
        if mask is not None:
            mask = _mask_tensor(mask, "mask=")
            _check_against_report(mask, structure)
    else:
        if mask is not None and mask is not mask_or_report:
            raise _core.MaskError("invalid_argument: block_mask(mask, ..., mask=) got two masks: mask= goes with a "
                                  "masklens.Report (the mask an arbitrary report's mask_mod reads); "
                                  "block_mask(mask, ...) reads its first argument")
        mask, structure = _mask_tensor(mask_or_report, "mask_or_report"), None
    if device is None:
        device = mask.device if mask is not None else torch.device("cpu")
    if structure is None:
        if _tiles_on_device(mask, device):
            # One read on the device: the verdict, and the tiles written as the BlockMask's
            # tensors there (None: an exact structure stored B x H times over, tiled from
            # its fields below).
            structure, bm = _device_block_mask(mask, size, masked_threshold)
            if bm is not None:
                return bm
        elif mask.device.type == "cuda":
            structure = _verdicts.scan(mask, masked_threshold).structure
        if structure is None or structure.kind == "arbitrary":
            verdict, tiles = _scan.scan_with_tiles(mask, size, masked_threshold)
            structure = verdict.structure
    if structure.kind != "arbitrary":
        mask_mod = mask_mod_for(structure, device)
        if tiles is None:
            return block_mask_from_structure(structure, size, mask_mod, device)
        return block_mask_from_tiles(tiles, mask_mod, device)
    if mask is None:
        raise _core.MaskError("invalid_argument: the BlockMask of an arbitrary mask reads the mask: pass mask=")
    if tiles is None and _tiles_on_device(mask, device):
        return _device_block_mask(mask, size, masked_threshold)[1]
    if tiles is None:
        verdict, tiles = _scan.scan_with_tiles(mask, size, masked_threshold)
        if isinstance(mask_or_report, _report.Report) and verdict.structure.kind != "arbitrary":
            raise _core.MaskError(f"invalid_argument: mask= is not the mask the report describes: it reads as "
                                  f"{verdict.structure.describe()}, the report's is arbitrary; pass the mask the "
                                  "report was made of")
    allowed = attends(mask, masked_threshold)
    while allowed.dim() < 4:
        allowed = allowed.unsqueeze(0)
    return block_mask_from_tiles(tiles, mask_mod_for(structure, device, allowed.to(device)), device)
