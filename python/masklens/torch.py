"""masklens.torch.scaled_dot_product_attention: torch's function, with the mask proven.

Same signature and result as torch.nn.functional.scaled_dot_product_attention (rows
that attend to nothing come out 0, as torch's math kernel gives them). With a dense
attn_mask it scans the mask once per tensor (cached, see masklens._cache), decides the
backend for the call (masklens.decide) and runs it: the mask dropped for is_causal or
causal_lower_right, a plan of slices, torch's varlen_attn, compiled FlexAttention,
flash-attn where installed, or the mask kept on a kernel that is correct for it.

Torch's own call runs unchanged, with the arguments given, where there is nothing to
prove or no time to prove it (no mask, is_causal=True, inside torch.compile, during CUDA
graph capture unless the call was run before it on the same, unchanged mask: then the
prepared call is replayed) and wherever masklens does not positively understand the call, so that
torch gives its result or raises its exception exactly as without masklens: tensors
that are not plain, 4-D, strided, of one dtype masklens decides for (float16, bfloat16,
float32) on one CPU or CUDA device; shapes, heads or a mask dtype torch refuses, a mask
that does not broadcast from 2 to 4 dims, an empty dimension; a scale that is not None
or finite and positive; a mask that requires grad in grad mode (its gradient is torch's
to compute); a mask masklens cannot read (NaN or +inf: with a warning naming it)
(_torch_runs_it, _refusal; docs/python.md).

A call on a mask and call seen before reads its entry (a memo of the last mask, then
the weak dictionary), the runner prepared for the call (masklens._run.Prepared) and
runs it: no scan, no decision, no check already made (bench/dropin_overhead.py).

    from masklens.torch import scaled_dot_product_attention, block_mask, inspect, load_kernels
    load_kernels()      # at start-up, after torch's CUDA context exists: masklens.load_kernels

load_kernels (masklens.load_kernels, here beside the functions a torch program calls)
loads the device scanner's CUDA kernels now, so that the first drop-in call on a CUDA
mask does not pay for loading them (CUDA loads a kernel at its first launch). True once
loaded; False, doing nothing, without masklens._cuda or a CUDA device. Nothing here
calls it.
"""
from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from . import _cache, _env, _run
from . import _core
from . import element_name, load_kernels, strict as _is_strict  # load_kernels: re-exported, see above
from ._run import set_flex_compile_ms  # noqa: F401  (the cold compile's cost: docs/python.md)

logger = logging.getLogger("masklens")

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_logged = set()


def _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


# Types the drop-in reads as they are: a subclass (a DTensor, a FakeTensor, a tensor with
# its own __torch_function__) goes to torch, which knows what it means.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# The scales the kernels take as a positive, finite float32 (they compute in float32): a
# float64 scale below the smallest normal float32 or above its largest becomes 0 or inf
# there, where a mask dropped for is_causal is not torch's dense result.
_SCALE_MIN = float(torch.finfo(torch.float32).tiny)
# The additive value at or below which the drop-in takes a key as masked (masklens.inspect's
# default, -1000, describes masks; the drop-in must compute torch's result). A dropped mask
# is exact where no logit of a row exceeds the row's best attended one by |value| - 104
# (exp underflows to 0 in float32 below -104): at -1e8 and below (finfo.min, -1e9, -inf)
# that holds for any logits of a finite result; -1e4 or -1000 stay additive values, the
# mask kept, since logit spreads in the thousands occur (large activations, scale=1e4).
DROPIN_MASKED_THRESHOLD = -1e8
_SCALE_MAX = float(torch.finfo(torch.float32).max)


def _torch_runs_it(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """Why this call goes to torch as it is (a short reason; None: masklens may take it),
    checked on every call (a few attribute reads): nothing to prove (no mask, is_causal),
    no time to prove it (inside torch.compile; CUDA graph capture is decided by the
    caller), or arguments masklens does not positively understand, where torch raises or
    runs as it would without masklens:
    - tensors that are not plain [B, H, L, D] tensors of one dtype masklens decides for
      (float16, bfloat16, float32; float64 runs only torch's math kernel anyway);
    - a scale that is not None or a positive number the kernels hold as a normal
      float32: with scale 0 or below (or one that is 0 or inf in float32), a mask dropped
      for is_causal is not torch's dense result (torch's CPU kernel gives NaN for
      is_causal there; the dense mask gives none);
    - a mask whose gradient autograd wants (it requires grad and grad mode is on): a
      learnable bias reaches torch's kernels, which compute its gradient; dropping it
      (even when its values are proven causal) would lose the gradient."""
    if attn_mask is None or is_causal:
        return "no mask to prove" if attn_mask is None else "is_causal=True"
    if (type(attn_mask) not in _PLAIN or type(query) not in _PLAIN or type(key) not in _PLAIN
            or type(value) not in _PLAIN):
        return "a tensor subclass (torch knows what it means)"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or attn_mask.is_nested or query.is_nested:
        return "tensors that are not [B, H, L, D]"
    dtype = query.dtype
    if dtype not in _DTYPES or key.dtype is not dtype or value.dtype is not dtype:
        return f"query/key/value dtypes {query.dtype}/{key.dtype}/{value.dtype} (masklens decides for fp16, bf16, fp32)"
    if scale is not None and not (type(scale) in (float, int) and _SCALE_MIN <= scale <= _SCALE_MAX):
        return f"scale {scale} (masklens takes a positive, normal float32 scale)"
    if type(dropout_p) not in (float, int) or not 0 <= dropout_p < 1:
        return f"dropout_p {dropout_p}"
    if attn_mask.requires_grad and torch.is_grad_enabled():
        return "a mask that requires grad in grad mode (its gradient comes from torch's kernels)"
    return "inside torch.compile" if torch.compiler.is_compiling() else None


def _refusal(query, key, value, attn_mask, enable_gqa):
    """Why masklens does not take this call (torch then runs it, or raises as torch does),
    or None: the checks made once per mask and call (the cache's keys hold what they
    read). The tensors are on one CPU or CUDA device, strided; their shapes agree as
    torch requires them to; the mask has a dtype torch takes with this query (bool,
    float32 or the query's own) and broadcasts to [B, H, Q, K] from 2 to 4 dims."""
    device = query.device
    if device.type not in ("cpu", "cuda"):
        return f"tensors on {device} (masklens reads CPU and CUDA masks)"
    if key.device != device or value.device != device or attn_mask.device != device:
        return (f"tensors on different devices: query {device}, key {key.device}, value {value.device}, "
                f"attn_mask {attn_mask.device}")
    strided = torch.strided
    if any(t.layout != strided for t in (query, key, value, attn_mask)):
        return f"a tensor of a layout other than strided (attn_mask: {attn_mask.layout})"
    B, H, Q, D = query.shape
    _, Hk, K, Dk = key.shape
    if min(B, H, Q, D, Hk, K) < 1 or value.shape[-1] < 1:
        return f"an empty dimension: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if key.shape[0] != B or value.shape[:3] != key.shape[:3] or Dk != D:
        return (f"shapes torch does not take together: query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                f"{tuple(value.shape)}")
    if Hk != H and not (enable_gqa and H % Hk == 0):
        return f"{H} query heads and {Hk} key heads" + ("" if enable_gqa else " without enable_gqa")
    if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
        return (f"an attn_mask of dtype {attn_mask.dtype} with a {query.dtype} query (torch takes bool, float32 or "
                "the query's dtype)")
    shape, target = tuple(attn_mask.shape), (B, H, Q, K)
    if not (2 <= len(shape) <= 4 and all(m in (t, 1) for m, t in zip(shape[::-1], target[::-1]))):
        return f"an attn_mask of shape {shape} that does not broadcast to (batch, heads, q_len, k_len) = {target}"
    return None


def _view_shape(mask_shape, Q, K):
    """The shape of _view4(mask, Q, K), without building the view."""
    s = (1,) * (4 - len(mask_shape)) + tuple(mask_shape)
    return s if s[2] == Q and s[3] == K else (s[0], s[1], Q, K)


def _view4(attn_mask, Q, K):
    """The mask as 4 dims with its query and key dims broadcast to Q and K (batch and
    heads stay as given: a structure of batch 1 describes every batch)."""
    m = attn_mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    if m.shape[2] != Q or m.shape[3] != K:
        m = m.expand(m.shape[0], m.shape[1], Q, K)
    return m


def _call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa):
    # Everything _refusal read of the call but the devices of key and value (a kernel
    # raises for those as torch would): a hit needs no check.
    return (query.dtype, query.shape, key.shape, value.shape, attn_mask.dtype, float(dropout_p), training,
            torch.are_deterministic_algorithms_enabled(), query.device, enable_gqa)


def _attention_call(dtype, query_shape, kv_heads, k_len, head_dim_v, training, dropout_p, mask_dtype):
    """The AttentionCall decide() reads: the query's dtype and [B, H, Q, D] shape, the key's
    heads and length, the value's head dim, training, dropout, the mask's dtype."""
    call = _core.AttentionCall()
    call.dtype = _DTYPES[dtype]
    call.batch, call.heads, call.q_len, call.head_dim = query_shape
    call.head_dim_v = head_dim_v
    call.kv_heads = kv_heads
    call.k_len = k_len
    call.training = training
    call.dropout = float(dropout_p)
    call.deterministic = torch.are_deterministic_algorithms_enabled()
    call.mask_dtype = element_name(mask_dtype)
    return call


def _decide(entry, query, key, value, attn_mask, dropout_p, training, enable_gqa):
    """The Prepared policy for this call on the entry's mask, decided once per call key
    (None: torch's own dispatch)."""
    ck = _call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa)
    hit = entry.policies.get(ck)
    if hit is not None:  # a None (fallback) is decided again: strictness may have changed
        _cache.timing["decide_ms"] = 0.0
        return hit
    t0 = time.perf_counter()
    call = _attention_call(query.dtype, tuple(query.shape), key.shape[1], key.shape[2], value.shape[-1], training,
                           dropout_p, attn_mask.dtype)
    env = _env.environment(query.device if query.device.type == "cuda" else "cpu", runnable_only=True)
    structure = entry.verdict.structure
    # A cold FlexAttention compile is a cost; what the rule forgoes counts toward it (_run).
    compile_ms, flex_bucket = _run.flex_compile_charge(structure, query, key, value, env)
    try:
        policy = _core.decide(structure, call, env, 64, compile_ms)
    except _core.MaskError as e:
        if _is_strict():
            raise RuntimeError(f"masklens (strict): no available backend computes this mask correctly: "
                               f"{structure.describe()}: {e}") from e
        logger.warning("masklens: %s: %s; running torch's own dispatch with the mask", structure.describe(), e)
        policy = None
    prepared = _run.Prepared(policy, structure, flex_bucket) if policy is not None else None
    _cache.timing["decide_ms"] = (time.perf_counter() - t0) * 1e3  # environment() included: cached per device
    entry.policies[ck] = prepared
    if policy is not None:
        what = (structure.describe(), policy.backend, policy.call.mask, policy.is_plan, query.device.type)
        if what not in _logged:
            _logged.add(what)
            plan = f" as a plan of {len(policy.plan)} calls" if policy.is_plan else ""
            why = "; ".join(f"{r.backend}: {r.reason}" for r in policy.rejected if r.kind != "unavailable")
            logger.info("masklens: %s [%d, %d, %d, %d] -> %s (mask %s)%s, estimated %.3f ms; rejected: %s",
                        structure.describe(), structure.batch, structure.heads, structure.q_len, structure.k_len,
                        policy.backend, policy.call.mask, plan, policy.cost_ms, why)
    return prepared


# entry.derived's mark that a drop-in call ran on the entry's mask, building what its
# runner memoises: only then is the call replayed under CUDA graph capture.
_RAN = "ran"


def _attending_rows(entry, device):
    key = ("rows", device)
    rows = entry.derived.get(key)
    if rows is None:
        rows = _cache.to_device(entry.verdict.attending_rows(), device).unsqueeze(-1)  # [b, h, Q, 1]
        entry.derived[key] = rows
    return rows


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, running the mask as masklens
    decides (module docstring). Whatever masklens does not positively understand runs
    as torch's own call with the arguments given: torch's result, or torch's exception."""
    if _torch_runs_it(query, key, value, attn_mask, dropout_p, is_causal, scale):
        return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    Q, K = query.shape[2], key.shape[2]
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    view = None
    # A mask and call seen before passed _refusal (the entry's key holds the mask's shape,
    # dtype and device, the call key the shapes of q, k, v and the query's device).
    entry = _cache.cached_entry(attn_mask, _view_shape(attn_mask.shape, Q, K), DROPIN_MASKED_THRESHOLD)
    prepared = ck = None
    if entry is not None:
        ck = _call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa)
        prepared = entry.policies.get(ck)
    if query.is_cuda and torch.cuda.is_current_stream_capturing():
        # CUDA graph capture: no scan, no decision, no upload can be captured. A call run
        # before capture on this mask (unchanged since) is replayed: its prepared runner and
        # every table it built (rows, packing, BlockMask) are at hand. Anything else runs
        # as torch's call.
        if prepared is None or (_RAN, ck) not in entry.derived:
            return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if prepared is not None:
        _cache.timing["decide_ms"] = 0.0
    else:
        if _refusal(query, key, value, attn_mask, enable_gqa) is not None:
            return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        view = _view4(attn_mask, Q, K)
        try:
            entry = _cache.entry_for(attn_mask, DROPIN_MASKED_THRESHOLD, view=view)
        except _core.MaskError as e:
            # A mask masklens cannot prove (NaN or +inf in it): torch runs it as it is.
            warnings.warn(f"masklens: attn_mask: {e}; running torch's own call", RuntimeWarning, stacklevel=2)
            return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        prepared = _decide(entry, query, key, value, attn_mask, dropout_p, training, enable_gqa)
        if prepared is None:
            return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if view is None and prepared.needs_mask:
        view = _view4(attn_mask, Q, K)
    t = _run.Tensors(query, key, value, view, scale, dropout_p, prepared.structure, entry.derived)
    out = _run.run_policy(prepared, t)
    if prepared.zero_rows:  # rows with no key at all: 0
        out = torch.where(_attending_rows(entry, out.device), out, out.new_zeros(()))
    if view is not None:  # the slow path ran: the call's tables are built (a capture may replay it)
        entry.derived[(_RAN, ck or _call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa))] = True
    return out


def inspect(query, key, value, attn_mask, dropout_p=0.0, enable_gqa=False):
    """The policy scaled_dot_product_attention runs for these arguments (None: torch's own
    dispatch), and the verdict it is based on. A call the drop-in hands to torch as it is
    (a shape, dtype or device it does not take, a mask that requires grad) is a MaskError
    saying why."""
    why = _torch_runs_it(query, key, value, attn_mask, dropout_p, False, None) or _refusal(
        query, key, value, attn_mask, enable_gqa)
    if why is not None:
        raise _core.MaskError(f"invalid_argument: the drop-in runs torch's own call for {why}")
    view = _view4(attn_mask, query.shape[2], key.shape[2])
    entry = _cache.entry_for(attn_mask, DROPIN_MASKED_THRESHOLD, view=view)
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    prepared = _decide(entry, query, key, value, attn_mask, dropout_p, training, enable_gqa)
    return (prepared.policy if prepared is not None else None), entry.verdict


def _attends(mask, masked_threshold):
    return mask if mask.dtype == torch.bool else (mask > masked_threshold if mask.is_floating_point() else mask != 0)


def _tiles_on_device(mask, device):
    """Whether a mask's tiles are written on its device (masklens._cuda's tile scan) for a
    BlockMask wanted there."""
    return mask.device.type == "cuda" and torch.device(device) == mask.device and _cache.has_device_tiles()


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
    spans' bounds instead (_run.span_mask_mod): no table is built after the read."""
    view = mask
    while view.dim() < 4:
        view = view.unsqueeze(0)
    spans = []
    verdict, arrays = _cache.device_scan_tiles(view.detach(), size, masked_threshold, classify_many_runs=False,
                                               spans_out=spans)
    structure = None if verdict is None else verdict.structure
    if structure is not None and structure.kind != "arbitrary":
        slices = tuple(arrays["kv_num_blocks"].shape[:2])
        if slices != _structure_slices(structure):
            return structure, None
        if _run.rule_reads_tables(structure):
            mask_mod = _run.span_mask_mod(spans[0](), *slices)
        else:
            mask_mod = _run.mask_mod_for(structure, view.device)
    else:
        mask_mod = _run.mask_mod_for(structure, view.device, _attends(view, masked_threshold))
    return structure, _run.block_mask_from_arrays(arrays, view.shape[-2:], size, mask_mod)


def block_mask(mask_or_report, block_size=128, *, mask=None, device=None, masked_threshold: float = -1000.0):
    """A torch FlexAttention BlockMask from masklens' tiles (BlockMask.from_kv_blocks' layout,
    with the q side masklens writes too), at block_size = N or (q, k).

    `mask_or_report` is a mask (torch tensor or numpy array, 1-4 dims) or a masklens.Report.
    A CUDA mask (with `device` its own) is read once on the device by masklens._cuda,
    which proves the structure and writes the BlockMask's tensors there in that read.
    Otherwise an exact structure's tiles come from its fields (no read of the mask past
    the scan), an arbitrary mask's from a host scan (a CUDA mask without masklens._cuda
    is copied to the host for them). An exact structure's mask_mod comes from its fields
    (from one device read, a rule that needs tables takes the read's row bounds instead);
    an arbitrary mask's reads the mask (`mask[b, h, q, kv]`): a Report of an arbitrary
    mask needs `mask=` (its tiles are reused when inspect(tiles=...) counted them at this
    size). The tensors are on `device` (default: the mask's, else the CPU)."""
    import masklens
    size = _cache.tile_size(block_size)
    tiles = None
    if isinstance(mask_or_report, masklens.Report):
        structure = mask_or_report.structure
        have = mask_or_report.tiles
        if have is not None and tuple(have.block_size) == size:
            tiles = have
    else:
        mask, structure = mask_or_report, None
    if mask is not None and not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(mask)
    if mask is not None:
        mask = _cache.readable(mask, True)  # a layout, dtype or subclass it cannot read: a MaskError
    if device is None:
        device = mask.device if mask is not None else torch.device("cpu")
    if structure is None:
        if _tiles_on_device(mask, device):
            # One read on the device: the verdict, and the tiles written as the BlockMask's
            # tensors there (None: an exact structure stored B x H times over, tiled from
            # its fields below).
            structure, bm = _device_block_mask(mask, size, masked_threshold)
            if bm is not None:
                return bm
        elif mask.device.type == "cuda":
            structure = masklens.scan(mask, masked_threshold).structure
        if structure is None or structure.kind == "arbitrary":
            verdict, tiles = _cache.scan_with_tiles(mask, size, masked_threshold)
            structure = verdict.structure
    if structure.kind != "arbitrary":
        mask_mod = _run.mask_mod_for(structure, device)
        if tiles is None:
            return _run.block_mask_from_structure(structure, size, mask_mod, device)
        return _run.block_mask_from_tiles(tiles, mask_mod, device)
    if mask is None:
        raise _core.MaskError("invalid_argument: the BlockMask of an arbitrary mask reads the mask: pass mask=")
    if tiles is None and _tiles_on_device(mask, device):
        return _device_block_mask(mask, size, masked_threshold)[1]
    if tiles is None:
        _, tiles = _cache.scan_with_tiles(mask, size, masked_threshold)
    attends = _attends(mask, masked_threshold)
    while attends.dim() < 4:
        attends = attends.unsqueeze(0)
    return _run.block_mask_from_tiles(tiles, _run.mask_mod_for(structure, device, attends.to(device)), device)


# --- Compiled models -----------------------------------------------------------------
# Inside torch.compile the drop-in is torch's call: a scan and a decision cannot run in
# a graph, and a graph break in every attention layer would cost more than it saves. A
# compiled model's masks are proven instead where the mask is made, once per forward,
# outside the graph (masklens.transformers' mask function, a torch.compiler.disable'd
# call): what reaches the attention layers is then what compiles well (prepare_compiled).


class CompiledMask:
    """The mask of a compiled model's attention layers where masklens decided FlexAttention
    or torch's varlen_attn: the BlockMask, or the packed layout's cumulative lengths, and
    the dense mask beside it for a call the form does not fit (dropout, other shapes).
    A plain object: Dynamo reads its tensors as graph inputs and guards its Python values
    (kind, lengths, window) as constants, so a new padding or new document boundaries (new
    tensor contents) reuse the compiled graph."""

    def __init__(self, kind, mask, expected, **fields):
        self.kind = kind            # "flex" or "varlen"
        self.mask = mask            # the dense mask, as sdpa would have it
        self.expected = expected    # (heads, kv_heads, head_dim, head_dim_v) the decision was for
        self.block_mask = fields.get("block_mask")
        self.cu_seqlens = fields.get("cu_seqlens")  # varlen: int32 [n + 1] over the B * Q packed rows
        self.max_len = fields.get("max_len", 0)
        self.window = fields.get("window", (-1, -1))
        self.rows = fields.get("rows")  # varlen: bool [B, Q, 1, 1], False for rows that attend nothing

    @property
    def shape(self):
        return self.mask.shape

    def __repr__(self):
        return f"<masklens CompiledMask {self.kind} {tuple(self.mask.shape)}>"


def _sequences_tile(sequences, batch, length):
    """Packed rows for varlen_attn over the [batch * length] rows of q (= k) as they lie:
    the cumulative lengths of the sequences, with the gaps between them (rows that attend
    nothing) as sequences of their own, whose output is zeroed; None where a sequence's
    query and key ranges differ (the rows could not be packed in place)."""
    by_batch = [[] for _ in range(batch)]
    for b, qs, qe, ks, ke in sequences:
        if (qs, qe) != (ks, ke):
            return None
        by_batch[b].append((qs, qe))
    cu, gaps = [0], False
    for b, seqs in enumerate(by_batch):
        at = 0
        for qs, qe in sorted(seqs):
            if qs < at:
                return None
            if qs > at:
                cu.append(b * length + qs)
                gaps = True
            cu.append(b * length + qe)
            at = qe
        if at < length:
            cu.append((b + 1) * length)
            gaps = True
    return cu, gaps


def _varlen_form(policy, structure, view, expected):
    a = policy.call.args
    B, _, Q, K = view.shape
    if Q != K:
        return None
    seqs = [tuple(s) for s in _run._broadcast_sequences(a.sequences, structure, B)]
    tiled = _sequences_tile(seqs, B, Q)
    if tiled is None:
        return None
    cu, gaps = tiled
    device = view.device
    rows = None
    if gaps:
        attends = torch.zeros(B * Q, dtype=torch.bool)
        for b, qs, qe, _, _ in seqs:
            attends[b * Q + qs:b * Q + qe] = True
        rows = attends.view(B, Q, 1, 1).to(device)
    cu_seqlens = _cache.to_device(np.asarray(cu, dtype=np.int32), device)
    # max_len: the length, an upper bound of every sequence's; a Python int Dynamo guards,
    # so it must not change with the padding.
    return CompiledMask("varlen", view, expected, cu_seqlens=cu_seqlens, max_len=Q,
                        window=(a.window_left, a.window_right), rows=rows)


def _flex_form(policy, structure, view, expected):
    a = policy.call.args
    t = _run.Tensors(None, None, None, view, None, 0.0, structure, {})
    block_mask = _run.flex_block_mask(t, a, view.device)
    if block_mask is None:
        return None
    return CompiledMask("flex", view, expected, block_mask=block_mask)


def _compiled_form(policy, structure, view, expected):
    """What the compiled attention layers run for a decided policy: None for plain causal
    (sdpa's is_causal: the policy drops the mask for is_causal with Q = K), a CompiledMask
    for FlexAttention or varlen_attn, else the dense mask (torch's sdpa with it)."""
    call = policy.call
    Q, K = view.shape[-2:]
    if policy.is_plan:
        return view
    if call.backend in _run._KERNELS:
        a = call.args
        if call.mask == "drop" and a is not None and a.is_causal and Q == K and structure.empty_rows == 0:
            return None
        return view
    if call.backend == "torch.flex_attention":
        return _flex_form(policy, structure, view, expected) or view
    if call.backend == "torch.varlen_attn":
        return _varlen_form(policy, structure, view, expected) or view
    return view


def prepare_compiled(mask, *, heads, kv_heads, head_dim, head_dim_v=None, dtype=torch.float32, training=None,
                     dropout_p=0.0):
    """What a compiled model's attention layers should receive in place of `mask` (a dense
    [B, 1 or H, Q, K] mask made outside the graph): None where the mask is plain causal
    (sdpa's is_causal, Q = K), a CompiledMask where masklens decides FlexAttention or
    varlen_attn for the call (`heads`, `kv_heads`, `head_dim`, `dtype`; training: grad mode
    by default), else the mask itself. The mask is scanned once (the verdict cache) and the
    call decided among single calls (no plans: a plan's slices are Python ints that would
    compile again at every new padding). A mask masklens cannot read, or a dtype it does not
    decide for, comes back as it is. Call it outside the graph (torch.compiler.disable)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or dtype not in _DTYPES or mask.requires_grad:
        return mask
    if mask.device.type not in ("cpu", "cuda"):
        return mask
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    training = torch.is_grad_enabled() if training is None else training
    B, _, Q, K = mask.shape
    try:
        entry = _cache.entry_for(mask, DROPIN_MASKED_THRESHOLD)
    except _core.MaskError:
        return mask
    expected = (heads, kv_heads, head_dim, head_dim_v)
    key = ("compiled", dtype, expected, training, float(dropout_p), torch.are_deterministic_algorithms_enabled())
    form = entry.derived.get(key, entry)  # the entry itself: not yet decided
    if form is not entry:
        return form
    call = _attention_call(dtype, (B, heads, Q, head_dim), kv_heads, K, head_dim_v, training, dropout_p, mask.dtype)
    env = _env.environment(mask.device if mask.device.type == "cuda" else "cpu", runnable_only=True)
    try:
        policy = _core.decide(entry.verdict.structure, call, env, 1)
    except _core.MaskError:
        form = mask
    else:
        form = _compiled_form(policy, entry.verdict.structure, mask, expected)
    entry.derived[key] = form
    return form


def attend_compiled(cm, query, key, value, dropout_p=0.0, scale=None, enable_gqa=False):
    """A CompiledMask's attention, [B, H, Q, Dv] (traced into the compiled graph), or None
    where the call is not the one decided for (dropout, other heads or dims, another
    length or batch, a varlen_attn without the window or scale asked for): the caller
    then runs torch's sdpa with cm.mask."""
    B, H, Q, D = query.shape
    Hk, Dv = key.shape[1], value.shape[-1]
    if dropout_p or (H, Hk, D, Dv) != cm.expected or Q != cm.mask.shape[-2] or key.shape[2] != cm.mask.shape[-1]:
        return None
    if H != Hk and not enable_gqa:
        return None
    # The varlen form's sequences are laid over the mask's own B x Q rows; a BlockMask of
    # one batch broadcasts, as flex takes it.
    mask_batch = cm.mask.shape[0] if cm.mask.dim() == 4 else 1
    if mask_batch != B and (cm.kind != "flex" or mask_batch != 1):
        return None
    if cm.kind == "flex":
        from torch.nn.attention.flex_attention import flex_attention
        kwargs = {"enable_gqa": True} if H != Hk else {}
        return flex_attention(query, key, value, block_mask=cm.block_mask, scale=scale, **kwargs)
    varlen_attn, params = _run._varlen_params()
    # A torch whose varlen_attn lacks the keyword would run without it: bidirectional where
    # the window is causal, the default scale for the caller's (run_varlen refuses alike).
    if (scale is not None and "scale" not in params) or ("window_size" not in params and cm.window != (-1, -1)):
        return None
    kwargs = {"scale": scale} if scale is not None else {}
    if "window_size" in params:
        kwargs["window_size"] = cm.window
    packed = [t.transpose(1, 2).reshape(B * t.shape[2], t.shape[1], t.shape[3]) for t in (query, key, value)]
    out = varlen_attn(*packed, cm.cu_seqlens, cm.cu_seqlens, cm.max_len, cm.max_len, **kwargs)
    out = out.view(B, Q, H, Dv)
    if cm.rows is not None:  # the gaps' own rows: 0, as rows that attend nothing
        out = torch.where(cm.rows, out, out.new_zeros(()))
    return out.transpose(1, 2)
