"""Masks known from their definition, never built: transformers' mask functions read back.

transformers composes every mask it makes from a few primitives of
transformers.masking_utils (causal_mask_function, sliding_window_overlay, chunked_overlay,
padding_mask_function, packed_sequence_mask_function, blockwise_overlay, ...), joined by
and_masks / or_masks and wrapped by add_offsets_to_mask_function and
remap_positions_for_packed_sequence, and hands the composition to the registered mask
function with the lengths and offsets (sdpa_mask's arguments). Each primitive is a
closure whose free variables (a window, a chunk size, an O(B·L) tensor) can be read back.

recognise() walks that tree. For each query row it works out the keys the composition
lets attend as one interval [begin, end) in O(B·Q) over the metadata (never O(Q·K)):
every node of the tree gives each row one interval, AND intersects, OR joins two that
meet. That row table is exactly what a scan of sdpa_mask's [B, 1, Q, K] tensor gives
(each row of a bool mask whose keys form one interval: no flags), so the classifier's
verdict over its runs (_core.classify_runs; the runs are cut on the metadata's device)
is the scan's, proven by the same render-back.

Nothing is guessed. A function that is not a recognised primitive (a model's own lambda,
a custom or_mask_function), a padding mask with holes, a row whose keys are not one
interval, a primitive whose behaviour on this transformers differs from the rule written
here: recognise() returns the reason (Unrecognised) and the caller builds the mask as
before. Each primitive's rule is pinned once per process and parameter: the installed
transformers' own function is evaluated on a grid around its parameter and compared with
the rule here (pin()); a mismatch turns the primitive off with a warning.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
import torch

from . import _core

logger = logging.getLogger("masklens")

# Far below and above every key: an unbounded side of an interval.
_NEG = -(1 << 62)
_POS = 1 << 62


class Unrecognised(Exception):
    """Why a mask function is not read back (its node and the reason)."""


class _Originals:
    """transformers.masking_utils with its factories as transformers wrote them: where
    masklens._graph_definition has wrapped one, the factory behind the wrapper (the pins and
    the primitives' code objects are made from these, whatever the wrappers give)."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        value = getattr(self._module, name)
        return getattr(value, "_masklens_original", value)


def _mu():
    import transformers.masking_utils as mu
    return _Originals(mu)


def _code(fn):
    return getattr(fn, "__code__", None)


_primitive_codes = None


def _primitives() -> dict:
    """{code object: primitive name} of the installed transformers' mask primitives (the
    closures' inner functions are told apart by their code objects)."""
    global _primitive_codes
    if _primitive_codes is not None:
        return _primitive_codes
    mu = _mu()
    t = torch.zeros((1, 1), dtype=torch.long)
    makers = {
        "causal": lambda: mu.causal_mask_function,
        "bidirectional": lambda: mu.bidirectional_mask_function,
        "and": lambda: mu.and_masks(mu.causal_mask_function),
        "or": lambda: mu.or_masks(mu.causal_mask_function),
        "sliding": lambda: mu.sliding_window_overlay(1),
        "sliding_bidirectional": lambda: mu.sliding_window_bidirectional_overlay(1),
        "chunked": lambda: mu.chunked_overlay(1, t[0]),
        "padding": lambda: mu.padding_mask_function(t.bool()),
        "packed": lambda: mu.packed_sequence_mask_function(t),
        "blocks": lambda: mu.blockwise_overlay(t),
        "remap": lambda: mu.remap_positions_for_packed_sequence(mu.causal_mask_function, t),
        "offsets": lambda: mu.add_offsets_to_mask_function(mu.causal_mask_function, 0, 0),
    }
    codes = {}
    for name, make in makers.items():
        try:
            code = _code(make())
        except (AttributeError, TypeError):  # not in this transformers
            continue
        if code is not None:
            codes[code] = name
    _primitive_codes = codes
    return codes


def _free(fn) -> dict:
    """A closure's free variables by name."""
    cells = fn.__closure__ or ()
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, cells)}


def _int(x, what):
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_floating_point():
            raise Unrecognised(f"{what} is a tensor of shape {tuple(x.shape)}")
        x = int(x.item())
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise Unrecognised(f"{what} is {type(x).__name__} {x!r}")
    return int(x)


def _meta(t, what, device):
    """An O(B·L) tensor of the definition, on the device the rows are worked out on (the
    mask's: a CUDA model's metadata is read where it is, never copied to the host)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise Unrecognised(f"{what} is not a 2-D tensor")
    return t.detach().to(device)


def _name_of(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


# A parsed node: (name, params, children), its tensors on the rows' device.
def parse(fn, device, checks, scope=None):
    """The tree of a mask function, its tensors on `device`, or Unrecognised naming the
    first node that is not a recognised primitive; what only the tensors' values can say
    is added to `checks` (a _Checks). `scope` carries the packed documents an enclosing
    AND restricts to (remap_positions_for_packed_sequence is exact only inside one). An
    object standing for a closure (masklens._graph_definition's Primitive) is read as it."""
    fn = getattr(fn, "_masklens_closure", fn)
    name = _primitives().get(_code(fn))
    if name is None:
        raise Unrecognised(f"{_name_of(fn)} (from {getattr(fn, '__module__', '?')}) is not a recognised mask "
                           "primitive")
    if name in _disabled:
        raise Unrecognised(f"{name}: off for this process (its behaviour differed from masklens' rule)")
    free = _free(fn) if name not in ("causal", "bidirectional") else {}
    if name in ("and", "or"):
        fns = free.get("mask_functions")
        if not isinstance(fns, tuple) or not fns:
            raise Unrecognised(f"{name}_masks holds no functions")
        inner_scope = scope
        if name == "and":
            for f in fns:  # a packed-documents child makes this AND a documents scope
                f = getattr(f, "_masklens_closure", f)
                if _primitives().get(_code(f)) == "packed":
                    inner_scope = _meta(_free(f)["packed_sequence_mask"], "packed_sequence_mask", device)
        return (name, (), tuple(parse(f, device, checks, inner_scope) for f in fns))
    if name in ("sliding", "sliding_bidirectional"):
        return (name, (_int(free["sliding_window"], "sliding_window"),), ())
    if name == "chunked":
        lp = free["left_padding"]
        if not isinstance(lp, torch.Tensor) or lp.dim() != 1:
            raise Unrecognised("chunked_overlay's left_padding is not a 1-D tensor")
        chunk = _int(free["chunk_size"], "chunk_size")
        if chunk < 1:
            raise Unrecognised(f"chunk_size {chunk}")
        return (name, (chunk, lp.detach().to(device).long()), ())
    if name == "padding":
        return (name, (_meta(free["padding_mask"], "padding_mask", device).bool(),), ())
    if name == "packed":
        return (name, (_meta(free["packed_sequence_mask"], "packed_sequence_mask", device).long(),), ())
    if name == "blocks":
        return (name, (_meta(free["block_sequence_ids"], "block_sequence_ids", device).long(),), ())
    if name == "offsets":
        offsets = (_int(free["q_offset"], "q_offset"), _int(free["kv_offset"], "kv_offset"))
        if min(offsets) < 0:
            raise Unrecognised(f"add_offsets_to_mask_function with a negative offset {offsets}")
        # The documents scope holds in the coordinates of the AND that set it, not shifted ones.
        return (name, offsets, (parse(free["mask_function"], device, checks),))
    if name == "remap":
        pos = _meta(free["position_ids"], "position_ids", device).long()
        if scope is None:
            raise Unrecognised("remap_positions_for_packed_sequence outside and_masks(..., "
                               "packed_sequence_mask_function(...))")
        docs = _documents_of_positions(pos)
        if pos.shape != scope.shape:
            raise Unrecognised("position_ids whose documents are not the packed_sequence_mask's")
        checks.add((docs != scope - scope[:, :1]).any(), "position_ids whose documents are not the "
                                                          "packed_sequence_mask's")
        checks.add((pos < 0).any(), "negative position_ids")
        return (name, (pos, docs), (parse(free["mask_function"], device, checks),))
    return (name, (), ())


def _documents_of_positions(pos):
    """Document numbers of packed position_ids: a new document wherever a position is not
    its predecessor + 1 (transformers' find_packed_sequence_indices), from 0."""
    step = torch.ones_like(pos, dtype=torch.bool)
    step[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
    step[:, 0] = False
    return step.long().cumsum(-1)


class _Checks:
    """What makes a definition unreadable, found on the rows' device: each a 0-d bool
    tensor and its reason, read back together with the rows' runs in one copy to the host
    rather than one synchronisation each (a CUDA model's metadata stays where it is until
    then). Indices are clamped where a check stands for them, so nothing reads outside a
    table before the checks are read."""

    def __init__(self):
        self.flags, self.reasons = [], []

    def add(self, flag, reason: str) -> None:
        self.flags.append(flag.reshape(1))
        self.reasons.append(reason)

    def tensor(self, device):
        return torch.cat(self.flags) if self.flags else torch.zeros(0, dtype=torch.bool, device=device)

    def raise_first(self, values) -> None:
        """Unrecognised with the first reason whose flag is set (values: the flags on the host)."""
        for value, reason in zip(values, self.reasons):
            if value:
                raise Unrecognised(reason)

    def raise_now(self) -> None:
        """The checks read back on their own (one synchronisation)."""
        if self.flags:
            self.raise_first(self.tensor(self.flags[0].device).cpu().tolist())


_LONG_MAX = torch.iinfo(torch.long).max


def _runs(ids, checks, what, only_nonnegative=False):
    """For each position of ids [B, L]: the start and end [start, end) of its run of equal
    values; checks that every value's positions (every non-negative value's, with
    only_nonnegative) form one run per batch (a value in two runs: its rows attend two
    key ranges)."""
    B, L = ids.shape
    idx = torch.arange(L, device=ids.device).expand(B, L)
    new = torch.ones((B, L), dtype=torch.bool, device=ids.device)
    new[:, 1:] = ids[:, 1:] != ids[:, :-1]
    start = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), dim=-1).values
    # The end of a run: the first run start after the position (a suffix minimum), or L.
    next_start = torch.full((B, L), L, dtype=torch.long, device=ids.device)
    next_start[:, :-1] = torch.where(new[:, 1:], idx[:, 1:], torch.full_like(idx[:, 1:], L))
    end = torch.flip(torch.cummin(torch.flip(next_start, [-1]), dim=-1).values, [-1])
    # One run per value and batch: sorted along each batch, the runs' first values hold no
    # value twice (the positions that start no run sort last as the largest integer, which
    # an id itself may not be).
    keep = new & (ids >= 0) if only_nonnegative else new
    firsts = torch.where(keep, ids, torch.full_like(ids, _LONG_MAX)).sort(dim=-1).values
    twice = (firsts[:, 1:] == firsts[:, :-1]) & (firsts[:, 1:] != _LONG_MAX)
    checks.add(twice.any(), f"{what}: a value appears in two separate runs (its rows attend two key ranges)")
    checks.add((keep & (ids == _LONG_MAX)).any(), f"{what} holds the id 2**63 - 1, which the check above sorts last")
    return start, end


class _Rows:
    """What a node sees of each row (b, q) [B, Q]: the query value it is given (qv), and
    the shift that maps a key index k to the key value it is given (kv = k + shift); the
    batch count (b runs over 0..batch-1) and the checks the nodes add to."""

    __slots__ = ("b", "qv", "shift", "batch", "checks")

    def __init__(self, b, qv, shift, batch, checks):
        self.b, self.qv, self.shift, self.batch, self.checks = b, qv, shift, batch, checks

    def derived(self, qv, shift):
        return _Rows(self.b, qv, shift, self.batch, self.checks)


def _batch_rows(table, rows, what):
    """Unrecognised where a table has fewer batch rows than the mask (known on the host)."""
    if table.shape[0] < rows.batch:
        raise Unrecognised(f"{what} has {table.shape[0]} batch rows")


def _gather_all(tables, rows, idx, what):
    """[table[b, idx] for each table] for [B, Q] indices into tables of one shape; an index
    outside them (transformers would fail to index it there) is one check, read with the
    others."""
    _batch_rows(tables[0], rows, what)
    length = tables[0].shape[1]
    if length == 0:  # nothing to clamp an index into (known on the host)
        raise Unrecognised(f"{what} is empty")
    rows.checks.add(((idx < 0) | (idx >= length)).any(), f"{what} of length {length} is indexed outside it")
    clamped = idx.clamp(0, length - 1)
    return [table[rows.b, clamped] for table in tables]


def _gather(table, rows, idx, what):
    return _gather_all((table,), rows, idx, what)[0]


def _interval_of_value(table, rows, idx, what, only_nonnegative=False):
    """The run of equal values of `table` [B, L] holding table[b, idx], as [start, end)."""
    start, end = _runs(table, rows.checks, what, only_nonnegative)
    return tuple(_gather_all((start, end), rows, idx, what))


def _evaluate(node, rows):
    """(begin, end) [B, Q]: the key indices [begin, end) each row attends under `node`."""
    name, params, children = node
    qv, shift = rows.qv, rows.shift
    neg = torch.full_like(qv, _NEG)
    pos = torch.full_like(qv, _POS)
    if name == "causal":                                    # kv <= q
        return neg, qv - shift + 1
    if name == "bidirectional":                             # q >= 0
        return neg, torch.where(qv >= 0, pos, neg)
    if name == "sliding":                                   # kv > q - W
        (W,) = params
        return qv - W - shift + 1, pos
    if name == "sliding_bidirectional":                     # |q - kv| <= W
        (W,) = params
        return qv - W - shift, qv + W - shift + 1
    if name == "chunked":                                   # (kv - lp) // C == (q - lp) // C
        C, lp = params
        if lp.shape[0] < rows.batch:
            raise Unrecognised(f"left_padding has {lp.shape[0]} batch rows")
        left = lp[rows.b]
        start = left + torch.div(qv - left, C, rounding_mode="floor") * C
        return start - shift, start + C - shift
    if name == "padding":                                   # padding_mask[b, kv]
        (pm,) = params
        _batch_rows(pm, rows, "padding_mask")
        any_key = pm.any(-1)
        first = pm.int().argmax(-1)
        last = pm.shape[1] - 1 - pm.flip(-1).int().argmax(-1)
        rows.checks.add((any_key & (pm.sum(-1) != last - first + 1)).any(),
                        "padding_mask with holes (a batch's valid keys are not one range)")
        s = torch.where(any_key, first, torch.zeros_like(first))[rows.b]
        e = torch.where(any_key, last + 1, torch.zeros_like(last))[rows.b]
        return s - shift, e - shift
    if name == "packed":                                    # same document
        (psm,) = params
        s, e = _interval_of_value(psm, rows, qv, "packed_sequence_mask")
        return s - shift, e - shift
    if name == "blocks":                                    # same block, when in one
        (ids,) = params
        s, e = _interval_of_value(ids, rows, qv, "block_sequence_ids", only_nonnegative=True)
        inside = _gather(ids, rows, qv, "block_sequence_ids") >= 0
        return torch.where(inside, s - shift, pos), torch.where(inside, e - shift, neg)
    if name == "and":
        begin, end = neg, pos
        for child in children:
            b, e = _evaluate(child, rows)
            begin, end = torch.maximum(begin, b), torch.minimum(end, e)
        return begin, end
    if name == "or":
        begin, end = pos, neg  # empty
        for child in children:
            b, e = _evaluate(child, rows)
            empty, child_empty = begin >= end, b >= e
            both = ~empty & ~child_empty
            rows.checks.add((both & ((b > end) | (begin > e))).any(), "or_masks: a row attends two separate key ranges")
            begin = torch.where(child_empty, begin, torch.where(empty, b, torch.minimum(begin, b)))
            end = torch.where(child_empty, end, torch.where(empty, e, torch.maximum(end, e)))
        return begin, end
    if name == "offsets":
        qo, ko = params
        return _evaluate(children[0], rows.derived(qv + qo, shift + ko))
    if name == "remap":
        # Inside one document positions rise by 1 a token (parse() checked the documents
        # are packed_sequence_mask's): the key at index j has position pos[q] + j - q. The
        # rows are restricted to their document, as the enclosing AND restricts them.
        position_ids, docs = params
        pq = _gather(position_ids, rows, qv, "position_ids")
        ds, de = _interval_of_value(docs, rows, qv, "position_ids")
        new_shift = shift + pq - qv
        b, e = _evaluate(children[0], rows.derived(pq, new_shift))
        return torch.maximum(b, ds - shift), torch.minimum(e, de - shift)
    raise Unrecognised(f"no rule for {name}")


def row_bounds(tree, batch: int, q_len: int, k_len: int, q_offset: int, kv_offset: int, device="cpu",
               checks=None):
    """(begin, end) int64 tensors [batch, q_len] on `device`: each row's keys [begin, end),
    clipped to [0, k_len); an empty row is (0, 0). With `checks` (a _Checks) what makes
    the definition unreadable is added there, to be read with the runs; without, it is
    read here (one synchronisation) and raised."""
    own = checks is None
    checks = _Checks() if own else checks
    b = torch.arange(batch, device=device).view(-1, 1).expand(batch, q_len)
    q = torch.arange(q_len, device=device).view(1, -1).expand(batch, q_len) + q_offset
    shift = torch.full((batch, q_len), kv_offset, dtype=torch.long, device=device)
    begin, end = _evaluate(tree, _Rows(b, q, shift, batch, checks))
    if own:
        checks.raise_now()
    begin, end = begin.clamp(0, k_len), end.clamp(0, k_len)
    empty = begin >= end
    return begin.masked_fill(empty, 0), end.masked_fill(empty, 0)


_NO_KEY = (1 << 63) - 1  # RowSpan::kNoKey: an empty row's first key


# Runs read back in the first copy: a recognised structure has a few a document, block or
# padding edge; more take a second, exact copy.
_RUN_ROOM = 4096


def _runs_at(heads, first, last, n):
    """The runs [len(heads), 8] starting at flat row indices `heads` (ascending; entries
    equal to n are room left over and come out as runs of length 0)."""
    at = heads.clamp(max=n - 1)
    lengths = torch.diff(heads, append=torch.full((1,), n, dtype=heads.dtype, device=heads.device))
    nxt = (at + 1).clamp(max=n - 1)
    longer = lengths > 1
    f, lst = first[at], last[at]
    zero = torch.zeros_like(f)
    return torch.stack([heads, lengths, f, lst, torch.where(longer, first[nxt] - f, zero),
                        torch.where(longer, last[nxt] - lst, zero), torch.where(f == _NO_KEY, zero, lst - f + 1), zero],
                       dim=1)


def _first_heads(flat_start, room: int, n: int):
    """The first `room` run starts, then n for the room left over: torch.nonzero_static,
    which needs no synchronisation; where the device has none (CUDA before torch 2.6) the
    exact starts, padded (one synchronisation more)."""
    try:
        return torch.nonzero_static(flat_start, size=room, fill_value=n).flatten()
    except (AttributeError, NotImplementedError, RuntimeError):
        heads = flat_start.nonzero().flatten()[:room]
        return torch.cat([heads, heads.new_full((room - heads.numel(),), n)])


def row_runs(begin, end, checks=None):
    """The rows as span runs (span_runs.hpp), int64 [n, 8] on the host: (row, length,
    first, last, d_first, d_last, count, flags), a run wherever the rows' keys step alike
    (any cutting is valid; a cut is made where the step, the emptiness or the batch
    changes), and whether every batch's rows are the first's. Cut on the rows' device; the
    runs, that flag and the checks' flags cross in one copy (a second only past
    _RUN_ROOM runs), and a set check raises Unrecognised."""
    checks = _Checks() if checks is None else checks
    D, Q = begin.shape
    empty = begin >= end
    first = begin.masked_fill(empty, _NO_KEY)
    last = (end - 1).masked_fill(empty, -1)
    start = torch.zeros((D, Q), dtype=torch.bool, device=begin.device)
    start[:, 0] = True
    if Q > 1:
        start[:, 1:] |= empty[:, 1:] != empty[:, :-1]
    if Q > 2:
        d_first, d_last = first.diff(dim=1), last.diff(dim=1)
        start[:, 2:] |= (d_first[:, 1:] != d_first[:, :-1]) | (d_last[:, 1:] != d_last[:, :-1])
    n = D * Q
    room = min(n, _RUN_ROOM)
    flat_start, flat_first, flat_last = start.flatten(), first.flatten(), last.flatten()
    heads = _first_heads(flat_start, room, n)
    alike = ((begin == begin[:1]) & (end == end[:1])).all()
    flags = checks.tensor(begin.device)
    payload = torch.cat([flat_start.sum().reshape(1), alike.reshape(1).long(), flags.long(),
                         _runs_at(heads, flat_first, flat_last, n).flatten()]).cpu().numpy()
    count, alike, nflags = int(payload[0]), bool(payload[1]), flags.numel()
    checks.raise_first(payload[2:2 + nflags])
    if count <= room:
        return payload[2 + nflags:].reshape(room, 8)[:count], alike
    heads = flat_start.nonzero().flatten()
    return _runs_at(heads, flat_first, flat_last, n).cpu().numpy(), alike


def row_intervals(tree, batch: int, q_len: int, k_len: int, q_offset: int, kv_offset: int, device="cpu"):
    """row_bounds() as numpy arrays on the host."""
    begin, end = row_bounds(tree, batch, q_len, k_len, q_offset, kv_offset, device)
    return begin.cpu().numpy(), end.cpu().numpy()


# ---- semantics pinned: the installed transformers' primitives against the rules above ----

_pinned = set()     # (primitive, parameters) checked and found equal
_disabled = set()   # primitives whose behaviour differed: off for the process


def _grid_points(*params, n=12):
    """Query and key values around 0 and each parameter (and its multiples)."""
    pts = set(range(n))
    for p in params:
        for m in (1, 2, 3):
            pts.update(range(max(m * p - 3, 0), m * p + 4))
    return torch.tensor(sorted(pts), dtype=torch.long)


def pin(tree) -> None:
    """Checks each primitive of a parsed tree once per process and parameter: the installed
    transformers' function on a grid of query and key values against the rule above; a
    mismatch turns the primitive off (warning) and raises Unrecognised."""
    name, params, children = tree
    for child in children:
        pin(child)
    key = (name,) + tuple(p for p in params if isinstance(p, int))
    if key in _pinned:
        return
    _check_primitive(name, params)
    _pinned.add(key)


def _synthetic(name, params):
    """(mask function built by transformers, parsed tree, batch, points): a primitive on
    synthetic inputs, for pin()."""
    mu = _mu()
    L = 40
    pos_pts = torch.arange(L)
    if name in ("causal", "bidirectional"):
        fn = mu.causal_mask_function if name == "causal" else mu.bidirectional_mask_function
        return fn, (name, (), ()), 1, pos_pts
    if name in ("sliding", "sliding_bidirectional"):
        W = params[0]
        make = mu.sliding_window_overlay if name == "sliding" else mu.sliding_window_bidirectional_overlay
        return make(W), (name, (W,), ()), 1, _grid_points(W)
    if name == "chunked":
        C = params[0]
        lp = torch.tensor([0, 3])
        fn = mu.chunked_overlay(C, lp)
        return fn, (name, (C, lp), ()), 2, _grid_points(C, C + 3)
    if name == "padding":
        pm = torch.zeros((4, L), dtype=torch.bool)
        pm[0, :] = True
        pm[1, 5:] = True
        pm[2, :17] = True
        pm[3, 9:30] = True
        return mu.padding_mask_function(pm), (name, (pm,), ()), 4, pos_pts
    if name == "packed":
        psm = torch.tensor([[0] * 7 + [1] * 20 + [2] * 13, [0] * 40, [3] * 1 + [4] * 38 + [5] * 1])
        return mu.packed_sequence_mask_function(psm), (name, (psm,), ()), 3, pos_pts
    if name == "blocks":
        # Text (-1) and other negative ids, blocks of one token, ids shared across batches.
        ids = torch.full((3, L), -1, dtype=torch.long)
        ids[0, 3:9] = 0
        ids[0, 20:31] = 1
        ids[0, 35:37] = -2
        ids[1, 0:5] = 0
        ids[1, 5:6] = 7
        ids[1, 6:14] = -3
        ids[2, 30:40] = 2
        return mu.blockwise_overlay(ids), (name, (ids,), ()), 3, pos_pts
    causal = mu.causal_mask_function
    # The joins over the two module-level primitives alone, so that a join is never blamed
    # for a change in another primitive.
    bidirectional = mu.bidirectional_mask_function
    shifted = mu.add_offsets_to_mask_function(causal, 0, 6)  # kv <= q - 6
    if name == "and":
        return (mu.and_masks(bidirectional, causal), (name, (), (("bidirectional", (), ()), ("causal", (), ()))), 1,
                pos_pts)
    if name == "or":
        # causal OR (kv <= q - 6): a union whose second part lies inside the first.
        return (mu.or_masks(shifted, causal),
                (name, (), (("offsets", (0, 6), (("causal", (), ()),)), ("causal", (), ()))), 1, pos_pts)
    if name == "offsets":
        qo, ko = params
        n = max(L - max(qo, ko), 8)
        return (mu.add_offsets_to_mask_function(causal, qo, ko), (name, (qo, ko), (("causal", (), ()),)), 1,
                torch.arange(n))
    if name == "remap":
        pos = torch.tensor([list(range(7)) + list(range(20)) + list(range(13))])
        psm = _documents_of_positions(pos)
        fn = mu.and_masks(mu.remap_positions_for_packed_sequence(mu.chunked_overlay(4, torch.tensor([0])), pos),
                          mu.packed_sequence_mask_function(psm))
        tree = ("and", (), (("remap", (pos, psm), (("chunked", (4, torch.tensor([0])), ()),)), ("packed", (psm,), ())))
        return fn, tree, 1, pos_pts
    raise Unrecognised(f"no pin for {name}")


def _check_primitive(name, params) -> None:
    fn, tree, batch, pts = _synthetic(name, params)
    n = pts.numel()
    b = torch.arange(batch).view(-1, 1, 1, 1)
    h = torch.zeros((1, 1, 1, 1), dtype=torch.long)
    want = fn(b, h, pts.view(1, 1, -1, 1), pts.view(1, 1, 1, -1))
    want = torch.as_tensor(want).bool().expand(batch, 1, n, n)
    # The rule: each row's interval over the key values (indices are the values here).
    rows = _Rows(torch.arange(batch).view(-1, 1).expand(batch, n), pts.view(1, -1).expand(batch, n),
                 torch.zeros((batch, n), dtype=torch.long), batch, _Checks())
    try:
        begin, end = _evaluate(tree, rows)
        rows.checks.raise_now()
    except Unrecognised as e:
        _disable(name, f"its rule could not be evaluated: {e}")
    k = pts.view(1, 1, -1)
    got = (k >= begin.unsqueeze(-1)) & (k < end.unsqueeze(-1))
    if not torch.equal(got.unsqueeze(1), want):
        _disable(name, "its values differ from masklens' rule on a grid")


def _disable(name, why):
    _disabled.add(name)
    warnings.warn(f"masklens: transformers' mask primitive {name!r}: {why}; masks using it are built and scanned "
                  "(the zero-byte path is off for it in this process)", RuntimeWarning, stacklevel=3)
    raise Unrecognised(f"{name}: {why}")


_sdpa_pinned = False


def _pin_sdpa_mask() -> None:
    """sdpa_mask's own composition, checked once per process: padding ANDed in, offsets
    added to the indices, the padding mask padded, an empty row. A mismatch turns the
    reading off with a warning."""
    global _sdpa_pinned
    if _sdpa_pinned:
        return
    if "sdpa_mask" in _disabled:
        raise Unrecognised("sdpa_mask: off for this process (its behaviour differed from masklens' reading)")
    mu = _mu()
    am = torch.tensor([[False, False, True, True, True, True], [True, True, True, True, True, False]])
    fn = mu.sliding_window_causal_mask_function(3)
    kw = dict(batch_size=2, q_length=3, kv_length=6, q_offset=3, kv_offset=0, mask_function=fn, attention_mask=am)
    want = mu.sdpa_mask(**kw, allow_is_causal_skip=False).expand(2, 1, 3, 6)[:, 0]
    # kv_offset: keys [2, 7) of a 5-token padding mask (padded by prepare_padding_mask).
    kw2 = dict(batch_size=2, q_length=4, kv_length=5, q_offset=2, kv_offset=2,
               mask_function=mu.causal_mask_function, attention_mask=am[:, :5])
    want2 = mu.sdpa_mask(**kw2, allow_is_causal_skip=False).expand(2, 1, 4, 5)[:, 0]
    for args, dense in ((kw, want), (kw2, want2)):
        tree = parse(args["mask_function"], torch.device("cpu"), _Checks())
        padding = mu.prepare_padding_mask(args["attention_mask"], args["kv_length"], args["kv_offset"])
        tree = ("and", (), (tree, ("padding", (padding.bool(),), ())))
        begin, end = row_bounds(tree, 2, args["q_length"], args["kv_length"], args["q_offset"], args["kv_offset"])
        keys = torch.arange(args["kv_length"])
        got = (keys >= begin.unsqueeze(-1)) & (keys < end.unsqueeze(-1))
        if not torch.equal(got, dense):
            _disable("sdpa_mask", "its padding or offsets differ from masklens' reading")
    _sdpa_pinned = True


# ---- the definition as a whole ----

class Definition:
    """A mask read from its definition: the verdict (its structure and rows) without a
    [B, 1, Q, K] tensor."""

    __slots__ = ("batch", "q_len", "k_len", "verdict", "tree", "begin", "end")

    def __init__(self, batch, q_len, k_len, verdict, tree, begin=None, end=None):
        self.batch, self.q_len, self.k_len = batch, q_len, k_len
        self.verdict = verdict
        self.tree = tree
        self.begin, self.end = begin, end  # [B, Q] int64 on the rows' device: each row's keys [begin, end)

    def bounds(self):
        """[B, 1, Q, 2] int64 on the rows' device: each row's first and last key, (K, -1) for
        a row that attends nothing (the table _mask_mods.bounds_mask_mod reads)."""
        empty = self.begin >= self.end
        first = self.begin.masked_fill(empty, self.k_len)
        last = (self.end - 1).masked_fill(empty, -1)
        return torch.stack([first, last], -1).unsqueeze(1)


# sdpa_mask's arguments that do not change the mask it builds (the skips say whether it
# builds one; dtype and config serve other mask functions). Any other argument is
# something this reading does not know: the mask is built.
_NEUTRAL_ARGUMENTS = {"local_size", "allow_is_causal_skip", "allow_is_bidirectional_skip", "allow_torch_fix",
                      "use_vmap", "dtype", "config"}


def recognise(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
              device="cpu", **others):
    """The Definition of the mask sdpa_mask would build from these arguments (its own
    keyword names), or Unrecognised saying which node or value is not read back. The rows
    are worked out on `device` (the mask's)."""
    unknown = sorted(set(others) - _NEUTRAL_ARGUMENTS)
    if unknown:
        raise Unrecognised(f"sdpa_mask arguments masklens does not read: {', '.join(unknown)}")
    try:
        _pin_sdpa_mask()
        return _recognise(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                          torch.device(device))
    except Unrecognised:
        raise
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        # A closure that is not laid out as the primitive's was (a transformers that renamed
        # a variable, say): not read, never guessed.
        raise Unrecognised(f"the definition could not be read: {type(e).__name__}: {e}") from e


def _recognise(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, device):
    mu = _mu()
    if mask_function is None:
        mask_function = mu.causal_mask_function
    B, Q, K = _int(batch_size, "batch_size"), _int(q_length, "q_length"), _int(kv_length, "kv_length")
    qo, ko = _int(q_offset, "q_offset"), _int(kv_offset, "kv_offset")
    if min(B, Q, K) < 1:
        raise Unrecognised(f"an empty mask [{B}, 1, {Q}, {K}]")
    if min(qo, ko) < 0:
        raise Unrecognised(f"negative offsets q_offset {qo}, kv_offset {ko}")
    checks = _Checks()
    tree = parse(mask_function, device, checks)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
            raise Unrecognised("an attention_mask that is not a 2-D tensor")
        if attention_mask.dtype != torch.bool:  # transformers' create_*_mask hand a bool one
            raise Unrecognised(f"an attention_mask of dtype {attention_mask.dtype} (sdpa_mask ANDs it as it is)")
        padding = mu.prepare_padding_mask(attention_mask, K, ko)
        tree = ("and", (), (tree, ("padding", (_meta(padding, "padding_mask", device).bool(),), ())))
    pin(tree)
    begin, end = row_bounds(tree, B, Q, K, qo, ko, device, checks)
    runs, alike = row_runs(begin, end, checks)  # the one copy to the host
    tables = B
    if B > 1 and alike:  # one row table holds every batch (a broadcast mask): the first batch's runs
        runs, tables = runs[runs[:, 0] < Q], 1
    # The rows' spans are exactly a scan's of the dense bool mask (no flags): the
    # classifier's verdict over their runs is the scan's.
    verdict = _core.classify_runs([B, 1, Q, K, tables, 1], np.ascontiguousarray(runs))
    return Definition(B, Q, K, verdict, tree, begin, end)


class DefinedMask:
    """What the attention layers receive in place of transformers' [B, 1, Q, K] mask: the
    mask's Definition (its verdict: structure and rows), and how to build the dense mask
    should anything need it. Tensor-like: it has the mask's shape, dtype (bool) and
    device, and .to(device) moves it unbuilt; any other use by the model's code (an
    operator, a torch function, a tensor attribute or method, an index, a write) builds
    the dense mask once, logs why, and acts on it, and the layers then take that tensor
    (proven by a scan: the code may have written it), so code that touches the mask
    between the mask function and attention gets the mask it expects."""

    __slots__ = ("definition", "shape", "device", "entry", "touched", "_build", "_dense", "_stand_ins",
                 "__weakref__")

    dtype = torch.bool
    layout = torch.strided
    is_nested = False
    requires_grad = False
    ndim = 4

    def __init__(self, definition, device, build, entry):
        self.definition = definition
        self.shape = torch.Size((definition.batch, 1, definition.q_len, definition.k_len))
        self.device = torch.device(device)
        self.entry = entry      # the verdict as the drop-in's cache holds one: its policies per call
        self.touched = False    # the model's code used the dense mask (the layers take that tensor)
        self._build = build     # () -> the dense mask (transformers' sdpa_mask with the same arguments)
        self._dense = None
        self._stand_ins = {}

    @property
    def verdict(self):
        return self.definition.verdict

    @property
    def structure(self):
        return self.definition.verdict.structure

    def dim(self):
        return 4

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def built(self) -> bool:
        """Whether the dense mask was built."""
        return self._dense is not None

    def stand_in(self, device):
        """A zero-byte bool tensor of the mask's shape on `device` (a broadcast scalar): what
        the drop-in's checks and call keys read of a mask."""
        t = self._stand_ins.get(device)
        if t is None:
            t = self._stand_ins[device] = torch.zeros((), dtype=torch.bool, device=device).expand(self.shape)
        return t

    def to(self, *args, **kwargs):
        """Moved to another device unbuilt (accelerate's hooks move a layer's arguments with
        .to(device, non_blocking=...)); any other conversion builds the mask."""
        moving = {k: v for k, v in kwargs.items() if k not in ("non_blocking", "copy")}
        target = moving.pop("device", None) if not args else args[0]
        if not moving and len(args) <= 1 and isinstance(target, (str, torch.device)):
            if torch.device(target) == self.device:
                return self
            moved = DefinedMask(self.definition, target, self._build, self.entry)
            if self._dense is not None:
                moved._dense, moved.touched = self._dense.to(target), self.touched
            return moved
        return self._used("to").to(*args, **kwargs)

    @torch.compiler.disable
    def materialise(self, why: str) -> torch.Tensor:
        """The dense [B, 1, Q, K] bool mask, built once (logged with `why`)."""
        if self._dense is None:
            logger.info("masklens: building the dense mask %s of %s: %s", tuple(self.shape),
                        self.structure.describe(), why)
            self._dense = self._build().to(self.device).expand(self.shape)
        return self._dense

    def _used(self, what: str) -> torch.Tensor:
        """The dense mask for the model's own use of it: the layers take that tensor after."""
        self.touched = True
        return self.materialise(f"the model's code used it ({what})")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map_only
        name = getattr(func, "__name__", str(func))
        args, kwargs = tree_map_only(DefinedMask, lambda m: m._used(name), (args, kwargs or {}))
        return func(*args, **kwargs)

    def __getattr__(self, name):
        # Only what a tensor has: hasattr(mask, "_hf_hook") and the like answer False unbuilt.
        if (name.startswith("__") and name.endswith("__")) or not hasattr(torch.Tensor, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._used(f"its attribute {name!r}"), name)

    def __getitem__(self, index):
        return self._used("an index")[index]

    def __setitem__(self, index, value):
        self._used("a write")[index] = value

    def __len__(self):
        return self.shape[0]

    def __contains__(self, item):
        return item in self._used("in")

    def __reduce__(self):
        # Pickled (or deep-copied) as the tensor it stands for.
        return (torch.Tensor.clone, (self._used("pickle").contiguous(),))

    def __repr__(self):
        return f"<masklens DefinedMask {tuple(self.shape)} {self.structure.describe()}>"


def _operator(name):
    def op(self, *args):
        return getattr(self._used(f"operator {name}"), name)(*args)
    op.__name__ = name
    return op


# Every operator a tensor has, with a DefinedMask on either side, acts on the dense mask
# (torch dispatches a tensor's operator with the mask on the right to __torch_function__).
_NOT_OPERATORS = {"__getattribute__", "__getattr__", "__setattr__", "__delattr__", "__init__", "__new__", "__repr__",
                  "__str__", "__format__", "__dir__", "__class__", "__init_subclass__", "__subclasshook__",
                  "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__sizeof__", "__hash__",
                  "__getitem__", "__setitem__", "__len__", "__contains__", "__torch_function__",
                  "__torch_dispatch__", "__deepcopy__", "__weakref__", "__dict__", "__module__", "__doc__",
                  "__slots__", "__annotations__", "__array__", "__array_wrap__", "__array_priority__",
                  "__cuda_array_interface__", "__dlpack__", "__dlpack_device__", "__iter__", "__reversed__"}
for _name in dir(torch.Tensor):
    if (_name.startswith("__") and _name.endswith("__") and _name not in _NOT_OPERATORS
            and callable(getattr(torch.Tensor, _name, None)) and _name not in DefinedMask.__dict__):
        setattr(DefinedMask, _name, _operator(_name))
del _name
