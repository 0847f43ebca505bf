"""masklens.Report: what masklens proved about a mask and decided for a call, as the JSON
contract (docs/json.md, schema 2) and as the CLI's text."""
from __future__ import annotations

import json

from . import _core
from ._core import AttentionCall, Environment, MaskStructure, Policy, TileSummary, Verdict


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
        """The JSON contract (docs/json.md, schema 2), written by the CLI's own writer
        (json.hpp): the same document `masklens inspect --json` prints for the mask."""
        return json.loads(_core.report_json(self.structure, self.policy, self.tiles))

    def __str__(self) -> str:
        return explain_text(self)

    def __repr__(self) -> str:
        backend = self.policy.backend if self.policy else None
        return f"<masklens.Report {self.structure.describe()} -> {backend}>"


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
