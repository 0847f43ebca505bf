"""masklens.Report: what masklens proved about a mask and decided for a call, as the JSON
contract (docs/json.md, schema 2) and as the CLI's text."""
from __future__ import annotations

from . import _core
from ._core import AttentionCall, BlockMaskTensors, Call, Environment, MaskStructure, Policy, TileSummary, Verdict


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
        d = {"schema": _core.JSON_SCHEMA, "shape": [s.batch, s.heads, s.q_len, s.k_len],
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
            (qs, qe), (ks, ke) = st.q_range, st.k_range
            lines.append(f"          b={st.batch} q[{qs}:{qe}] k[{ks}:{ke}] {st.call.backend} {args}")
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
