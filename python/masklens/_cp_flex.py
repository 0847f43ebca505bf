"""The flex_attention that context-parallel attention calls: torch.compile'd on CUDA by
default (eager flex materialises the scores), eager on the CPU (where flex has no
backward). One compiled function for every call under CP, with dynamic lengths: a new
sequence length (dynamic padding) reuses the compiled kernel where a static compile would
compile again.

Unlike the drop-in's flex (masklens._flex) it keeps no buckets per shape and rule (one
Dynamo cache and recompile limit for all of CP's calls), and it has no guard against
flex's unfused path: past Dynamo's recompile limit the call runs eagerly, materialising
this rank's [rows, Q] scores. The drop-in's guard falls back to torch's call with the
dense mask, which a rank under CP does not hold (it has its rows, and the keys of the
whole sequence only after the gather)."""
from __future__ import annotations

import torch

_compiled_flex = None


def flex_for(compiled, device):
    """flex_attention, compiled where `compiled` says (None: on CUDA)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention
    if compiled is None:
        compiled = torch.device(device).type == "cuda"
    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=True)
    return _compiled_flex
