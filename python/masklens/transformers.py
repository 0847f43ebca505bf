"""attn_implementation="masklens" for transformers models.

    import masklens.transformers      # registers (or call masklens.transformers.register())
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="masklens")

Registers two functions under "masklens": the attention function (sdpa's contract,
running masklens.torch.scaled_dot_product_attention) and the mask function
(transformers' own sdpa_mask). Both are needed: for an implementation name it has no
mask function for, transformers builds no mask at all, and padded batches go wrong.

sdpa_mask hands every layer of a forward the same mask tensor, so a model pays one scan
per forward (per mask kind: sliding and full layers have one each). One-token decode,
CUDA graph capture and torch.compile take transformers' sdpa path unchanged: the scan
would cost more than it saves there, or cannot run at all.

Importing this module or calling register() does not initialise CUDA (nor load
masklens' kernels): registration happens at import, often before the program has chosen
its device. CUDA loads a kernel at its first launch, so the first forward's scan of a
CUDA mask would also pay for loading masklens' (about a millisecond, once per process);
a framework that wants it at start-up calls masklens.load_kernels() once its CUDA
context exists (after the model is on its device, say):

    import masklens, masklens.transformers
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="masklens").to("cuda")
    masklens.load_kernels()           # True; False without masklens._cuda or a CUDA device
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import _cache
from .torch import scaled_dot_product_attention

NAME = "masklens"


def masklens_mask(*args, **kwargs):
    """transformers' sdpa_mask; each call starts a new forward for the verdict cache
    (inference-mode masks are remembered within one forward)."""
    _cache.begin_forward()
    return sdpa_mask(*args, **kwargs)


def _skip_scan(query, attention_mask) -> bool:
    return (attention_mask is None or query.shape[2] == 1 or torch.compiler.is_compiling()
            or (query.is_cuda and torch.cuda.is_current_stream_capturing())
            or not isinstance(attention_mask, torch.Tensor))


def masklens_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                               **kwargs):
    """sdpa_attention_forward's contract: query/key/value [B, H, L, D], GQA through
    module.num_key_value_groups, returns (out [B, L, H, Dv], None)."""
    if _skip_scan(query, attention_mask) or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if kwargs.get("softcap") is not None:
        raise ValueError("`masklens` attention does not support `softcap` (as `sdpa`). Try `eager` or "
                         "`flex_attention`")
    groups = getattr(module, "num_key_value_groups", 1)
    enable_gqa = groups > 1
    if enable_gqa and key.shape[1] * groups != query.shape[1]:
        # Heads that do not divide as GQA expects: expand as sdpa does.
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        enable_gqa = False
    # sdpa's is_causal rule: only without a mask; with one the mask decides (and masklens
    # drops it again where it is plain causal).
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                       enable_gqa=enable_gqa)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Registers "masklens" with AttentionInterface and AttentionMaskInterface. Touches no
    CUDA device: masklens.load_kernels() is the framework's to call at start-up."""
    AttentionInterface.register(NAME, masklens_attention_forward)
    AttentionMaskInterface.register(NAME, masklens_mask)


register()
