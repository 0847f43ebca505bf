"""The merge of every rank's span runs into the whole mask's, in global row order: rows
moved to their global positions, runs cut where a load-balanced shard's two chunks meet,
a shard that stores one slice for a broadcast batch or head standing for each of them.
Pure arithmetic on what the gather brought, the same on every rank, so every rank
classifies the same runs into the same verdict."""
from __future__ import annotations

import numpy as np

from . import _core
from ._cp_shards import check_sharding, row_ranges


def _shape_of(headers) -> tuple[int, int, int, int, int]:
    """(batch, heads, Q, K, world) the shards describe together, or a MaskError."""
    holding = headers[headers[:, 1] > 0]
    if len(holding) == 0:
        raise _core.MaskError("invalid_shape: no rank holds a row of the mask")
    for column, name in ((2, "batch"), (3, "heads"), (4, "keys (K)")):
        values = sorted(set(int(x) for x in headers[:, column]))
        if len(values) > 1:
            raise _core.MaskError(f"invalid_shape: the ranks' shards differ in {name}: "
                                  f"{[int(x) for x in headers[:, column]]} by rank; every rank holds rows of one mask")
    return (int(headers[0, 2]), int(headers[0, 3]), int(headers[:, 1].sum()), int(headers[0, 4]), len(headers))


def _rank_ranges(headers, q_len, world, sharding) -> list[list[tuple[int, int]]]:
    """Each rank's global row ranges: for contiguous sharding from the rows each holds (any
    split, in rank order); for load_balanced the head-tail chunks, checked against them."""
    rows = [int(n) for n in headers[:, 1]]
    if sharding == "contiguous":
        offsets = np.concatenate([[0], np.cumsum(rows)]).tolist()
        return [[(offsets[r], offsets[r + 1])] for r in range(world)]
    ranges = [row_ranges(q_len, world, r, sharding) for r in range(world)]
    expected = [sum(b - a for a, b in rr) for rr in ranges]
    if expected != rows:
        raise _core.MaskError(f"invalid_shape: load_balanced sharding of {q_len} rows over {world} ranks gives "
                              f"{expected} rows by rank (chunks r and 2W-1-r), the ranks hold {rows}")
    return ranges


def _interval(runs) -> np.ndarray:
    """Whether each run's rows are intervals (count == last - first + 1, as uint64)."""
    u = runs.view(np.uint64)
    return (runs[:, 6] != 0) & (u[:, 3] - u[:, 2] + np.uint64(1) == u[:, 6])


def _split_at(runs, local_q, cut) -> tuple[np.ndarray, np.ndarray]:
    """Runs cut at local row `cut` of their slice (a load-balanced shard's chunk boundary):
    (runs, their local q), the pieces past the cut starting at it, affine as before."""
    crossing = (local_q < cut) & (local_q + runs[:, 1] > cut)
    if not crossing.any():
        return runs, local_q
    head, tail = runs[crossing].copy(), runs[crossing].copy()
    k = cut - local_q[crossing]
    head[:, 1] = k
    tail[:, 0] += k
    tail[:, 1] -= k
    with np.errstate(over="ignore"):  # steps are modulo 2^64, as span_runs.hpp stores them
        interval = _interval(tail)
        tail[:, 2] += tail[:, 4] * k
        tail[:, 3] += tail[:, 5] * k
        tail[interval, 6] = tail[interval, 3] - tail[interval, 2] + 1
    merged = np.concatenate([runs[~crossing], head, tail])
    q = np.concatenate([local_q[~crossing], local_q[crossing], local_q[crossing] + k])
    return merged, q


def _to_slices(runs, rows, local_slices, distinct):
    """The rank's runs for each of the table's distinct slices: a rank whose shard stores
    one slice where others store B (or H) has its slice stand for each of them.
    (runs, their target slice)."""
    db, dh = distinct
    ldb, ldh = local_slices
    local_slice = runs[:, 0] // rows
    if (ldb, ldh) == (db, dh):
        return runs, local_slice
    targets = np.arange(db * dh)
    b, h = targets // dh, targets % dh
    source = (b if ldb > 1 else np.zeros_like(b)) * ldh + (h if ldh > 1 else np.zeros_like(h))
    starts = np.searchsorted(local_slice, source, side="left")
    ends = np.searchsorted(local_slice, source, side="right")
    lengths = ends - starts
    picks = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())
    return runs[picks], np.repeat(targets, lengths)


def merge_runs(headers, gathered_runs, sharding: str = "contiguous"):
    """(table shape [batch, heads, Q, K, distinct batch, distinct heads], int64 [n, 8]): the
    whole mask's runs in global row order from every rank's header and runs, the same on
    every rank. Runs crossing a load-balanced shard's chunk boundary are cut there."""
    check_sharding(sharding)
    batch, heads, q_len, k_len, world = _shape_of(headers)
    ranges = _rank_ranges(headers, q_len, world, sharding)
    holding = headers[:, 1] > 0
    distinct = (int(headers[holding, 5].max()), int(headers[holding, 6].max()))
    pieces = []
    for r in range(world):
        rows = int(headers[r, 1])
        if rows == 0:
            continue
        runs = gathered_runs[r]
        local_q = runs[:, 0] % rows
        for cut in np.cumsum([b - a for a, b in ranges[r]])[:-1]:
            runs, local_q = _split_at(runs, local_q, int(cut))
        order = np.argsort(runs[:, 0], kind="stable")
        runs = runs[order]
        runs, slices = _to_slices(runs, rows, (int(headers[r, 5]), int(headers[r, 6])), distinct)
        out = runs.copy()
        out[:, 0] = slices * q_len + _global_rows(runs[:, 0] % rows, ranges[r])
        pieces.append(out)
    merged = np.concatenate(pieces)
    merged = merged[np.argsort(merged[:, 0], kind="stable")]
    return [batch, heads, q_len, k_len, *distinct], np.ascontiguousarray(merged)


def _global_rows(local_q, ranges) -> np.ndarray:
    """Global query row of each local row, through the rank's ranges in local order."""
    out = np.empty_like(local_q)
    start_local = 0
    for a, b in ranges:
        inside = (local_q >= start_local) & (local_q < start_local + (b - a))
        out[inside] = a + local_q[inside] - start_local
        start_local += b - a
    return out
