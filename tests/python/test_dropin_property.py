"""The drop-in against torch's scaled_dot_product_attention over random calls: shapes,
dtypes, scales (None, positive, 0, negative), masks (bool, additive with -inf or a
finite minimum, float32 beside a lower-precision query; causal, bottom-right causal,
sliding window, padding, packed documents, prefix, random, rows that attend nothing;
laid out [Q, K], [H, Q, K], [1, 1, Q, K], [B, 1, Q, K], [B, H, Q, K] or expanded with
stride 0; requiring grad or not), GQA, and calls torch refuses or runs at the edges
(Q = 0, K = 0, mismatched shapes, mask dtypes and dims torch does not take), with
dropout_p = 0. Where torch raises, the drop-in raises the same exception type; where
torch runs, the output and every gradient (q, k, v and the mask's) agree within the
dtype's tolerance. Seeded: a failure names its case, which `case(seed)` rebuilds."""
import random

import pytest
import torch
import torch.nn.functional as F

import masklens
from masklens.torch import scaled_dot_product_attention as sdpa

CASES = 480
DTYPES = [torch.float32, torch.float32, torch.bfloat16, torch.float64]
# (atol, rtol) of outputs and gradients. The drop-in may run another kernel than torch's
# dispatch picks for the dense mask (is_causal, a plan of slices, the mask cast): in
# bfloat16 that is a rounding or two of the inputs' scale.
TOLERANCE = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (3e-2, 3e-2), torch.float64: (1e-10, 1e-8)}
KINDS = ["causal", "causal_bottom_right", "window", "left_padding", "right_padding", "documents", "prefix", "random",
         "full", "empty_row"]
FORMS = ["bool", "additive", "additive_finite", "additive_float32", "additive_bias"]
LAYOUTS = ["QK", "HQK", "11QK", "B1QK", "BHQK", "expanded"]
EDGES = ["Q = 0", "K = 0", "v longer than k", "17 rows for 16", "one head too many", "1-D mask", "float16 mask",
         "uint8 mask", "kv heads without enable_gqa"]


def allowed_rows(rng, kind, B, Q, K):
    """[B, Q, K] bool: which keys each query row attends, per batch."""
    i, j = torch.arange(Q)[:, None], torch.arange(K)[None, :]
    rows = []
    for _ in range(B):
        if kind == "causal":
            a = j <= i
        elif kind == "causal_bottom_right":
            a = j <= i + (K - Q)
        elif kind == "window":
            a = (j <= i) & (i - j < rng.randint(1, max(Q, 1)))
        elif kind == "left_padding":
            a = (j <= i + (K - Q)) & (j >= rng.randint(0, K - 1))
        elif kind == "right_padding":
            a = (j < rng.randint(1, K)).expand(Q, K)
        elif kind == "documents":
            cuts = torch.tensor(sorted(rng.sample(range(1, max(Q, K) + 1), rng.randint(0, min(3, max(Q, K)))) or [0]))
            a = (j <= i) & (torch.bucketize(i, cuts, right=True) == torch.bucketize(j, cuts, right=True))
        elif kind == "prefix":
            a = (j <= i) | (j < rng.randint(0, K))
        elif kind == "random":
            a = torch.rand(Q, K, generator=torch.Generator().manual_seed(rng.randrange(2**31))) > 0.4
        elif kind == "full":
            a = torch.ones(Q, K, dtype=torch.bool)
        else:  # empty_row: causal with one row attending nothing
            a = (j <= i).clone()
            a[rng.randrange(Q)] = False
        rows.append(a.expand(Q, K))
    return torch.stack(rows)


def laid_out(allowed, layout, H):
    """The [B, Q, K] pattern in the mask's layout (one batch's pattern where the layout
    has no batch dim)."""
    one = allowed[0]
    if layout == "QK":
        return one.clone()
    if layout == "HQK":
        return one.expand(H, *one.shape).clone()
    if layout == "11QK":
        return one[None, None].clone()
    if layout == "B1QK":
        return allowed[:, None].clone()
    if layout == "BHQK":
        return allowed[:, None].expand(-1, H, -1, -1).clone()
    return one.expand(allowed.shape[0], H, *one.shape)  # expanded: stride 0 over batch and heads


def as_form(rng, attends, form, dtype):
    """The mask's values: bool, or additive (-inf, the dtype's minimum, a float32 mask with
    a lower-precision query, or a bias on the attended keys)."""
    if form == "bool":
        return attends
    mask_dtype = torch.float32 if form == "additive_float32" else dtype
    if form == "additive_finite":
        return torch.zeros(attends.shape, dtype=mask_dtype).masked_fill(~attends, torch.finfo(mask_dtype).min)
    base = torch.zeros(attends.shape, dtype=mask_dtype)
    if form == "additive_bias":
        g = torch.Generator().manual_seed(rng.randrange(2**31))
        base = (torch.rand(attends.shape, generator=g) - 1).to(mask_dtype)
    return base.masked_fill(~attends, float("-inf"))


def case(seed, dtypes=DTYPES, device="cpu"):
    """One random call: {"q", "k", "v", "mask", "mask_grad", "kwargs", "about"}."""
    rng = random.Random(seed)
    dtype = rng.choice(dtypes)
    B, H = rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
    Hk = rng.choice([h for h in (1, 2, 4) if H % h == 0]) if rng.random() < 0.3 else H
    enable_gqa = Hk != H or rng.random() < 0.1
    Q = rng.randint(1, 20)
    K = Q if rng.random() < 0.5 else rng.randint(1, 20)
    D = rng.choice([4, 8, 16])
    Dv = rng.choice([D, D, 8])
    Kv = K
    scale = rng.choice([None, None, None, None, 0.5, 0.125, 3.0, 0.0, -1.0, -0.25])
    kind, form, layout = rng.choice(KINDS), rng.choice(FORMS), rng.choice(LAYOUTS)
    edge = rng.choice(EDGES) if rng.random() < 0.15 else None
    if edge == "Q = 0":
        Q = 0
    elif edge == "K = 0":
        K = Kv = 0
    elif edge == "v longer than k":
        Kv = K + 1
    elif edge == "kv heads without enable_gqa" and H > 1:
        Hk, enable_gqa = 1, False
    if Q and K:
        mask = as_form(rng, laid_out(allowed_rows(rng, kind, B, Q, K), layout, H), form, dtype)
    else:
        mask = torch.ones(Q, K, dtype=torch.bool)
    if edge == "17 rows for 16":
        mask = torch.ones(Q + 1, K, dtype=torch.bool)
    elif edge == "one head too many":
        mask = torch.ones(1, H + 1, Q, K, dtype=torch.bool)
    elif edge == "1-D mask":
        mask = torch.ones(K, dtype=torch.bool)
    elif edge == "float16 mask":
        mask = mask.to(torch.float16) if mask.is_floating_point() else torch.zeros(mask.shape, dtype=torch.float16)
    elif edge == "uint8 mask":
        mask = mask.to(torch.uint8) if mask.dtype == torch.bool else mask
    mask_grad = mask.is_floating_point() and rng.random() < 0.2
    g = torch.Generator().manual_seed(seed)
    grad = rng.random() < 0.75
    about = dict(dtype=dtype, B=B, H=H, Hk=Hk, Q=Q, K=K, Kv=Kv, D=D, Dv=Dv, scale=scale, kind=kind, form=form,
                 layout=layout, edge=edge, mask=(tuple(mask.shape), mask.dtype, tuple(mask.stride())),
                 mask_grad=mask_grad, grad=grad, enable_gqa=enable_gqa)
    make = lambda *shape: torch.randn(*shape, generator=g).to(device, dtype).requires_grad_(grad)
    return {"q": make(B, H, Q, D), "k": make(B, Hk, K, D), "v": make(B, Hk, Kv, Dv), "mask": mask.to(device),
            "mask_grad": mask_grad, "kwargs": {"dropout_p": 0.0, "scale": scale, "enable_gqa": enable_gqa},
            "about": about}


def attend(fn, c, seed):
    """(exception type, None) where fn raises; else (None, (output, gradients of q, k, v
    and the mask's leaf)). A mask requiring grad is a leaf, or (odd seeds) a learnable
    zero bias added to the mask: autograd must reach it either way."""
    q, k, v = (c[n].detach().clone().requires_grad_(c[n].requires_grad) for n in "qkv")
    leaf = mask = c["mask"]  # as laid out (an expanded mask keeps its stride 0)
    if c["mask_grad"]:
        if seed % 2:
            leaf = torch.zeros(mask.shape, dtype=mask.dtype, device=mask.device, requires_grad=True)
            mask = c["mask"] + leaf
        else:
            leaf = mask = c["mask"].detach().requires_grad_(True)
    try:
        out = fn(q, k, v, attn_mask=mask, **c["kwargs"])
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), None
    inputs = [t for t in (q, k, v, leaf) if t.requires_grad]
    if not inputs or not out.requires_grad:
        return None, (out, [])
    # The output's weights, rounded to the case's dtype (a float64 reference takes the same values).
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(c.get("weights", out.dtype))
    w = w.to(out.device, out.dtype)
    try:
        grads = list(torch.autograd.grad((out * w).sum(), inputs, allow_unused=True))
    except Exception as e:  # noqa: BLE001 - a backward torch refuses (its kernels' "LSE is not correctly
        return type(e), None  # aligned" on some CUDA shapes) is an outcome too, compared by type
    return None, (out, grads)


def math_sdpa(*args, **kwargs):
    """torch's SDPA on its math kernel: on CUDA the values a call must give, where the
    default dispatch can pick a kernel that is wrong for the mask (cuDNN reads a float32
    mask beside float16/bfloat16 q as their dtype, pytorch#191612; it gives rows with no
    key the mean of V): the drop-in is torch's result without those defects."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(*args, **kwargs)


def drop_in_takes(c):
    """Whether the drop-in runs case `c` itself (else it hands it to torch's own call, whose
    result it then is, defects of the default dispatch included: docs/python.md)."""
    from masklens import torch as mt
    q, k, v, mask, kw = c["q"], c["k"], c["v"], c["mask"], c["kwargs"]
    if mask.dim() not in (2, 3, 4) or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    return (mt._torch_runs_it(q, k, v, mask, kw["dropout_p"], False, kw["scale"], kw["enable_gqa"]) is None and not c["mask_grad"]
            and mt._refusal(q, k, v, mask, kw["enable_gqa"]) is None)


def assert_behaves_as_torch(c, seed, tolerance, values=F.scaled_dot_product_attention):
    """The drop-in's outcome of case `c` is torch's: the same exception type as torch's
    default dispatch, or the output and every gradient within tolerance[dtype] = (atol,
    rtol) of `values` (torch's default call; math_sdpa on CUDA)."""
    theirs = attend(F.scaled_dot_product_attention, c, seed)
    ours = attend(sdpa, c, seed)
    what = f"seed {seed}: {c['about']}"
    assert ours[0] == theirs[0], f"{what}: torch raised {theirs[0]}, masklens {ours[0]}"
    if theirs[0] is not None:
        return
    if values is not F.scaled_dot_product_attention:
        theirs = attend(values, c, seed)
        assert theirs[0] is None, f"{what}: the reference raised {theirs[0]}"
    (out, grads), (ref, ref_grads) = ours[1], theirs[1]
    atol, rtol = tolerance[c["q"].dtype]
    exact = []  # torch's math in float64 on the same values, made where first needed

    def close(a, b, n, name):
        """a within tolerance of torch's b; or, in float16 / bfloat16, as close to float64
        math as torch's own result is (FlashAttention's test rule: at most twice torch's
        error, plus atol / 10), as kernels that sum in other orders round differently."""
        try:
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol, equal_nan=True, msg=lambda m: f"{what}: {name}: {m}")
        except AssertionError:
            if c["q"].dtype not in (torch.float16, torch.bfloat16):
                raise
            if not exact:
                exact.append(attend(F.scaled_dot_product_attention, in_float64(c), seed))
            raised, values64 = exact[0]
            if raised is not None:
                raise
            # The rule below compares finite errors: a NaN where torch has none (or the
            # reverse) is never within it.
            assert torch.equal(a.isnan(), b.isnan()), f"{what}: {name}: NaN where torch's is not, or the reverse"
            e = (values64[0], *values64[1])[n].to(a.device)
            ours_error, torch_error = (a.double() - e).abs().nan_to_num(), (b.double() - e).abs().nan_to_num()
            assert ours_error.max() <= 2 * torch_error.max() + atol / 10, (
                f"{what}: {name}: masklens {ours_error.max():.3g} from float64 math, torch {torch_error.max():.3g}")

    close(out, ref, 0, "output")
    assert len(grads) == len(ref_grads), what
    for n, (a, b) in enumerate(zip(grads, ref_grads)):
        assert (a is None) == (b is None), f"{what}: gradient {n}: masklens {a is None}, torch {b is None}"
        if b is not None:
            close(a, b, n + 1, f"gradient {n}")


def in_float64(c):
    """Case `c` with q, k, v and a float mask in float64 (the output's weights rounded as the
    case's are): the values the case's tensors hold, computed without rounding."""
    up = lambda t: t.detach().double().requires_grad_(t.requires_grad)  # noqa: E731
    mask = c["mask"]
    mask = mask.detach().double().requires_grad_(mask.requires_grad) if mask.is_floating_point() else mask
    return {**c, "q": up(c["q"]), "k": up(c["k"]), "v": up(c["v"]), "mask": mask, "weights": c["q"].dtype}


@pytest.mark.parametrize("block", range(6))
def test_drop_in_behaves_as_torch_on_random_calls(block):
    """CASES random calls in 6 blocks (a failure names its seed and case). The drop-in
    proves (scans) a good share of the masks, rather than handing every call to torch."""
    per_block = CASES // 6
    scans = masklens.scan_count()
    for seed in range(block * per_block, (block + 1) * per_block):
        assert_behaves_as_torch(case(seed), seed, TOLERANCE)
    assert masklens.scan_count() - scans >= per_block // 5


# On a GPU torch's dispatch and the drop-in may pick different fused kernels (flash,
# efficient, cuDNN, math, varlen): half-precision outputs differ by a few roundings.
CUDA_TOLERANCE = {torch.float32: (2e-3, 2e-3), torch.bfloat16: (6e-2, 6e-2), torch.float16: (2e-2, 2e-2)}


# Cases whose call torch's own default dispatch cannot make on CUDA without faulting the
# context (the drop-in hands them to torch as they are): seed 69, fp32 q, k, v [1, 1, 12, 16] with
# scale 0, enable_gqa and a float mask that requires grad, is an illegal memory access in
# torch's call alone (torch 2.11, measured on an H100 with CUDA_LAUNCH_BLOCKING=1).
TORCH_FAULTS_ON_CUDA = {69}


@pytest.mark.gpu
def test_drop_in_behaves_as_torch_on_random_cuda_calls(monkeypatch):
    """The same calls on a CUDA device (float16, bfloat16, float32), among torch's own
    kernels and varlen_attn (FlexAttention, left out, would compile a frame per random
    shape: test_gpu.py runs it)."""
    from masklens import _env
    real = _env.environment
    monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": {"torch"}}))
    for seed in range(CASES // 4):
        if seed in TORCH_FAULTS_ON_CUDA:
            continue
        c = case(seed, dtypes=[torch.float16, torch.bfloat16, torch.float32], device="cuda")
        assert_behaves_as_torch(c, seed, CUDA_TOLERANCE, values=math_sdpa if drop_in_takes(c) else
                                F.scaled_dot_product_attention)


def test_the_cases_cover_what_they_claim():
    """The generator reaches every kind, form, layout and edge, GQA, every scale sign
    and masks that require grad; torch raises for some cases."""
    seen = {"kind": set(), "form": set(), "layout": set(), "edge": set(), "scale": set()}
    gqa = mask_grad = raised = 0
    for seed in range(CASES):
        c = case(seed)
        a = c["about"]
        for key in ("kind", "form", "layout", "edge"):
            seen[key].add(a[key])
        seen["scale"].add(None if a["scale"] is None else (a["scale"] > 0) - (a["scale"] < 0))
        gqa += a["Hk"] != a["H"] and a["enable_gqa"]
        mask_grad += a["mask_grad"]
        if a["edge"] in ("v longer than k", "1-D mask", "uint8 mask"):
            raised += attend(F.scaled_dot_product_attention, c, seed)[0] is not None
    assert seen["kind"] == set(KINDS) and seen["form"] == set(FORMS) and seen["layout"] == set(LAYOUTS)
    assert seen["edge"] == set(EDGES) | {None} and seen["scale"] == {None, -1, 0, 1}
    assert gqa >= 30 and mask_grad >= 30 and raised >= 10
