"""The runs of a mask definition's O(B·L) tables, read to the host together.

A definition (masklens._definition, include/masklens/definition.hpp) reads its metadata
only as runs of equal values: where a padding mask, packed documents, block ids or
positions change along each batch, and the value between. Each table's changes are found
on its device, by masklens' device pass (include/masklens/cuda/table_runs.hpp) where
masklens._cuda is built, else by torch operations (torch.nonzero_static: no
synchronisation), and every table's run starts and values cross to the host together
(CPU tables are read where they lie, in C++ with the definition: TableView); the rows
are then worked out on the host, per piece.
"""
from __future__ import annotations

import numpy as np
import torch

from . import _core, _scan


class TableRuns:
    """A [B, L] table's runs of equal values on the host, sorted by batch and start: run i
    is positions [start[i], end[i]) of batch b[i], holding value[i] (a positions table's
    value is position - index, constant along a document)."""

    __slots__ = ("b", "start", "end", "value", "batch", "length")

    def __init__(self, b, start, value, batch: int, length: int):
        """b, start, value: int64 arrays already sorted by (b, start)."""
        self.b, self.start, self.value = b, start, value
        self.end = np.empty_like(start)
        self.end[:-1] = start[1:]
        last = np.ones(len(b), dtype=bool)  # a batch's last run ends at the length
        last[:-1] = b[1:] != b[:-1]
        self.end[last] = length
        self.batch, self.length = batch, length

    @classmethod
    def empty(cls, batch: int, length: int):
        """No runs: a table with no batch or no position."""
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none, batch, length)

    @classmethod
    def from_columns(cls, batch: int, length: int, b, start, end, value):
        """Runs already sorted with their ends (masklens._core.table_runs' columns)."""
        self = cls.__new__(cls)
        self.b, self.start, self.end, self.value, self.batch, self.length = b, start, end, value, batch, length
        return self

    def as_tuple(self):
        """(batches, length, batch, start, end, value): the table as definition.hpp reads it."""
        return (self.batch, self.length, *(np.ascontiguousarray(a, dtype=np.int64)
                                          for a in (self.b, self.start, self.end, self.value)))


def _merged(firsts, flat_starts, values, B: int, L: int, positions: bool) -> TableRuns:
    """The runs from each batch's first value and the flat indices (b * L + j, sorted) where
    a new value starts: a start at a batch's first position is that batch's first run."""
    inner = flat_starts % L != 0
    flat_starts, values = flat_starts[inner], values[inner]
    # Batch k's first run goes before its changes: after k firsts and the changes of batches < k.
    at = np.searchsorted(flat_starts, np.arange(B) * L) + np.arange(B)
    n = B + len(flat_starts)
    is_first = np.zeros(n, dtype=bool)
    is_first[at] = True
    start, value = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    start[at], value[at] = np.arange(B) * L, firsts
    start[~is_first], value[~is_first] = flat_starts, values
    b = start // L
    start = start - b * L
    if positions:  # runs of position - index
        value = value - start
    return TableRuns(b, start, value, B, L)


_ELEMENTS = {torch.bool: "bool", torch.int32: "int32", torch.int64: "int64"}
# The current stream of a CUDA device by index, as the device read enqueues on it
# (_scan.stream_of without its checks: the read knows its device is CUDA).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def read_runs(tables, room: int = 1024):
    """TableRuns (masklens._core's from the device pass: the same names; on the CPU, a
    TableView) of each (tensor [B, L], positions) in `tables`,
    and the 1-D tensors among them as host arrays: a device's tables and lists cross to the
    host together, CPU ones not at all. CUDA tables are read by masklens' device
    pass where masklens._cuda is built (include/masklens/cuda/table_runs.hpp: one kernel
    writes every table's changes and the lists into pinned memory, the runs sorted in C++);
    otherwise each table's changes are found by torch operations (torch.nonzero_static, no
    synchronisation) and cross in one copy. Either way up to `room` changes a table cross;
    a table with more is read again exactly. CPU
    tables are not read here: each is a TableView, read in C++ with the definition. The
    device pass's runs are masklens._core.TableRuns (C++ objects, what read_definition
    takes as they are: the same column names, no pickling); a table read again past the
    room, or an empty one, is a TableRuns of this module."""
    return start_read(tables, room)()


def start_read(tables, room: int = 1024):
    """read_runs with the device pass's wait left to the caller: a function of no argument
    that returns what read_runs returns. Where masklens' device pass reads the tables, it
    is enqueued on the current stream now (the tables as they are at this point of the
    stream) and the function waits for its copy alone, not for the stream; any other
    read is made now and the function returns it."""
    finish = _device_start(tables, room)
    if finish is not None:
        return finish
    read = _host_read(tables, room)
    if read is None:
        read = _torch_read(tables, room)
    return lambda: read


class TableView:
    """A [B, L] table as masklens' C++ reads it where it lies (include/masklens/table_runs.hpp:
    a CPU table in one pass inside masklens._core.read_definition; a CUDA one by the device
    pass): the tensor, kept alive until then, and whether it holds positions."""

    __slots__ = ("tensor", "positions")

    def __init__(self, tensor, positions: bool):
        self.tensor, self.positions = tensor, positions

    def as_tuple(self):
        """(data, element, batch, length, batch stride, length stride, positions): the table
        as masklens._core reads it (a dimension of one is never stepped along: stride 0)."""
        return _view(self.tensor, self.positions)

    def runs(self) -> TableRuns:
        """The table's runs, read now (what read_definition reads of it)."""
        return TableRuns.from_columns(*_core.table_runs(self.as_tuple()))


def _host_read(tables, room: int):
    """read_runs of CPU tables, or None where it does not apply (a table off the CPU, or of
    an element type other than bool, int32 and int64): each table a TableView, read in C++
    where the definition is read (no copy, no torch operation); the 1-D lists as int64
    arrays."""
    if not all(_scan.device_type(t.device) == "cpu" and t.dtype in _ELEMENTS for t, _ in tables):
        return None
    out = []
    for t, positions in tables:
        if t.dim() == 1:
            out.append(t.detach().numpy().astype(np.int64))
        elif t.numel() == 0:  # no runs: the definition names an empty table
            out.append(TableRuns.empty(*t.shape))
        else:
            out.append(TableView(t.detach(), positions))
    return out


def _view(t, positions: bool):
    """TableView(t, positions).as_tuple(), without the object (a read's hot path)."""
    B, L = t.shape
    return _view_of(t, _ELEMENTS[t.dtype], B, L, t.stride(), positions)


def _view_of(t, element: str, B: int, L: int, strides, positions: bool):
    """The tuple masklens' C++ reads a [B, L] view of t as, from what the caller has already
    asked of it (strides: batch, length); a dimension of one is never stepped along."""
    return (t.data_ptr(), element, B, L, strides[0] if B > 1 else 0, strides[1] if L > 1 else 0, positions)


def _device_start(tables, room: int):
    """start_read through masklens._cuda (its kernel enqueued, the wait in the function
    returned), or None where it does not apply (tables not all on one CUDA device, an
    element type other than bool, int32 or int64, no _cuda)."""
    if not tables:
        return None
    device = tables[0][0].device
    if not _scan.is_cuda(device):
        return None
    # One pass over the tables (a read's hot path: each tensor asked as little as it can be,
    # a torch call costing tens of microseconds where a training step left the caches
    # cold): the 1-D lists and the 2-D tables the kernel reads, as views, and what the
    # finish makes of each.
    lists, grids, plan = [], [], []
    for t, positions in tables:
        element = _ELEMENTS.get(t.dtype)
        if element is None or t.device != device:
            return None
        shape = t.shape
        if len(shape) == 1:
            n = shape[0]
            if n:  # a list is a view of one batch
                lists.append(_view_of(t, element, 1, n, (0, t.stride(0)), False))
            plan.append(n)
        elif len(shape) != 2:  # not a table: the torch read names it
            return None
        elif shape[0] and shape[1]:
            grids.append(_view_of(t, element, shape[0], shape[1], t.stride(), positions))
            plan.append(None)
        else:
            plan.append(tuple(shape))
    if not grids:
        return None
    begin = getattr(_scan.cuda_module(), "table_runs_begin", None)  # None: no _cuda, or an older one
    if begin is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _raw_stream(index) if _raw_stream is not None else _scan.stream_of(device)
    if _dropped:
        _bury()
    try:
        pending = begin(lists, grids, room, stream, index)
    except _core.MaskError as e:  # a table the kernel refuses (past 2^40 elements...): torch reads it
        if str(e).startswith("device_error"):
            raise
        return None
    return _PendingRead(pending, tables, plan, room)


# Reads dropped before their kernel ran, with the tables it reads (they may come from
# another stream, whose frees torch's allocator does not order after this one): kept
# until it has, looked at when the next read starts.
_dropped = []


def _bury() -> None:
    """Lets go of the dropped reads that have completed (or failed: nothing more runs), one
    at a time: a read dropped meanwhile (a finaliser, another thread) is kept."""
    for dropped in list(_dropped):
        try:
            landed = dropped[0].ready
        except Exception:  # noqa: BLE001  a device error: its kernel will not run
            landed = True
        if landed:
            for i, d in enumerate(_dropped):
                if d is dropped:
                    del _dropped[i]
                    break


class _PendingRead:
    """A device read enqueued (masklens._cuda.PendingTableRuns) with the tables it reads and
    the plan of its answer (a list's length, None for a table the kernel reads, the shape of
    an empty one); called, it waits for the read and returns read_runs'
    answer."""

    __slots__ = ("pending", "tables", "plan", "room")

    def __init__(self, pending, tables, plan, room):
        self.pending, self.tables, self.plan, self.room = pending, tables, plan, room

    def __call__(self):
        sections, words = self.pending.finish()
        out, at, section = [], 0, iter(sections)
        for step in self.plan:
            if step is None:
                runs = next(section)
                # More changes than the room: that table again, with room for them all.
                out.append(_torch_read([self.tables[len(out)]], runs)[0] if isinstance(runs, int)
                           else runs)  # masklens._core.TableRuns, as read_definition takes it
            elif isinstance(step, int):
                out.append(words[at:at + step])
                at += step
            else:
                out.append(TableRuns.empty(*step))
        return out

    def __del__(self):
        pending = getattr(self, "pending", None)
        if pending is not None and not pending.finished and _dropped is not None:  # None: the interpreter exits
            _dropped.append((pending, self.tables))


def _torch_read(tables, room: int):
    """read_runs by torch operations: the table read flat (b * L + j), a handful of
    operations a table; a change across two batches is dropped on the host, where every
    batch's first value starts a run anyway."""
    parts, plans = [], []
    for t, positions in tables:
        if t.dim() == 1:
            parts.append(t)
            plans.append(("flat", t.numel()))
            continue
        B, L = t.shape
        if B == 0 or L == 0:  # no runs: the definition names an empty table
            plans.append(("empty", B, L))
            continue
        parts.append(t[:, 0])
        if L < 2:
            plans.append(("runs", B, L, 0, positions, None))
            continue
        flat = t.reshape(-1)
        # A new value wherever it changes (a position: wherever it is not the previous + 1,
        # in int64 as the C++ reads take it: an int32 table's diff would wrap at 2^31 and
        # join positions whose values are 2^32 apart).
        if positions:
            changed = flat.long().diff() != 1
        elif flat.dtype == torch.bool:
            changed = flat.diff()  # a bool diff is the xor of neighbours
        else:
            changed = flat[1:] != flat[:-1]
        # room + 1 slots: a last slot filled says there may be more than room.
        r = min(room + 1, B * L - 1)
        try:
            where = torch.nonzero_static(changed, size=r, fill_value=-1).view(-1)
        except (AttributeError, NotImplementedError, RuntimeError):  # a device without it: exact, synchronised
            where = changed.nonzero().view(-1)[:r]
            where = torch.cat([where, where.new_full((r - where.shape[0],), -1)])
        starts = where + 1  # an empty slot reads position 0: dropped by the count
        parts += [starts, flat[starts]]
        plans.append(("runs", B, L, r, positions, (flat, changed)))
    # torch.cat promotes a bool or int32 table's values to int64 with the rest: one copy
    # (a table on another device than the first joins it there).
    device = parts[0].device if parts else None
    parts = [p if p.device == device else p.to(device) for p in parts]
    payload = torch.cat(parts).long().cpu().numpy() if parts else np.zeros(0, dtype=np.int64)
    out, at = [], 0
    for plan in plans:
        if plan[0] == "flat":
            out.append(payload[at:at + plan[1]])
            at += plan[1]
            continue
        if plan[0] == "empty":
            out.append(TableRuns.empty(plan[1], plan[2]))
            continue
        _, B, L, r, positions, held = plan
        firsts = payload[at:at + B]
        at += B
        starts = values = np.zeros(0, dtype=np.int64)
        if r:
            starts, values = payload[at:at + r], payload[at + r:at + 2 * r]
            at += 2 * r
            count = int((starts > 0).sum())
            if count == r and r == room + 1:  # the room overflowed: read the table's changes exactly
                flat, changed = held
                exact = changed.nonzero().view(-1) + 1
                starts, values = exact.cpu().numpy(), flat[exact].long().cpu().numpy()
                count = len(starts)
            starts, values = starts[:count], values[:count]
        out.append(_merged(firsts, starts, values, B, L, positions))
    return out
