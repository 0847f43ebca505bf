"""Masks known from their definition, never built: transformers' mask functions read back.

transformers composes every mask it makes from a few primitives of
transformers.masking_utils (causal_mask_function, sliding_window_overlay, chunked_overlay,
padding_mask_function, packed_sequence_mask_function, blockwise_overlay, ...), joined by
and_masks / or_masks and wrapped by add_offsets_to_mask_function and
remap_positions_for_packed_sequence, and hands the composition to the registered mask
function with the lengths and offsets (sdpa_mask's arguments). Each primitive is a
closure whose free variables (a window, a chunk size, an O(B·L) tensor) can be read back.

recognise() walks that tree, and include/masklens/definition.hpp (_core.read_definition)
works out the keys the composition lets each query row attend as one interval [begin,
end): every node gives each row one interval, AND intersects, OR joins all its children (a
child OR's among them) at once, in any order or nesting, where they meet. The rows are
worked out per piece (runs of rows whose interval ends move linearly, cut where a table
changes value along the rows, a chunk starts or two ends cross), from the runs of the
O(B·L) tables read together (masklens._table_runs), so the work is O(pieces), not
O(B·Q) and never O(Q·K). That row table is exactly what a scan of sdpa_mask's [B, 1, Q, K]
tensor gives (each row of a bool mask whose keys form one interval: no flags), so the
classifier's verdict over its pieces is the scan's, proven by the same render-back.

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
import types
import warnings

import numpy as np
import torch

from . import _core
from . import _table_runs

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


_originals = None


def _mu():
    """transformers.masking_utils as _Originals: made once (each mask function call asks)."""
    global _originals
    if _originals is None:
        import transformers.masking_utils as mu
        _originals = _Originals(mu)
    return _originals


_FUNCTION = types.FunctionType


def _code(fn):
    return fn.__code__ if type(fn) is _FUNCTION else getattr(fn, "__code__", None)


def _closure(fn):
    """The closure behind fn: itself, or the one an object stands for
    (masklens._graph_definition's Primitive)."""
    return fn if type(fn) is _FUNCTION else getattr(fn, "_masklens_closure", fn)


# {id(code object): primitive name}. Keyed by identity: a code object's hash is computed
# anew at each lookup from its name, bytecode and constants (about 1 µs), and the mask
# function's path looks one up at every node; _primitive_code_objects keeps them alive.
_primitive_codes = None
_primitive_code_objects = []


def _primitives() -> dict:
    """{id(code object): primitive name} of the installed transformers' mask primitives (the
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
            codes[id(code)] = name
            _primitive_code_objects.append(code)
    _primitive_codes = codes
    return codes


# (id(code object), free variable) -> (the code object, kept alive so that its id stays
# its own; its cell's index in the closure).
_cell_index = {}


def _free(fn, var):
    """A closure's free variable `var`, or Unrecognised naming both where the closure has
    none of that name (a transformers whose primitive is laid out otherwise: not read)."""
    code = fn.__code__
    known = _cell_index.get((id(code), var))
    if known is None:
        if var not in code.co_freevars:
            raise Unrecognised(f"{_name_of(fn)} holds no {var!r} (a primitive laid out otherwise)")
        known = _cell_index[(id(code), var)] = (code, code.co_freevars.index(var))
    return fn.__closure__[known[1]].cell_contents


def _int(x, what):
    if type(x) is int:  # the common case, first: a window, a length, an offset
        return x
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_floating_point():
            raise Unrecognised(f"{what} is a tensor of shape {tuple(x.shape)}")
        x = int(x.item())
    if x is None:
        raise Unrecognised(f"sdpa_mask called without {what}")
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise Unrecognised(f"{what} is {type(x).__name__} {x!r}")
    return int(x)


def _meta(t, what):
    """An O(B·L) tensor of the definition, read where it is (a CUDA model's metadata is
    never copied whole to the host; its runs are)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise Unrecognised(f"{what} is not a 2-D tensor")
    dtype = t.dtype
    if dtype.is_floating_point or dtype.is_complex:  # ids and positions are integers (or bool): never rounded
        raise Unrecognised(f"{what} is a {dtype} tensor")
    return t


def _name_of(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


_LEAVES = {"causal": ("causal", (), ()), "bidirectional": ("bidirectional", (), ())}
_LEAF_KEYS = {"causal": ("causal",), "bidirectional": ("bidirectional",)}  # their pins' keys


class _Walk:
    """What recognise() gathers in its one walk of the tree, beside the tree: the tables it
    reads ({(id, positions): tensor}, first seen first, as _tables gives them) and the
    nodes whose pin (primitive and parameters) is not yet checked, children first."""

    __slots__ = ("tables", "unpinned")

    def __init__(self):
        self.tables, self.unpinned = {}, []

    def table(self, t, positions=False):
        self.tables.setdefault((id(t), positions), t)

    def node(self, key, node):
        if key not in _pinned:
            self.unpinned.append(node)
        return node


# A parsed node: (name, params, children); its tables are the closures' own tensors.
def parse(fn, scope=None, walk=None):
    """The tree of a mask function, or Unrecognised naming the first node that is not a
    recognised primitive (what only the tables' values can say is checked where the rows
    are evaluated). `scope` carries the packed documents an enclosing AND restricts to
    (remap_positions_for_packed_sequence is exact only inside one). An object standing
    for a closure (masklens._graph_definition's Primitive) is read as it. walk: a _Walk
    that gathers the tables and the nodes to pin in the same pass."""
    if type(fn) is not _FUNCTION:
        fn = getattr(fn, "_masklens_closure", fn)
    primitives = _primitive_codes or _primitives()
    name = primitives.get(id(fn.__code__ if type(fn) is _FUNCTION else getattr(fn, "__code__", None)))
    if name is None:
        raise Unrecognised(f"{_name_of(fn)} (from {getattr(fn, '__module__', '?')}) is not a recognised mask "
                           "primitive")
    if _disabled and name in _disabled:
        raise Unrecognised(f"{name}: off for this process (its behaviour differed from masklens' rule)")
    leaf = _LEAVES.get(name)
    if leaf is not None:
        return leaf if walk is None else walk.node(_LEAF_KEYS[name], leaf)
    if name == "and" or name == "or":
        fns = _free(fn, "mask_functions")
        if not isinstance(fns, tuple) or not fns:
            raise Unrecognised(f"{name}_masks holds no functions")
        inner_scope = scope
        if name == "and":
            for f in fns:  # a packed-documents child makes this AND a documents scope
                f = _closure(f)
                if primitives.get(id(_code(f))) == "packed":
                    inner_scope = _meta(_free(f, "packed_sequence_mask"), "packed_sequence_mask")
        node = (name, (), tuple([parse(f, inner_scope, walk) for f in fns]))
        return node if walk is None else walk.node((name,), node)
    if name == "sliding" or name == "sliding_bidirectional":
        window = _int(_free(fn, "sliding_window"), "sliding_window")
        node = (name, (window,), ())
        return node if walk is None else walk.node((name, window), node)
    if name == "padding" or name == "packed" or name == "blocks":
        var = _TABLE_VARIABLES[name]
        table = _meta(_free(fn, var), var)
        node = (name, (table,), ())
        if walk is not None:
            walk.table(table)
            walk.node((name,), node)
        return node
    if name == "remap":
        pos = _meta(_free(fn, "position_ids"), "position_ids")
        if scope is None:
            raise Unrecognised("remap_positions_for_packed_sequence outside and_masks(..., "
                               "packed_sequence_mask_function(...))")
        if pos.shape != scope.shape:
            raise Unrecognised("position_ids whose documents are not the packed_sequence_mask's")
        if walk is not None:  # its own tables ahead of its child's, as _tables has them
            walk.table(pos, True)
            walk.table(scope)
        node = (name, (pos, scope), (parse(_free(fn, "mask_function"), None, walk),))
        return node if walk is None else walk.node((name,), node)
    if name == "chunked":
        lp = _free(fn, "left_padding")
        if not isinstance(lp, torch.Tensor) or lp.dim() != 1:
            raise Unrecognised("chunked_overlay's left_padding is not a 1-D tensor")
        chunk = _int(_free(fn, "chunk_size"), "chunk_size")
        if chunk < 1:
            raise Unrecognised(f"chunk_size {chunk}")
        node = (name, (chunk, lp), ())
        if walk is not None:
            walk.table(lp)
            walk.node((name, chunk), node)
        return node
    if name == "offsets":
        offsets = (_int(_free(fn, "q_offset"), "q_offset"), _int(_free(fn, "kv_offset"), "kv_offset"))
        if min(offsets) < 0:
            raise Unrecognised(f"add_offsets_to_mask_function with a negative offset {offsets}")
        # The documents scope holds in the coordinates of the AND that set it, not shifted ones.
        node = (name, offsets, (parse(_free(fn, "mask_function"), None, walk),))
        return node if walk is None else walk.node((name, *offsets), node)
    raise Unrecognised(f"{name}: a primitive with no reading")  # every name above has one


# The free variable holding a one-table primitive's table (its name in the message too).
_TABLE_VARIABLES = {"padding": "padding_mask", "packed": "packed_sequence_mask", "blocks": "block_sequence_ids"}


def _documents_of_positions(pos):
    """Document numbers of packed position_ids: a new document wherever a position is not
    its predecessor + 1 (transformers' find_packed_sequence_indices), from 0."""
    step = torch.ones_like(pos, dtype=torch.bool)
    step[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
    step[:, 0] = False
    return step.long().cumsum(-1)


def _tables(tree, found=None) -> dict:
    """{(id, positions): tensor} of the tables the tree reads, first seen first (1-D:
    chunked's left padding, read as a list)."""
    found = {} if found is None else found
    name, params, children = tree
    if name in ("padding", "packed", "blocks"):
        found.setdefault((id(params[0]), False), params[0])
    elif name == "chunked":
        found.setdefault((id(params[1]), False), params[1])
    elif name == "remap":
        found.setdefault((id(params[0]), True), params[0])
        found.setdefault((id(params[1]), False), params[1])
    for child in children:
        _tables(child, found)
    return found


def _encode(tree, index):
    """The tree as definition.hpp's nodes: (rule, a, b, table, scope, children), tables
    and lists by their index."""
    name, params, children = tree
    a = b = 0
    table = scope = -1
    if name in ("sliding", "sliding_bidirectional"):
        (a,) = params
    elif name == "chunked":
        a, table = params[0], index[(id(params[1]), False)]
    elif name in ("padding", "packed", "blocks"):
        table = index[(id(params[0]), False)]
    elif name == "offsets":
        a, b = params
    elif name == "remap":
        table, scope = index[(id(params[0]), True)], index[(id(params[1]), False)]
    return (name, a, b, table, scope, tuple([_encode(child, index) for child in children]))


# Table changes read back in the first copy: a recognised definition has a few a document,
# block or padding edge; a table with more takes a second, exact copy.
_TABLE_ROOM = 1024


def _read(tree):
    """(encoded tree, tables, lists, keep): what definition.hpp reads: a CUDA table's runs
    (one copy to the host for all), a CPU table's view (its address: `keep` holds the
    views, each holding its tensor, until the read is made), the 1-D lists."""
    found = _tables(tree)
    return _gathered(tree, found, _start_tables(found)())


def _start_tables(found):
    """masklens._table_runs.start_read of the tables found ({(id, positions): tensor})."""
    return _table_runs.start_read([(t, key[1]) for key, t in found.items()], _TABLE_ROOM)


def _gathered(tree, found, runs_read):
    """_read's answer from the tables' runs as masklens._table_runs' read gives them (in
    the order of found: _tables(tree), or the same dict from parse's _Walk.tables)."""
    index, tables, lists = {}, [], []
    for key, runs in zip(found, runs_read):
        if isinstance(runs, np.ndarray):
            index[key] = len(lists)
            lists.append(np.ascontiguousarray(runs, dtype=np.int64))
        else:
            index[key] = len(tables)
            # The device pass's runs as they are; others as tuples: runs, or a CPU table's
            # view (its address).
            tables.append(runs if type(runs) is _core.TableRuns else runs.as_tuple())
    return _encode(tree, index), tables, lists, runs_read


def _reason(answer):
    if isinstance(answer, str):
        raise Unrecognised(answer)
    return answer


class RowPieces:
    """Every row's keys [begin, end) as pieces, int64 [n, 7] (batch, lo, hi, kb, cb, ke,
    ce: rows [lo, hi) of a batch, begin = kb q + cb, end = ke q + ce), clipped to [0,
    k_len); an empty row is (0, 0)."""

    __slots__ = ("pieces", "batch", "q_len")

    def __init__(self, pieces, batch, q_len):
        self.pieces, self.batch, self.q_len = pieces, batch, q_len

    def rows(self):
        """(begin, end) int64 [batch, q_len] on the host, as NumPy arrays."""
        return tuple(t.numpy() for t in self.rows_on("cpu"))

    def rows_on(self, device):
        """(begin, end) int64 [batch, q_len] on `device`: the pieces cross (seven numbers
        each) and are spread there, with no synchronisation."""
        p = torch.from_numpy(np.ascontiguousarray(self.pieces)).to(device, non_blocking=True)
        per_row = torch.repeat_interleave(p[:, 3:], p[:, 2] - p[:, 1], dim=0, output_size=self.batch * self.q_len)
        q = torch.arange(self.q_len, device=device).repeat(self.batch)
        begin, end = per_row[:, 0] * q + per_row[:, 1], per_row[:, 2] * q + per_row[:, 3]
        return begin.view(self.batch, self.q_len), end.view(self.batch, self.q_len)


def read_definition(tree, batch: int, q_len: int, k_len: int, q_offset: int, kv_offset: int):
    """(Verdict, RowPieces) of the [batch, 1, q_len, k_len] mask a parsed tree defines, its
    tables read here (one copy), or Unrecognised naming the value that is not one interval
    a row."""
    return start_definition(tree, batch, q_len, k_len, q_offset, kv_offset)()


def start_definition(tree, batch: int, q_len: int, k_len: int, q_offset: int, kv_offset: int, tables=None):
    """read_definition in two halves: the tables' device pass enqueued now (their values as
    the stream has them here), and a function of no argument that waits for its copy
    alone and returns what read_definition returns (or raises its Unrecognised). tables:
    _tables(tree) where the caller has it (parse's _Walk.tables is the same dict)."""
    found = _tables(tree) if tables is None else tables
    finish = _start_tables(found)

    def read():
        encoded, tables, lists, keep = _gathered(tree, found, finish())
        verdict, pieces = _reason(_core.read_definition(encoded, tables, lists, batch, q_len, k_len, q_offset,
                                                        kv_offset))
        del keep  # the CPU tables' memory, read now
        return verdict, RowPieces(pieces, batch, q_len)
    return read


def row_intervals(tree, batch: int, q_len: int, k_len: int, q_offset: int, kv_offset: int):
    """Each row's keys [begin, end) as numpy arrays [batch, q_len] on the host."""
    return read_definition(tree, batch, q_len, k_len, q_offset, kv_offset)[1].rows()



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
    # The rule: each row's interval over the key values (indices are the values here): the
    # rows are pieces of consecutive points, the query value rising by 1 along each.
    p = pts.numpy()
    cuts = [0, *(np.flatnonzero(np.diff(p) != 1) + 1), n]
    starts = [(b, lo, hi, 1, p[lo] - lo, 0, 0) for b in range(batch) for lo, hi in zip(cuts, cuts[1:])]
    encoded, tables, lists, keep = _read(tree)
    answer = _core.definition_pieces(encoded, tables, lists, batch, np.array(starts, dtype=np.int64), -1)
    del keep
    if isinstance(answer, str):
        _disable(name, f"its rule could not be evaluated: {answer}")
    begin, end = (torch.from_numpy(r) for r in RowPieces(answer, batch, n).rows())
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
        tree = parse(args["mask_function"])
        padding = mu.prepare_padding_mask(args["attention_mask"], args["kv_length"], args["kv_offset"])
        tree = ("and", (), (tree, ("padding", (padding,), ())))
        begin, end = (torch.from_numpy(r) for r in row_intervals(tree, 2, args["q_length"], args["kv_length"],
                                                                 args["q_offset"], args["kv_offset"]))
        keys = torch.arange(args["kv_length"])
        got = (keys >= begin.unsqueeze(-1)) & (keys < end.unsqueeze(-1))
        if not torch.equal(got, dense):
            _disable("sdpa_mask", "its padding or offsets differ from masklens' reading")
    _sdpa_pinned = True


# ---- the definition as a whole ----

# What reading a definition may raise where a closure is not laid out as the primitive's
# was (a transformers that renamed a variable, say), or a device read fails: not read.
_READ_ERRORS = (AttributeError, KeyError, IndexError, TypeError, ValueError, RuntimeError)


class Definition:
    """A mask read from its definition: the verdict (its structure and rows) without a
    [B, 1, Q, K] tensor; the rows as pieces (RowPieces) and the device they serve.

    The read may be pending (recognise(defer=True)): the tables' device pass is enqueued
    and the verdict is waited for at its first use (`verdict`, `pieces`, `entry`). Its
    Unrecognised (a padding mask with holes, say: only the tables' values tell) is raised
    there, at every use."""

    __slots__ = ("batch", "q_len", "k_len", "tree", "device", "_read", "_verdict", "_pieces", "_failed", "_entry")

    def __init__(self, batch, q_len, k_len, tree, read, device="cpu"):
        """read: (Verdict, RowPieces), or a function of no argument that gives them."""
        self.batch, self.q_len, self.k_len = batch, q_len, k_len
        self.tree = tree
        self.device = device if type(device) is torch.device else torch.device(device)
        self._read, self._verdict, self._pieces, self._failed, self._entry = None, None, None, None, None
        if callable(read):
            self._read = read
        else:
            self._verdict, self._pieces = read

    @property
    def pending(self) -> bool:
        """Whether the read is still to be waited for."""
        return self._read is not None

    def _resolve(self):
        if self._read is not None:
            read, self._read = self._read, None
            try:
                self._verdict, self._pieces = read()
            except Unrecognised as e:
                self._failed = e
            except _READ_ERRORS as e:  # as recognise() takes them: not read, never guessed
                self._failed = Unrecognised(f"the definition could not be read: {type(e).__name__}: {e}")
            except BaseException:  # an interrupt, say: the read is still to be made
                self._read = read
                raise
        if self._failed is not None:
            raise Unrecognised(str(self._failed))

    @property
    def verdict(self):
        self._resolve()
        return self._verdict

    @property
    def pieces(self):
        self._resolve()
        return self._pieces

    def failure(self):
        """The read waited for: None where it gave the verdict, else its Unrecognised."""
        try:
            self._resolve()
        except Unrecognised as e:
            return e
        return None

    @property
    def entry(self):
        """The verdict as the drop-in's cache holds one (its policies per call, what was
        derived from it), one for every mask this definition stands for."""
        if self._entry is None:
            from . import _verdicts
            self._entry = _verdicts.Entry(None, self.verdict)
        return self._entry

    def bounds(self):
        """[B, 1, Q, 2] int64 on the mask's device: each row's first and last key, (K, -1)
        for a row that attends nothing (the table _mask_mods.bounds_mask_mod reads)."""
        begin, end = self.pieces.rows_on(self.device)
        empty = begin >= end
        first = begin.masked_fill(empty, self.k_len)
        last = (end - 1).masked_fill(empty, -1)
        return torch.stack([first, last], -1).unsqueeze(1)


# sdpa_mask's arguments that do not change the mask it builds (the skips say whether it
# builds one; dtype and config serve other mask functions). Any other argument is
# something this reading does not know: the mask is built.
_NEUTRAL_ARGUMENTS = {"local_size", "allow_is_causal_skip", "allow_is_bidirectional_skip", "allow_torch_fix",
                      "use_vmap", "dtype", "config"}


# Every argument recognise() reads or knows to be neutral, by sdpa_mask's names.
_ARGUMENTS = frozenset({"batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function",
                        "attention_mask", "device"}) | _NEUTRAL_ARGUMENTS


def _refuse_unknown(names) -> None:
    unknown = sorted(set(names) - _ARGUMENTS)
    if unknown:
        raise Unrecognised(f"sdpa_mask arguments masklens does not read: {', '.join(unknown)}")


def recognise(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
              device="cpu", defer=False, **others):
    """The Definition of the mask sdpa_mask would build from these arguments (its own
    keyword names), or Unrecognised saying which node or value is not read back. The rows
    are worked out on `device` (the mask's). defer=True leaves the tables' read pending
    where it reads any (Definition.pending): what only their values can say is raised
    at the verdict's first use."""
    _refuse_unknown(others)
    return _recognised(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, device,
                       defer)


def recognise_arguments(arguments: dict, device: torch.device, defer=False):
    """recognise() of sdpa_mask's keyword arguments as a mask function receives them: the
    dict itself (the mask function's path unpacks nothing) and the mask's device (a
    torch.device, or what makes one)."""
    if not arguments.keys() <= _ARGUMENTS:
        _refuse_unknown(arguments)
    get = arguments.get
    return _recognised(get("batch_size"), get("q_length"), get("kv_length"), get("q_offset", 0), get("kv_offset", 0),
                       get("mask_function"), get("attention_mask"), device, defer)


def _recognised(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, device, defer):
    """What recognise() and recognise_arguments() share: the read, with anything a closure
    laid out otherwise raises (or a device that is none) as Unrecognised."""
    try:
        if type(device) is not torch.device:
            device = torch.device(device)
        if not _sdpa_pinned:
            _pin_sdpa_mask()
        return _recognise(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                          device, defer)
    except Unrecognised:
        raise
    except _READ_ERRORS as e:
        # A closure that is not laid out as the primitive's was (a transformers that renamed
        # a variable, say): not read, never guessed.
        raise Unrecognised(f"the definition could not be read: {type(e).__name__}: {e}") from e


def _recognise(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, device, defer):
    mu = _originals or _mu()
    if mask_function is None:
        mask_function = mu.causal_mask_function
    # Plain ints, as transformers passes them, are taken as they are (_int reads the rest).
    B = batch_size if type(batch_size) is int else _int(batch_size, "batch_size")
    Q = q_length if type(q_length) is int else _int(q_length, "q_length")
    K = kv_length if type(kv_length) is int else _int(kv_length, "kv_length")
    qo = q_offset if type(q_offset) is int else _int(q_offset, "q_offset")
    ko = kv_offset if type(kv_offset) is int else _int(kv_offset, "kv_offset")
    if min(B, Q, K) < 1:
        raise Unrecognised(f"an empty mask [{B}, 1, {Q}, {K}]")
    if min(qo, ko) < 0:
        raise Unrecognised(f"negative offsets q_offset {qo}, kv_offset {ko}")
    walk = _Walk()  # the tables and the nodes to pin, gathered as the tree is read
    tree = parse(mask_function, None, walk)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
            raise Unrecognised("an attention_mask that is not a 2-D tensor")
        if attention_mask.dtype != torch.bool:  # transformers' create_*_mask hand a bool one
            raise Unrecognised(f"an attention_mask of dtype {attention_mask.dtype} (sdpa_mask ANDs it as it is)")
        padding = _meta(mu.prepare_padding_mask(attention_mask, K, ko), "padding_mask")
        walk.table(padding)
        tree = ("and", (), (tree, walk.node(("padding",), ("padding", (padding,), ()))))
        walk.node(("and",), tree)
    for node in walk.unpinned:  # children first: pin() finds them pinned
        pin(node)
    # The rows' spans are exactly a scan's of the dense bool mask (no flags): the
    # classifier's verdict over their pieces is the scan's.
    read = start_definition(tree, B, Q, K, qo, ko, walk.tables)  # the tables' runs, crossing to the host together
    return Definition(B, Q, K, tree, read if defer and walk.tables else read(), device)


class DefinedMask:
    """What the attention layers receive in place of transformers' [B, 1, Q, K] mask: the
    mask's Definition (its verdict: structure and rows), and how to build the dense mask
    should anything need it. Tensor-like: it has the mask's shape, dtype (bool) and
    device, and .to(device) moves it unbuilt; any other use by the model's code (an
    operator, a torch function, a tensor attribute or method, an index, a write) builds
    the dense mask once, logs why, and acts on it, and the layers then take that tensor
    (proven by a scan: the code may have written it), so code that touches the mask
    between the mask function and attention gets the mask it expects."""

    __slots__ = ("definition", "shape", "device", "_outcome", "touched", "_build", "_dense", "_stand_ins",
                 "__weakref__")

    dtype = torch.bool
    layout = torch.strided
    is_nested = False
    requires_grad = False
    ndim = 4

    def __init__(self, definition, device, build, outcome=None):
        """outcome: () -> (how, what), what the mask stands for once its definition's read
        (pending or not) is waited for: ("definition", ...), ("none", ...) where sdpa_mask
        gives none, ("built", why) where it is not read back; by default ("definition", its
        structure), or ("built", why)."""
        self.definition = definition
        self.shape = torch.Size((definition.batch, 1, definition.q_len, definition.k_len))
        self.device = device if type(device) is torch.device else torch.device(device)
        self._outcome = outcome
        self.touched = False    # the model's code used the dense mask (the layers take that tensor)
        self._build = build     # () -> the dense mask (transformers' sdpa_mask with the same arguments)
        self._dense = None
        self._stand_ins = {}

    def outcome(self) -> tuple:
        """(how, what) the mask stands for, its definition's read waited for (the
        constructor's `outcome`)."""
        if self._outcome is not None:
            return self._outcome()
        failure = self.definition.failure()
        return ("built", str(failure)) if failure is not None else ("definition", self.structure.describe())

    @property
    def entry(self):
        """The verdict as the drop-in's cache holds one (its policies per call), shared by
        every mask of the definition; waits for a pending read."""
        return self.definition.entry

    @property
    def verdict(self):
        return self.definition.verdict

    @property
    def structure(self):
        return self.definition.verdict.structure

    def _describe(self) -> str:
        """The structure's description, or why the definition is not read back (a pending
        read waited for)."""
        failure = self.definition.failure()
        return f"a definition not read back ({failure})" if failure is not None else self.structure.describe()

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
            moved = DefinedMask(self.definition, target, self._build, self._outcome)
            if self._dense is not None:
                moved._dense, moved.touched = self._dense.to(target), self.touched
            return moved
        return self._used("to").to(*args, **kwargs)

    @torch.compiler.disable
    def materialise(self, why: str) -> torch.Tensor:
        """The dense [B, 1, Q, K] bool mask, built once (logged with `why`)."""
        if self._dense is None:
            logger.info("masklens: building the dense mask %s of %s: %s", tuple(self.shape), self._describe(), why)
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
        return f"<masklens DefinedMask {tuple(self.shape)} {self._describe()}>"


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
