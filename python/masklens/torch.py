"""masklens.torch.scaled_dot_product_attention: torch's function, with the mask proven.

Same signature and result as torch.nn.functional.scaled_dot_product_attention (rows
that attend to nothing come out 0, as torch's math kernel gives them). With a dense
attn_mask it scans the mask once per tensor (cached, see masklens._cache), decides the
backend for the call (masklens.decide) and runs it: the mask dropped for is_causal or
causal_lower_right, a plan of slices, torch's varlen_attn, compiled FlexAttention,
flash-attn where installed, or the mask kept on a kernel that is correct for it.

Torch's own call runs unchanged, with the arguments given, where there is nothing to
prove or no time to prove it (no mask, is_causal=True, inside torch.compile, during CUDA
graph capture) and wherever masklens does not positively understand the call, so that
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

import torch
import torch.nn.functional as F

from . import _cache, _env, _run
from . import _core
from . import element_name, load_kernels, strict as _is_strict  # load_kernels: re-exported, see above

logger = logging.getLogger("masklens")

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_logged = set()


def _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


# Types the drop-in reads as they are: a subclass (a DTensor, a FakeTensor, a tensor with
# its own __torch_function__) goes to torch, which knows what it means.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_INF = float("inf")


def _torch_runs_it(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """Whether this call goes to torch as it is, checked on every call (a few attribute
    reads): nothing to prove (no mask, is_causal), no time to prove it (inside
    torch.compile, during CUDA graph capture), or arguments masklens does not positively
    understand, where torch raises or runs as it would without masklens:
    - tensors that are not plain [B, H, L, D] tensors of one dtype masklens decides for
      (float16, bfloat16, float32; float64 runs only torch's math kernel anyway);
    - a scale that is not None or a finite positive number: with scale 0 or below, a
      mask dropped for is_causal is not torch's dense result (torch's CPU kernel gives
      NaN for is_causal there; the dense mask gives none);
    - a mask whose gradient autograd wants (it requires grad and grad mode is on): a
      learnable bias reaches torch's kernels, which compute its gradient; dropping it
      (even when its values are proven causal) would lose the gradient."""
    if attn_mask is None or is_causal:
        return True
    if (type(attn_mask) not in _PLAIN or type(query) not in _PLAIN or type(key) not in _PLAIN
            or type(value) not in _PLAIN):
        return True
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or attn_mask.is_nested or query.is_nested:
        return True
    dtype = query.dtype
    if dtype not in _DTYPES or key.dtype is not dtype or value.dtype is not dtype:
        return True
    if scale is not None and not (type(scale) in (float, int) and 0 < scale < _INF):
        return True
    if type(dropout_p) not in (float, int) or not 0 <= dropout_p < 1:
        return True
    if attn_mask.requires_grad and torch.is_grad_enabled():
        return True
    return torch.compiler.is_compiling() or (query.is_cuda and torch.cuda.is_current_stream_capturing())


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


def _decide(entry, query, key, value, attn_mask, dropout_p, training, enable_gqa):
    """The Prepared policy for this call on the entry's mask, decided once per call key
    (None: torch's own dispatch)."""
    ck = _call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa)
    hit = entry.policies.get(ck)
    if hit is not None:  # a None (fallback) is decided again: strictness may have changed
        _cache.timing["decide_ms"] = 0.0
        return hit
    t0 = time.perf_counter()
    call = _core.AttentionCall()
    call.dtype = _DTYPES[query.dtype]
    call.head_dim = query.shape[-1]
    call.head_dim_v = value.shape[-1]
    call.batch = query.shape[0]
    call.heads = query.shape[1]
    call.kv_heads = key.shape[1]
    call.q_len = query.shape[2]
    call.k_len = key.shape[2]
    call.training = training
    call.dropout = float(dropout_p)
    call.deterministic = torch.are_deterministic_algorithms_enabled()
    call.mask_dtype = element_name(attn_mask.dtype)
    env = _env.environment(query.device if query.device.type == "cuda" else "cpu", runnable_only=True)
    structure = entry.verdict.structure
    try:
        policy = _core.decide(structure, call, env)
    except _core.MaskError as e:
        if _is_strict():
            raise RuntimeError(f"masklens (strict): no available backend computes this mask correctly: "
                               f"{structure.describe()}: {e}") from e
        logger.warning("masklens: %s: %s; running torch's own dispatch with the mask", structure.describe(), e)
        policy = None
    prepared = _run.Prepared(policy, structure) if policy is not None else None
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
    entry = _cache.cached_entry(attn_mask, _view_shape(attn_mask.shape, Q, K))
    prepared = None
    if entry is not None:
        prepared = entry.policies.get(_call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa))
    if prepared is not None:
        _cache.timing["decide_ms"] = 0.0
    else:
        if _refusal(query, key, value, attn_mask, enable_gqa) is not None:
            return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        view = _view4(attn_mask, Q, K)
        try:
            entry = _cache.entry_for(attn_mask, view=view)
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
    return out


def inspect(query, key, value, attn_mask, dropout_p=0.0, enable_gqa=False):
    """The policy scaled_dot_product_attention runs for these arguments (None: torch's own
    dispatch), and the verdict it is based on. A call the drop-in hands to torch as it is
    (a shape, dtype or device it does not take) is a MaskError saying why."""
    why = _refusal(query, key, value, attn_mask, enable_gqa)
    if why is not None:
        raise _core.MaskError(f"invalid_argument: the drop-in runs torch's own call for {why}")
    view = _view4(attn_mask, query.shape[2], key.shape[2])
    entry = _cache.entry_for(attn_mask, view=view)
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
