"""Compiled models: what a compiled model's attention layers receive in place of a dense
mask, decided outside the graph.

Inside torch.compile the drop-in is torch's call: a scan and a decision cannot run in
a graph, and a graph break in every attention layer would cost more than it saves. A
compiled model's masks are proven instead where the mask is made, once per forward,
outside the graph (masklens.transformers' mask function, a torch.compiler.disable'd
call): what reaches the attention layers is then what compiles well (prepare_compiled),
and attend_compiled runs it inside the graph.
"""
from __future__ import annotations

import numpy as np
import torch

from . import _block_mask, _core, _env, _registry, _run, _scan, _verdicts


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
    seqs = [tuple(s) for s in _run.broadcast_sequences(a.sequences, structure, B)]
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
    cu_seqlens = _scan.to_device(np.asarray(cu, dtype=np.int32), device)
    # max_len: the length, an upper bound of every sequence's; a Python int Dynamo guards,
    # so it must not change with the padding.
    return CompiledMask("varlen", view, expected, cu_seqlens=cu_seqlens, max_len=Q,
                        window=(a.window_left, a.window_right), rows=rows)


def _flex_form(policy, structure, view, expected):
    a = policy.call.args
    block_mask = _block_mask.flex_block_mask(structure, view, a, view.device)
    if block_mask is None:
        return None
    return CompiledMask("flex", view, expected, block_mask=block_mask)


def decided_form(policy, structure, q_len: int, k_len: int) -> str:
    """The form a compiled layer takes for a decided policy: "causal" (sdpa's is_causal:
    the policy drops the mask for is_causal with Q = K and no empty row), "flex" (a backend
    computing BlockMask tiles), "varlen" (torch's own varlen kernel), or "dense" (torch's
    sdpa with the mask: an SDPA kernel that keeps it, a plan, another library's kernel,
    anything else). The forms call torch's own functions, so only a backend whose family
    comes with torch takes one of them; the call's arguments say which."""
    call = policy.call
    if policy.is_plan or not _registry.torch_backend(call.backend):
        return "dense"
    a = call.args
    kind = a.type if a is not None else None
    if kind == "sdpa":
        causal = call.mask == "drop" and a.is_causal
        return "causal" if causal and q_len == k_len and structure.empty_rows == 0 else "dense"
    if _registry.computes_flex_tiles(call.backend):
        return "flex"
    if kind == "varlen":
        return "varlen"
    return "dense"


def compiled_form(policy, structure, view, expected):
    """What the compiled attention layers run for a decided policy: None for plain causal,
    a CompiledMask for FlexAttention or varlen_attn, else the dense mask (decided_form)."""
    form = decided_form(policy, structure, *view.shape[-2:])
    if form == "causal":
        return None
    if form == "flex":
        return _flex_form(policy, structure, view, expected) or view
    if form == "varlen":
        return _varlen_form(policy, structure, view, expected) or view
    return view


def decide_for_layers(structure, mask, expected, dtype, training, dropout_p=0.0, batch=None, mask_build_ms=0.0):
    """The policy of a compiled model's attention layers over `mask` ([B, 1 or H, Q, K]; the
    call's batch B unless given): `expected` = (heads, kv_heads, head_dim, head_dim_v),
    among single calls (no plans: a plan's slices are Python ints a graph would guard) of
    the families that run here; mask_build_ms as decide() takes it (a mask not yet built)."""
    heads, kv_heads, head_dim, head_dim_v = expected
    B, _, Q, K = mask.shape
    B = B if batch is None else batch
    call = _run.attention_call(dtype, (B, heads, Q, head_dim), kv_heads, K, head_dim_v, training, dropout_p, mask.dtype)
    env = _env.environment(mask.device if mask.device.type == "cuda" else "cpu", runnable_only=True)
    return _core.decide(structure, call, env, 1, 0.0, mask_build_ms)


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
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or dtype not in _run.DTYPES or mask.requires_grad:
        return mask
    if mask.device.type not in ("cpu", "cuda"):
        return mask
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    training = torch.is_grad_enabled() if training is None else training
    try:
        entry = _verdicts.entry_for(mask, _verdicts.DROPIN_MASKED_THRESHOLD)
    except _core.MaskError:
        return mask
    expected = (heads, kv_heads, head_dim, head_dim_v)
    key = ("compiled", dtype, expected, training, float(dropout_p), torch.are_deterministic_algorithms_enabled())
    form = entry.derived.get(key, entry)  # the entry itself: not yet decided
    if form is not entry:
        return form
    try:
        policy = decide_for_layers(entry.verdict.structure, mask, expected, dtype, training, dropout_p)
    except _core.MaskError:
        form = mask
    else:
        form = compiled_form(policy, entry.verdict.structure, mask, expected)
    entry.derived[key] = form
    return form


def fits_decided_call(mask, expected, query, key, value, dropout_p, enable_gqa) -> bool:
    """Whether a compiled layer's call is the one its mask's form was decided for: no
    dropout, (heads, kv_heads, head_dim, head_dim_v) as `expected`, the mask's lengths,
    and GQA only where enable_gqa."""
    B, H, Q, D = query.shape
    Hk, Dv = key.shape[1], value.shape[-1]
    return (not dropout_p and (H, Hk, D, Dv) == expected and Q == mask.shape[-2] and key.shape[2] == mask.shape[-1]
            and (H == Hk or bool(enable_gqa)))


def attend_compiled(cm, query, key, value, dropout_p=0.0, scale=None, enable_gqa=False):
    """A CompiledMask's attention, [B, H, Q, Dv] (traced into the compiled graph), or None
    where the call is not the one decided for (fits_decided_call; another batch, a
    varlen_attn without the window or scale asked for): the caller then runs torch's sdpa
    with cm.mask."""
    if not fits_decided_call(cm.mask, cm.expected, query, key, value, dropout_p, enable_gqa):
        return None
    B, H, Q, _ = query.shape
    Hk, Dv = key.shape[1], value.shape[-1]
    # The varlen form's sequences are laid over the mask's own B x Q rows; a BlockMask of
    # one batch broadcasts, as flex takes it.
    mask_batch = cm.mask.shape[0] if cm.mask.dim() == 4 else 1
    if mask_batch != B and (cm.kind != "flex" or mask_batch != 1):
        return None
    if cm.kind == "flex":
        from torch.nn.attention.flex_attention import flex_attention
        kwargs = {"enable_gqa": True} if H != Hk else {}
        return flex_attention(query, key, value, block_mask=cm.block_mask, scale=scale, **kwargs)
    varlen_attn, params = _run.varlen_params()
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
