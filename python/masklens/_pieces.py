"""Rows worked out per piece: the machinery masklens._definition evaluates a mask's
definition with, in O(pieces) on the host rather than O(rows) on the device.

Every row's key interval [begin, end) under a composition of transformers' mask
primitives is piecewise linear in the row index q: on each piece (a run of rows of one
batch) an end is k * q + c. Pieces are cut where a table of the definition (padding,
documents, positions, block ids) changes value, where a chunk starts, or where two ends
cross, so their number is that of the tables' runs (a few per document or padding edge)
whatever the length. The only device work is reading those runs: every table's run
starts and values cross to the host in one copy (read_runs).

Grid holds the pieces and remembers each cut, so a Line made before a cut is read on the
pieces after it (Line.now). Comparisons cut the pieces first where they could flip
(cut_flips), so that a comparison made at a piece's first row holds for the whole piece.
All arithmetic is int64 with the unbounded ends at +-2**62, so no sum overflows.
"""
from __future__ import annotations

import numpy as np
import torch


class Grid:
    """Pieces of rows: piece i is rows [lo[i], hi[i]) of batch b[i], sorted by batch and
    row, covering each batch's rows; `stride` exceeds every row index."""

    __slots__ = ("b", "lo", "hi", "stride", "_parents")

    def __init__(self, b, lo, hi, stride: int):
        self.b, self.lo, self.hi = (np.asarray(x, dtype=np.int64) for x in (b, lo, hi))
        self.stride = int(stride)
        self._parents = []  # per cut: each new piece's piece before it

    @property
    def version(self) -> int:
        return len(self._parents)

    def __len__(self):
        return len(self.lo)

    def cut(self, b, q) -> None:
        """New pieces start at rows q of batches b (where strictly inside a piece)."""
        b, q = np.asarray(b, dtype=np.int64), np.asarray(q, dtype=np.int64)
        if q.size == 0:
            return
        old = self.b * self.stride + self.lo
        at = np.clip(np.searchsorted(old, b * self.stride + q, "right") - 1, 0, None)
        inside = (self.b[at] == b) & (q > self.lo[at]) & (q < self.hi[at])
        if not inside.any():
            return
        starts = np.union1d(old, b[inside] * self.stride + q[inside])
        parent = np.searchsorted(old, starts, "right") - 1
        lo = starts - self.b[parent] * self.stride
        hi = self.hi[parent]
        same = parent[1:] == parent[:-1]  # a cut piece's parts: each ends where the next starts
        hi[:-1][same] = lo[1:][same]
        self.b, self.lo, self.hi = self.b[parent], lo, hi
        self._parents.append(parent)

    def since(self, version: int):
        """For each piece now, its piece as of `version`."""
        idx = np.arange(len(self.lo))
        for parent in reversed(self._parents[version:]):
            idx = parent[idx]
        return idx


def _per_piece(x, n: int):
    x = np.asarray(x, dtype=np.int64)
    return x if x.shape == (n,) else np.full(n, x, dtype=np.int64)


class Line:
    """k * q + c on each piece of a grid."""

    __slots__ = ("grid", "k", "c", "version")

    def __init__(self, grid: Grid, k, c):
        n = len(grid.lo)
        self.grid, self.version = grid, grid.version
        self.k, self.c = _per_piece(k, n), _per_piece(c, n)

    def now(self):
        """(k, c) on the grid's pieces now."""
        if self.version != self.grid.version:
            idx = self.grid.since(self.version)
            self.k, self.c, self.version = self.k[idx], self.c[idx], self.grid.version
        return self.k, self.c

    def first(self):
        """The value at each piece's first row."""
        k, c = self.now()
        return k * self.grid.lo + c

    def last(self):
        """The value at each piece's last row."""
        k, c = self.now()
        return k * (self.grid.hi - 1) + c

    def __add__(self, other):
        k, c = self.now()
        if isinstance(other, Line):
            k2, c2 = other.now()
            return Line(self.grid, k + k2, c + c2)
        return Line(self.grid, k, c + np.asarray(other, dtype=np.int64))

    def __sub__(self, other):
        k, c = self.now()
        if isinstance(other, Line):
            k2, c2 = other.now()
            return Line(self.grid, k - k2, c - c2)
        return Line(self.grid, k, c - np.asarray(other, dtype=np.int64))

    def __rsub__(self, other):  # a per-piece constant minus a line
        k, c = self.now()
        return Line(self.grid, -k, np.asarray(other, dtype=np.int64) - c)


def constant(grid: Grid, value) -> Line:
    return Line(grid, 0, value)


def cut_flips(f: Line, g: Line) -> None:
    """Cuts the pieces where f >= g changes (at most once a piece: both are linear)."""
    grid = f.grid
    kf, cf = f.now()
    kg, cg = g.now()
    dk, dc = kf - kg, cf - cg
    rising, falling = dk > 0, dk < 0
    if not (rising.any() or falling.any()):
        return
    # rising: f >= g from the first q with dk q + dc >= 0, ceil(-dc / dk); falling: f < g
    # from the first q past dc / -dk.
    flip = np.where(rising, -(dc // np.where(rising, dk, 1)), dc // np.where(falling, -dk, 1) + 1)
    at = (rising | falling) & (flip > grid.lo) & (flip < grid.hi)
    grid.cut(grid.b[at], flip[at])


def ge(f: Line, g: Line):
    """f >= g per piece, read at each piece's first row (valid after cut_flips(f, g))."""
    return f.first() >= g.first()


def pick(where, f: Line, g: Line) -> Line:
    """f on the pieces where `where` (per piece now), g elsewhere."""
    kf, cf = f.now()
    kg, cg = g.now()
    return Line(f.grid, np.where(where, kf, kg), np.where(where, cf, cg))


def maximum(f: Line, g: Line) -> Line:
    cut_flips(f, g)
    return pick(ge(f, g), f, g)


def minimum(f: Line, g: Line) -> Line:
    cut_flips(f, g)
    return pick(ge(f, g), g, f)


def _ragged(first, count):
    """(owner, value): for each i, count[i] entries first[i], first[i] + 1, ..."""
    owner = np.repeat(np.arange(len(count)), count)
    offsets = np.cumsum(count) - count
    return owner, np.arange(owner.size) - np.repeat(offsets, count) + np.repeat(first, count)


def cut_every(x: Line, origins, period: int) -> None:
    """Cuts the pieces where x - origin (origins: one per batch) becomes a multiple of
    period; x rises by 0 or 1 a row."""
    grid = x.grid
    k, c = x.now()
    origin = origins[grid.b]
    if ((k != 0) & (k != 1)).any():
        raise ValueError("a row value that does not rise by 0 or 1 a row")
    lo, hi = grid.lo, grid.hi
    # The first row after lo where k q + c - origin is a multiple of period (rising pieces).
    first = lo + 1 + (-(k * (lo + 1) + c - origin)) % period
    count = np.where(k == 1, np.maximum(hi - first + period - 1, 0) // period, 0)
    owner, step = _ragged(np.zeros_like(count), count)
    grid.cut(grid.b[owner], first[owner] + step * period)


class TableRuns:
    """A [B, L] table's runs of equal values on the host, sorted by batch and start: run i
    is positions [start[i], end[i]) of batch b[i], holding value[i] (a positions table's
    value is position - index, constant along a document)."""

    __slots__ = ("b", "start", "end", "value", "batch", "length")

    def __init__(self, b, start, value, batch: int, length: int):
        order = np.lexsort((start, b))
        self.b, self.start, self.value = b[order], start[order], value[order]
        self.end = np.empty_like(self.start)
        self.end[:-1] = self.start[1:]
        self.end[-1:] = length
        last = np.ones(len(self.b), dtype=bool)
        last[:-1] = self.b[1:] != self.b[:-1]
        self.end[last] = length
        self.batch, self.length = batch, length

    def find(self, b, x):
        """The run holding position x of batch b (x inside the table)."""
        keys = self.b * (self.length + 1) + self.start
        return np.searchsorted(keys, np.asarray(b) * (self.length + 1) + np.asarray(x), "right") - 1

    def repeated_values(self, only_nonnegative=False):
        """Whether a batch holds a value in two runs (every value's, or every non-negative's)."""
        keep = self.value >= 0 if only_nonnegative else np.ones(len(self.value), dtype=bool)
        pairs = np.stack([self.b[keep], self.value[keep]], axis=1)
        return len(np.unique(pairs, axis=0)) != len(pairs)

    def cut_at_starts(self, x: Line) -> None:
        """Cuts the pieces where x (a position inside the table, rising by 0 or 1 a row)
        enters another run."""
        grid = x.grid
        k, c = x.now()
        lo_run, last_run = self.find(grid.b, x.first()), self.find(grid.b, x.last())
        owner, run = _ragged(lo_run + 1, np.maximum(last_run - lo_run, 0))
        grid.cut(grid.b[owner], self.start[run] - c[owner])  # x(q) = q + c reaches the run's start

    def at(self, x: Line):
        """The run index of x per piece (valid after cut_at_starts(x))."""
        return self.find(x.grid.b, x.first())


def read_runs(tables, room: int = 1024):
    """TableRuns of each (tensor [B, L], positions) in `tables`, and the 1-D tensors among
    them as host arrays, in one copy to the host: each table's changes are found on its
    device (torch.nonzero_static, no synchronisation) and up to `room` of them cross with
    the others; a table with more is read again exactly (one copy more)."""
    parts, plans = [], []
    for t, positions in tables:
        if t.dim() == 1:
            parts.append(t.long())
            plans.append(("flat", t.numel()))
            continue
        B, L = t.shape
        key = t.long()
        if positions:
            key = key - torch.arange(L, device=t.device)
        parts.append(key[:, 0])
        if L < 2:
            plans.append(("runs", B, L, 0, None))
            continue
        changed = key[:, 1:] != key[:, :-1]
        r = min(room, B * (L - 1))
        try:
            where = torch.nonzero_static(changed, size=r, fill_value=0)
        except (AttributeError, NotImplementedError, RuntimeError):  # a device without it: exact, synchronised
            where = changed.nonzero()[:r]
            where = torch.cat([where, where.new_zeros((r - where.shape[0], 2))])
        parts += [changed.sum().reshape(1), where.flatten(), key[:, 1:][where[:, 0], where[:, 1]]]
        plans.append(("runs", B, L, r, (key, changed)))
    payload = torch.cat(parts).cpu().numpy() if parts else np.zeros(0, dtype=np.int64)
    out, at = [], 0
    for plan in plans:
        if plan[0] == "flat":
            out.append(payload[at:at + plan[1]])
            at += plan[1]
            continue
        _, B, L, r, held = plan
        firsts = payload[at:at + B]
        at += B
        b, start, value = np.arange(B), np.zeros(B, dtype=np.int64), firsts
        if r:
            count = int(payload[at])
            where = payload[at + 1:at + 1 + 2 * r].reshape(r, 2)[:count]
            values = payload[at + 1 + 2 * r:at + 1 + 3 * r][:count]
            at += 1 + 3 * r
            if count > r:
                key, changed = held
                w = changed.nonzero()
                where, values = w.cpu().numpy(), key[:, 1:][w[:, 0], w[:, 1]].cpu().numpy()
            b = np.concatenate([b, where[:, 0]])
            start = np.concatenate([start, where[:, 1] + 1])
            value = np.concatenate([value, values])
        out.append(TableRuns(b, start, value, B, L))
    return out
