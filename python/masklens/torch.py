"""masklens.torch.scaled_dot_product_attention: torch's function, with the mask proven.

Same signature and result as torch.nn.functional.scaled_dot_product_attention (rows
that attend to nothing come out 0, as torch's math kernel gives them). With a dense
attn_mask it scans the mask once per tensor (cached, see masklens._verdicts), decides the
backend for the call (masklens.decide) and runs it: the mask dropped for is_causal or
causal_lower_right, a plan of slices, torch's varlen_attn, compiled FlexAttention,
flash-attn where installed, or the mask kept on a kernel that is correct for it.

Torch's own call runs unchanged, with the arguments given, where there is nothing to
prove or no time to prove it (no mask, is_causal=True, inside torch.compile unless
set_one_graph(True) has the graph decide it, during CUDA graph capture unless the call
was run before it on the same, unchanged mask: then the prepared call is replayed) and
wherever masklens does not positively understand the call, so that torch gives its
result or raises its exception exactly as without masklens: tensors that are not plain,
4-D, strided, of one dtype masklens decides for (float16, bfloat16, float32) on one CPU
or CUDA device; shapes, heads or a mask dtype torch refuses, a mask that does not
broadcast from 2 to 4 dims, an empty dimension; a scale that is not None or finite and
positive; a mask that requires grad in grad mode (its gradient is torch's to compute); a
mask masklens cannot read (NaN or +inf: with a warning naming it) (_torch_runs_it,
_refusal; docs/python.md).

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

from . import _core, _env, _flex, _one_graph, _run, _scan, _verdicts
from ._block_mask import block_mask  # noqa: F401  (re-exported: docs/python.md)
from ._compiled import CompiledMask, attend_compiled, prepare_compiled  # noqa: F401  (compiled models)
from ._one_graph import set_one_graph  # noqa: F401  (compiled code decides in the graph: docs/python.md)
from ._env import strict as _is_strict
from ._flex import set_flex_compile_ms  # noqa: F401  (the cold compile's cost: docs/python.md)
from ._scan import load_kernels  # noqa: F401  (re-exported, see above)
from ._verdicts import DROPIN_MASKED_THRESHOLD


logger = logging.getLogger("masklens")
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
_SCALE_MAX = float(torch.finfo(torch.float32).max)


def _torch_runs_it(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
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
    if type(is_causal) is not bool or type(enable_gqa) is not bool:  # None, 0, np.bool_, a tensor: torch's TypeError
        return (f"is_causal of type {type(is_causal).__name__}, enable_gqa of type {type(enable_gqa).__name__} "
                "(torch takes bools)")
    if attn_mask is None or is_causal:
        return "no mask to prove" if attn_mask is None else "is_causal=True"
    if (type(attn_mask) not in _PLAIN or type(query) not in _PLAIN or type(key) not in _PLAIN
            or type(value) not in _PLAIN):
        return "a tensor subclass (torch knows what it means)"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or attn_mask.is_nested or query.is_nested:
        return "tensors that are not [B, H, L, D]"
    dtype = query.dtype
    if dtype not in _run.DTYPES or key.dtype is not dtype or value.dtype is not dtype:
        return f"query/key/value dtypes {query.dtype}/{key.dtype}/{value.dtype} (masklens decides for fp16, bf16, fp32)"
    if scale is not None and not (type(scale) in (float, int) and _SCALE_MIN <= scale <= _SCALE_MAX):
        return f"scale {scale} (masklens takes a positive, normal float32 scale)"
    if type(dropout_p) not in (float, int) or not 0 <= dropout_p < 1:
        return f"dropout_p {dropout_p}"
    if attn_mask.requires_grad and torch.is_grad_enabled():
        return "a mask that requires grad in grad mode (its gradient comes from torch's kernels)"
    return _INSIDE_COMPILE if torch.compiler.is_compiling() else None


_INSIDE_COMPILE = "inside torch.compile"


def _in_graph(query, key, value, attn_mask, dropout_p, scale, enable_gqa):
    """Inside torch.compile with one graph on (set_one_graph): the call's form decided at
    run time by an op of the graph (masklens._one_graph), traced; None where the drop-in
    runs torch's own call (dropout, a scale given, or what _refusal names)."""
    # A scale given (even the default's value) may be a symbolic float here, which the
    # cond's branches may not close over: torch's own call (constant_scale).
    if dropout_p or scale is not None or _refusal(query, key, value, attn_mask, enable_gqa) is not None:
        return None
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    gm = _one_graph.graph_mask(_view4(attn_mask, query.shape[2], key.shape[2]), batch=query.shape[0],
                               heads=query.shape[1], kv_heads=key.shape[1], head_dim=query.shape[-1],
                               head_dim_v=value.shape[-1], dtype=query.dtype, training=training)
    if not isinstance(gm, _one_graph.GraphMask):
        return None

    def sdpa(q, k, v, mask):  # torch's call with the mask, or is_causal (mask None): [B, Q, H, Dv]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=enable_gqa)
        return out.transpose(1, 2).contiguous()
    out = _one_graph.attend_graph(gm, query, key, value, sdpa)
    return None if out is None else out.transpose(1, 2)


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


def _decide(entry, query, key, value, attn_mask, dropout_p, training, enable_gqa, mask_build_ms=0.0):
    """The Prepared policy for this call on the entry's mask, decided once per call key
    (None: torch's own dispatch). mask_build_ms: what building the dense mask costs a call
    that keeps it, where the mask is known without its tensor (masklens.transformers'
    definitions; decide()'s DecideOptions::mask_build_ms)."""
    ck = _call_key(query, key, value, attn_mask, dropout_p, training, enable_gqa)
    if mask_build_ms:
        ck += (mask_build_ms,)
    hit = entry.policies.get(ck)
    if hit is not None and not hit.stale:  # a None (fallback) is decided again: strictness may have changed
        _scan.timing["decide_ms"] = 0.0
        return hit
    t0 = time.perf_counter()
    call = _run.attention_call(query.dtype, tuple(query.shape), key.shape[1], key.shape[2], value.shape[-1], training,
                               dropout_p, attn_mask.dtype)
    env = _env.environment(query.device if query.device.type == "cuda" else "cpu", runnable_only=True)
    structure = entry.verdict.structure
    # A cold FlexAttention compile is a cost; what the rule forgoes counts toward it (_run).
    compile_ms, flex_bucket = _flex.flex_compile_charge(structure, query, key, value, env)
    try:
        policy = _core.decide(structure, call, env, 64, compile_ms, mask_build_ms)
    except _core.MaskError as e:
        if _is_strict():
            raise RuntimeError(f"masklens (strict): no available backend computes this mask correctly: "
                               f"{structure.describe()}: {e}") from e
        logger.warning("masklens: %s: %s; running torch's own dispatch with the mask", structure.describe(), e)
        policy = None
    prepared = _run.Prepared(policy, structure, flex_bucket) if policy is not None else None
    _scan.timing["decide_ms"] = (time.perf_counter() - t0) * 1e3  # environment() included: cached per device
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


class _KeepsMask(torch.autograd.Function):
    """The output as it is, with the additive mask saved for backward, as torch's kernels
    save it: a write into the mask between forward and backward (its _version moved)
    makes backward raise autograd's own error, as torch's backward does, where the mask
    was dropped or cast and no kernel saved it. A bool mask is converted by torch before
    its kernel, so torch saves none: nothing to keep."""

    @staticmethod
    def forward(ctx, out, mask):
        ctx.save_for_backward(mask)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        ctx.saved_tensors  # noqa: B018  (autograd's version check: raises after an in-place write)
        return grad, None


# entry.derived's mark that a drop-in call ran on the entry's mask, building what its
# runner memoises: only then is the call replayed under CUDA graph capture.
_RAN = "ran"


def _attending_rows(entry, device):
    key = ("rows", device)
    rows = entry.derived.get(key)
    if rows is None:
        rows = _scan.to_device(entry.verdict.attending_rows(), device).unsqueeze(-1)  # [b, h, Q, 1]
        entry.derived[key] = rows
    return rows


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, running the mask as masklens
    decides (module docstring). Whatever masklens does not positively understand runs
    as torch's own call with the arguments given: torch's result, or torch's exception."""
    why = _torch_runs_it(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if why is not None:
        out = None
        if why == _INSIDE_COMPILE and _one_graph.enabled:
            out = _in_graph(query, key, value, attn_mask, dropout_p, scale, enable_gqa)
        if out is not None:
            return out
        return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    Q, K = query.shape[2], key.shape[2]
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    view = None
    # A mask and call seen before passed _refusal (the entry's key holds the mask's shape,
    # dtype and device, the call key the shapes of q, k, v and the query's device).
    entry = _verdicts.cached_entry(attn_mask, _view_shape(attn_mask.shape, Q, K), DROPIN_MASKED_THRESHOLD)
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
    elif prepared is not None and prepared.stale:
        prepared = None  # decided again below (a flex passed over for its compile is paid for)
    if prepared is not None:
        _scan.timing["decide_ms"] = 0.0
    else:
        if _refusal(query, key, value, attn_mask, enable_gqa) is not None:
            return _passthrough(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        view = _view4(attn_mask, Q, K)
        try:
            entry = _verdicts.entry_for(attn_mask, DROPIN_MASKED_THRESHOLD, view=view)
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
    if out.requires_grad and attn_mask.is_floating_point():
        out = _KeepsMask.apply(out, attn_mask)
    return out


def inspect(query, key, value, attn_mask, dropout_p=0.0, enable_gqa=False):
    """The policy scaled_dot_product_attention runs for these arguments (None: torch's own
    dispatch), and the verdict it is based on. A call the drop-in hands to torch as it is
    (a shape, dtype or device it does not take, a mask that requires grad) is a MaskError
    saying why."""
    why = _torch_runs_it(query, key, value, attn_mask, dropout_p, False, None, enable_gqa) or _refusal(
        query, key, value, attn_mask, enable_gqa)
    if why is not None:
        raise _core.MaskError(f"invalid_argument: the drop-in runs torch's own call for {why}")
    view = _view4(attn_mask, query.shape[2], key.shape[2])
    entry = _verdicts.entry_for(attn_mask, DROPIN_MASKED_THRESHOLD, view=view)
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    prepared = _decide(entry, query, key, value, attn_mask, dropout_p, training, enable_gqa)
    return (prepared.policy if prepared is not None else None), entry.verdict
