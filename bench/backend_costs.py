"""Measures the cost rates of include/masklens/cost.hpp on this GPU, and the headline
calls they rank, beside the dense-mask baseline of the same run.

A rate is milliseconds per unit of work, forward and backward: one unit is 10^9
(query, key) pairs x heads x head_dim / 128. Kernels that skip masked tiles are charged
the attended pairs, a dense mask (and the math kernel) every pair. Every figure is the
median of several runs after a warm-up.

usage: python3 bench/backend_costs.py [--json OUT] [--quick]
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baselines import median_ms  # noqa: E402  (one timing loop for every bench script)

DEV = "cuda"
QUICK = "--quick" in sys.argv
OUT = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
H, D, DT = 4, 128, torch.bfloat16


def timed(fn, reps=5, warm=2):
    """Median milliseconds of fn() (forward + backward), after warm-up."""
    for _ in range(warm - 1):  # median_ms warms up once more itself
        fn()
    return median_ms(fn, reps)


def qkv(L, B=1):
    return [torch.randn(B, H, L, D, device=DEV, dtype=DT, requires_grad=True) for _ in range(3)]


def fwd_bwd(out_fn):
    def run():
        out = out_fn()
        out.backward(torch.ones_like(out))
    return run


def units(pairs):
    return pairs * H * (D + D) / 256 / 1e9


def causal_pairs(L):
    return L * (L + 1) / 2


def window_pairs(L, W):
    return sum(min(q + 1, W) for q in range(L)) if L < 200000 else L * W


def sdpa(kernel, q, k, v, mask=None, causal=False):
    with sdpa_kernel([kernel]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def varlen(q, k, v, cu, max_len, window):
    from torch.nn.attention.varlen import varlen_attn
    import inspect
    params = inspect.signature(varlen_attn).parameters
    qp, kp, vp = (t[0].transpose(0, 1) for t in (q, k, v))
    kwargs = {"window_size": window} if "window_size" in params else {"is_causal": True}
    return varlen_attn(qp, kp, vp, cu, cu, max_len, max_len, **kwargs)


def flex_runner(L, mask_mod):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    block_mask = create_block_mask(mask_mod, None, None, L, L, device=DEV)
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def rates(report):
    L = 8192 if QUICK else 16384
    q, k, v = qkv(L)
    i = torch.arange(L, device=DEV)
    dense_causal = (i[None, :] <= i[:, None])[None, None]
    full, attended = units(L * L), units(causal_pairs(L))
    W = 2048
    cu = torch.tensor([0, L], dtype=torch.int32, device=DEV)
    rows = {}

    def rate(name, ms, work, usage):
        rows[name] = {"ms": ms, "units": work, "rate": ms / work, "usage": usage}
        print(f"  {name:34s} {ms:9.3f} ms  {work:7.3f} units  {ms / work:7.2f} ms/unit  ({usage})")

    print(f"rates: 1 x {H} x {L} x {D}, bf16, forward + backward")
    rate("torch.sdpa.cudnn is_causal", timed(fwd_bwd(lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal=True))), attended, "native")
    rate("torch.sdpa.flash is_causal", timed(fwd_bwd(lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal=True))), attended, "native")
    rate("torch.sdpa.efficient is_causal", timed(fwd_bwd(lambda: sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v, causal=True)), reps=3), attended, "native")
    rate("torch.sdpa.math is_causal", timed(fwd_bwd(lambda: sdpa(SDPBackend.MATH, q, k, v, causal=True)), reps=3, warm=1), full, "native, every pair")
    rate("torch.varlen_attn causal", timed(fwd_bwd(lambda: varlen(q, k, v, cu, L, (-1, 0)))), attended, "native")
    rate(f"torch.varlen_attn window {W}", timed(fwd_bwd(lambda: varlen(q, k, v, cu, L, (W - 1, 0)))), units(window_pairs(L, W)), "native")
    flex_window = flex_runner(L, lambda b, h, qi, ki: (ki <= qi) & (qi - ki < W))
    rate(f"torch.flex_attention window {W}", timed(fwd_bwd(lambda: flex_window(q, k, v))), units(window_pairs(L, W)), "native")
    m = dense_causal
    flex_dense = flex_runner(L, lambda b, h, qi, ki: m[0, 0, qi, ki])
    rate("torch.flex_attention reading the mask", timed(fwd_bwd(lambda: flex_dense(q, k, v))), full, "dense mask")
    # What a partial tile costs over a full one (cost.hpp kFlexPartialTile*): every tile
    # full (nothing masked) against every tile partial (one pair masked per 128 x 128
    # tile), both computing every pair, with the mask_mod reading the dense mask and
    # with an index rule.
    every = torch.ones(L, L, dtype=torch.bool, device=DEV)
    holes = every.clone()
    holes[::128, 1::128] = False
    for how, mods in (("reading the mask", (lambda b, h, qi, ki: every[qi, ki], lambda b, h, qi, ki: holes[qi, ki])),
                      ("with an index rule", (lambda b, h, qi, ki: qi >= 0,
                                              lambda b, h, qi, ki: ((qi % 128) != 0) | ((ki % 128) != 1)))):
        run_full, run_partial = flex_runner(L, mods[0]), flex_runner(L, mods[1])  # BlockMasks built once
        full_ms = timed(fwd_bwd(lambda: run_full(q, k, v)))
        partial_ms = timed(fwd_bwd(lambda: run_partial(q, k, v)))
        rate(f"torch.flex_attention {how}, every tile full", full_ms, full, "tiles")
        rate(f"torch.flex_attention {how}, every tile partial", partial_ms, full, "tiles")
        print(f"  partial / full tile, {how}: {partial_ms / full_ms:.2f}")
    del every, holes
    rate("torch.sdpa.cudnn dense bool mask", timed(fwd_bwd(lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, mask=dense_causal))), full, "dense mask")
    rate("torch.sdpa.efficient dense bool mask", timed(fwd_bwd(lambda: sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v, mask=dense_causal)), reps=3), full, "dense mask")
    rate("torch.sdpa.math dense bool mask", timed(fwd_bwd(lambda: sdpa(SDPBackend.MATH, q, k, v, mask=dense_causal)), reps=3, warm=1), full, "dense mask")
    report["rates"] = {"shape": [1, H, L, D], "rows": rows}


def headline(report):
    """The measurements docs/backends.md cites, at 69632 tokens, beside the dense mask."""
    L = 32768 if QUICK else 69632
    W = 4096
    q, k, v = qkv(L)
    i = torch.arange(L, device=DEV)
    rows = {}

    def row(name, ms, baseline=None):
        rows[name] = {"ms": ms, "vs_dense": (baseline / ms) if baseline else None}
        print(f"  {name:46s} {ms:9.2f} ms" + (f"  {baseline / ms:6.1f}x faster than the dense mask" if baseline else ""))

    print(f"headline: 1 x {H} x {L} x {D}, bf16, forward + backward")
    window = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W))[None, None]
    dense_w = timed(fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=window)), reps=3)
    row(f"window {W}: dense mask, default dispatch", dense_w)
    del window
    cu = torch.tensor([0, L], dtype=torch.int32, device=DEV)
    row(f"window {W}: torch.varlen_attn", timed(fwd_bwd(lambda: varlen(q, k, v, cu, L, (W - 1, 0)))), dense_w)
    flex_window = flex_runner(L, lambda b, h, qi, ki: (ki <= qi) & (qi - ki < W))
    row(f"window {W}: compiled flex_attention", timed(fwd_bwd(lambda: flex_window(q, k, v))), dense_w)
    cuts = [0, L // 3, 2 * L // 3, L]
    doc = torch.bucketize(i, torch.tensor(cuts[1:-1], device=DEV), right=True)
    packed = ((i[None, :] <= i[:, None]) & (doc[:, None] == doc[None, :]))[None, None]
    dense_p = timed(fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=packed)), reps=3)
    row("3 documents: dense mask, default dispatch", dense_p)
    del packed

    def plan():
        outs = []
        for s, e in zip(cuts, cuts[1:]):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                outs.append(F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True))
        return torch.cat(outs, dim=2)
    row("3 documents: plan of 3 is_causal calls (cuDNN)", timed(fwd_bwd(plan)), dense_p)
    cu3 = torch.tensor(cuts, dtype=torch.int32, device=DEV)
    row("3 documents: torch.varlen_attn", timed(fwd_bwd(lambda: varlen(q, k, v, cu3, L - cuts[2], (-1, 0)))), dense_p)
    report["headline"] = {"shape": [1, H, L, D], "rows": rows}


def main():
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version()}
    print(report)
    rates(report)
    torch.cuda.empty_cache()
    headline(report)
    if OUT:
        with open(OUT, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":  # bench/dropin.py imports the runners above
    main()
