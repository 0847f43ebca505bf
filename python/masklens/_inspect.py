"""masklens.inspect and masklens.explain: a mask scanned (cached per torch tensor), the
call read from the tensors, and the decision, as a Report."""
from __future__ import annotations

from . import _block_mask, _env, _registry, _scan, _verdicts
from ._core import AttentionCall, MaskError, decide
from ._report import Report, explain_text


_CALL_FIELDS = ("dtype", "head_dim", "head_dim_v", "batch", "heads", "kv_heads", "q_len", "k_len", "training",
                "dropout", "deterministic", "mask_dtype")
# The Environment's keywords: the GPU, torch and cuDNN (every host's fields, not a
# family's), each family's library version (kFamilies' version fields: a new family's
# keyword is accepted with its row), and the families available.
_ENV_FIELDS = ("sm", "torch", "cudnn", *_registry.version_fields(), "available")


def _is_training(*tensors) -> bool:
    import torch
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def make_call(mask, query=None, key=None, value=None, **fields) -> AttentionCall:
    """The AttentionCall of tensors in torch SDPA's layout [B, H, L, D] (any of query, key
    and value may be left out: the call's defaults stand for what it would say); keyword
    fields override what the tensors say."""
    shape = tuple(mask.shape)
    batch = shape[0] if len(shape) == 4 else 1
    # What key and value say, with or without a query (None: the call's default).
    kv_heads = None if key is None else (key.shape[-3] if key.dim() >= 3 else 1)
    k_len = None if key is None else key.shape[-2]
    head_dim_v = None if value is None else value.shape[-1]
    if query is None:  # no query: the call's defaults but for the mask's batch and dtype and key / value's fields
        call = AttentionCall()
        call.batch = batch
        call.mask_dtype = _scan.element_name(mask.dtype)
        for name, v in (("kv_heads", kv_heads), ("k_len", k_len), ("head_dim_v", head_dim_v)):
            if v is not None:
                setattr(call, name, v)
    else:
        from . import _run  # torch's: imported only with tensors
        batch = max(batch, query.shape[0] if query.dim() == 4 else 1)
        heads = query.shape[-3] if query.dim() >= 3 else 1
        call = _run.attention_call(query.dtype, (batch, heads, query.shape[-2], query.shape[-1]), kv_heads, k_len,
                                   head_dim_v, _is_training(query, key, value), mask_dtype=mask.dtype)
    for name, value_ in fields.items():
        _env.set_field(call, "call", name, value_)
    call.validate()
    return call


def split_fields(overrides: dict):
    call_fields = {k: overrides.pop(k) for k in list(overrides) if k in _CALL_FIELDS}
    env_fields = {k: overrides.pop(k) for k in list(overrides) if k in _ENV_FIELDS}
    if overrides:
        raise TypeError(f"masklens.inspect: unknown keyword(s) {sorted(overrides)}; call fields are {_CALL_FIELDS}, "
                        f"environment fields {_ENV_FIELDS}")
    return call_fields, env_fields


def broadcast_to_call(mask, query, key):
    """The mask as torch's scaled_dot_product_attention reads it for query and key: it
    must broadcast to the attention weights [B, H, Q, K] (query's leading dims and
    length, key's length) from 2 to that many dims, each dim equal to the call's or 1,
    else a MaskError (torch raises there too). Its query and key dims come back expanded
    to Q and K (stride 0, no copy); batch and heads stay as stored: a structure of batch
    1 describes every batch."""
    target = tuple(query.shape[:-1]) + (key.shape[-2] if key is not None else mask.shape[-1],)
    shape = tuple(mask.shape)
    if not (2 <= len(shape) <= len(target) and all(m in (t, 1) for m, t in zip(shape[::-1], target[::-1]))):
        names = "[B, H, Q, K]" if len(target) == 4 else "[..., Q, K]"
        raise MaskError(f"invalid_shape: mask of shape {list(shape)} does not broadcast to the call's {names} = "
                        f"{list(target)} as torch's scaled_dot_product_attention broadcasts it (2 to {len(target)} "
                        "dims, each equal to the call's or 1)")
    full = shape[:-2] + target[-2:]
    if full == shape:
        return mask
    if hasattr(mask, "expand"):
        return mask.expand(full)
    import numpy as np
    return np.broadcast_to(mask, full)


def _verdict(mask, view, masked_threshold):
    """scan() of the mask as the call reads it (`view`), a torch mask's verdict cached
    under the mask the caller holds (a view dies with the call)."""
    if view is mask or not hasattr(mask, "expand"):
        return _verdicts.scan(view, masked_threshold)
    return _verdicts.entry_for(mask, masked_threshold, view=view).verdict


def inspect(mask, query=None, key=None, value=None, *, masked_threshold: float = -1000.0,
            max_plan_calls: int = 64, strict: bool = False, tiles=None, **fields) -> Report:
    """Scans `mask` (torch tensor or numpy array, 2-4 dims, broadcast as SDPA broadcasts it),
    and decides the call for query/key/value ([B, H, L, D]) where given. The call and the
    environment come from the tensors and what is installed (the tensors' GPU, else the
    current one, else the CPU); every AttentionCall and Environment field can be given by
    keyword (dtype="bf16", head_dim=256, sm=90, torch="2.11", available={"torch", "flex"}).
    With strict=True a mask no available backend computes correctly raises MaskError.
    tiles=N or (q, k) counts the mask's tiles too (Report.tiles, "tiles" in to_dict(), as
    the CLI's inspect --tiles): from the same read of the mask, on its device for a CUDA
    mask where masklens._cuda counts tiles (else: a CUDA mask's exact structure is tiled
    from its fields, an arbitrary one from a host copy). An arbitrary mask's structure
    then carries its tile fractions, which decide() charges flex on."""
    call_fields, env_fields = split_fields(dict(fields))
    # With a query, the mask's dims are checked against the call (broadcast_to_call names it).
    mask = _scan.readable(mask, check_dims=query is None)
    masked_threshold = _scan.threshold_value(masked_threshold)
    view = broadcast_to_call(mask, query, key) if query is not None else mask
    summary = None
    if tiles is None:
        verdict = _verdict(mask, view, masked_threshold)
    else:
        size = _scan.tile_size(tiles)
        on_device = str(getattr(getattr(view, "device", None), "type", "cpu")) == "cuda"
        if on_device and _scan.has_device_tiles():
            verdict, summary = _block_mask.device_tile_summary(view.detach(), size, masked_threshold)
        else:
            verdict = _verdict(mask, view, masked_threshold) if on_device else None
            if verdict is not None and verdict.structure.kind != "arbitrary":
                summary = _block_mask.structure_tiles_as_stored(verdict.structure, size, view)
            else:
                verdict, summary = _scan.scan_with_tiles(view, size, masked_threshold)
    call = make_call(view, query, key, value, **call_fields)
    device = None
    for t in (query, mask):
        if t is not None and hasattr(t, "device") and str(getattr(t.device, "type", "")) == "cuda":
            device = t.device
            break
    env = _env.environment(device, **env_fields)
    try:
        policy = decide(verdict.structure, call, env, max_plan_calls)
        error = None
    except MaskError as e:
        if strict:
            raise
        policy, error = None, str(e)
    return Report(verdict, policy, call, env, error, summary)


def explain(mask, query=None, key=None, value=None, file=None, **fields) -> Report:
    """Prints the decision for `mask` with every rejection and its source; returns the Report."""
    report = inspect(mask, query, key, value, **fields)
    print(explain_text(report), file=file)
    return report
