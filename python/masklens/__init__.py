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

from . import _core
from ._core import (AttentionCall, BlockMaskTensors, Call, Environment, FlexArgs, Hazard, KernelArgs, MaskError,
                    MaskStructure, PlanStep, Policy, Rejection, SdpaArgs, TileFractions, TileSummary, VarlenArgs,
                    Verdict, decide, describe, tiles_from_structure)
from ._env import environment, set_strict, strict
from ._inspect import explain, inspect, make_call  # noqa: F401  (make_call: masklens.distributed)
from ._report import Report, explain_text  # noqa: F401  (explain_text: a Report as explain() prints it)
from ._scan import (cuda_scan_unavailable, element_name, has_cuda_scan, last_timing,  # noqa: F401
                    load_kernels, scan_count)
from ._verdicts import forget, forward, scan

__version__ = _core.__version__
JSON_SCHEMA = _core.JSON_SCHEMA
logger = logging.getLogger("masklens")
__all__ = ["AttentionCall", "BlockMaskTensors", "Call", "Environment", "FlexArgs", "Hazard", "KernelArgs", "MaskError",
           "MaskStructure", "PlanStep", "Policy", "Rejection", "Report", "SdpaArgs", "TileFractions", "TileSummary",
           "VarlenArgs", "Verdict", "decide", "describe", "tiles_from_structure",
           "cuda_scan_unavailable", "environment", "explain", "forget", "forward", "has_cuda_scan", "inspect",
           "last_timing", "load_kernels", "scan", "scan_count", "set_strict", "strict"]
