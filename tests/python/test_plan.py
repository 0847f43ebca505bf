"""Plans run as one autograd function (masklens._plan.PlanAttention), on the CPU: GPU
policies' plans with their CUDA kernels' ops stood in for by torch's CPU flash ops (the
ops the CPU's own entry runs), against each document alone and against the same plan run
as torch calls; what the function keeps for backward (q, k, v, the assembled output and
the steps' logsumexps, never a step's own output); the output's layout; the paths that
stay torch calls (dropout, no grad, a step with no fused ops)."""
import pytest
import torch
from torch.nn.attention import SDPBackend

from masklens import _plan, _run
from helpers import assert_close, grads, qkv, reference
from test_runners import gpu_policy, tensors

# The GPU policies' plans: packed documents at 4096 tokens, for sm90 with a torch before
# varlen_attn (where one cuDNN call per document is the cheapest exact form). The run
# takes smaller heads than the policy was decided for: a plan's steps are rows.
L = 4096
CUTS = {"four documents": [[1024, 2048, 3072]] * 2, "uneven documents": [[1000, 1500, 3900], [300, 2000, 2600]]}


def documents_mask(cuts, two_d=False):
    i = torch.arange(L)
    per_batch = []
    for c in cuts:
        docs = torch.bucketize(i, torch.tensor(c), right=True)
        per_batch.append((i[None] <= i[:, None]) & (docs[:, None] == docs[None]))
    return per_batch[0] if two_d else torch.stack(per_batch)[:, None]


def plan_policy(mask):
    shape = torch.zeros(()).expand(2, 8, L, 128)
    policy, structure = gpu_policy(mask, shape, shape, shape, dtype="bf16", training=True, torch="2.5")
    assert policy.is_plan and {st.call.backend for st in policy.plan} - {"zeros"} == {"torch.sdpa.cudnn"}
    return policy, structure


@pytest.fixture(params=[True, False], ids=["kernel takes gqa", "kv repeated"])
def cpu_stand_ins(request, monkeypatch):
    """The CUDA kernels' fused ops stood in for by the CPU flash ops, with or without
    grouped K and V."""
    cpu = _plan.FUSED_OPS[("cpu", SDPBackend.MATH)]
    ops = _plan.FusedOps(cpu.forward, cpu.backward, takes_gqa=request.param)
    for kernel in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        monkeypatch.setitem(_plan.FUSED_OPS, ("cpu", kernel), ops)
    return request.param


def run(mask, q, k, v, dropout_p=0.0):
    policy, structure = plan_policy(mask)
    t = tensors(policy, structure, q, k, v, mask)
    t.dropout_p = dropout_p
    return _run.run_policy(policy, t)


def ran_fused(out) -> bool:
    """Whether out came from PlanAttention (the runner returns its transposed view)."""
    fn = out.grad_fn
    return fn is not None and any(type(f).__name__ == "PlanAttentionBackward"
                                  for f in (fn, *(g for g, _ in fn.next_functions)))


def per_document(cuts, q, k, v):
    """The reference: each document of each batch alone, causal (helpers.reference)."""
    out = torch.zeros_like(q)
    for b, c in enumerate(cuts):
        for s, e in zip([0, *c], [*c, L]):
            causal = torch.ones(e - s, e - s, dtype=torch.bool).tril()
            out[b:b + 1, :, s:e] = reference(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e], causal)
    return out


@pytest.mark.parametrize("two_d", [False, True], ids=["[B, 1, L, L]", "2-D: every batch"])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_a_fused_plan_equals_each_document_alone(two_d, kv_heads, cpu_stand_ins):
    cuts = CUTS["four documents"]
    q, k, v = qkv(2, 2, L, L, Hk=kv_heads)
    out = run(documents_mask(cuts, two_d), q, k, v)
    assert ran_fused(out)
    ref = per_document(cuts, q, k, v)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


def test_a_padded_plan_leaves_its_empty_rows_zero_with_no_zeroing_copy(cpu_stand_ins):
    """Left padding: a zeros step for the padded rows and one call for the rest. The plan's
    output is 0 there itself, so the drop-in makes no zeroed copy of it (one more output at
    the peak); the padded rows get no gradient."""
    starts = (256, 1000)
    i = torch.arange(L)
    mask = torch.stack([(i[None] <= i[:, None]) & (i[None] >= s) for s in starts])[:, None]
    policy, structure = plan_policy(mask)
    assert structure.empty_rows and not _run.Prepared(policy, structure).zero_rows
    q, k, v = qkv(2, 2, L, L, Hk=1)
    out = run(mask, q, k, v)
    assert ran_fused(out)
    ref = torch.zeros_like(q)
    for b, s in enumerate(starts):
        causal = torch.ones(L - s, L - s, dtype=torch.bool).tril()
        ref[b:b + 1, :, s:] = reference(q[b:b + 1, :, s:], k[b:b + 1, :, s:], v[b:b + 1, :, s:], causal)
    assert_close(out, ref, 1e-5)
    dq, dk, dv = grads(out, (q, k, v))
    for b, s in enumerate(starts):
        assert not dq[b, :, :s].any() and not dk[b, :, :s].any() and not dv[b, :, :s].any()
    for a, b in zip((dq, dk, dv), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


def test_plans_that_might_leave_a_row_unzeroed_are_zeroed_after():
    """A step whose rows might attend nothing (a kept mask, a bottom-right call over fewer
    keys than rows, no key, a kernel of no SDPA entry) may leave such a row non-zero: the
    drop-in zeroes those plans' rows after them."""
    class Call:
        def __init__(self, backend, mask):
            self.backend, self.mask = backend, mask

    class Step:
        def __init__(self, backend, mask, q_range=(0, 8), k_range=(0, 8)):
            self.call, self.q_range, self.k_range = Call(backend, mask), q_range, k_range

    class Plan:
        def __init__(self, *steps):
            self.plan = steps
    kernels_of = _run.SDPA_KERNELS.get
    zeros = Step("zeros", "drop", k_range=(0, 0))
    assert _plan.leaves_empty_rows_zero(Plan(zeros, Step("torch.sdpa.cudnn", "drop")), kernels_of)
    assert _plan.leaves_empty_rows_zero(Plan(zeros, Step("torch.sdpa.causal_lower_right", "replace", (0, 8), (0, 12))),
                                        kernels_of)
    assert not _plan.leaves_empty_rows_zero(Plan(Step("torch.sdpa.causal_lower_right", "replace", (0, 12), (0, 8))),
                                            kernels_of)
    assert not _plan.leaves_empty_rows_zero(Plan(Step("torch.sdpa.efficient", "keep")), kernels_of)
    assert not _plan.leaves_empty_rows_zero(Plan(Step("torch.varlen_attn", "drop")), kernels_of)
    assert not _plan.leaves_empty_rows_zero(Plan(Step("torch.sdpa.cudnn", "drop", k_range=(4, 4))), kernels_of)


def test_a_bottom_right_plan_over_padded_keys_is_not_zeroed_after(cpu_stand_ins):
    """Q < K bottom-right with the first keys padded: a plan whose causal_lower_right step
    has more keys than rows, each row attending one; it runs as torch calls, exact, with no
    zeroed copy."""
    q_len = 1024
    i, j = torch.arange(q_len)[:, None], torch.arange(L)[None]
    mask = ((j <= i + (L - q_len)) & (j >= 300))[None, None].expand(2, 1, q_len, L)
    shape = torch.zeros(()).expand(2, 8, q_len, 128)
    policy, structure = gpu_policy(mask, shape, torch.zeros(()).expand(2, 8, L, 128),
                                   torch.zeros(()).expand(2, 8, L, 128), dtype="bf16", training=True, torch="2.5")
    assert policy.is_plan, policy.backend
    assert not _run.Prepared(policy, structure).zero_rows
    q = qkv(2, 2, q_len, L)[0]
    _, k, v = qkv(2, 2, L, L, seed=1)
    out = _run.run_policy(policy, tensors(policy, structure, q, k, v, mask))
    ref = reference(q, k, v, mask)
    assert_close(out, ref, 1e-5)


@pytest.mark.parametrize("name", sorted(CUTS))
def test_a_fused_plan_equals_the_plan_of_torch_calls(name, cpu_stand_ins, monkeypatch):
    mask = documents_mask(CUTS[name])
    q, k, v = qkv(2, 2, L, L, Hk=1)
    fused = run(mask, q, k, v)
    fused_grads = grads(fused, (q, k, v))
    monkeypatch.setattr(_plan, "FUSED_OPS", {})
    calls = run(mask, q, k, v)
    assert not ran_fused(calls)
    assert_close(fused, calls, 1e-6)
    for a, b in zip(fused_grads, grads(calls, (q, k, v))):
        assert_close(a, b, 1e-5)


def saved_storages(fn):
    """fn()'s result and the storages autograd keeps for its backward (pointer -> bytes)."""
    kept = {}

    def pack(t):
        s = t.untyped_storage()
        kept[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, kept


def test_a_fused_plan_keeps_one_output_and_no_step_output(cpu_stand_ins):
    mask = documents_mask(CUTS["uneven documents"])
    q, k, v = qkv(2, 2, L, L, D=32)
    out, kept = saved_storages(lambda: run(mask, q, k, v))
    big = {ptr for ptr, n in kept.items() if n >= out.numel() * out.element_size()}
    assert big == {t.untyped_storage().data_ptr() for t in (q, k, v, out)}
    # The rest are the steps' logsumexps: one float per head and query row.
    assert sum(n for ptr, n in kept.items() if ptr not in big) == 2 * 2 * L * 4


def kept_with_output(fn):
    """What autograd keeps of fn()'s call with its output (as a model's o_proj keeps it):
    (bytes, the output's bytes, the output)."""
    out, kept = saved_storages(fn)
    kept[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    return sum(kept.values()), out.numel() * out.element_size(), out


def test_a_plan_of_torch_calls_keeps_one_output_more(cpu_stand_ins, monkeypatch):
    """The fused plan keeps its output once; as torch calls, each step's output is kept
    beside it (their copies of q, k and v's rows replace the views the fused plan keeps)."""
    mask = documents_mask(CUTS["uneven documents"])
    q, k, v = qkv(2, 2, L, L, D=32)
    fused, out_bytes, _ = kept_with_output(lambda: run(mask, q, k, v))
    monkeypatch.setattr(_plan, "FUSED_OPS", {})
    calls, _, _ = kept_with_output(lambda: run(mask, q, k, v))
    assert calls == fused + out_bytes


def test_the_output_is_laid_out_as_the_model_transposes_it(cpu_stand_ins):
    mask = documents_mask(CUTS["four documents"])
    q, k, v = qkv(2, 2, L, L)
    for out in (run(mask, q, k, v), run(mask, *(t.detach() for t in (q, k, v)))):
        assert out.shape == (2, 2, L, 16) and out.transpose(1, 2).is_contiguous()


def test_dropout_and_no_grad_run_torch_calls(cpu_stand_ins):
    cuts = CUTS["four documents"]
    q, k, v = qkv(2, 2, L, L)
    assert not ran_fused(run(documents_mask(cuts), q, k, v, dropout_p=0.1))
    with torch.no_grad():
        quiet = run(documents_mask(cuts), q, k, v)
        assert quiet.grad_fn is None
        assert_close(quiet, per_document(cuts, q, k, v), 1e-5)


def test_a_step_without_fused_ops_runs_the_plan_as_torch_calls(monkeypatch):
    """Without stand-ins a GPU plan's CUDA kernels have no CPU ops: torch calls, exact."""
    monkeypatch.setattr(_plan, "FUSED_OPS", {("cpu", SDPBackend.MATH): _plan.FUSED_OPS[("cpu", SDPBackend.MATH)]})
    cuts = CUTS["four documents"]
    q, k, v = qkv(2, 2, L, L)
    out = run(documents_mask(cuts), q, k, v)
    assert not ran_fused(out)
    assert_close(out, per_document(cuts, q, k, v), 1e-5)


def test_the_fused_ops_refuse_what_their_kernels_do_not_take():
    class Args:
        is_causal = False

    class Call:
        backend, mask, args = "torch.sdpa.flash", "drop", Args

    class Step:
        call, q_range, k_range = Call, (0, 64), (0, 128)
    kernels_of = _run.SDPA_KERNELS.get
    flash = _plan.FUSED_OPS[("cuda", SDPBackend.FLASH_ATTENTION)]
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 128) is flash
    assert _plan._fused_ops(Step, kernels_of, "cuda", 100, 100) is None  # flash pads it: torch's call
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 64) is None
    Args.is_causal = True  # causal over unequal lengths: torch's rules, torch's call
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 128) is None
    Step.k_range = (64, 128)
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 128) is flash
    Call.mask = "keep"
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 128) is None
    Call.backend, Call.mask = "torch.sdpa.causal_lower_right", "replace"
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 128) is None
    Call.backend, Call.mask = "torch.varlen_attn", "drop"
    assert _plan._fused_ops(Step, kernels_of, "cuda", 128, 128) is None


def test_autocast_casting_and_a_switched_off_cpu_flash_run_torch_calls(cpu_stand_ins):
    cuts = CUTS["four documents"]
    q, k, v = qkv(1, 2, L, L)
    mask = documents_mask(cuts)[:1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran_fused(run(mask, q, k, v))  # autocast would cast them: torch's calls do
        low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
        assert ran_fused(run(mask, *low))  # already in autocast's dtype: nothing to cast
    flash = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(False)
    try:
        assert not ran_fused(run(mask, q, k, v))
    finally:
        torch.backends.cuda.enable_flash_sdp(flash)
    assert ran_fused(run(mask, q, k, v))


def test_an_output_changed_in_place_is_caught_at_backward(cpu_stand_ins):
    """As for torch's own call, whose backward keeps its output: the transposed output the
    model makes contiguous (no copy) and changes in place is refused at backward."""
    q, k, v = qkv(1, 2, L, L)
    out = run(documents_mask(CUTS["four documents"])[:1], q, k, v)
    flat = out.transpose(1, 2).contiguous()
    flat.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        flat.sum().backward()


def test_steps_sharing_keys_add_their_key_gradients():
    """Two steps whose query rows split one call over the same keys: the keys' gradients
    are the sum of both steps' (PlanAttention built by hand on the CPU ops)."""
    ops = _plan.FUSED_OPS[("cpu", SDPBackend.MATH)]
    steps = [_plan._Step(0, (0, 12), (0, 40), ops, False, False), _plan._Step(0, (12, 40), (0, 40), ops, False, False)]
    q, k, v = qkv(1, 2, 40, 40, Hk=1)
    out = _plan.PlanAttention.apply(steps, False, None, q, k, v).transpose(1, 2)
    ref = reference(q, k, v, torch.ones(40, 40, dtype=torch.bool))
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


def gpu_documents(kv_heads, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, L, 128, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k, v = (torch.randn(2, kv_heads, L, 128, device="cuda", dtype=dtype, generator=g).requires_grad_()
            for _ in range(2))
    return q, k, v


def torch_calls_per_document(kernel, cuts, q, k, v):
    """Each document through torch's own sdpa on `kernel`, assembled by autograd."""
    from torch.nn.attention import sdpa_kernel
    out = torch.zeros_like(q)
    with sdpa_kernel([kernel]):
        for b, c in enumerate(cuts):
            for s, e in zip([0, *c], [*c, L]):
                out[b:b + 1, :, s:e] = torch.nn.functional.scaled_dot_product_attention(
                    *(t[b:b + 1, :, s:e].contiguous() for t in (q, k, v)), is_causal=True, enable_gqa=True)
    return out


def assert_near(a, b):
    """bf16 results of two orders of the same kernels: within bf16's rounding of values ~1."""
    assert (a.float() - b.float()).abs().max().item() <= 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("kernel", [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], ids=["cudnn", "flash"])
def test_fused_steps_on_the_gpu_equal_torch_calls(kernel, kv_heads):
    cuts = CUTS["uneven documents"]
    q, k, v = gpu_documents(kv_heads)
    ops = _plan.FUSED_OPS[("cuda", kernel)]
    steps = [_plan._Step(b, (s, e), (s, e), ops, True, True)
             for b, c in enumerate(cuts) for s, e in zip([0, *c], [*c, L])]
    out = _plan.PlanAttention.apply(steps, False, None, q, k, v).transpose(1, 2)
    ref = torch_calls_per_document(kernel, cuts, q, k, v)
    assert torch.equal(out, ref)  # the same kernel on the same contiguous rows
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_near(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_a_gpu_plan_runs_fused_and_keeps_one_output_less(kv_heads):
    """The drop-in's plan on CUDA (cuDNN steps) runs as PlanAttention, equals the plan of
    torch calls, and keeps q, k and v as given (grouped with GQA), its output and one
    logsumexp a head and query row, and each step's philox seed and offset (an int64 each,
    which cuDNN's backward takes), nothing else: one attention output less than the torch
    calls (what autograd keeps, as test_a_plan_of_torch_calls_keeps_one_output_more counts
    it on the CPU); with GQA the torch calls also keep K and V repeated to every head."""
    cuts = CUTS["uneven documents"]
    mask = documents_mask(cuts)
    q, k, v = gpu_documents(kv_heads)
    fused_kept, out_bytes, fused = kept_with_output(lambda: run(mask, q, k, v))
    assert ran_fused(fused)
    given = sum(t.untyped_storage().nbytes() for t in (q, k, v))
    logsumexp = q.shape[0] * q.shape[1] * L * 4
    rng_state = 2 * 8 * sum(len(c) + 1 for c in cuts)  # one step a document
    assert fused_kept == given + out_bytes + logsumexp + rng_state
    fused_grads = grads(fused, (q, k, v))
    saved = _plan.FUSED_OPS
    _plan.FUSED_OPS = {}
    try:
        calls_kept, _, calls = kept_with_output(lambda: run(mask, q, k, v))
        calls_grads = grads(calls, (q, k, v))
    finally:
        _plan.FUSED_OPS = saved
    assert not ran_fused(calls)
    assert torch.equal(fused, calls)
    for a, b in zip(fused_grads, calls_grads):
        assert_near(a, b)
    if kv_heads == q.shape[1]:
        assert calls_kept == fused_kept + out_bytes
    else:
        assert calls_kept >= fused_kept + out_bytes


def test_the_drop_in_trains_a_cpu_plan_fused():
    """On the CPU the drop-in plans packed documents at 2048 tokens with torch's math
    kernel: in training that plan runs as PlanAttention on the CPU flash ops."""
    import masklens.torch as mt
    n = 2048
    cuts = [[512, 1024, 1536]]
    i = torch.arange(n)
    docs = torch.bucketize(i, torch.tensor(cuts[0]), right=True)
    mask = ((i[None] <= i[:, None]) & (docs[:, None] == docs[None]))[None, None]
    q, k, v = qkv(1, 2, n, n, D=64, Hk=1)
    policy, _ = mt.inspect(q, k, v, mask, enable_gqa=True)
    assert policy.is_plan
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert ran_fused(out)
    ref = torch.zeros_like(q)
    for s, e in zip([0, *cuts[0]], [*cuts[0], n]):
        causal = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        ref[:, :, s:e] = reference(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], causal)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


@pytest.mark.gpu
def test_a_gpu_padded_plan_is_fused_and_not_zeroed_after():
    """Left padding through the drop-in on CUDA (a zeros step, one cuDNN call): fused, the
    padded rows 0 with no gradient, and no zeroed copy: what autograd keeps with the output
    is what the same plan keeps without its empty rows (one output, no second)."""
    import masklens.torch as mt
    starts = (256, 1000)
    i = torch.arange(L, device="cuda")
    mask = torch.stack([(i[None] <= i[:, None]) & (i[None] >= s) for s in starts])[:, None]
    q, k, v = gpu_documents(2)
    kept, out_bytes, out = kept_with_output(lambda: mt.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                                     enable_gqa=True))
    assert ran_fused(out)
    dq, dk, dv = grads(out, (q, k, v))
    for b, s in enumerate(starts):
        assert not out[b, :, :s].any() and not dq[b, :, :s].any() and not dk[b, :, :s].any()
    q_bytes, kv_bytes = q.numel() * q.element_size(), 2 * k.numel() * k.element_size()
    assert kept < q_bytes + kv_bytes + 2 * out_bytes  # q, k, v, one output and the logsumexps
