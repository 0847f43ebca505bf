"""masklens: prove what a dense attention mask is, and run attention with the backend
and arguments that compute it correctly and fastest.

    import masklens
    report = masklens.inspect(mask, q, k, v)      # structure, policy, rejections, hazards
    masklens.explain(mask, q, k, v)               # the decision, printed as the CLI prints it
    from masklens.torch import scaled_dot_product_attention   # the drop-in
    import masklens.transformers                  # attn_implementation="masklens"
    masklens.load_kernels()                       # at start-up: the CUDA kernels loaded now

See docs/python.md.
"""
from __future__ import annotations

import logging

from . import _cache, _core, _env
from ._cache import forget, forward, scan_count
from ._core import (AttentionCall, BlockMaskTensors, Call, Environment, FlexArgs, Hazard, KernelArgs, MaskError,
                    MaskStructure, PlanStep, Policy, Rejection, SdpaArgs, TileFractions, TileSummary, VarlenArgs,
                    Verdict, decide, describe, tiles_from_structure)
from ._env import environment

__version__ = _core.__version__
JSON_SCHEMA = _core.JSON_SCHEMA
logger = logging.getLogger("masklens")

__all__ = ["AttentionCall", "BlockMaskTensors", "Call", "Environment", "FlexArgs", "Hazard", "KernelArgs", "MaskError",
           "MaskStructure", "PlanStep", "Policy", "Rejection", "Report", "SdpaArgs", "TileFractions", "TileSummary",
           "VarlenArgs", "Verdict", "decide", "describe", "tiles_from_structure",
           "cuda_scan_unavailable", "environment", "explain", "forget", "forward", "has_cuda_scan", "inspect",
           "last_timing", "load_kernels", "scan", "scan_count", "set_strict", "strict"]

_strict = False


def set_strict(on: bool = True) -> None:
    """strict: raise where only a kernel with a known defect would run the mask, instead
    of falling back to torch's own dispatch (masklens.torch, masklens.transformers)."""
    global _strict
    _strict = bool(on)


def strict() -> bool:
    return _strict


_CALL_FIELDS = ("dtype", "head_dim", "head_dim_v", "batch", "heads", "kv_heads", "q_len", "k_len", "training",
                "dropout", "deterministic", "mask_dtype")
_ENV_FIELDS = ("sm", "torch", "cudnn", "flash_attn", "flash_attn3", "xformers", "transformer_engine", "flashinfer",
               "cudnn_frontend", "available")
_TORCH_DTYPES = {"torch.bool": "bool", "torch.uint8": "uint8", "torch.int8": "int8", "torch.float16": "float16",
                 "torch.bfloat16": "bfloat16", "torch.float32": "float32"}
_NUMPY_DTYPES = {"bool": "bool", "uint8": "uint8", "int8": "int8", "float16": "float16", "float32": "float32"}


def has_cuda_scan() -> bool:
    """Whether CUDA masks are scanned on their device (masklens._cuda, built where Meson
    found nvcc). Where not, they are copied to the host once, with a warning;
    `cuda_scan_unavailable()` says why."""
    return _cache.cuda_module() is not None


def cuda_scan_unavailable() -> str | None:
    """Why CUDA masks are not scanned on the device, or None where they are."""
    return _cache.cuda_reason()


def load_kernels(device=None) -> bool:
    """Loads masklens' CUDA kernels on a device now, so that the process's first scan of a
    CUDA mask does not also pay for loading them (CUDA loads a kernel at its first launch:
    0.7-1.0 ms once per process on an H200, bench/README.md's device_step). A framework
    calls it at start-up, once its CUDA context exists (masklens.transformers' mask
    function calls it on a background thread the first time it sees a CUDA device;
    importing masklens.transformers initialises no CUDA). `device`: a torch.device, "cuda:N", an index, or
    None for torch's current CUDA device. Returns True once every kernel of the device
    scanner (scan, run reduction, tile scan, BlockMask writer) is loaded there (a second
    call finds them loaded); False, with no error and nothing done, where there is no
    masklens._cuda (`cuda_scan_unavailable()` says why), no CUDA device, or `device` is
    not a CUDA device. A failure on a CUDA device (an index past the device count, a GPU
    the build has no code for) is a MaskError naming the CUDA call. It also allocates the
    pinned host memory a BlockMask's tables cross to the device through (a few MiB)."""
    module = _cache.cuda_module()
    if module is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return False
    index = torch.cuda.current_device() if device.index is None else device.index
    module.load_kernels(index)
    _cache.reserve_staging(torch.device("cuda", index))
    return True


def last_timing() -> dict:
    """What the last scan or drop-in call cost, in milliseconds: `scanned` (False: the
    verdict came from the cache), `device` ("cuda" or "host": where the last scan ran),
    `scan_ms` (device: allocation, kernel, copy of the spans and the one synchronisation;
    host: scan and classify), `classify_ms` (device scans), `decide_ms` (0 when the
    policy was cached); device scans also `prepare_ms` (the size query, and a BlockMask's
    tensors allocated, before scan_ms) and `kernels_ms` (within scan_ms: the call that
    enqueues the kernels and copies and synchronises, host work done meanwhile included);
    0 after a host scan. Timers are taken around each step, so they cost ~1 µs."""
    return dict(_cache.timing)


def element_name(dtype) -> str | None:
    """The mask element name of a torch or numpy dtype ('bool', 'bfloat16', ...), or None."""
    return _TORCH_DTYPES.get(str(dtype)) or _NUMPY_DTYPES.get(str(dtype))


def scan(mask, masked_threshold: float = -1000.0) -> Verdict:
    """Scans and classifies a mask (torch tensor of any device, or numpy array), cached per
    torch tensor (see masklens._cache for what the cache can and cannot see). A CUDA
    tensor is scanned on its device where has_cuda_scan()."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and isinstance(mask, torch.Tensor):
        return _cache.entry_for(mask, masked_threshold).verdict
    return _cache.scan(mask, masked_threshold)


def _is_training(*tensors) -> bool:
    import torch
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def make_call(mask, query=None, key=None, value=None, **fields) -> AttentionCall:
    """The AttentionCall of tensors in torch SDPA's layout [B, H, L, D]; keyword fields
    override what the tensors say."""
    call = AttentionCall()
    shape = tuple(mask.shape)
    call.batch = shape[0] if len(shape) == 4 else 1
    call.mask_dtype = element_name(mask.dtype)
    if query is not None:
        call.dtype = str(query.dtype).replace("torch.", "")
        call.head_dim = query.shape[-1]
        call.heads = query.shape[-3] if query.dim() >= 3 else 1
        call.batch = max(call.batch, query.shape[0] if query.dim() == 4 else 1)
        call.q_len = query.shape[-2]
    if key is not None:
        call.kv_heads = key.shape[-3] if key.dim() >= 3 else 1
        call.k_len = key.shape[-2]
    if value is not None:
        call.head_dim_v = value.shape[-1]
    if query is not None:
        import torch
        call.training = _is_training(query, key, value)
        call.deterministic = torch.are_deterministic_algorithms_enabled()
    for name, value_ in fields.items():
        _env.set_field(call, "call", name, value_)
    call.validate()
    return call


class Report:
    """What masklens proved about a mask and decided for a call."""

    def __init__(self, verdict: Verdict, policy: Policy | None, call: AttentionCall, env: Environment,
                 error: str | None = None, tiles: TileSummary | None = None):
        self.verdict = verdict
        self.tiles = tiles  # the tile summary inspect(tiles=...) counted, else None
        self.structure: MaskStructure = verdict.structure
        self.policy = policy
        self.call = call
        self.environment = env
        self.error = error  # why there is no policy (decide() failed), else None

    @property
    def rejected(self) -> list:
        return list(self.policy.rejected) if self.policy else []

    @property
    def hazards(self) -> list:
        return list(self.policy.hazards) if self.policy else []

    def to_dict(self) -> dict:
        """The JSON contract (docs/json.md, schema 2), as the CLI's --json prints it."""
        s = self.structure
        d = {"schema": JSON_SCHEMA, "shape": [s.batch, s.heads, s.q_len, s.k_len],
             "structure": structure_dict(s), "policy": policy_dict(self.policy, s) if self.policy else None}
        if self.tiles is not None:
            d["tiles"] = tiles_dict(self.tiles)
        return d

    def __str__(self) -> str:
        return explain_text(self)

    def __repr__(self) -> str:
        backend = self.policy.backend if self.policy else None
        return f"<masklens.Report {self.structure.describe()} -> {backend}>"


def structure_dict(s: MaskStructure) -> dict:
    d = {"kind": s.kind}
    if s.kind not in ("full", "arbitrary"):
        d["alignment"] = s.alignment
    if s.kind == "sliding_window":
        d["window"] = s.window
    if s.kind == "chunked":
        d["chunk"] = s.chunk
    if s.kind == "prefix_lm":
        d["prefix"] = s.prefix
    if s.kind == "causal_blocks":
        d["blocks"] = [list(b) for b in s.blocks]
    d["segments"] = [list(x) for x in s.segments] if s.segments is not None else None
    d["kv_valid"] = [list(r) for r in s.kv_valid] if s.kv_valid is not None else None
    d["q_valid"] = [list(r) for r in s.q_valid] if s.q_valid is not None else None
    d["empty_rows"] = s.empty_rows
    d["finite_masked_rows"] = s.finite_masked_rows
    d["bias"] = s.bias
    t = s.tile_fractions
    if t is not None:  # written only when known, as the CLI writes it
        d["tile_fractions"] = {"block": [t.block_q, t.block_k], "partial": t.partial, "full": t.full}
    return d


def tiles_dict(tiles: TileSummary) -> dict:
    """The document's "tiles" (docs/json.md): BlockMask's eight tensors as nested lists."""
    t = tiles.block_mask()
    d = {"block": list(tiles.block_size), "seq_lengths": [tiles.q_len, tiles.k_len], "shape": list(tiles.shape),
         "counts": tiles.counts}
    for name in BlockMaskTensors.fields:
        d[name] = getattr(t, name).tolist()
    return d


def typed_call_dict(call: Call) -> dict:
    a = call.args
    if a is None:
        return {"type": "zeros"}
    if a.type == "sdpa":
        return {"type": "sdpa", "kernel": a.kernel, "is_causal": a.is_causal,
                "causal_lower_right": a.causal_lower_right, "enable_gqa": a.enable_gqa}
    if a.type == "kernel":
        return {"type": "kernel", "causal": a.causal, "alignment": a.alignment, "window_left": a.window_left,
                "window_right": a.window_right, "chunk": a.chunk}
    if a.type == "varlen":
        return {"type": "varlen", "sequences": [list(x) for x in a.sequences], "packed": a.packed,
                "causal": a.causal, "window_left": a.window_left, "window_right": a.window_right}
    return {"type": "flex", "block": [a.block_q, a.block_k], "mask_mod_reads_mask": a.mask_mod_reads_mask}


def call_dict(call: Call, batch: int, q_len: int, k_len: int) -> dict:
    args, mask_object = call.rendered(batch, q_len, k_len)
    return {"backend": call.backend, "mask": call.mask, "mask_cast": call.mask_cast, "mask_form": call.mask_form,
            "call": typed_call_dict(call), "args": args, "mask_object": mask_object}


def policy_dict(p: Policy, s: MaskStructure) -> dict:
    d = call_dict(p.call, s.batch, s.q_len, s.k_len)
    d["cost_ms"] = p.cost_ms
    if not p.is_plan:
        d["plan"] = None
    else:
        d["plan"] = []
        for st in p.plan:
            (qs, qe), (ks, ke) = st.q_range, st.k_range
            step = call_dict(st.call, 1, qe - qs, ke - ks)
            step.update({"batch": st.batch, "q_range": [qs, qe], "k_range": [ks, ke]})
            d["plan"].append(step)
    d["rejected"] = []
    for r in p.rejected:
        x = {"backend": r.backend, "kind": r.kind, "reason": r.reason, "source": r.source}
        if r.kind == "refused":
            x["rules"] = r.rules
        if r.kind == "defect":
            x["defect"] = r.defect
        if r.kind == "slower":
            x["cost_ms"] = r.cost_ms
        d["rejected"].append(x)
    d["hazards"] = [{"kind": h.kind, "detail": h.detail} for h in p.hazards]
    return d


def _structure_tiles_as_stored(structure, size, mask):
    """An exact structure's tiles (tiles_from_structure, no read) laid out over the slices
    `mask` stores, as a scan of the mask lays them out: a batch or head dimension of the
    mask that is absent, 1 or of stride 0 holds one slice, any other one each (the
    structure alone would store one wherever its rule is the same for all), so that
    Report.tiles is the same whichever way it was counted."""
    summary = tiles_from_structure(structure, *size)
    dims, strides = list(mask.shape), list(mask.stride())
    while len(dims) < 4:
        dims.insert(0, 1)
        strides.insert(0, 0)
    stored = tuple(n if n > 1 and stride != 0 else 1 for n, stride in zip(dims[:2], strides[:2]))
    if tuple(summary.shape[:2]) == stored:
        return summary
    import numpy as np
    states = np.ascontiguousarray(np.broadcast_to(summary.states, stored + tuple(summary.shape[2:])))
    return _core.tile_summary_from_states(states, dims[0], dims[1], summary.q_len, summary.k_len, *summary.block_size)


def _split_fields(overrides: dict):
    call_fields = {k: overrides.pop(k) for k in list(overrides) if k in _CALL_FIELDS}
    env_fields = {k: overrides.pop(k) for k in list(overrides) if k in _ENV_FIELDS}
    if overrides:
        raise TypeError(f"masklens.inspect: unknown keyword(s) {sorted(overrides)}; call fields are {_CALL_FIELDS}, "
                        f"environment fields {_ENV_FIELDS}")
    return call_fields, env_fields


def _broadcast_to_call(mask, query, key):
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
        return scan(view, masked_threshold)
    return _cache.entry_for(mask, masked_threshold, view=view).verdict


def inspect(mask, query=None, key=None, value=None, *, masked_threshold: float = -1000.0,
            max_plan_calls: int = 64, strict: bool = False, tiles=None, **fields) -> Report:
    """Scans `mask` (torch tensor or numpy array, 1-4 dims, broadcast as SDPA broadcasts it),
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
    call_fields, env_fields = _split_fields(dict(fields))
    mask = _cache.readable(mask)
    view = _broadcast_to_call(mask, query, key) if query is not None else mask
    summary = None
    if tiles is None:
        verdict = _verdict(mask, view, masked_threshold)
    else:
        size = _cache.tile_size(tiles)
        on_device = str(getattr(getattr(view, "device", None), "type", "cpu")) == "cuda"
        if on_device and _cache.has_device_tiles():
            verdict, summary = _cache.device_tile_summary(view.detach(), size, masked_threshold)
        else:
            verdict = _verdict(mask, view, masked_threshold) if on_device else None
            if verdict is not None and verdict.structure.kind != "arbitrary":
                summary = _structure_tiles_as_stored(verdict.structure, size, view)
            else:
                verdict, summary = _cache.scan_with_tiles(view, size, masked_threshold)
    call = make_call(view, query, key, value, **call_fields)
    device = None
    for t in (query, mask):
        if t is not None and hasattr(t, "device") and str(getattr(t.device, "type", "")) == "cuda":
            device = t.device
            break
    env = environment(device, **env_fields)
    try:
        policy = decide(verdict.structure, call, env, max_plan_calls)
        error = None
    except MaskError as e:
        if strict:
            raise
        policy, error = None, str(e)
    return Report(verdict, policy, call, env, error, summary)


def explain_text(report: Report) -> str:
    s, p = report.structure, report.policy
    lines = [f"structure {s.describe()}  [{s.batch}, {s.heads}, {s.q_len}, {s.k_len}]"]
    c, e = report.call, report.environment
    lines.append(f"for       {c.dtype} head_dim {c.head_dim}, heads {c.heads}/{c.kv_heads or c.heads}, "
                 f"{'training' if c.training else 'inference'}, sm{e.sm}, torch {e.torch}, cuDNN {e.cudnn}, "
                 f"available {', '.join(sorted(e.available))}")
    if p is None:
        lines.append(f"no call   {report.error}")
        return "\n".join(lines)
    cast = f", cast to {p.call.mask_cast}" if p.call.mask_cast else ""
    lines.append(f"call      {p.backend} (mask {p.call.mask}{cast})  estimated {_core.format_ms(p.cost_ms)}")
    if p.is_plan:
        lines.append(f"          a plan of {len(p.plan)} calls, each on q[b, :, q_range] and k/v[b, :, k_range]:")
        for st in p.plan[:8]:
            args, _ = st.call.rendered(1, st.q_range[1] - st.q_range[0], st.k_range[1] - st.k_range[0])
            lines.append(f"          b={st.batch} q[{st.q_range[0]}:{st.q_range[1]}] k[{st.k_range[0]}:{st.k_range[1]}] "
                         f"{st.call.backend} {args}")
        if len(p.plan) > 8:
            lines.append(f"          ... {len(p.plan) - 8} more")
    else:
        args, mask_object = p.call.rendered(s.batch, s.q_len, s.k_len)
        lines.append(f"          args {args}" + (f", mask object {mask_object}" if mask_object else ""))
    for h in p.hazards:
        lines.append(f"hazard    {h.kind}: {h.detail}")
    for r in p.rejected:
        lines.append(f"rejected  {r.backend} ({r.kind}): {r.reason}  [{r.source}]")
    return "\n".join(lines)


def explain(mask, query=None, key=None, value=None, file=None, **fields) -> Report:
    """Prints the decision for `mask` with every rejection and its source; returns the Report."""
    report = inspect(mask, query, key, value, **fields)
    print(explain_text(report), file=file)
    return report
