"""transformers under context parallelism: attn_implementation="masklens_cp". A model
run inside ContextParallel.step() on this rank's shard of input_ids sees only its rank's
tokens, so transformers' own mask functions would build a mask of local positions; the
registered mask function builds none, and the attention function runs the step's
ContextParallel.attention with the ranks' agreed report and this rank's mask rows."""
from __future__ import annotations

import contextlib

TRANSFORMERS_NAME = "masklens_cp"

_step = None  # (ContextParallel, report, local mask) of the step inside ContextParallel.step()


@contextlib.contextmanager
def stepping(cp, report, local_mask):
    """The step every "masklens_cp" attention layer runs under, until the block ends."""
    global _step
    previous, _step = _step, (cp, report, local_mask)
    try:
        yield
    finally:
        _step = previous


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
