"""Lengths that change (docs/python.md, "Lengths that change"): the drop-in's compiled
FlexAttention compiles once per shape bucket whatever the lengths inside it, never runs
flex's unfused path, does not compile again when grad mode changes, and a cold compile is
a cost decide() weighs (docs/policy.md). CPU tests compile through Inductor's CPU backend
or, where only Dynamo's guards are counted, through Dynamo's "eager" backend (the same
guards and recompiles, without Inductor's seconds per graph)."""
import pytest
import torch

import masklens
from masklens import _core, _env, _flex
from masklens.torch import inspect
from masklens.torch import scaled_dot_product_attention as sdpa

from helpers import assert_close, grads, qkv, reference, rows_cols

pytest.importorskip("torch.nn.attention.flex_attention")
from torch._dynamo.utils import counters  # noqa: E402

WINDOW = 96
# 20 new lengths between 256 and 1200 (buckets of 128 * 2^k: 256, 512, 1024, 2048).
LENGTHS = [256 + 47 * i + (i * i) % 13 for i in range(20)]
BUCKETS = {_flex.length_bucket(n) for n in LENGTHS}


def window_mask(n, window=WINDOW):
    i, j = rows_cols(n, n)
    return (j <= i) & (i - j < window)


def prefix_lm_mask(n, prefix):
    i, j = rows_cols(n, n)
    return (j <= i) | (j < prefix)


def decide_as_h100(monkeypatch, available):
    """The drop-in decides as on an sm90 GPU with `available` (on CPU tensors)."""
    real = _env.environment
    monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": available, "sm": 90}))


@pytest.fixture
def fresh_flex():
    """No compiled flex and no bucket state before or after the test."""
    torch._dynamo.reset()
    _flex.forget_flex_buckets()
    counters.clear()
    yield
    torch._dynamo.reset()
    _flex.forget_flex_buckets()
    _flex.set_flex_compile_ms(None)


@pytest.fixture
def dynamo_eager(monkeypatch):
    """torch.compile on Dynamo's "eager" backend: Dynamo traces, guards and recompiles as
    for Inductor; the graph runs as torch ops."""
    real = torch.compile
    made = []

    def compile_eager(fn, **kwargs):
        made.append(kwargs)
        return real(fn, **{**kwargs, "backend": "eager"})
    monkeypatch.setattr(torch, "compile", compile_eager)
    return made


@pytest.fixture
def no_dense_fallback(monkeypatch):
    def fail(*a, **kw):
        raise AssertionError("the compiled flex fell back to torch's dense call")
    monkeypatch.setattr(_flex, "_dense_fallback", fail)


@pytest.fixture
def unfused(monkeypatch):
    """The calls that reached flex's unfused path: flex_attention run uncompiled, which
    warns (once a process) before it materialises the score matrix."""
    from torch.nn.attention import flex_attention as fa
    seen = []
    monkeypatch.setattr(fa, "_warn_once", lambda warning_id, *a, **kw: seen.append(warning_id))
    return seen


def run_lengths(lengths, alternate_grad=True, heads=2, dim=16):
    """The drop-in over a loop of new lengths (a new mask tensor each step), evaluation
    steps under torch.no_grad() between steps with grad mode on, each output checked
    against torch's dense-mask SDPA."""
    for step, n in enumerate(lengths):
        mask = window_mask(n)
        # Eval steps take leaves that require grad (parameters' views do): flex refuses
        # those on the CPU whatever the grad mode, so the runner detaches them there.
        evaluating = alternate_grad and step % 2
        q, k, v = qkv(1, heads, n, n, D=dim, grad=bool(evaluating), seed=step)
        with torch.no_grad() if evaluating else torch.enable_grad():
            out = sdpa(q, k, v, attn_mask=mask)
        assert_close(out, reference(q, k, v, mask), 1e-5)
        masklens.forget(mask)


def test_twenty_new_lengths_trace_once_per_bucket(monkeypatch, fresh_flex, dynamo_eager, no_dense_fallback, unfused):
    """Twenty new lengths, train and eval steps alternating: one Dynamo frame per bucket
    (the lengths inside a bucket are symbolic), none for a grad-mode change."""
    decide_as_h100(monkeypatch, {"flex"})
    run_lengths(LENGTHS)
    assert dynamo_eager == [{"dynamic": True}] * len(BUCKETS)
    assert counters["frames"]["ok"] == len(BUCKETS), dict(counters["frames"])
    compiles = _flex.flex_compiles()
    assert sorted(key[-1] for key in compiles) == sorted(BUCKETS)
    assert set(compiles.values()) == {1}, compiles
    assert not any(b.broken for b in _flex._flex_buckets.values())
    # The same lengths again, and a grad-mode change on each: nothing compiles.
    run_lengths(LENGTHS[::-1], alternate_grad=True)
    assert counters["frames"]["ok"] == len(BUCKETS)
    assert not unfused


def test_twenty_new_lengths_compile_once_per_bucket_with_inductor(monkeypatch, fresh_flex, no_dense_fallback, unfused):
    """The same loop through Inductor's CPU backend: one graph per bucket, flex's unfused
    path never reached (its warning would fail the test), every output torch's."""
    decide_as_h100(monkeypatch, {"flex"})
    run_lengths(LENGTHS)
    assert counters["stats"]["unique_graphs"] == len(BUCKETS), dict(counters["stats"])
    assert set(_flex.flex_compiles().values()) == {1}
    assert not unfused


def bottom_right_window_mask(q_len, k_len, window=WINDOW):
    """A sliding window aligned bottom-right: the last q_len rows of a k_len-long causal
    window (prefill of q_len new tokens over a cache)."""
    i, j = rows_cols(q_len, k_len)
    p = i + (k_len - q_len)
    return (j <= p) & (p - j < window)


def test_prefill_over_a_cache_traces_once_for_every_offset(monkeypatch, fresh_flex, dynamo_eager, no_dense_fallback,
                                                           unfused):
    """Bottom-right windows whose offset K - Q changes every step (prefill over a growing
    cache), all in one bucket: one Dynamo frame; the offset is a tensor the mask_mod reads,
    not a constant the graph is specialised on. (Every step has two query tiles or more:
    Dynamo specialises a size of 1, so a bucket's first call with one tile and a later one
    with more would compile twice.)"""
    decide_as_h100(monkeypatch, {"flex"})
    steps = [(150, 300), (140, 333), (200, 420), (131, 500), (250, 511)]
    assert len({_flex.length_bucket(k) for _, k in steps}) == 1
    for q_len, k_len in steps:
        mask = bottom_right_window_mask(q_len, k_len)
        structure = masklens.scan(mask).structure
        assert (structure.kind, structure.alignment) == ("sliding_window", "bottom_right")
        q, k, v = qkv(1, 2, q_len, k_len, grad=False, seed=k_len)
        out = sdpa(q, k, v, attn_mask=mask)
        assert_close(out, reference(q, k, v, mask), 1e-5)
        assert inspect(q, k, v, mask)[0].backend == "torch.flex_attention"
        masklens.forget(mask)
    assert counters["frames"]["ok"] == 1, dict(counters["frames"])
    assert list(_flex.flex_compiles().values()) == [1]
    assert not unfused


def structure_masks(n):
    """Masks of each form a flex call takes: the structure's rule, its tables (documents,
    padding), the dense mask read (query padding, an arbitrary mask)."""
    i, j = rows_cols(n, n)
    causal = j <= i
    docs = torch.bucketize(torch.arange(n), torch.tensor([n // 3, n // 2]), right=True)
    arbitrary = causal & ((i // 16 + j // 16) % 3 != 0)
    arbitrary[:, 0] = True
    return {"window": window_mask(n), "packed documents": causal & (docs[:, None] == docs[None, :]),
            "left padding": causal & (j >= 7), "query padding": causal & (i < n - 9) & (j < n - 9),
            "arbitrary": arbitrary}


@pytest.mark.parametrize("name", list(structure_masks(64)))
def test_decision_and_run_charge_the_same_bucket(name, monkeypatch, fresh_flex, dynamo_eager):
    """The bucket decide() was told about is the one the call compiles in: after a call
    its bucket is warm, and a new length in it is decided warm."""
    decide_as_h100(monkeypatch, {"flex"})
    for n in (200, 230):
        mask = structure_masks(n)[name]
        q, k, v = qkv(1, 2, n, n, grad=False)
        charge, bucket = _flex.flex_compile_charge(policy_structure(mask), q, k, v)
        assert charge == (_core.FLEX_COLD_COMPILE_MS if n == 200 else 0)
        out = sdpa(q, k, v, attn_mask=mask)
        assert_close(out, reference(q, k, v, mask), 1e-5)
        assert list(_flex._flex_buckets.values()) == [bucket] and bucket.warm
        masklens.forget(mask)
    assert counters["frames"]["ok"] == 1


def test_recompile_limit_takes_torchs_dense_call_not_the_unfused_path(monkeypatch, fresh_flex, dynamo_eager, unfused):
    """Where Dynamo would run a bucket's flex uncompiled (its recompile limit hit), the
    bucket's function raises before flex's unfused path: torch's call with the dense mask
    runs that call, the bucket is broken, and decide() never charges it less than +inf."""
    decide_as_h100(monkeypatch, {"flex"})
    mask = window_mask(300)
    q, k, v = qkv(1, 2, 300, 300, grad=False)
    with torch._dynamo.config.patch(recompile_limit=1):
        out = sdpa(q, k, v, attn_mask=mask)  # compiles the bucket
        assert_close(out, reference(q, k, v, mask), 1e-5)
        out = sdpa(q, k, v, attn_mask=mask, scale=0.25)  # a scale after None would recompile: over the limit
    assert_close(out, reference(q, k, v, mask, scale=0.25), 1e-5)
    assert not unfused
    (bucket,) = _flex._flex_buckets.values()
    assert bucket.broken and bucket.compile_charge() == float("inf")
    assert counters["frames"]["ok"] == 1


def test_cpu_backward_runs_torchs_dense_call_without_a_compile(monkeypatch, fresh_flex, dynamo_eager):
    """Flex has no backward on the CPU: a call that wants one runs torch's dense call (its
    gradients), compiling nothing."""
    decide_as_h100(monkeypatch, {"flex"})
    mask = window_mask(200)
    q, k, v = qkv(1, 2, 200, 200)
    out = sdpa(q, k, v, attn_mask=mask)
    ref_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = reference(*ref_in, mask)
    assert_close(out, ref, 1e-5)
    for a, b in zip(grads(out, (q, k, v)), grads(ref, ref_in)):
        assert_close(a, b, 1e-5)
    assert counters["frames"]["ok"] == 0 and not dynamo_eager


@pytest.fixture
def threads():
    """torch.set_num_threads for the test, restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_cpu_buckets_are_per_thread_count_with_the_count_in_inductors_key(monkeypatch, fresh_flex, dynamo_eager,
                                                                         threads):
    """Inductor's CPU flex kernel is sized for the threads of its compile, and neither
    Dynamo's guards nor Inductor's cache key hold that count (pytorch/pytorch#167463): a
    kernel compiled on one thread and run on two wrote past its buffers (a heap corruption
    seen as an abort). A CPU bucket is per thread count, and its compile runs with the
    count pinned in Inductor's config, which its cache key holds."""
    decide_as_h100(monkeypatch, {"flex"})
    from torch._inductor import config as inductor_config
    # The pin is a key only while Inductor's cache key holds its config's cpp.threads.
    assert "cpp.threads" in inductor_config.save_config_portable(ignore_private_configs=False)
    assert not any("cpp.threads".startswith(p) for p in inductor_config._cache_config_ignore_prefix)
    configured = inductor_config.cpp.threads
    seen = []
    real_bucket_function = _flex._bucket_function

    def recording(bucket):
        fn = real_bucket_function(bucket)

        def call(*args):
            seen.append((bucket.key, inductor_config.cpp.threads, torch.get_num_threads()))
            return fn(*args)
        return call
    monkeypatch.setattr(_flex, "_bucket_function", recording)
    mask = window_mask(300)
    for count in (1, 2, 1, 2):
        threads(count)
        q, k, v = qkv(1, 2, 300, 300, grad=False, seed=count)
        assert_close(sdpa(q, k, v, attn_mask=mask), reference(q, k, v, mask), 1e-5)
    assert len(_flex._flex_buckets) == 2 and all(b.warm for b in _flex._flex_buckets.values())
    keys = [key for key, _, _ in seen]
    assert keys[0] != keys[1] and keys[0] == keys[2] and keys[1] == keys[3]
    assert [(pinned, now) for _, pinned, now in seen] == [(1, 1), (2, 2), (1, 1), (2, 2)]
    assert inductor_config.cpp.threads == configured  # pinned only for the call


def test_buckets_are_powers_of_two_from_128():
    assert [_flex.length_bucket(n) for n in (1, 128, 129, 256, 257, 16384, 16385, 28069, 32768, 32769)] == \
        [128, 128, 256, 256, 512, 16384, 32768, 32768, 32768, 65536]


def test_a_cold_flex_loses_to_a_compile_free_call(monkeypatch, fresh_flex):
    """decide() charges a cold bucket's compile: a prefix-LM mask, which flex runs in one
    call and torch with the dense mask or a plan of slices, goes to torch while flex's
    bucket is cold (its rejection says so) and to flex once the bucket is warm."""
    decide_as_h100(monkeypatch, {"torch", "flex"})
    mask = prefix_lm_mask(512, 128)
    q, k, v = qkv(1, 2, 512, 512, grad=False)
    policy, _ = inspect(q, k, v, mask)
    assert policy.backend.startswith("torch.sdpa.")
    (flex,) = [r for r in policy.rejected if r.backend == "torch.flex_attention"]
    assert flex.kind == "slower" and flex.compile_ms == _core.FLEX_COLD_COMPILE_MS
    assert "a cold compile of 3500 ms included" in flex.reason
    assert flex.cost_ms - flex.compile_ms < policy.cost_ms  # warm, flex would win
    _, bucket = _flex.flex_compile_charge(policy_structure(mask), q, k, v)
    bucket.warm = True
    fresh = mask.clone()
    assert inspect(q, k, v, fresh)[0].backend == "torch.flex_attention"
    masklens.forget()


def policy_structure(mask):
    return masklens.inspect(mask).structure


def test_calls_that_forgo_a_cold_flex_pay_for_its_compile(monkeypatch, fresh_flex):
    """Renting until buying pays: every call that runs without a flex that would have won
    warm counts what it gave up into the bucket; once that reaches the compile's cost,
    decide() charges the bucket's compile no more and the next new mask runs flex."""
    decide_as_h100(monkeypatch, {"torch", "flex"})
    mask = prefix_lm_mask(512, 128)
    q, k, v = qkv(1, 2, 512, 512, grad=False)
    policy, _ = inspect(q, k, v, mask)
    saving = _flex.forgone_saving_ms(policy)
    assert saving > 0
    _flex.set_flex_compile_ms(3.5 * saving)
    masklens.forget()
    for _ in range(4):
        out = sdpa(q, k, v, attn_mask=mask)  # torch's kernel, counting
    assert_close(out, reference(q, k, v, mask), 1e-5)
    (bucket,) = _flex._flex_buckets.values()
    assert bucket.forgone_ms == pytest.approx(4 * saving) and bucket.compile_charge() == 0
    assert inspect(q, k, v, mask.clone())[0].backend == "torch.flex_attention"
    masklens.forget()


def test_a_reused_mask_moves_to_flex_once_its_compile_is_paid_for(monkeypatch, fresh_flex, dynamo_eager):
    """The same mask tensor every step (its decision cached): once the calls that ran
    without flex have given up the compile's cost, the cached decision is stale, the next
    call decides again and runs flex (one compile), and later calls stay there."""
    decide_as_h100(monkeypatch, {"torch", "flex"})
    mask = prefix_lm_mask(512, 128)
    q, k, v = qkv(1, 2, 512, 512, grad=False)
    saving = _flex.forgone_saving_ms(inspect(q, k, v, mask)[0])
    _flex.set_flex_compile_ms(2.5 * saving)
    masklens.forget()
    backends = []
    for _ in range(6):
        out = sdpa(q, k, v, attn_mask=mask)
        assert_close(out, reference(q, k, v, mask), 1e-5)
        backends.append(inspect(q, k, v, mask)[0].backend)
    # Three calls pay for the compile (the third crosses it); the fourth decides again.
    assert [b == "torch.flex_attention" for b in backends] == [False, False, True, True, True, True], backends
    assert counters["frames"]["ok"] == 1
    masklens.forget()


def test_compile_cost_is_data_and_overridable(monkeypatch, fresh_flex):
    assert _flex.flex_compile_ms() == _core.FLEX_COLD_COMPILE_MS == 3500
    monkeypatch.setenv("MASKLENS_FLEX_COMPILE_MS", "120")
    assert _flex.flex_compile_ms() == 120
    _flex.set_flex_compile_ms(7)
    assert _flex.flex_compile_ms() == 7
    with pytest.raises(ValueError):
        _flex.set_flex_compile_ms(-1)


@pytest.mark.gpu
def test_cuda_train_and_eval_share_one_graph_per_bucket(monkeypatch, fresh_flex, no_dense_fallback, unfused):
    """On a GPU (flex has a backward there): training steps and torch.no_grad() steps at
    new lengths alternate, and each bucket compiles one graph (the training form; the
    evaluation steps run it and detach). Outputs and gradients are as close to a float32
    reference as torch's own bf16 call with the dense mask."""
    real = _env.environment
    monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": {"flex"}}))
    lengths = [600, 700, 900, 1000, 1024, 1100, 1500, 2000]

    def error(a, b):
        return (a.float() - b.float()).abs().max().item()
    for step, n in enumerate(lengths):
        mask = window_mask(n).cuda()
        q, k, v = (t.cuda().bfloat16().detach().requires_grad_() for t in qkv(1, 4, n, n, D=64, seed=step))
        train = step % 2 == 0
        runs = {}
        for name, attention, dtype in (("masklens", sdpa, torch.bfloat16),
                                       ("torch", torch.nn.functional.scaled_dot_product_attention, torch.bfloat16),
                                       ("fp32", torch.nn.functional.scaled_dot_product_attention, torch.float32)):
            inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            with torch.enable_grad() if train else torch.no_grad():
                out = attention(*inputs, attn_mask=mask)
            runs[name] = (out, grads(out, inputs) if train else ())
        out = runs["masklens"][0]
        assert out.requires_grad == train
        assert error(out, runs["fp32"][0]) <= 2 * error(runs["torch"][0], runs["fp32"][0]) + 1e-2
        for ours, theirs, exact in zip(runs["masklens"][1], runs["torch"][1], runs["fp32"][1]):
            assert error(ours, exact) <= 2 * error(theirs, exact) + 1e-2
        masklens.forget(mask)
    assert not unfused
    assert set(_flex.flex_compiles().values()) == {1}
    assert len(_flex.flex_compiles()) == len({_flex.length_bucket(n) for n in lengths})
