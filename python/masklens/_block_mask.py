"""torch FlexAttention BlockMasks: the one place one is made. Its constructors, by what
they start from:

  block_mask(mask_or_report, ...)   a mask or a masklens.Report (masklens.torch.block_mask):
                                    picks among the routes below
  from_structure(structure, size, mask_mod, device)   an exact structure's fields (no mask read)
  from_tiles(tiles, mask_mod, device)                 a host tile summary (_core.TileSummary)
  from_device_read(mask, size, mask_mod, ...)         one read of a CUDA mask on its device
  from_arrays(arrays, seq_lengths, block_size, mask_mod)   the eight int32 tensors, written
  flex_block_mask(structure, mask, args, device)      a drop-in flex call's (None: not at hand)

and the tensors alone, for code that returns them from an op (masklens._one_graph):
structure_arrays(structure, size, device) and tile_arrays(tiles, device), what
from_structure and from_tiles build on.

Where the pieces live: the tensors' storage in masklens._block_mask_storage, their device
writers in masklens._device_tiles (the only callers of masklens._cuda besides _scan), and
the mask_mods (what a mask means to flex) in masklens._mask_mods; their names are kept
here too, where callers and benchmarks reach them.
"""
from __future__ import annotations

import inspect as _pyinspect

import numpy as np
import torch

from . import _block_mask_storage as storage, _core, _device_tiles, _mask_mods, _report, _scan, _verdicts
from ._device_tiles import device_block_mask_from_structure, device_block_mask_tensors, device_scan_tiles
from ._mask_mods import attends, mask_mod_for, rule_reads_tables, span_mask_mod

# Reached as masklens._block_mask.<name> by masklens._inspect, tests and benchmarks (which
# wrap some of them to time a step of block_mask()).
BLOCK_MASK_FIELDS, block_mask_shapes = storage.BLOCK_MASK_FIELDS, storage.block_mask_shapes
_block_mask_storage, _block_mask_tensors = storage._block_mask_storage, storage._block_mask_tensors
device_tile_summary = _device_tiles.device_tile_summary
structure_tiles_as_stored = _device_tiles.structure_tiles_as_stored
span_bounds, bounds_mask_mod = _mask_mods.span_bounds, _mask_mods.bounds_mask_mod
document_table = _mask_mods.document_table


_BLOCK_MASK_TAKES_Q_SIDE = None


def block_mask_takes_q_side() -> bool:
    """Whether torch's BlockMask constructor takes the q side (torch 2.11's does). Worked
    out once; a caller that builds BlockMasks inside a traced graph asks first, eagerly."""
    global _BLOCK_MASK_TAKES_Q_SIDE
    if _BLOCK_MASK_TAKES_Q_SIDE is None:
        from torch.nn.attention.flex_attention import BlockMask
        _BLOCK_MASK_TAKES_Q_SIDE = "q_num_blocks" in _pyinspect.signature(BlockMask.__init__).parameters
    return _BLOCK_MASK_TAKES_Q_SIDE


def from_arrays(arrays, seq_lengths, block_size, mask_mod):
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


def tile_arrays(tiles, device):
    """torch BlockMask's eight int32 tensors of masklens' tile summary (a _core.TileSummary)
    on `device` (the kv side, and the q side torch would derive for the backward), with
    their (q_len, k_len). On a CUDA device with masklens._cuda, written there from the
    summary's states (one byte a tile crosses); otherwise written on the host and shared
    from numpy (moved to `device`)."""
    if torch.device(device).type == "cuda" and _scan.has_device_writer():
        return device_block_mask_tensors(tiles, device), (tiles.q_len, tiles.k_len)
    t = tiles.block_mask()
    return {name: _scan.to_device(getattr(t, name), device) for name in t.fields}, t.seq_lengths


def structure_arrays(structure, size, device):
    """The same tensors of an exact structure at `size` (q, k), from its fields (no mask is
    read): on a CUDA device with masklens._cuda, written there from the structure's tile
    ranges (a few bytes a q tile cross; no host writer, no tile states); otherwise from
    its tile summary (tiles_from_structure) as tile_arrays writes it."""
    if torch.device(device).type == "cuda" and _scan.has_structure_writer():
        return device_block_mask_from_structure(structure, size, device)
    return tile_arrays(_core.tiles_from_structure(structure, *size), device)


def from_tiles(tiles, mask_mod, device):
    """A torch BlockMask over masklens' tile summary: tile_arrays' tensors."""
    arrays, seq_lengths = tile_arrays(tiles, device)
    return from_arrays(arrays, seq_lengths, tiles.block_size, mask_mod)


def from_structure(structure, size, mask_mod, device):
    """torch's BlockMask of an exact structure at `size` (q, k): structure_arrays' tensors
    (on the host path through from_tiles, the one constructor over a tile summary)."""
    if torch.device(device).type == "cuda" and _scan.has_structure_writer():
        arrays, seq_lengths = device_block_mask_from_structure(structure, size, device)
        return from_arrays(arrays, seq_lengths, size, mask_mod)
    return from_tiles(_core.tiles_from_structure(structure, *size), mask_mod, device)


def from_device_read(mask, size, mask_mod, masked_threshold=-1000.0, classify_many_runs=True):
    """The BlockMask of a CUDA mask ([B, H, Q, K]) from masklens._cuda's device tile summary:
    one read on the device, the eight tensors written there (device_scan_tiles).
    (Verdict, BlockMask); the Verdict is None where classify_many_runs is False and the
    mask's runs are many (masklens._scan.MANY_RUNS)."""
    verdict, arrays = device_scan_tiles(mask.detach(), size, masked_threshold, classify_many_runs=classify_many_runs)
    return verdict, from_arrays(arrays, mask.shape[-2:], size, mask_mod)


def flex_block_mask(structure, mask, a, device):
    """The BlockMask of a flex call (FlexArgs `a`) from masklens' tiles, or None where they
    are not at hand: an exact structure's tiles from its fields (no read of the mask), a
    kept CPU mask's from one host read, a kept CUDA mask's from one device read where
    masklens._cuda summarises tiles (else None: create_block_mask then evaluates the
    mask_mod on the device). `mask`: the dense [B, H, Q, K] mask the call keeps."""
    size = (a.block_q, a.block_k)
    if not a.mask_mod_reads_mask:
        return from_structure(structure, size, mask_mod_for(structure, device), device)
    if mask.device.type == "cpu":
        _, tiles = _core.scan_with_tiles(mask.detach(), *size)
        return from_tiles(tiles, mask_mod_for(structure, device, mask), device)
    if mask.device.type == "cuda" and mask.device == device and _scan.has_device_tiles():
        _, block_mask = from_device_read(mask, size, mask_mod_for(structure, device, mask),
                                         classify_many_runs=False)  # the verdict is known: only the tiles are new
        return block_mask
    return None


# The names these constructors had (benchmarks and tests call them).
block_mask_from_arrays, block_mask_from_tiles, block_mask_from_structure = from_arrays, from_tiles, from_structure
device_block_mask = from_device_read


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
    return structure, from_arrays(arrays, view.shape[-2:], size, mask_mod)


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


def _report_arguments(report, mask, size):
    """(mask or None, structure, tiles or None) of block_mask(report, mask=...): the tiles
    inspect(tiles=...) counted at this size are reused; mask= is checked against the report."""
    have = report.tiles
    tiles = have if have is not None and tuple(have.block_size) == size else None
    if mask is not None:
        mask = _mask_tensor(mask, "mask=")
        _check_against_report(mask, report.structure)
    return mask, report.structure, tiles


def _mask_argument(mask_or_report, mask):
    """The mask of block_mask(mask, ...), as a torch tensor; mask= goes with a Report only."""
    if mask is not None and mask is not mask_or_report:
        raise _core.MaskError("invalid_argument: block_mask(mask, ..., mask=) got two masks: mask= goes with a "
                              "masklens.Report (the mask an arbitrary report's mask_mod reads); "
                              "block_mask(mask, ...) reads its first argument")
    return _mask_tensor(mask_or_report, "mask_or_report")


def _host_structure(mask, size, masked_threshold):
    """(structure, tiles or None) of a mask whose tiles are not written on its device: a
    CUDA mask is scanned there first (an exact structure's tiles then come from its fields,
    with no copy to the host); otherwise one host scan gives both."""
    if mask.device.type == "cuda":
        structure = _verdicts.scan(mask, masked_threshold).structure
        if structure.kind != "arbitrary":
            return structure, None
    verdict, tiles = _scan.scan_with_tiles(mask, size, masked_threshold)
    return verdict.structure, tiles


def _of_arbitrary_mask(mask, tiles, size, device, masked_threshold, of_report):
    """The BlockMask of an arbitrary structure: the mask's tiles (those at hand, else one
    read) and a mask_mod reading the mask. `of_report`: mask= came with a Report, and must
    read as arbitrary as the report does."""
    if mask is None:
        raise _core.MaskError("invalid_argument: the BlockMask of an arbitrary mask reads the mask: pass mask=")
    if tiles is None and _tiles_on_device(mask, device):
        return _device_block_mask(mask, size, masked_threshold)[1]
    if tiles is None:
        verdict, tiles = _scan.scan_with_tiles(mask, size, masked_threshold)
        if of_report and verdict.structure.kind != "arbitrary":
            raise _core.MaskError(f"invalid_argument: mask= is not the mask the report describes: it reads as "
                                  f"{verdict.structure.describe()}, the report's is arbitrary; pass the mask the "
                                  "report was made of")
    allowed = attends(mask, masked_threshold)
    while allowed.dim() < 4:
        allowed = allowed.unsqueeze(0)
    return from_tiles(tiles, mask_mod_for(None, device, allowed.to(device)), device)


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
    of_report = isinstance(mask_or_report, _report.Report)
    if of_report:
        mask, structure, tiles = _report_arguments(mask_or_report, mask, size)
    else:
        mask, structure, tiles = _mask_argument(mask_or_report, mask), None, None
    if device is None:
        device = mask.device if mask is not None else torch.device("cpu")
    if structure is None and _tiles_on_device(mask, device):
        # One read on the device: the verdict, and the tiles written as the BlockMask's
        # tensors there (None: an exact structure stored B x H times over, tiled from its
        # fields below).
        structure, bm = _device_block_mask(mask, size, masked_threshold)
        if bm is not None:
            return bm
    elif structure is None:
        structure, tiles = _host_structure(mask, size, masked_threshold)
    if structure.kind == "arbitrary":
        return _of_arbitrary_mask(mask, tiles, size, device, masked_threshold, of_report)
    mask_mod = mask_mod_for(structure, device)
    return from_structure(structure, size, mask_mod, device) if tiles is None else from_tiles(tiles, mask_mod, device)
