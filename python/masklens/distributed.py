"""masklens under context parallelism: the ranks of a sharded sequence agree on one
verdict, and attention runs on torch's own CP engine (docs/distributed.md).

    import masklens.distributed as mld
    cp = mld.ContextParallel(mesh, sharding="load_balanced")   # or "contiguous"
    local_mask = cp.shard(mask, dim=-2)          # this rank's query rows, as CP shards them
    q, k, v = (cp.shard(t, dim=2) for t in (q, k, v))
    with cp:                                     # torch's CP dispatcher, forward and backward
        report = cp.inspect(local_mask, q)       # one all_gather: every rank the same Report
        out = cp.attention(q, k, v, report, local_mask)

Spans are a monoid over row shards (row_span.hpp): each rank scans only its rows into
span runs (the device scanner on a CUDA mask where masklens._cuda is built, else the host
scanner), the ranks all_gather the runs (O(runs): one run for a causal shard, a few for a
window or padding, one per document) with their row counts, and every rank reassembles
the whole table's runs in global row order and classifies them (classify_runs.hpp:
deterministic, so every rank holds the same verdict, which equals masklens.inspect's on
the whole mask). A plain causal verdict runs as `is_causal` through torch's SDPA ring
(CUDA only); every other exact structure and any arbitrary mask runs as FlexAttention
with the keys and values all-gathered by torch's `flex_cp_allgather` and a BlockMask of
this rank's rows built by masklens (tiles from the local rows, the structure's rule as
mask_mod). Nothing here moves data but torch.distributed's collectives.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist

import masklens
from . import _block_mask, _core, _inspect, _scan, _verdicts

SHARDINGS = ("contiguous", "load_balanced")

# A rank's header in the gather: status (0 ok, 1 its scan failed), its rows, the mask's
# batch, heads and keys, its distinct batch and heads (0: no rows, no opinion), its runs;
# then what every rank must have asked alike: the sharding and the masked threshold (its
# float64 bits). Ranks that read their rows differently would merge into verdicts that
# differ by rank, and then run different collectives.
_HEADER = 10
_OK, _FAILED = 0, 1
# Runs that travel in the first all_gather: a structured shard has a handful, so one
# collective settles it; more (an arbitrary mask) take a second, sized by the largest.
EAGER_RUNS = 256
_RUN_COLUMNS = 8  # (row, length, first, last, d_first, d_last, count, flags): Verdict.runs
_KEPT_BLOCK_MASKS = 8  # a training step's masks (one per mask kind), not every step's


# ---------------------------------------------------------------------------------
# Which rows a rank holds

def _check_sharding(sharding: str) -> None:
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
    _check_sharding(sharding)
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


# ---------------------------------------------------------------------------------
# This rank's runs

def _as_4d(mask):
    """The mask as [B, H, rows, K] (leading dims of 1 added), a torch tensor or numpy array."""
    if isinstance(mask, torch.Tensor):
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        return mask
    return mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))


def _distinct(view) -> tuple[int, int]:
    """Distinct batch and heads a scan of `view` (a torch tensor) stores: one where the
    dimension is 1 or of stride 0 (as SpanTable::for_view sizes it)."""
    b, h = view.shape[0], view.shape[1]
    return (1 if view.stride(0) == 0 or b == 1 else b), (1 if view.stride(1) == 0 or h == 1 else h)


def _local_runs(view, masked_threshold: float):
    """(int64 [runs, 8] of this rank's rows, numbered slice * rows + q; (distinct batch,
    distinct heads)): on the device where masklens._cuda is built and the mask is there,
    else on the host (scanned and encoded, not classified)."""
    if isinstance(view, torch.Tensor) and view.device.type == "cuda" and _scan.cuda_module() is not None:
        verdict = _scan.device_scan(view.detach(), masked_threshold)
        _scan.counted_scan()
        return np.asarray(verdict.runs, dtype=np.int64).reshape(-1, _RUN_COLUMNS), _distinct(view)
    host = _scan.host_array(view) if isinstance(view, torch.Tensor) else view
    table, runs = _core.scan_runs(host, masked_threshold)
    _scan.counted_scan()
    return np.asarray(runs), (table[4], table[5])


class _ShardError:
    """A shard that failed before its scan (inspect's broadcast): its message travels in the
    gather like a scan's error."""

    def __init__(self, message: str):
        self.message = message


def _scan_shard(local_mask, masked_threshold: float, sharding: str = "contiguous"):
    """(header int64 [_HEADER], runs int64 [n, 8], error message or None) of this rank."""
    header = np.zeros(_HEADER, dtype=np.int64)
    runs = np.zeros((0, _RUN_COLUMNS), dtype=np.int64)
    try:
        # Every argument is checked here, inside the gather's try: a rank that raised before
        # the collective would leave the others waiting in it until the group's timeout.
        if isinstance(local_mask, _ShardError):
            raise _core.MaskError(local_mask.message)
        _check_sharding(sharding)
        masked_threshold = _scan.threshold_value(masked_threshold)
        header[8] = SHARDINGS.index(sharding)
        header[9] = np.array([masked_threshold], dtype=np.float64).view(np.int64)[0]
        mask = _scan.readable(local_mask)
        if len(mask.shape) < 2 or len(mask.shape) > 4:
            raise _core.MaskError(f"invalid_shape: a shard of a mask's rows has 2 to 4 dims ([..., rows, K]), got "
                                  f"{len(mask.shape)}")
        view = _as_4d(mask)
        batch, heads, rows, keys = (int(n) for n in view.shape)
        db = dh = 0  # no rows: no say in how many slices are distinct
        if rows > 0:
            runs, (db, dh) = _local_runs(view, masked_threshold)
        header[:8] = (_OK, rows, batch, heads, keys, db, dh, len(runs))
        return header, runs, None
    except Exception as e:  # noqa: BLE001 - whatever it is, every rank must hear of it in the gather
        header[0] = _FAILED
        return header, runs, str(e) if isinstance(e, _core.MaskError) else f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------
# The agreement: one all_gather (two past EAGER_RUNS runs on some rank)

def _collective_device(group, mask):
    """Where the gathered tensors live: the current CUDA device for NCCL (it takes CUDA
    tensors only), the CPU for gloo (and a CPU mask under a group that has both)."""
    backend = str(dist.get_backend(group)).lower()
    on_cuda = isinstance(mask, torch.Tensor) and mask.device.type == "cuda"
    if "nccl" in backend and ("gloo" not in backend or on_cuda):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather(array: np.ndarray, group, device) -> np.ndarray:
    """[world, *array.shape]: every rank's array (same shape on every rank)."""
    mine = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return torch.stack(out).cpu().numpy()


def _check_asked_alike(headers) -> None:
    """A MaskError on every rank where the ranks scanned with different shardings or
    thresholds (every rank sees the same headers, so every rank raises)."""
    shardings = [SHARDINGS[int(c)] for c in headers[:, 8]]
    thresholds = headers[:, 9].astype(np.int64).view(np.float64).tolist()
    if len(set(shardings)) > 1 or len(set(headers[:, 9].tolist())) > 1:
        raise _core.MaskError(f"invalid_argument: the ranks scanned their rows differently: sharding {shardings}, "
                              f"masked_threshold {thresholds} by rank; every rank of the group must pass the same")


def _gather(header, runs, error, group, device):
    """Every rank's header and runs (a list of int64 [n_r, 8]), identical on every rank; a
    MaskError on every rank naming each rank whose scan failed."""
    first = np.zeros((EAGER_RUNS, _RUN_COLUMNS), dtype=np.int64)
    first[:min(len(runs), EAGER_RUNS)] = runs[:EAGER_RUNS]
    gathered = _all_gather(np.concatenate([header, first.ravel()]), group, device)
    headers = gathered[:, :_HEADER]
    if (headers[:, 0] != _OK).any():
        # Every rank saw the same headers, so every rank takes this path: one more gather,
        # of the messages, and the same error everywhere (no rank left waiting).
        messages = [None] * dist.get_world_size(group)
        dist.all_gather_object(messages, error, group=group)
        failed = "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)
        raise _core.MaskError(f"{failed} (rows numbered within the rank's shard)")
    _check_asked_alike(headers)
    counts = headers[:, 7]
    gathered_runs = [gathered[r, _HEADER:].reshape(EAGER_RUNS, _RUN_COLUMNS)[:min(n, EAGER_RUNS)]
                     for r, n in enumerate(counts)]
    most = int(counts.max())
    if most > EAGER_RUNS:  # the same decision on every rank: all take the second gather
        rest = np.zeros((most - EAGER_RUNS, _RUN_COLUMNS), dtype=np.int64)
        rest[:max(len(runs) - EAGER_RUNS, 0)] = runs[EAGER_RUNS:]
        more = _all_gather(rest, group, device)
        gathered_runs = [np.concatenate([g, more[r, :max(int(n) - EAGER_RUNS, 0)]])
                         for r, (g, n) in enumerate(zip(gathered_runs, counts))]
    return headers, gathered_runs


# ---------------------------------------------------------------------------------
# The merge: the whole table's runs in global row order (the same on every rank)

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
    _check_sharding(sharding)
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


# ---------------------------------------------------------------------------------
# The agreed verdict and report

def _group_of(group, mesh):
    if mesh is not None:
        return mesh.get_group()
    return group if group is not None else dist.group.WORLD


def scan(local_mask, *, group=None, sharding: str = "contiguous", masked_threshold: float = -1000.0):
    """The Verdict of the whole mask from this rank's rows of it (`local_mask`: [..., rows,
    K], the query rows this rank holds under `sharding`, every key): each rank scans its
    rows into span runs, one all_gather brings every rank's runs (a second where some rank
    has more than EAGER_RUNS), and each rank classifies the same merged runs. Equal to
    masklens.scan() of the whole mask; the same on every rank. A collective: every rank of
    `group` calls it, with its own rows. A rank whose scan fails (NaN, a bad dtype) makes
    every rank raise the same MaskError, naming it."""
    group = _group_of(group, None)
    header, runs, error = _scan_shard(local_mask, masked_threshold, sharding)
    headers, gathered = _gather(header, runs, error, group, _collective_device(group, local_mask))
    table, merged = merge_runs(headers, gathered, sharding)
    return _core.classify_runs(table, merged)


def inspect(local_mask, query=None, key=None, value=None, *, group=None, sharding: str = "contiguous",
            masked_threshold: float = -1000.0, max_plan_calls: int = 64, strict: bool = False, **fields):
    """masklens.inspect() of the whole mask from this rank's rows of it: the agreed verdict
    (scan() above: one collective) and the decision for the whole call. query, key, value
    are this rank's shards ([B, H, rows, D]); the call's lengths are the whole sequence's
    (Q the ranks' rows together, K the mask's keys). Report.to_dict() equals
    masklens.inspect(whole_mask, whole_q, whole_k, whole_v).to_dict()."""
    try:
        call_fields, env_fields = _inspect.split_fields(dict(fields))
        mask = view = _scan.readable(local_mask, check_dims=query is None)
        if query is not None:
            # Broadcast as SDPA reads it, against the local query and the mask's own keys
            # (the key shard is not the keys the rows attend to).
            view = _inspect.broadcast_to_call(mask, query, None)
        # The call's and the environment's fields checked now, with the local lengths (the
        # whole call is made after the gather, from the same fields).
        masklens.make_call(view, query, key, value, **call_fields)
        masklens.environment(_cuda_device(query, mask), **env_fields)
    except Exception as e:  # noqa: BLE001 - raised in the collective, on every rank (see _scan_shard)
        mask, view = None, _ShardError(str(e) if isinstance(e, _core.MaskError) else f"{type(e).__name__}: {e}")
    verdict = scan(view, group=group, sharding=sharding, masked_threshold=masked_threshold)
    s = verdict.structure
    if query is not None:
        call_fields = {"q_len": s.q_len, "k_len": s.k_len, **call_fields}
    call = masklens.make_call(view, query, key, value, **call_fields)
    env = masklens.environment(_cuda_device(query, mask), **env_fields)
    try:
        policy, error = masklens.decide(s, call, env, max_plan_calls), None
    except _core.MaskError as e:
        if strict:
            raise
        policy, error = None, str(e)
    return masklens.Report(verdict, policy, call, env, error)


def _cuda_device(query, mask):
    """The CUDA device of the query or the mask (the environment decided for), or None."""
    return next((t.device for t in (query, mask) if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)


# ---------------------------------------------------------------------------------
# Attention on torch's CP engine

def is_plain_causal(structure) -> bool:
    """Whether `is_causal` alone computes the structure: causal, as many keys as queries, no
    padding, documents, bias or rows masked by finite values (what torch's SDPA ring
    attention takes: is_causal and no mask)."""
    s = structure
    return (s.kind == "causal" and s.q_len == s.k_len and s.segments is None and s.kv_valid is None
            and s.q_valid is None and s.empty_rows == 0 and s.finite_masked_rows == 0 and not s.bias)


def _check_flex_structure(structure) -> None:
    """FlexAttention's mask_mod keeps or drops a key: a bias, or rows masked only by finite
    values (which attend uniformly in a dense softmax), are not a mask_mod."""
    if structure.bias or structure.finite_masked_rows:
        raise _core.MaskError("invalid_argument: a mask carrying an additive bias, or rows masked only by finite "
                              "values, is not a FlexAttention mask_mod: under CP masklens runs masks that keep or "
                              "drop keys (docs/distributed.md)")


def _gqa(query, key):
    return {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}


def _agreed_arguments(group, sharding, block_size):
    """ContextParallel's sharding and block size, checked on this rank and then with every
    rank of the group (one all_gather_object): a bad or differing argument on any rank is
    a MaskError on every rank, where one rank raising alone would leave the others waiting
    in their next collective. The block size as (q, k)."""
    error, size = None, None
    try:
        _check_sharding(sharding)
        size = _scan.tile_size(block_size)
        if min(size) < 1:
            raise _core.MaskError(f"invalid_argument: block_size must be a tile size N or (q, k), integers >= 1, got "
                                  f"{block_size!r}")
    except _core.MaskError as e:
        error = str(e)
    said = [None] * dist.get_world_size(group)
    dist.all_gather_object(said, (error, sharding if isinstance(sharding, str) else repr(sharding), size), group=group)
    failed = "; ".join(f"rank {r}: {e}" for r, (e, _, _) in enumerate(said) if e is not None)
    if failed:
        raise _core.MaskError(f"ContextParallel: {failed}")
    if len({(sh, sz) for _, sh, sz in said}) > 1:
        raise _core.MaskError("invalid_argument: ContextParallel: the ranks differ in sharding or block_size: "
                              f"{[(sh, sz) for _, sh, sz in said]} by rank; every rank of the group must pass the same")
    return size


class ContextParallel:
    """masklens on torch's context parallelism over `mesh` (a 1-D DeviceMesh; its group is
    the CP group). sharding: "contiguous" (torch's Shard(seq_dim)) or "load_balanced"
    (torch's head-tail load balancer). `with cp:` turns torch's CP dispatcher on (and its
    load-balance option to match the sharding) for the forward and the backward: SDPA ring
    attention dispatches through it."""

    def __init__(self, mesh, sharding: str = "contiguous", block_size: int = 128):
        self.mesh = mesh
        self.group = mesh.get_group()
        self.sharding = sharding
        self.block_size = _agreed_arguments(self.group, sharding, block_size)
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self._active = 0
        self._saved_balance = None
        # The last few BlockMasks: (report, local mask, device) -> BlockMask; the objects are
        # held with it, so an id is never another object's.
        self._block_masks = {}

    # -- torch's CP dispatcher ----------------------------------------------------------
    def __enter__(self):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
        if self._active == 0:
            self._saved_balance = cp_attention._cp_options.enable_load_balance
            cp_attention._cp_options.enable_load_balance = self.sharding == "load_balanced"
            cp_attention._enable_context_parallel_dispatcher()
        self._active += 1
        return self

    def __exit__(self, *exc):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
        self._active -= 1
        if self._active == 0:
            cp_attention._disable_context_parallel_dispatcher()
            cp_attention._cp_options.enable_load_balance = self._saved_balance
        return False

    # -- shards and the verdict ---------------------------------------------------------
    def shard(self, tensor, dim: int):
        """This rank's part of a whole-sequence tensor along `dim` (mask rows: -2; q, k, v: 2)."""
        return shard(tensor, dim, rank=self.rank, world_size=self.world_size, sharding=self.sharding)

    def unshard(self, tensor, dim: int):
        """The whole sequence from every rank's part along `dim` (an all_gather, put back in
        global order): for checking outputs."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        whole = torch.cat(parts, dim)
        order = torch.as_tensor(np.argsort(sequence_order(whole.shape[dim], self.world_size, self.sharding)),
                                device=whole.device)
        return whole.index_select(dim, order)

    def inspect(self, local_mask, query=None, key=None, value=None, **kwargs):
        return inspect(local_mask, query, key, value, group=self.group, sharding=self.sharding, **kwargs)

    def scan(self, local_mask, masked_threshold: float = -1000.0):
        return scan(local_mask, group=self.group, sharding=self.sharding, masked_threshold=masked_threshold)

    # -- attention ----------------------------------------------------------------------
    def uses_ring(self, structure, device) -> bool:
        """Whether attention() runs torch's SDPA ring (`is_causal`): a plain causal verdict on
        CUDA. CP's ring dispatches only the CUDA SDPA kernels (flash, efficient, cuDNN)."""
        return is_plain_causal(structure) and torch.device(device).type == "cuda"

    def attention(self, query, key, value, report, local_mask=None, *, scale=None, compiled=None):
        """This rank's attention output ([B, H, rows, D]) for its shards of q, k, v under the
        agreed `report` (a Report or Verdict from inspect()/scan()). A plain causal verdict on
        CUDA runs F.scaled_dot_product_attention(is_causal=True) on DTensors sharded on the
        sequence: torch's ring attention (inside `with cp:` when gradients flow, so that the
        backward is dispatched too). Anything else runs flex_attention on this rank's
        queries against the keys and values all-gathered by torch's flex_cp_allgather (its
        backward reduce-scatters the gradients), with masklens' BlockMask of this rank's rows
        (cp.block_mask). compiled: torch.compile'd flex (default on CUDA; eager on the CPU,
        where flex has no backward)."""
        structure = report.structure
        if structure.q_len != structure.k_len:
            raise _core.MaskError("invalid_argument: CP shards queries and keys alike: the mask must have as many keys "
                                  f"as queries, got Q={structure.q_len}, K={structure.k_len}")
        self._check_shards(structure.q_len, query)
        if self.uses_ring(structure, query.device):
            return self._ring_causal(query, key, value, scale)
        _check_flex_structure(structure)
        if structure.kind == "arbitrary" and local_mask is None:
            raise _core.MaskError("invalid_argument: an arbitrary mask's BlockMask reads the mask: pass local_mask")
        from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather
        from torch.distributed.distributed_c10d import _get_process_group_name
        block_mask = self.block_mask(report, local_mask, query.device)
        whole_key, whole_value = flex_cp_allgather(key.contiguous(), value.contiguous(), 2,
                                                   _get_process_group_name(self.group))
        return _flex(compiled, query.device)(query, whole_key, whole_value, block_mask=block_mask, scale=scale,
                                            **_gqa(query, key))

    def _check_shards(self, q_len: int, query) -> None:
        """torch's CP gathers and rotates equal shards (all_gather_tensor): Q must divide by
        W (contiguous) or by 2W (load_balanced: torch's head-tail chunks); the same test on
        every rank, so every rank raises alike before any collective."""
        parts = self.world_size * (2 if self.sharding == "load_balanced" else 1)
        if q_len % parts:
            raise _core.MaskError(f"invalid_shape: torch's context parallelism runs shards of equal length: Q={q_len} "
                                  f"does not divide into {parts} {self.sharding} parts (W={self.world_size}); the "
                                  "verdict (inspect, scan) takes any length")
        if query.shape[2] * self.world_size != q_len:
            raise _core.MaskError(f"invalid_shape: this rank's query holds {query.shape[2]} rows; its shard of "
                                  f"Q={q_len} over {self.world_size} ranks is {q_len // self.world_size}")

    def _ring_causal(self, query, key, value, scale):
        from torch.distributed.tensor import DTensor, Shard
        import torch.nn.functional as F
        needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if needs_backward and not self._active:
            raise RuntimeError("masklens.distributed: the SDPA ring's backward is dispatched by torch's CP "
                               "dispatcher: run the forward and the backward inside `with cp:`")
        if key.shape[1] != query.shape[1]:
            # GQA: CP's ring calls the flash / efficient / cuDNN ops, which take as many key
            # heads as query heads: repeat them, as SDPA does without enable_gqa.
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        with self if not self._active else contextlib.nullcontext():
            q, k, v = (DTensor.from_local(t.contiguous(), self.mesh, [Shard(2)], run_check=False)
                       for t in (query, key, value))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            return out.to_local()

    # -- transformers -------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, report, local_mask=None):
        """A training or inference step of a transformers model whose attn_implementation is
        "masklens_cp" (register_transformers()): every attention layer runs attention() with
        this agreed report and this rank's mask rows (transformers builds no mask: from a
        shard of input_ids it would see only local positions). torch's CP dispatcher is on
        inside: run the forward and the backward in it."""
        global _step
        previous, _step = _step, (self, report, local_mask)
        try:
            with self:
                yield self
        finally:
            _step = previous

    # -- BlockMask of this rank's rows ----------------------------------------------------
    def block_mask(self, report, local_mask=None, device=None):
        """FlexAttention's BlockMask of this rank's query rows against the whole sequence in the
        order the ranks' shards gather (flex CP's coordinates: local q, gathered kv). Its
        tiles are read from the local rows with their keys put in that order (one local read:
        on the device where masklens._cuda writes tiles, else on the host); its mask_mod is
        the agreed structure's rule at the global positions (an exact structure: nothing held
        but the position tables) or, for an arbitrary mask, a lookup into the local rows.
        Memoised per report and local mask."""
        structure = report.structure
        device = torch.device(device) if device is not None else (
            local_mask.device if local_mask is not None else torch.device("cpu"))
        # The mask's version too: a buffer refilled in place (same object) is another mask.
        version = None if local_mask is None else _verdicts.tensor_key(local_mask, None)
        key = (id(report), id(local_mask), version, str(device))
        if key not in self._block_masks:
            if len(self._block_masks) >= _KEPT_BLOCK_MASKS:
                self._block_masks.pop(next(iter(self._block_masks)))
            self._block_masks[key] = (report, local_mask, self._build_block_mask(structure, local_mask, device))
        return self._block_masks[key][2]

    def _build_block_mask(self, structure, local_mask, device):
        Q = structure.q_len
        mine = positions(Q, self.world_size, self.rank, self.sharding)
        order = sequence_order(Q, self.world_size, self.sharding)
        identity = self.sharding == "contiguous"
        rows = local_mask if local_mask is not None else _structure_rows(structure, mine, device)
        rows = _as_4d(torch.as_tensor(rows)).to(device)
        if not identity:
            rows = rows.index_select(3, torch.as_tensor(order, device=device))
        if structure.kind == "arbitrary":
            mask_mod = _block_mask.mask_mod_for(structure, device, _block_mask.attends(rows))
        else:
            mask_mod = _global_rule(structure, device, mine, None if identity else order)
        return _local_block_mask(rows, self.block_size, mask_mod, device)


_step = None  # (ContextParallel, report, local mask) of the step inside ContextParallel.step()

TRANSFORMERS_NAME = "masklens_cp"


def _transformers_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                            **kwargs):
    """transformers' attention contract (sdpa_attention_forward's): query/key/value [B, H, L,
    D] of this rank's tokens, returns (out [B, L, H, Dv], None). The step's report decides,
    not `attention_mask` (None: the mask function below builds none)."""
    if _step is None:
        raise RuntimeError(f'attn_implementation="{TRANSFORMERS_NAME}" runs inside ContextParallel.step(report, '
                           "local_mask), which holds the ranks' agreed verdict")
    if dropout:
        raise ValueError(f'"{TRANSFORMERS_NAME}" attention runs without dropout (flex and the SDPA ring under CP)')
    # One step holds one report: a model whose layers attend through different masks
    # (sliding and full layers) would run every layer on it.
    layer_types = getattr(getattr(module, "config", None), "layer_types", None)
    if kwargs.get("sliding_window") is not None or len(set(layer_types or ())) > 1:
        raise ValueError(f'"{TRANSFORMERS_NAME}" runs models whose layers share one mask; this one has layer types '
                         f"{sorted(set(layer_types or ()))} (sliding_window={kwargs.get('sliding_window')})")
    cp, report, local_mask = _step
    out = cp.attention(query, key, value, report, local_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    """transformers' mask function for "masklens_cp": none (the step holds the mask)."""
    return None


def register_transformers() -> None:
    """Registers attn_implementation="masklens_cp" with transformers' AttentionInterface and
    AttentionMaskInterface: a model run inside ContextParallel.step() on this rank's shard of
    input_ids (and of position_ids: the global positions) attends as the whole sequence's
    mask says."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(TRANSFORMERS_NAME, _transformers_attention)
    AttentionMaskInterface.register(TRANSFORMERS_NAME, _no_mask)


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
    rule = _block_mask.mask_mod_for(structure, device)
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
        _, arrays = _block_mask.device_scan_tiles(rows.detach(), size, classify_many_runs=False)
        return _block_mask.block_mask_from_arrays(arrays, rows.shape[-2:], size, mask_mod)
    _, tiles = _scan.scan_with_tiles(rows.detach(), size)
    return _block_mask.block_mask_from_tiles(tiles, mask_mod, device)


_compiled_flex = None


def _flex(compiled, device):
    """flex_attention, torch.compile'd on CUDA by default (eager flex materialises the scores),
    with dynamic lengths: a new sequence length (dynamic padding) reuses the compiled
    kernel where a static compile would compile again, and past Dynamo's recompile limit
    fall back to the unfused path."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention
    if compiled is None:
        compiled = torch.device(device).type == "cuda"
    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex
