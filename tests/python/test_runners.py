"""The runners behind masklens.torch, on the CPU: GPU policies (decided for sm90 with
torch, flex and flash-attn available) executed with torch's CPU kernels — plans of
slices, varlen packing (the kernel replaced by per-sequence SDPA), FlexAttention's
mask_mod from the structure's fields (eager flex) — against the dense reference."""
import warnings

import pytest
import numpy as np
import torch
import torch.nn.functional as F

import masklens
from masklens import _block_mask, _flex, _run
from helpers import assert_close, grads, qkv, reference, rows_cols

L = 64


def gpu_policy(mask, q, k, v, **env):
    fields = {"sm": 90, "torch": "2.11", "cudnn": "9.19", "available": {"torch"}}
    fields.update(env)
    r = masklens.inspect(mask, q, k, v, **fields)
    return r.policy, r.structure


def tensors(policy, structure, q, k, v, mask):
    m = mask
    while m.dim() < 4:
        m = m.unsqueeze(0)
    return _run.Tensors(q, k, v, m, None, 0.0, structure, {})


def zero_empty_rows(out, mask):
    attends = mask if mask.dtype == torch.bool else mask > -1000
    while attends.dim() < 4:
        attends = attends.unsqueeze(0)
    return torch.where(attends.any(-1, keepdim=True), out, torch.zeros_like(out))


def sdpa_per_sequence(qp, kp, vp, cu_q, cu_k, max_q, max_k, causal, window, scale):
    """varlen_attn's semantics on the CPU: each sequence alone, bottom-right causal, window
    (left, right); K and V may have fewer heads than Q (GQA, as flash's varlen takes it)."""
    outs = []
    for n in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[n].item(), cu_q[n + 1].item(), cu_k[n].item(), cu_k[n + 1].item()
        q, k, v = (t.transpose(0, 1)[None] for t in (qp[qs:qe], kp[ks:ke], vp[ks:ke]))
        Q, K = qe - qs, ke - ks
        i, j = rows_cols(Q, K)
        p = i + (K - Q)
        allow = torch.ones(Q, K, dtype=torch.bool)
        if causal or window[1] >= 0:
            allow &= j <= p + max(window[1], 0)
        if window[0] >= 0:
            allow &= j >= p - window[0]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def masks():
    i, j = rows_cols(L, L)
    c = j <= i
    docs = torch.stack([torch.bucketize(torch.arange(L), torch.tensor(cuts), right=True) for cuts in ([10, 40], [30])])
    start = torch.tensor([0, 12])
    qi, kj = rows_cols(16, L)
    many = torch.bucketize(torch.arange(L), torch.tensor([2, 3, 6, 9, 11, 14, 18, 21, 25, 27, 30, 34, 37, 41, 44, 48,
                                                           52, 55, 59, 62]), right=True)
    return {
        "packed documents": (c[None] & (docs[:, :, None] == docs[:, None, :]))[:, None],
        "sliding window 16": (c & (i - j < 16)).expand(2, 1, L, L),
        "left padded causal": (c[None] & (j[None] >= start[:, None, None]))[:, None],
        "bottom-right Q<K": (kj <= qi + (L - 16)).expand(2, 1, 16, L),
        "chunked 16": (c & (i // 16 == j // 16)).expand(2, 1, L, L),
        "prefix 20": (c | (j < 20)).expand(2, 1, L, L),
        # 2-D masks: a structure of batch 1 that stands for every batch of the call.
        "2-D packed documents": c & (docs[0][:, None] == docs[0][None, :]),
        "2-D sliding window 16": c & (i - j < 16),
        # Many short documents.
        "2-D twenty-one documents": c & (many[:, None] == many[None, :]),
    }


MASKS = masks()


@pytest.mark.parametrize("name", list(MASKS))
def test_gpu_policy_runs_exactly_on_cpu(name):
    """Whatever sm90 picks (plan, varlen, sdpa with is_causal or the mask), run here."""
    mask = MASKS[name]
    q, k, v = qkv(2, 4, mask.shape[-2], mask.shape[-1], dtype=torch.float32)
    policy, structure = gpu_policy(mask, q, k, v, dtype="bf16", training=True)
    t = tensors(policy, structure, q, k, v, mask)
    if policy.backend == "torch.varlen_attn" and not policy.is_plan:
        out = _run.run_varlen(policy.call, t, q, k, v, attend=sdpa_per_sequence)
    else:
        out = _run.run_policy(policy, t)
    out = zero_empty_rows(out, mask)
    ref = reference(q, k, v, mask)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


def test_packed_documents_become_a_plan_or_varlen():
    mask = MASKS["packed documents"]
    q, k, v = qkv(2, 4, L, L, dtype=torch.bfloat16)
    policy, _ = gpu_policy(mask, q, k, v, training=True)
    assert policy.call.mask == "drop"
    assert policy.is_plan or policy.backend == "torch.varlen_attn"


@pytest.mark.parametrize("name", ["sliding window 16", "packed documents", "chunked 16", "2-D packed documents",
                                  "2-D sliding window 16"])
def test_varlen_packing(name):
    """The varlen call's packing and unpacking, with varlen_attn's semantics on the CPU."""
    mask = MASKS[name]
    q, k, v = qkv(2, 4, L, L, dtype=torch.float32)
    s = masklens.scan(mask).structure
    call = masklens.AttentionCall()
    call.training, call.heads, call.head_dim = True, 4, 16
    env = masklens.environment("cpu", sm=90, available={"torch"})
    policy = masklens.decide(s, call, env)
    # Ask for the varlen form itself: it must be among the correct choices.
    kinds = {r.backend: r.kind for r in policy.rejected}
    if policy.backend != "torch.varlen_attn":
        assert kinds.get("torch.varlen_attn") == "slower", kinds
        pytest.skip("varlen is correct but not chosen here; its packing is tested where it is")
    t = tensors(policy, s, q, k, v, mask)
    out = zero_empty_rows(_run.run_varlen(policy.call, t, q, k, v, attend=sdpa_per_sequence), mask)
    assert_close(out, reference(q, k, v, mask), 1e-5)


def test_varlen_rows_in_order_are_packed_as_a_view():
    """One batch of packed documents (its packed rows: every row, in order): the varlen
    kernel gets views of q, k and v, not gathered copies, and its output is the result
    itself (no zero-filled [B, H, Q, D] beside it); forward and backward equal the
    reference."""
    mask = MASKS["packed documents"][:1]
    q, k, v = qkv(1, 4, L, L, dtype=torch.float32)
    s = masklens.scan(mask).structure
    call = masklens.AttentionCall()
    call.training, call.heads, call.head_dim = True, 4, 16
    policy = masklens.decide(s, call, masklens.environment("cpu", sm=90, available={"torch"}))
    if policy.backend != "torch.varlen_attn" or policy.is_plan:
        pytest.skip(f"{policy.backend} chosen here; the varlen packing is tested where it is")
    seen = []

    def attend(qp, kp, vp, *args, **kwargs):
        seen.append(all(p.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
                        for p, x in ((qp, q), (kp, k), (vp, v))))
        return sdpa_per_sequence(qp, kp, vp, *args, **kwargs)
    out = zero_empty_rows(_run.run_varlen(policy.call, tensors(policy, s, q, k, v, mask), q, k, v, attend=attend),
                          mask)
    assert seen == [True]
    ref = reference(q, k, v, mask)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


def test_rows_of_a_last_dim_that_is_not_contiguous_are_gathered():
    """A varlen kernel reads rows with a contiguous last dim: where the caller's tensor has
    another stride there, the rows in order are gathered (a contiguous copy), not viewed."""
    x = torch.randn(1, 9, 2, 8).transpose(-1, -2)  # [B, L, H, D] = [1, 9, 8, 2], its last dim of stride 8
    b, i = torch.zeros(9, dtype=torch.long), torch.arange(9)
    packed = _run._packed(x, b, i, (0, 9))
    assert packed.stride(-1) == 1 and torch.equal(packed, x[0])
    y = x.contiguous()
    viewed = _run._packed(y, b, i, (0, 9))
    assert viewed.data_ptr() == y.data_ptr() and torch.equal(viewed, y[0])


@pytest.mark.parametrize("sequences,batch,order", [
    ([(0, 0, 5, 0, 5), (0, 5, 9, 5, 9)], 1, (0, 9)),
    ([(0, 3, 9, 3, 9)], 1, (3, 9)),                     # left padding: the rows after it
    ([(0, 0, 9, 0, 9), (1, 0, 9, 0, 9)], 2, "every"),
    ([(0, 0, 5, 0, 5), (1, 0, 9, 0, 9)], 2, None),      # batch 0 ends at row 5 of 9
    ([(0, 0, 4, 0, 4), (0, 5, 9, 5, 9)], 1, None),      # a gap (row 4)
    ([(0, 5, 9, 5, 9), (0, 0, 5, 0, 5)], 1, None),      # out of order
    ([(0, 0, 9, 0, 9)], 2, None),                       # batch 1 missing
])
def test_packed_rows_in_order_are_told_apart(sequences, batch, order):
    assert _run._in_order(sequences, 1, batch, 9) == order


def no_expansion(monkeypatch):
    """Fails the test if a runner repeats K and V to the query's heads."""
    def refuse(q, k, v):
        raise AssertionError(f"K/V expanded from {k.shape[1]} to {q.shape[1]} heads")
    monkeypatch.setattr(_run, "_expand_kv", refuse)


@pytest.mark.parametrize("name", ["packed documents", "sliding window 16", "chunked 16", "2-D packed documents"])
def test_varlen_takes_gqa_without_expanding(name, monkeypatch):
    """8 query heads over 2 key heads: the packed K and V keep 2 heads (the kernel gets
    them as flash's varlen does), and output and gradients equal the reference."""
    mask = MASKS[name]
    q, k, v = qkv(2, 8, L, L, Hk=2, dtype=torch.float32)
    s = masklens.scan(mask).structure
    call = masklens.AttentionCall()
    call.training, call.heads, call.kv_heads, call.head_dim = True, 8, 2, 16
    policy = masklens.decide(s, call, masklens.environment("cpu", sm=90, torch="2.11", available={"torch"}))
    if policy.backend != "torch.varlen_attn" or policy.is_plan:
        pytest.skip(f"{policy.backend} is decided here, not varlen")
    assert not any(h.kind == "gqa_expand" for h in policy.hazards)
    no_expansion(monkeypatch)
    heads_seen = []

    def attend(qp, kp, vp, *args, **kwargs):
        heads_seen.append((qp.shape[1], kp.shape[1], vp.shape[1]))
        return sdpa_per_sequence(qp, kp, vp, *args, **kwargs)

    out = zero_empty_rows(_run.run_varlen(policy.call, tensors(policy, s, q, k, v, mask), q, k, v, attend=attend), mask)
    assert heads_seen == [(8, 2, 2)]
    ref = reference(q, k, v, mask)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert a.shape == b.shape
        assert_close(a, b, 1e-4)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["sliding window 16", "packed documents", "2-D sliding window 16"])
def test_flex_takes_gqa_without_expanding(name, monkeypatch):
    """FlexAttention with enable_gqa: K and V keep their 2 heads; output (and, through
    flex's eager reference, gradients) equal the dense reference."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    mask = MASKS[name]
    q, k, v = qkv(2, 8, L, L, Hk=2, dtype=torch.float32)
    s = masklens.scan(mask).structure
    call = masklens.AttentionCall()
    call.training, call.heads, call.kv_heads, call.head_dim = True, 8, 2, 16
    policy = masklens.decide(s, call, masklens.environment("cpu", sm=90, available={"flex"}))
    assert policy.backend == "torch.flex_attention"
    assert not any(h.kind == "gqa_expand" for h in policy.hazards)
    no_expansion(monkeypatch)
    seen = []
    real_flex = fa.flex_attention

    def flex(q_, k_, v_, **kwargs):
        seen.append((q_.shape[1], k_.shape[1], kwargs.get("enable_gqa")))
        return real_flex(q_, k_, v_, **kwargs)

    monkeypatch.setattr(fa, "flex_attention", flex)
    # torch refuses flex's backward on the CPU up front; its eager implementation (the
    # dense reference flex is tested against upstream) computes it all the same.
    if hasattr(fa, "_validate_device"):
        monkeypatch.setattr(fa, "_validate_device", lambda *a: None)
    out = _flex.run_flex(policy.call, tensors(policy, s, q, k, v, mask), q, k, v, compiled=False)
    assert seen == [(8, 2, True)]
    ref = reference(q, k, v, mask)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert a.shape == b.shape
        assert_close(a, b, 1e-4)


@pytest.mark.parametrize("name", list(MASKS))
def test_flex_mask_mod_from_structure(name):
    """The BlockMask built from the structure's fields equals the dense mask (eager flex)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from torch.nn.attention.flex_attention import create_mask
    mask = MASKS[name]
    s = masklens.scan(mask).structure
    B, Q, K = 2, mask.shape[-2], mask.shape[-1]
    mod = _block_mask.mask_mod_for(s, "cpu")
    dense = create_mask(mod, B, 1, Q, K, device="cpu")
    assert torch.equal(dense, mask.expand(B, 1, Q, K))


@pytest.mark.parametrize("segments", [
    [[0, 5, 17, 40]],                    # one list for every batch
    [[0, 5, 17, 40], [0, 40], [0, 1, 2, 39, 40]],  # per batch; one batch a single document
    [[0, 40], [0, 40]],                  # no interior start anywhere
])
def test_document_table_numbers_each_batch_documents_apart(segments):
    """The mask_mod's document table: positions of one batch share an id exactly when they
    lie in one document (ids need not start at 0 per batch)."""
    Q = 40
    table = _block_mask.document_table(segments, Q, "cpu")
    assert table.dtype == torch.int32 and table.shape == (len(segments), Q)
    for b, seg in enumerate(segments):
        doc = np.searchsorted(np.asarray(seg[1:-1]), np.arange(Q), side="right")  # the reference: the doc index
        same = doc[:, None] == doc[None, :]
        ids = table[b].numpy()
        assert np.array_equal(ids[:, None] == ids[None, :], same), f"batch {b}"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_runs_eager_on_cpu():
    pytest.importorskip("torch.nn.attention.flex_attention")
    mask = MASKS["sliding window 16"]
    q, k, v = qkv(2, 4, L, L, dtype=torch.float32, grad=False)  # flex has no CPU backward
    s = masklens.scan(mask).structure
    call = masklens.AttentionCall()
    call.heads, call.head_dim, call.training = 4, 16, True
    policy = masklens.decide(s, call, masklens.environment("cpu", sm=90, available={"torch", "flex"}))
    flex = [r for r in policy.rejected if r.backend == "torch.flex_attention"]
    assert policy.backend == "torch.flex_attention" or flex[0].kind == "slower"
    # Build the flex call as decide would and run it eagerly.
    env = masklens.environment("cpu", sm=90, available={"flex"})
    policy = masklens.decide(s, call, env)
    assert policy.backend == "torch.flex_attention" and policy.call.args.type == "flex"
    t = tensors(policy, s, q, k, v, mask)
    out = _flex.run_flex(policy.call, t, q, k, v, compiled=False)
    assert_close(out, reference(q, k, v, mask), 1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_dropout_never_runs_on_flex(monkeypatch):
    """flex_attention has no dropout: with FlexAttention the only backend, a call with
    dropout is refused by rule (flex.dropout) and runs as torch's own call, whose output
    (the same seed) the drop-in returns; without dropout flex runs it."""
    from masklens.torch import scaled_dot_product_attention as sdpa, inspect
    only_flex(monkeypatch)  # torch >= 2.5 (the package's floor) has flex: never skipped
    mask = MASKS["sliding window 16"]
    q, k, v = qkv(2, 4, L, L, dtype=torch.float32)
    assert inspect(q, k, v, mask)[0].backend == "torch.flex_attention"
    assert inspect(q, k, v, mask, dropout_p=0.5)[0] is None  # torch's own dispatch
    s = masklens.scan(mask).structure
    call = masklens.AttentionCall()
    call.heads, call.head_dim, call.training, call.dropout = 4, 16, True, 0.5
    policy = masklens.decide(s, call, masklens.environment("cpu", sm=90, available={"torch", "flex"}))
    assert policy.backend != "torch.flex_attention"
    assert any(r.backend == "torch.flex_attention" and "flex_attention takes no dropout" in r.reason
               for r in policy.rejected)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "running torch's own dispatch"
        torch.manual_seed(0)
        out = sdpa(q, k, v, attn_mask=mask, dropout_p=0.5)
    torch.manual_seed(0)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.5))


def test_rows_that_attend_to_nothing_come_out_zero_whatever_the_kernel(monkeypatch):
    """A kernel that writes garbage into rows with no key (cuDNN returns the mean of V):
    the drop-in still returns 0 there, and the rows that attend are untouched."""
    from masklens.torch import scaled_dot_product_attention as sdpa
    mask = MASKS["left padded causal"]
    q, k, v = qkv(2, 4, L, L, dtype=torch.float32)
    real = _run.run_policy
    monkeypatch.setattr(_run, "run_policy", lambda policy, t: real(policy, t) + 7.0)
    out = sdpa(q, k, v, attn_mask=mask)
    assert torch.all(out[1, :, :12] == 0)  # row 1's first 12 queries attend to nothing
    assert torch.all(out[0] != 0) and torch.all(out[1, :, 12:] != 0)
    assert_close(out - 7.0 * (out != 0), reference(q, k, v, mask), 1e-5)


@pytest.mark.parametrize("name", list(MASKS))
def test_flex_mask_mod_reads_in_bounds_past_the_last_row_and_key(name):
    """create_block_mask evaluates whole tiles: with lengths that are not multiples of the
    block, the mask_mod is called with indices past Q and K. Its lookups must stay in
    bounds (on a GPU an out-of-bounds read is a device-side assert that poisons the
    process), for the structure's rule and for a kept mask."""
    mask = MASKS[name]
    s = masklens.scan(mask).structure
    Q, K = mask.shape[-2], mask.shape[-1]
    past_q = torch.arange(Q, Q + 130)[:, None]
    past_k = torch.arange(K, K + 130)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    mask4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # the drop-in hands the 4-D view
    for mod in (_block_mask.mask_mod_for(s, "cpu"), _block_mask.mask_mod_for(s, "cpu", mask4)):
        mod(zero, zero, past_q, torch.arange(K)[None, :])  # raises IndexError on an out-of-bounds read
        mod(zero, zero, torch.arange(Q)[:, None], past_k)
        mod(zero + 1, zero, past_q, past_k)  # batch 1 of a structure broadcast over the batch


def test_rows_masked_only_by_finite_values_keep_torchs_result():
    """A left-padded mask filled with finfo.min (as transformers writes it) has rows whose
    every key is masked by a finite value: torch's dense softmax attends uniformly there.
    The drop-in keeps the mask for them and returns torch's result, not zeros."""
    from masklens.torch import scaled_dot_product_attention as sdpa
    L = 12
    i, j = rows_cols(L, L)
    allowed = (j <= i) & (j >= 4)  # rows 0..3 see no valid key
    mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]
    q, k, v = qkv(1, 2, L, L)
    got = sdpa(q, k, v, attn_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(got, want, 1e-5)
    assert got[:, :, :4].abs().max() > 0  # the uniform rows are not zeroed
    for a, b in zip(grads(got, (q, k, v)), grads(want, (q, k, v))):
        assert_close(a, b, 1e-5)


def sdp_flags():
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())


def set_sdp_flags(state):
    b = torch.backends.cuda
    switches = (b.enable_flash_sdp, b.enable_mem_efficient_sdp, b.enable_math_sdp, b.enable_cudnn_sdp)
    for enable, on in zip(switches, state):
        enable(on)


@pytest.mark.parametrize("backend", list(_run.SDPA_KERNELS))
def test_kernel_switches_are_sdpa_kernels(backend, monkeypatch):
    """The drop-in selects a CUDA kernel with torch.backends.cuda's public switches
    instead of the sdpa_kernel context (20 µs a call): during the call they read as
    sdpa_kernel sets them, from any starting state, and are restored after it, also
    when the call raises. (The switches are process state: this runs on the CPU.)"""
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(_run.SDPA_KERNELS[backend]):
        want = sdp_flags()
    seen = []

    def record(*args, **kwargs):
        seen.append(sdp_flags())
        if kwargs.get("scale") == -1.0:
            raise RuntimeError("kernel failed")
        return "out"
    monkeypatch.setattr(_run.F, "scaled_dot_product_attention", record)
    start = sdp_flags()
    try:
        for state in [(True, True, True, True), want, (False, True, False, True)]:
            set_sdp_flags(state)
            assert _run._sdpa_on_kernels(_run.SDPA_KERNEL_FLAGS[backend], 0, 0, 0, None, 0.0, False, None, False) == "out"
            assert seen[-1] == want and sdp_flags() == state
            with pytest.raises(RuntimeError, match="kernel failed"):
                _run._sdpa_on_kernels(_run.SDPA_KERNEL_FLAGS[backend], 0, 0, 0, None, 0.0, False, -1.0, False)
            assert seen[-1] == want and sdp_flags() == state
    finally:
        set_sdp_flags(start)


def only_flex(monkeypatch):
    """The environment as an sm90 GPU's with FlexAttention the only backend."""
    from masklens import _env
    real_env = _env.environment
    if getattr(real_env, "only_flex", False):
        return
    patched = lambda *a, **kw: real_env(*a, **{**kw, "available": {"flex"}, "sm": 90})  # noqa: E731
    patched.only_flex = True
    monkeypatch.setattr(_env, "environment", patched)


def flex_frames(masks, q, k, v, monkeypatch):
    """The drop-in over `masks` in turn with only FlexAttention available, its
    torch.compile on Dynamo's "eager" backend (Dynamo's guards and recompiles are those
    of the real call, without Inductor's minutes on the CPU): (frames, graphs compiled,
    torch.compile's keyword arguments per compiled function, the outputs)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from masklens.torch import scaled_dot_product_attention as sdpa
    only_flex(monkeypatch)
    real_compile = torch.compile
    made = []

    def compile_eager(fn, **kwargs):
        made.append(kwargs)
        return real_compile(fn, **{**kwargs, "backend": "eager"})
    monkeypatch.setattr(torch, "compile", compile_eager)
    monkeypatch.setattr(_flex, "_compiled_flex", None)  # restored after the test
    _flex.forget_flex_buckets()  # each test compiles its own buckets
    torch._dynamo.reset()
    counters.clear()
    try:
        outs = [sdpa(q, k, v, attn_mask=m) for m in masks]
        frames, graphs = counters["frames"]["ok"], counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
        _flex.forget_flex_buckets()
        for m in masks:
            masklens.forget(m)  # a mask's entry holds its BlockMask
    return frames, graphs, made, outs


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["sliding window 16", "packed documents", "left padded causal", "2-D sliding window 16"])
def test_drop_in_compiles_flex_once_per_shape_and_structure(name, monkeypatch):
    """The drop-in's compiled FlexAttention is traced once for a shape and structure: the
    first call compiles one Dynamo frame, and a new mask tensor of the same structure (a
    new BlockMask, a new mask_mod closure over new tensors) and cached calls reuse it."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from masklens.torch import inspect
    mask = MASKS[name]
    q, k, v = qkv(2, 4, L, L, dtype=torch.float32, grad=False)  # flex has no CPU backward
    only_flex(monkeypatch)
    assert inspect(q, k, v, mask)[0].backend == "torch.flex_attention"
    fresh = mask.clone()  # a new tensor: scanned again, its own BlockMask and mask_mod
    frames, graphs, made, outs = flex_frames([mask, fresh, mask, fresh], q, k, v, monkeypatch)
    assert made == [{"dynamic": True}]  # one compiled flex for the shape's bucket (its lengths dynamic)
    assert (frames, graphs) == (1, 1), f"flex_attention compiled {frames} frames, {graphs} graphs"
    ref = zero_empty_rows(reference(q, k, v, mask), mask)
    for out in outs:
        assert_close(out, ref, 1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_drop_in_reuses_compiled_flex_for_new_document_boundaries_and_padding(monkeypatch):
    """Packed batches move their document boundaries every step, padded ones their valid
    ranges: the mask_mod reads them from tensors (Dynamo would guard Python ints as
    constants and compile again for each), so one frame serves them all."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    i, j = rows_cols(L, L)
    c = j <= i
    packed = [c & (d[:, None] == d[None, :])
              for d in (torch.bucketize(torch.arange(L), torch.tensor(cuts), right=True)
                        for cuts in ([10, 40], [20, 45], [5, 33]))]
    padded = [(c[None] & (j[None] >= torch.tensor(starts)[:, None, None]))[:, None] for starts in ([0, 12], [3, 20], [7, 9])]
    padded_2d = [c & (j >= start) for start in (3, 20, 7)]  # one valid range for every batch
    q, k, v = qkv(2, 4, L, L, dtype=torch.float32, grad=False)
    for masks in (packed, padded, padded_2d):
        frames, graphs, _, outs = flex_frames(masks, q, k, v, monkeypatch)
        assert (frames, graphs) == (1, 1), f"flex_attention compiled {frames} frames, {graphs} graphs"
        for m, out in zip(masks, outs):
            assert_close(out, zero_empty_rows(reference(q, k, v, m), m), 1e-5)
