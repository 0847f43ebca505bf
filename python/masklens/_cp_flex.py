"""The flex_attention that context-parallel attention calls: compiled on CUDA by default
(eager flex materialises the scores), eager on the CPU (where flex has no backward).

Compiled, it runs as the drop-in's flex does (masklens._flex.flex_in_bucket): one compiled
function a shape bucket, with dynamic lengths (a new sequence length, dynamic padding,
reuses the kernel), in buckets tagged "cp" that never warm, share or price the drop-in's,
keyed too by the rule of the BlockMask (masklens._cp_block_mask.rule_of).
Never flex's unfused path: where Dynamo would run a bucket uncompiled (past its recompile
limit, or falling back to eager) the call raises a MaskError. The drop-in falls back to
torch's call with the dense mask there; a rank under CP holds no such mask (it has its
rows, and the keys of the whole sequence only after the gather), so the error names the
fallbacks that are: compiled=False (eager flex, which materialises this rank's [rows, K]
scores), or a larger recompile limit."""
from __future__ import annotations

import torch

from . import _core, _flex
from ._cp_block_mask import rule_of

# The bucket tag of CP's compiled calls (masklens._flex.tagged_bucket_key).
CP_BUCKET_TAG = "cp"


def _compiled_cp_flex(query, key, value, *, block_mask, scale=None, enable_gqa=False):
    """flex_attention compiled in CP's bucket of these shapes; a MaskError naming the
    fallbacks where Dynamo would run it uncompiled."""
    if not query.is_cuda and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        # A CPU bucket runs without grad (flex has no CPU backward): its output would hold none.
        raise _core.MaskError("invalid_argument: compiled FlexAttention under context parallelism has no backward on "
                              "the CPU; pass compiled=False, or run without gradients")
    try:
        return _flex.flex_in_bucket(query, key, value, block_mask, tag=CP_BUCKET_TAG, rule=rule_of(block_mask),
                                    scale=scale, enable_gqa=enable_gqa)
    except _flex.FlexRanEager as e:
        raise _core.MaskError(
            "flex_uncompiled: compiled FlexAttention under context parallelism ran uncompiled (Dynamo's recompile "
            "limit, or a fallback to eager), which would materialise this rank's whole score matrix; a rank holds "
            "no dense mask to fall back to as the drop-in does: pass compiled=False to run flex eagerly, or raise "
            "torch._dynamo.config.recompile_limit") from e


def flex_for(compiled, device):
    """flex_attention, compiled in CP's buckets where `compiled` says (None: on CUDA)."""
    if compiled is None:
        compiled = torch.device(device).type == "cuda"
    if compiled:
        return _compiled_cp_flex
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention
