"""The drop-in keeps torch's contract: a mask that requires grad gets torch's gradient,
every scale gives torch's result, torch's exceptions where torch raises and a result
where torch runs; masklens.inspect checks the mask against the call; bad masks are a
MaskError that names what is wrong (issue 30)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import masklens
from helpers import assert_close, assert_same_outcome, leaves, outcome, qkv, rows_cols
from masklens.torch import scaled_dot_product_attention as sdpa

L = 16


def causal_bool(Q=L, K=L):
    i, j = rows_cols(Q, K)
    return j <= i


def causal_additive(Q=L, K=L, dtype=torch.float32):
    return torch.zeros(Q, K, dtype=dtype).masked_fill(~causal_bool(Q, K), float("-inf"))


# --- 1. a mask that requires grad -----------------------------------------------------

def train_bias(attention, with_causal, steps=3, lr=1.0, device="cpu"):
    """A zero-initialised learnable bias (alone or added to a causal -inf mask) trained
    with SGD through `attention`; q/k/v require grad too. Returns (the first step's
    gradients of bias, q, k, v; the bias after `steps` steps)."""
    bias = torch.nn.Parameter(torch.zeros(L, L, device=device))
    q, k, v = (t.detach().to(device).requires_grad_() for t in qkv(2, 4, L, L, seed=3))
    w = torch.randn(2, 4, L, 16, generator=torch.Generator().manual_seed(4)).to(device)
    opt = torch.optim.SGD([bias], lr=lr)
    first = None
    for _ in range(steps):
        opt.zero_grad()
        for t in (q, k, v):
            t.grad = None
        mask = bias + causal_additive().to(device) if with_causal else bias
        (attention(q, k, v, attn_mask=mask) * w).sum().backward()
        if first is None:
            first = [None if t.grad is None else t.grad.clone() for t in (bias, q, k, v)]
        opt.step()
    return first, bias.detach()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("with_causal", [False, True], ids=["bias", "bias+causal"])
def test_a_learnable_bias_gets_torchs_gradient(with_causal, device):
    ours, ours_after = train_bias(sdpa, with_causal, device=device)
    theirs, theirs_after = train_bias(F.scaled_dot_product_attention, with_causal, device=device)
    assert theirs[0].norm() > 1  # the premise: torch's gradient is not trivially zero
    assert ours[0] is not None, "the mask's gradient was lost"
    for a, b in zip(ours, theirs):
        assert_close(a, b, 1e-5)
    assert theirs_after.abs().max() > 0.1
    assert_close(ours_after, theirs_after, 1e-5)


def test_a_mask_computed_from_a_parameter_gets_its_gradient():
    """A non-leaf mask (an ALiBi-style slope times distances): the gradient reaches the
    parameter it was computed from."""
    i, j = rows_cols(L, L)
    distance = (j - i).clamp(max=0).float()

    def slope_grad(attention):
        slope = torch.nn.Parameter(torch.tensor(0.5))
        q, k, v = qkv(1, 2, L, L, seed=5)
        mask = (slope * distance).masked_fill(~causal_bool(), float("-inf"))
        attention(q, k, v, attn_mask=mask).square().sum().backward()
        return slope.grad, q.grad
    (ours, ours_q), (theirs, theirs_q) = slope_grad(sdpa), slope_grad(F.scaled_dot_product_attention)
    assert ours is not None and theirs.abs() > 0
    assert_close(ours, theirs, 1e-4)
    assert_close(ours_q, theirs_q, 1e-5)


def test_a_mask_that_requires_grad_without_grad_mode_is_still_scanned():
    """Under no_grad nothing reaches autograd: the mask is proven and dropped as any other."""
    bias = torch.nn.Parameter(causal_additive())
    q, k, v = qkv(2, 4, L, L, grad=False)
    before = masklens.scan_count()
    with torch.no_grad():
        out = sdpa(q, k, v, attn_mask=bias)
    assert masklens.scan_count() == before + 1
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach()), 1e-5)


# --- 2. writes torch does not see ------------------------------------------------------

def test_a_data_write_is_not_seen_until_forget():
    """`mask.data[...] = x` writes through a tensor with its own version counter: the
    mask's `_version` does not move, so the verdict is stale until masklens.forget(mask)
    (docs/python.md, the verdict cache)."""
    mask = causal_bool().expand(2, 1, L, L).clone()
    q, k, v = qkv(2, 4, L, L, grad=False)
    sdpa(q, k, v, attn_mask=mask)
    version = mask._version
    mask.data[1, 0, :, :4] = False  # batch 1 now left-padded: no longer plain causal
    assert mask._version == version  # the blind spot: torch does not count this write
    want = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    masklens.forget(mask)
    before = masklens.scan_count()
    assert_close(sdpa(q, k, v, attn_mask=mask), want, 1e-5)
    assert masklens.scan_count() == before + 1
    masklens.forget()  # every verdict
    assert_close(sdpa(q, k, v, attn_mask=mask), want, 1e-5)
    assert masklens.scan_count() == before + 2


# --- 4. every scale -------------------------------------------------------------------

# 5e-324 and 1e300 are positive in float64 but 0 and inf in the kernels' float32.
@pytest.mark.parametrize("scale", [0.0, -1.0, -0.125, float("inf"), float("nan"), 0.5, None, 5e-324, 1e300])
@pytest.mark.parametrize("form", ["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_scale_gives_torchs_result(scale, form, dtype, device):
    q, k, v = (t.detach().to(device).requires_grad_() for t in qkv(2, 4, L, L, dtype=dtype, seed=7))
    mask = (causal_bool() if form == "bool" else causal_additive(dtype=dtype)).to(device)
    out = sdpa(q, k, v, attn_mask=mask, scale=scale)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    tol = {}
    if device != "cpu":  # the drop-in may run another fused kernel than torch's dispatch picks
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out, ref, equal_nan=True, **tol)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), q), torch.autograd.grad(ref.sum(), q), equal_nan=True,
                               **tol)


@pytest.mark.parametrize("masked", [-1000.0, -1e4, -1e9, float("-inf")])
@pytest.mark.parametrize("spread", [1.0, 300.0])
def test_finite_masked_values_give_torchs_result_at_any_logit_spread(masked, spread):
    # A key masked by -1000 weighs in torch's result once logits of its row differ by
    # about 900: the drop-in keeps such a mask (a bias) and drops only -1e8 and below.
    q, k, v = qkv(1, 2, L, L, seed=11)
    q = q * spread
    i, j = rows_cols(L, L)
    mask = torch.zeros(L, L).masked_fill_(j > i, masked)
    torch.testing.assert_close(sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    policy, _ = masklens.torch.inspect(q, k, v, mask)
    assert policy.call.mask == ("drop" if masked <= masklens.torch.DROPIN_MASKED_THRESHOLD else "keep")


# --- 5. torch's exceptions where torch raises, a result where torch runs ---------------

def case_v_longer_than_k():
    q, k, v = qkv(1, 2, L, L)
    return (q, k, torch.randn(1, 2, L + 1, 16)), {"attn_mask": causal_bool()}


def case_mask_dtype(dtype):
    def make():
        mask = causal_additive(dtype=dtype) if dtype.is_floating_point else causal_bool().to(dtype)
        return qkv(1, 2, L, L), {"attn_mask": mask}
    return make


def case_mask(mask, Q=L, K=L, H=2, Hk=None, **kwargs):
    def make():
        return qkv(2, H, Q, K, Hk=Hk), {"attn_mask": mask(), **kwargs}
    return make


RAISES = {
    "v longer than k": case_v_longer_than_k,
    "float16 mask, float32 q": case_mask_dtype(torch.float16),
    "bfloat16 mask, float32 q": case_mask_dtype(torch.bfloat16),
    "uint8 mask": case_mask_dtype(torch.uint8),
    "int8 mask": case_mask_dtype(torch.int8),
    "float64 mask, float32 q": case_mask_dtype(torch.float64),
    "1-D mask": case_mask(lambda: torch.ones(L, dtype=torch.bool)),
    "5-D mask": case_mask(lambda: torch.ones(1, 1, 1, L, L, dtype=torch.bool)),
    "17 mask rows for 16": case_mask(lambda: torch.ones(L + 1, L, dtype=torch.bool)),
    "3 mask heads for 2": case_mask(lambda: torch.ones(1, 3, L, L, dtype=torch.bool)),
    "3 mask batches for 2": case_mask(lambda: torch.ones(3, 1, L, L, dtype=torch.bool)),
    "kv heads without enable_gqa": case_mask(causal_bool, H=4, Hk=2),
    "kv heads that do not divide": case_mask(causal_bool, H=4, Hk=3, enable_gqa=True),
    "sparse mask": case_mask(lambda: causal_bool().to_sparse()),
    "float8 mask": case_mask(lambda: torch.ones(L, L).to(torch.float8_e4m3fn)),
}


@pytest.mark.parametrize("name", list(RAISES))
def test_where_torch_raises_the_drop_in_raises_the_same(name):
    args, kwargs = RAISES[name]()
    assert outcome(F.scaled_dot_product_attention, *args, **kwargs)[0] is not None  # the premise
    assert_same_outcome(args, kwargs)


def meta_tensors():
    q, k, v = (torch.empty(2, 2, L, 16, device="meta") for _ in range(3))
    return (q, k, v), {"attn_mask": torch.ones(L, L, dtype=torch.bool, device="meta")}


def meta_mask_on_cpu():
    return qkv(2, 2, L, L), {"attn_mask": torch.ones(L, L, dtype=torch.bool, device="meta")}


RUNS = {
    "Q = 0": case_mask(lambda: torch.ones(0, L, dtype=torch.bool), Q=0),
    "K = 0": case_mask(lambda: torch.ones(L, 0, dtype=torch.bool), K=0),
    "meta tensors": meta_tensors,
    "a meta mask with CPU tensors": meta_mask_on_cpu,
    "float32 mask, bfloat16 q": lambda: (qkv(2, 2, L, L, dtype=torch.bfloat16), {"attn_mask": causal_additive()}),
    "a [Q, 1] mask": case_mask(lambda: torch.ones(L, 1, dtype=torch.bool)),
    "a [1, K] mask": case_mask(lambda: causal_bool()[-1:]),
    "a [H, Q, K] mask": case_mask(lambda: causal_bool().expand(2, L, L).clone()),
    "torch's CausalBias": case_mask(lambda: causal_lower_right(L, L)),  # a Tensor subclass
}


@pytest.mark.parametrize("name", list(RUNS))
def test_where_torch_runs_the_drop_in_runs(name):
    args, kwargs = RUNS[name]()
    assert outcome(F.scaled_dot_product_attention, *leaves(*args), **kwargs)[0] is None  # the premise
    # torch reads a meta mask with CPU tensors as uninitialised memory: only the result's
    # shape, dtype and device are defined.
    assert_same_outcome(args, kwargs, values=name != "a meta mask with CPU tensors")


def test_a_nan_mask_runs_as_torch_runs_it_with_a_warning():
    """torch runs a mask holding NaN (its rows come out NaN); the drop-in does too, and
    warns naming the element masklens could not read."""
    mask = causal_additive().clone()
    mask[9, 2] = float("nan")
    q, k, v = qkv(1, 2, L, L, grad=False)
    with pytest.warns(RuntimeWarning, match=r"element \[0, 0, 9, 2\]"):
        out = sdpa(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), equal_nan=True)


# --- 6. masklens.inspect checks the mask against the call -------------------------------

@pytest.mark.parametrize("shape", [(L,), (L + 1, L), (1, 3, L, L), (3, 1, L, L), (L, L + 1), (1, 1, 1, L, L)],
                         ids=["[K]", "17 rows", "3 heads", "3 batches", "17 keys", "5-D"])
def test_inspect_refuses_a_mask_that_does_not_broadcast_to_the_call(shape):
    q, k, v = qkv(2, 4, L, L)
    with pytest.raises(masklens.MaskError, match=r"invalid_shape: .*broadcast.*\[2, 4, 16, 16\]"):
        masklens.inspect(torch.ones(shape, dtype=torch.bool), q, k, v)


@pytest.mark.parametrize("shape", [(L, L), (1, 1, L, L), (2, 1, L, L), (4, L, L), (L, 1), (1, L)])
def test_inspect_reads_a_mask_broadcast_as_torch_broadcasts_it(shape):
    q, k, v = qkv(2, 4, L, L)
    mask = torch.ones(shape, dtype=torch.bool)
    report = masklens.inspect(mask, q, k, v)
    s = report.structure
    assert (s.q_len, s.k_len, s.kind) == (L, L, "full")
    assert (report.call.batch, report.call.heads, report.call.q_len, report.call.k_len) == (2, 4, L, L)
    assert report.policy is not None
    numpy_report = masklens.inspect(mask.numpy(), q, k, v)
    assert (numpy_report.structure.q_len, numpy_report.structure.k_len) == (L, L)


def test_inspect_reads_the_key_length_from_k_and_the_rows_from_q():
    q, k, v = qkv(1, 2, 8, L)
    report = masklens.inspect(torch.ones(1, L, dtype=torch.bool), q, k, v)
    assert (report.structure.q_len, report.structure.k_len) == (8, L)
    with pytest.raises(masklens.MaskError, match="broadcast"):
        masklens.inspect(torch.ones(L, L, dtype=torch.bool), q, k, v)  # 16 rows for an 8-row q


# --- messages for masks masklens cannot read ---------------------------------------------

@pytest.mark.parametrize("array, named", [
    (np.array([[object(), object()]]), "object"),
    (np.array([["a", "b"]]), "<U1"),
    (np.zeros((2, 2), dtype=[("a", "i4")]), "[('a', '<i4')]"),
    (np.zeros((2, 2), dtype=np.complex64), "complex64"),
    (np.zeros((2, 2), dtype=np.int64), "int64"),
], ids=["object", "unicode", "structured", "complex", "int64"])
def test_numpy_masks_of_no_mask_dtype_name_the_dtype(array, named):
    with pytest.raises(masklens.MaskError, match="unsupported_dtype") as e:
        masklens.inspect(array)
    assert named in str(e.value)


def test_a_big_endian_mask_is_read_as_its_values():
    native = np.where(causal_bool().numpy(), 0.0, -np.inf).astype(np.float32)
    big = native.astype(">f4")
    assert masklens.inspect(big).structure.describe() == masklens.inspect(native).structure.describe()
    assert masklens.scan(big).structure.kind == "causal"


@pytest.mark.parametrize("value, named", [([[True, False]], "list"), (None, "None"), (3.0, "float")])
def test_a_mask_that_is_no_array_names_its_type(value, named):
    with pytest.raises(masklens.MaskError, match="invalid_argument") as e:
        masklens.inspect(value)
    assert named in str(e.value)


def test_a_float8_mask_names_its_dtype():
    with pytest.raises(masklens.MaskError, match="unsupported_dtype: mask dtype torch.float8_e4m3fn"):
        masklens.inspect(torch.ones(4, 4).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
def test_torchs_causal_bias_is_read_as_the_mask_it_stands_for(variant):
    # A CausalBias is an empty tensor whose meaning is its variant and lengths: scanning
    # its storage read uninitialised memory.
    from torch.nn.attention import bias
    make = bias.causal_upper_left if variant == "upper_left" else bias.causal_lower_right
    q, k, v = qkv(2, 4, 8, 12)
    for _ in range(3):
        want = "causal top_left" if variant == "upper_left" else "causal bottom_right"
        assert masklens.inspect(make(8, 12), q, k, v).structure.describe() == want
        assert masklens.scan(make(8, 12)).structure.describe() == want
    with pytest.raises(masklens.MaskError, match="tensor subclass"):
        masklens.torch.inspect(q, k, v, make(8, 12))  # the drop-in runs torch's own call for it


def test_torch_inspect_says_why_the_drop_in_runs_torchs_call():
    q, k, v = qkv(1, 2, L, L)
    learnable = torch.zeros(L, L, requires_grad=True)
    with pytest.raises(masklens.MaskError, match="requires grad"):
        masklens.torch.inspect(q, k, v, learnable)
    with pytest.raises(masklens.MaskError, match="float64"):
        masklens.torch.inspect(q.double(), k.double(), v.double(), causal_bool())
    with pytest.raises(masklens.MaskError, match=r"\[B, H, L, D\]"):
        masklens.torch.inspect(q[0], k[0], v[0], causal_bool())


@pytest.mark.parametrize("field, value", [("head_dim", 2**63), ("sm", "ninety"), ("torch", 5)])
def test_a_keyword_the_binding_cannot_hold_names_the_field(field, value):
    q, k, v = qkv(1, 2, L, L)
    with pytest.raises(masklens.MaskError, match=field):
        masklens.inspect(causal_bool(), q, k, v, **{field: value})


def test_a_sparse_mask_names_its_layout():
    with pytest.raises(masklens.MaskError, match="sparse_coo") as e:
        masklens.scan(torch.eye(4, dtype=torch.bool).to_sparse())
    assert "to_dense()" in str(e.value)
