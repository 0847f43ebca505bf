"""FlexAttention's BlockMask for one rank under context parallelism: the rank's query
rows against the keys in the order the ranks' shards gather. masklens reads the tiles
from the rank's own rows (torch's _create_cp_block_mask instead evaluates a mask_mod over
every tile with a compiled create_block_mask) and writes the mask_mod from the agreed
structure's rule at global positions. Local work only: no collective."""
from __future__ import annotations

import weakref

import numpy as np
import torch

from . import _block_mask, _flex, _scan
from ._mask_mods import attends, mask_mod_for
from ._cp_runs import as_4d
from ._cp_shards import positions, sequence_order


def _structure_rows(structure, mine, device):
    """The rows at global positions `mine` of an exact structure, as a bool [B', 1, rows, K]
    mask (where no local mask is given, only to read the BlockMask's tiles)."""
    batches = structure.batch if any(len(f or ()) > 1 for f in (structure.segments, structure.kv_valid,
                                                                  structure.q_valid)) else 1
    out = torch.zeros((batches, 1, len(mine), structure.k_len), dtype=torch.bool)
    for b in range(batches):
        for i, q in enumerate(mine.tolist()):
            r = structure.row(b, q)
            if r is not None:
                out[b, 0, i, r[0]:r[1]] = True
    return out.to(device)


def _global_rule(structure, device, mine, order):
    """The structure's mask_mod (its rule from its fields) at global positions: local query
    row qi is global mine[qi]; gathered key ki is global order[ki] (None: the identity)."""
    rule = mask_mod_for(structure, device)
    rows, keys = len(mine), structure.k_len
    contiguous_from = int(mine[0]) if np.array_equal(mine, np.arange(mine[0], mine[0] + rows)) else None
    q_table = None if contiguous_from is not None else torch.as_tensor(mine, device=device)
    k_table = None if order is None else torch.as_tensor(order, device=device)

    def mask_mod(b, h, qi, ki):
        # Past the last row or key (a ragged last tile) the index is clamped for the table
        # lookups; flex masks those positions itself.
        q = qi + contiguous_from if q_table is None else q_table[qi.clamp(max=rows - 1)]
        k = ki if k_table is None else k_table[ki.clamp(max=keys - 1)]
        return rule(b, h, q, k)
    return mask_mod


def _local_block_mask(rows, size, mask_mod, device):
    """BlockMask over the tiles of `rows` ([B, H, rows, K] in flex CP's coordinates): written
    on the device from one device read where masklens._cuda writes tiles, else from a host
    read (masklens' tile summary, the tensors moved to `device`)."""
    if rows.device.type == "cuda" and _scan.has_device_tiles():
        return _block_mask.from_device_read(rows, size, mask_mod, classify_many_runs=False)[1]
    _, tiles = _scan.scan_with_tiles(rows.detach(), size)
    return _block_mask.from_tiles(tiles, mask_mod, device)


# What each BlockMask built here has its mask_mod branch on (rule_of): CP's compiled flex
# keys its bucket on it, so that masks of other rules do not recompile one bucket's function.
_rules = weakref.WeakKeyDictionary()


def rule_of(block_mask):
    """The rule a BlockMask of build_block_mask's mask_mod branches on (hashable; None for
    another BlockMask): the sharding (its position tables) and the structure's rule as
    the drop-in's buckets sign it (masklens._flex.rule_signature)."""
    return _rules.get(block_mask)


def build_block_mask(structure, local_mask, device, *, rank: int, world_size: int, sharding: str, block_size):
    """FlexAttention's BlockMask of rank `rank`'s query rows against the whole sequence in
    the order the ranks' shards gather (flex CP's coordinates: local q, gathered kv). Its
    tiles are read from the local rows with their keys put in that order (one local read:
    on the device where masklens._cuda writes tiles, else on the host); its mask_mod is
    the agreed structure's rule at the global positions (an exact structure: nothing held
    but the position tables) or, for an arbitrary mask, a lookup into the local rows."""
    Q = structure.q_len
    mine = positions(Q, world_size, rank, sharding)
    order = sequence_order(Q, world_size, sharding)
    identity = sharding == "contiguous"
    rows = local_mask if local_mask is not None else _structure_rows(structure, mine, device)
    rows = as_4d(torch.as_tensor(rows)).to(device)
    if not identity:
        rows = rows.index_select(3, torch.as_tensor(order, device=device))
    if structure.kind == "arbitrary":
        mask_mod = mask_mod_for(structure, device, attends(rows))
    else:
        mask_mod = _global_rule(structure, device, mine, None if identity else order)
    block_mask = _local_block_mask(rows, block_size, mask_mod, device)
    _rules[block_mask] = (sharding, _flex.rule_signature(structure, structure.kind == "arbitrary"))
    return block_mask
