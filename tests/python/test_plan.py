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
    assert policy.is_plan and {st.call.backend for st in policy.plan} == {"torch.sdpa.cudnn"}
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
    assert type(out.grad_fn).__name__ == "PlanAttentionBackward"
    ref = per_document(cuts, q, k, v)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)


@pytest.mark.parametrize("name", sorted(CUTS))
def test_a_fused_plan_equals_the_plan_of_torch_calls(name, cpu_stand_ins, monkeypatch):
    mask = documents_mask(CUTS[name])
    q, k, v = qkv(2, 2, L, L, Hk=1)
    fused = run(mask, q, k, v)
    fused_grads = grads(fused, (q, k, v))
    monkeypatch.setattr(_plan, "FUSED_OPS", {})
    calls = run(mask, q, k, v)
    assert type(calls.grad_fn).__name__ != "PlanAttentionBackward"
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


def test_a_plan_of_torch_calls_keeps_one_output_more(cpu_stand_ins, monkeypatch):
    """What the model keeps with the attention's output (o_proj's input): the fused plan
    keeps its output once; as torch calls, each step's output is kept beside it."""
    mask = documents_mask(CUTS["uneven documents"])
    q, k, v = qkv(2, 2, L, L, D=32)

    def kept_with_output():
        out, kept = saved_storages(lambda: run(mask, q, k, v))
        kept[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
        return sum(kept.values()), out.numel() * out.element_size()
    fused, out_bytes = kept_with_output()
    monkeypatch.setattr(_plan, "FUSED_OPS", {})
    calls, _ = kept_with_output()
    assert calls == fused + out_bytes


def test_the_output_is_laid_out_as_the_model_transposes_it(cpu_stand_ins):
    mask = documents_mask(CUTS["four documents"])
    q, k, v = qkv(2, 2, L, L)
    for out in (run(mask, q, k, v), run(mask, *(t.detach() for t in (q, k, v)))):
        assert out.shape == (2, 2, L, 16) and out.transpose(1, 2).is_contiguous()


def test_dropout_and_no_grad_run_torch_calls(cpu_stand_ins):
    cuts = CUTS["four documents"]
    q, k, v = qkv(2, 2, L, L)
    assert type(run(documents_mask(cuts), q, k, v, dropout_p=0.1).grad_fn).__name__ != "PlanAttentionBackward"
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
    assert type(out.grad_fn).__name__ != "PlanAttentionBackward"
    assert_close(out, per_document(cuts, q, k, v), 1e-5)


def test_the_fused_ops_refuse_what_their_kernels_do_not_take():
    class Call:
        backend, mask = "torch.sdpa.flash", "drop"
    kernels_of = _run.SDPA_KERNELS.get
    assert _plan._fused_ops(Call, kernels_of, "cuda", 128, 128) is _plan.FUSED_OPS[("cuda",
                                                                                    SDPBackend.FLASH_ATTENTION)]
    assert _plan._fused_ops(Call, kernels_of, "cuda", 100, 100) is None  # flash pads it: torch's call
    assert _plan._fused_ops(Call, kernels_of, "cuda", 128, 64) is None
    Call.mask = "keep"
    assert _plan._fused_ops(Call, kernels_of, "cuda", 128, 128) is None
    Call.backend, Call.mask = "torch.sdpa.causal_lower_right", "replace"
    assert _plan._fused_ops(Call, kernels_of, "cuda", 128, 128) is None
    Call.backend, Call.mask = "torch.varlen_attn", "drop"
    assert _plan._fused_ops(Call, kernels_of, "cuda", 128, 128) is None


def test_steps_sharing_keys_add_their_key_gradients():
    """Two steps whose query rows split one call over the same keys: the keys' gradients
    are the sum of both steps' (PlanAttention built by hand on the CPU ops)."""
    ops = _plan.FUSED_OPS[("cpu", SDPBackend.MATH)]
    steps = [_plan._Step(0, (0, 12), (0, 40), ops, False, False), _plan._Step(0, (12, 40), (0, 40), ops, False, False)]
    q, k, v = qkv(1, 2, 40, 40, Hk=1)
    out = _plan.PlanAttention.apply(steps, False, None, q, k, v)
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
    out = _plan.PlanAttention.apply(steps, False, None, q, k, v)
    ref = torch_calls_per_document(kernel, cuts, q, k, v)
    assert torch.equal(out, ref)  # the same kernel on the same contiguous rows
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_near(a, b)


@pytest.mark.gpu
def test_a_gpu_plan_runs_fused_and_keeps_one_output_less():
    """The drop-in's plan on CUDA (cuDNN steps) runs as PlanAttention, equals the plan of
    torch calls, and what stays allocated after the forward (the model keeping the
    transposed output, as o_proj does) is one attention output less. (The torch calls also
    keep copies of q, k and v's rows, which PlanAttention keeps as views: in a model
    nothing else keeps those tensors, so the copies replace them; here the test does.)"""
    mask = documents_mask(CUTS["uneven documents"])
    q, k, v = gpu_documents(2)
    w = torch.randn(8 * 128, 8 * 128, device="cuda", dtype=q.dtype)

    def forward():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = run(mask, q, k, v)
        flat = out.transpose(1, 2).contiguous().flatten(2)
        loss = (flat @ w).float().square().mean()
        torch.cuda.synchronize()
        return out, loss, torch.cuda.memory_allocated() - before
    fused, fused_loss, fused_bytes = forward()
    assert type(fused.grad_fn).__name__ == "PlanAttentionBackward"
    fused_grads = torch.autograd.grad(fused_loss, (q, k, v))
    calls = None
    try:
        _plan.FUSED_OPS, saved = {}, _plan.FUSED_OPS
        calls, calls_loss, calls_bytes = forward()
        calls_grads = torch.autograd.grad(calls_loss, (q, k, v))
    finally:
        _plan.FUSED_OPS = saved
    assert type(calls.grad_fn).__name__ != "PlanAttentionBackward"
    assert torch.equal(fused, calls)
    for a, b in zip(fused_grads, calls_grads):
        assert_near(a, b)
    out_bytes = fused.numel() * fused.element_size()
    copies = sum(t.numel() * t.element_size() for t in (q, k, v))
    assert abs(calls_bytes - fused_bytes - copies - out_bytes) <= out_bytes // 16


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
    assert type(out.grad_fn).__name__ == "PlanAttentionBackward"
    ref = torch.zeros_like(q)
    for s, e in zip([0, *cuts[0]], [*cuts[0], n]):
        causal = torch.ones(e - s, e - s, dtype=torch.bool).tril()
        ref[:, :, s:e] = reference(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], causal)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, (q, k, v))):
        assert_close(a, b, 1e-4)
