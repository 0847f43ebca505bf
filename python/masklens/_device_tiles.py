"""Tiles counted and BlockMask tensors written on the device by masklens._cuda (which must
be there; masklens._scan.has_device_tiles() and its kin say so): the eight tensors from a
host tile summary's states, from an exact structure's tile ranges, or in the very read
that scans a CUDA mask; and the tile summaries Report.tiles holds (from one device read,
or from an exact structure's fields laid out as that read lays them out). The one module
besides masklens._scan that calls masklens._cuda, through masklens._scan.cuda_module().
"""
from __future__ import annotations

import time

import numpy as np
import torch

from . import _core, _scan
from ._block_mask_storage import _block_mask_storage, _block_mask_tensors


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
    _scan.cuda_module().write_block_mask(states.data_ptr(), states.numel(), grid, pointers, nbytes,
                                         _scan.stream_of(device), index)
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
    _scan.cuda_module().write_block_mask_from_ranges(ranges.ctypes.data, ranges.nbytes, pointers[-1], grid,
                                                     pointers[:-1], nbytes, _scan.stream_of(device), device.index)
    return views(), (q_len, k_len)


def device_scan_tiles(mask, size, masked_threshold: float = -1000.0, classify_many_runs: bool = True,
                      states_out=None, spans_out=None):
    """device_scan() whose one read of the mask also counts its tiles of `size` (q, k) and
    writes torch BlockMask's eight int32 tensors on the mask's device (masklens._cuda.
    scan_runs on a plan with tiles, which must be there): (Verdict, {name: tensor}) with counts
    [B', H', q tiles], indices [B', H', q tiles, k tiles] and the q side [B', H', k tiles]
    / [B', H', k tiles, q tiles], B' and H' the distinct batch and heads (1 where the mask
    broadcasts them, as BlockMask broadcasts a dimension of 1). Allocated here, from
    torch's caching allocator (one block, eight views); written on the mask's current
    stream before the one synchronisation. classify_many_runs=False: the Verdict is None
    where the spans reduce to more than one run in _scan.MANY_RUNS rows (a BlockMask needs no
    verdict: a mask_mod reading the mask is exact for any mask; a block-sparse mask's
    ~one run per row would cost more on the host than the read on the device). `states_out`
    (a list): a uint8 tensor of one byte a tile on the mask's device is appended to it,
    written with each tile's state ([B', H', q tiles, k tiles], 0 empty, 1 partial, 2 full)
    in the same pass.
    `spans_out` (a list): a function giving the read's RowSpans appended, as _scan.device_runs()
    gives it."""
    t0 = time.perf_counter()
    cuda = _scan.cuda_module()
    runs = cuda.plan_runs(*_scan.device_args(mask, masked_threshold), *size)
    db, dh, nq, nk = runs.tile_grid
    pointers, nbytes, views = _block_mask_storage(mask.device, db, dh, nq, nk)

    extra = {}
    if states_out is not None:
        states = torch.empty((db, dh, nq, nk), dtype=torch.uint8, device=mask.device)
        states_out.append(states)
        extra = {"d_states": states.data_ptr(), "states_bytes": states.numel()}
    _scan.timing["prepare_ms"] = (time.perf_counter() - t0) * 1e3  # the size query and the tensors' allocation
    arrays = {}

    def scan_call(base, stream, device, up_to):
        # Enqueued without waiting: the tensors' views are made while the device reads the
        # mask, then the one synchronisation (whatever happens between: the pending scan
        # would refuse the thread's next one). A launch that raises leaves none pending.
        cuda.scan_runs(runs, base, runs.block_bytes, stream, device, pointers, nbytes, wait=False, **extra)
        try:
            arrays.update(views())
        except BaseException:
            cuda.wait_runs(runs)  # the thread free again; the error is the views'
            raise
        return cuda.wait_runs(runs, classify_up_to=up_to)
    verdict = _scan.device_runs(mask, runs, scan_call, classify_many_runs=classify_many_runs, spans_out=spans_out)
    _scan.counted_scan()
    return verdict, arrays


def device_tile_summary(mask, size, masked_threshold: float = -1000.0):
    """(Verdict, TileSummary) of a CUDA mask from one device read (device_scan_tiles): the
    BlockMask writer stores each tile's state beside the tensors, and the states cross to
    the host at one byte a tile. An arbitrary verdict's structure carries the tiles'
    fractions, as scan_with_tiles() gives it."""
    states = []
    verdict, _ = device_scan_tiles(mask, size, masked_threshold, states_out=states)
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    summary = _core.tile_summary_from_states(states[0].cpu().numpy(), *shape, *size)
    if verdict.structure.kind == "arbitrary":
        verdict.structure.tile_fractions = summary.fractions()
    return verdict, summary


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
