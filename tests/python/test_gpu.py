"""On a CUDA device (skipped without one): the drop-in runs the kernels it decides —
is_causal on cuDNN/flash, plans, torch's varlen_attn, compiled FlexAttention — and
matches an fp32 reference forward and backward; the second call on a mask costs no scan."""
import warnings

import pytest
import torch

import masklens
from helpers import assert_close, rows_cols
from masklens.torch import scaled_dot_product_attention as sdpa

pytestmark = pytest.mark.gpu
DEV = "cuda"


def reference32(q, k, v, mask):
    from helpers import reference
    return reference(q.float(), k.float(), v.float(), mask)


def masks(L=2048):
    i, j = rows_cols(L, L)
    i, j = i.to(DEV), j.to(DEV)
    c = j <= i
    docs = torch.bucketize(torch.arange(L, device=DEV), torch.tensor([300, 1200], device=DEV), right=True)
    start = torch.tensor([0, 100], device=DEV)
    return {
        "causal": c.expand(2, 1, L, L),
        "sliding window 256": (c & (i - j < 256)).expand(2, 1, L, L),
        "packed documents": (c & (docs[:, None] == docs[None, :])).expand(2, 1, L, L),
        "left padded causal": (c[None] & (j[None] >= start[:, None, None]))[:, None],
    }


NAMES = ["causal", "sliding window 256", "packed documents", "left padded causal"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("flex", [False, True])
def test_drop_in_matches_reference(name, flex, monkeypatch):
    if flex:  # only FlexAttention available: every mask runs through a compiled BlockMask
        from masklens import _env
        real = _env.environment
        monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": {"flex"}}))
    mask = masks()[name]
    B, _, Q, K = mask.shape
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(B, 4, n, 128, device=DEV, generator=g, dtype=torch.bfloat16).requires_grad_()
               for n in (Q, K, K))
    with warnings.catch_warnings():
        # Without the CUDA scanner the mask is copied to the host once, with a warning.
        warnings.simplefilter("ignore", RuntimeWarning)
        out = sdpa(q, k, v, attn_mask=mask)
    ref = reference32(q, k, v, mask)
    if flex:
        from masklens.torch import inspect
        assert inspect(q, k, v, mask)[0].backend == "torch.flex_attention"
    assert_close(out.float(), ref, 2e-2)
    w = torch.randn_like(ref)
    g1 = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    g2 = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(g1, g2):
        assert_close(a.float(), b.float(), 5e-2 * max(1.0, b.abs().max().item()))
    before = masklens.scan_count()
    sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() == before


def test_seed_case_drops_the_mask_for_is_causal():
    L = 8192
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril()
    q = torch.randn(1, 4, L, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    from masklens.torch import inspect
    policy, verdict = inspect(q, q, q, mask)
    assert verdict.structure.kind == "causal"
    assert policy.call.mask == "drop" and policy.call.args.is_causal
