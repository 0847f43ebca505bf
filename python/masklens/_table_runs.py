"""The runs of a mask definition's O(B·L) tables, read in one copy to the host.

A definition (masklens._definition, include/masklens/definition.hpp) reads its metadata
only as runs of equal values: where a padding mask, packed documents, block ids or
positions change along each batch, and the value between. Each table's changes are found
on its device (torch.nonzero_static: no synchronisation) and every table's run starts and
values cross to the host together; the rows are then worked out on the host, per piece.
"""
from __future__ import annotations

import numpy as np
import torch


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
        last = np.ones(len(self.b), dtype=bool)  # a batch's last run ends at the length
        last[:-1] = self.b[1:] != self.b[:-1]
        self.end[last] = length
        self.batch, self.length = batch, length

    def as_tuple(self):
        """(batches, length, batch, start, end, value): the table as definition.hpp reads it."""
        return (self.batch, self.length, *(np.ascontiguousarray(a, dtype=np.int64)
                                          for a in (self.b, self.start, self.end, self.value)))


def read_runs(tables, room: int = 1024):
    """TableRuns of each (tensor [B, L], positions) in `tables`, and the 1-D tensors among
    them as host arrays, in one copy to the host: each table's changes are found on its
    device (torch.nonzero_static, no synchronisation) and up to `room` of them cross with
    the others; a table with more is read again exactly (one copy more)."""
    parts, plans = [], []
    for t, positions in tables:
        if t.dim() == 1:
            parts.append(t)
            plans.append(("flat", t.numel()))
            continue
        B, L = t.shape
        if L == 0:  # no runs: the definition names an empty table
            plans.append(("empty", B))
            continue
        parts.append(t[:, 0])
        if L < 2:
            plans.append(("runs", B, L, 0, positions, None))
            continue
        # A new run wherever the value changes (a position: where it is not the previous + 1).
        changed = (t[:, 1:] - t[:, :-1] != 1) if positions else (t[:, 1:] != t[:, :-1])
        # room + 1 slots: a last slot filled says there may be more than room.
        r = min(room + 1, B * (L - 1))
        try:
            where = torch.nonzero_static(changed, size=r, fill_value=-1)
        except (AttributeError, NotImplementedError, RuntimeError):  # a device without it: exact, synchronised
            where = changed.nonzero()[:r]
            where = torch.cat([where, where.new_full((r - where.shape[0], 2), -1)])
        parts += [where.flatten(), t[:, 1:][where[:, 0], where[:, 1]]]
        plans.append(("runs", B, L, r, positions, (t, changed)))
    # torch.cat promotes a bool or int32 table's values to int64 with the rest: one copy
    # (a table on another device than the first joins it there).
    parts = [p.to(parts[0].device) for p in parts]
    payload = torch.cat(parts).long().cpu().numpy() if parts else np.zeros(0, dtype=np.int64)
    out, at = [], 0
    for plan in plans:
        if plan[0] == "flat":
            out.append(payload[at:at + plan[1]])
            at += plan[1]
            continue
        if plan[0] == "empty":
            none = np.zeros(0, dtype=np.int64)
            out.append(TableRuns(none, none, none, plan[1], 0))
            continue
        _, B, L, r, positions, held = plan
        firsts = payload[at:at + B]
        at += B
        b, start, value = np.arange(B), np.zeros(B, dtype=np.int64), firsts
        if r:
            where = payload[at:at + 2 * r].reshape(r, 2)
            values = payload[at + 2 * r:at + 3 * r]
            at += 3 * r
            count = int((where[:, 0] >= 0).sum())
            if count == r and r == room + 1:  # the room overflowed: read the table's changes exactly
                t, changed = held
                w = changed.nonzero()
                where, values = w.cpu().numpy(), t[:, 1:][w[:, 0], w[:, 1]].long().cpu().numpy()
                count = len(where)
            where, values = where[:count], values[:count]
            b = np.concatenate([b, where[:, 0]])
            start = np.concatenate([start, where[:, 1] + 1])
            value = np.concatenate([value, values])
        if positions:  # runs of position - index
            value = value - start
        out.append(TableRuns(b, start, value, B, L))
    return out
