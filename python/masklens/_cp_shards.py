"""Which query rows each rank of a context-parallel group holds: torch's two ways of
sharding a sequence (Shard(seq_dim) and the head-tail load balancer) as row ranges, the
order the ranks' shards make when gathered, and the cut of a whole-sequence tensor that
one rank holds. Arithmetic only: nothing here talks to another rank."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from . import _core

SHARDINGS = ("contiguous", "load_balanced")


def check_sharding(sharding: str) -> None:
    if sharding not in SHARDINGS:
        raise _core.MaskError(f"invalid_argument: sharding must be one of {SHARDINGS}, got {sharding!r}")


def _contiguous_bounds(q_len: int, world: int) -> list[int]:
    """Shard boundaries of torch's Shard(dim) (DTensor: torch.chunk's sizes, ceil(Q/W) rows
    a rank, the last ranks fewer or none)."""
    size = -(-q_len // world)
    return [min(r * size, q_len) for r in range(world + 1)]


def _chunk_bounds(q_len: int, chunks: int) -> list[int]:
    """Boundaries of `chunks` chunks as torch.tensor_split cuts them (sizes differing by at
    most one, the longer first): equal where torch's head-tail balancer allows the length."""
    base, extra = divmod(q_len, chunks)
    bounds = [0]
    for c in range(chunks):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    return bounds


def row_ranges(q_len: int, world_size: int, rank: int, sharding: str = "contiguous") -> list[tuple[int, int]]:
    """The global query rows [start, end) rank `rank` holds, in its local order.
    contiguous: torch's Shard(seq_dim) (what DTensor and context_parallel without load
    balancing give). load_balanced: torch's head-tail load balancer (_HeadTailLoadBalancer):
    2W chunks, rank r holding chunk r then chunk 2W-1-r; torch needs Q % 2W == 0, and other
    lengths are cut as torch.tensor_split cuts them."""
    check_sharding(sharding)
    if sharding == "contiguous":
        bounds = _contiguous_bounds(q_len, world_size)
        return [(bounds[rank], bounds[rank + 1])]
    bounds = _chunk_bounds(q_len, 2 * world_size)
    tail = 2 * world_size - 1 - rank
    return [(bounds[rank], bounds[rank + 1]), (bounds[tail], bounds[tail + 1])]


def positions(q_len: int, world_size: int, rank: int, sharding: str = "contiguous") -> np.ndarray:
    """The global position of each of the rank's local rows (int64)."""
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in row_ranges(q_len, world_size, rank, sharding)])


def sequence_order(q_len: int, world_size: int, sharding: str = "contiguous") -> np.ndarray:
    """The global position at each place of the sequence the ranks' shards make when
    gathered in rank order: what all_gather of K and V gives under CP (identity for
    contiguous sharding, the head-tail permutation for load_balanced)."""
    return np.concatenate([positions(q_len, world_size, r, sharding) for r in range(world_size)])


def shard(tensor, dim: int, *, rank: int | None = None, world_size: int | None = None, group=None,
          sharding: str = "contiguous"):
    """The part of `tensor` (the whole sequence along `dim`) that `rank` holds: a mask's
    query rows (dim=-2), or q, k, v (dim=2). Rank and world size are the group's unless
    given."""
    rank = dist.get_rank(group) if rank is None else rank
    world_size = dist.get_world_size(group) if world_size is None else world_size
    ranges = row_ranges(tensor.shape[dim], world_size, rank, sharding)
    if len(ranges) == 1 or ranges[1][0] == ranges[1][1]:
        a, b = ranges[0]
        return tensor.narrow(dim, a, b - a)  # a view
    index = torch.as_tensor(positions(tensor.shape[dim], world_size, rank, sharding), device=tensor.device)
    return tensor.index_select(dim, index)
