"""The flex_attention context-parallel attention calls (masklens._cp_flex), on the CPU:
compiled, it runs in masklens._flex's buckets of its own (tagged "cp": one compile a
bucket, a second call of the same shapes compiles nothing; the drop-in's buckets stay
cold and decide()'s charge for them unchanged), and where Dynamo would run it uncompiled
it raises a MaskError naming the fallbacks, never flex's unfused path. torch.compile runs
on Dynamo's "eager" backend: Dynamo traces, guards and recompiles as for Inductor."""
import pytest
import torch

import masklens
import masklens.torch
from masklens import _cp_block_mask, _cp_flex, _flex
from helpers import rows_cols

fa = pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.fixture
def fresh_flex():
    """No compiled flex and no bucket state before or after the test."""
    torch._dynamo.reset()
    _flex.forget_flex_buckets()
    yield
    torch._dynamo.reset()
    _flex.forget_flex_buckets()


@pytest.fixture
def dynamo_eager(monkeypatch):
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager"}))


def causal_call(L=96, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, L, D, generator=g) for _ in range(3))
    i, j = rows_cols(L, L)
    mask = j <= i
    return q, k, v, mask, masklens.torch.block_mask(mask, 32)


def test_compiled_cp_flex_compiles_once_in_a_bucket_of_its_own(fresh_flex, dynamo_eager):
    q, k, v, mask, block_mask = causal_call()
    flex = _cp_flex.flex_for(True, "cpu")
    out = flex(q, k, v, block_mask=block_mask, scale=None)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    compiles = _flex.flex_compiles()
    (key,) = compiles
    assert key[0] == _cp_flex.CP_BUCKET_TAG and key[-2] == (32, 32) and compiles[key] == 1
    # A second call of the same shapes (new tensors, a new BlockMask): nothing compiled.
    q2, k2, v2, _, block_mask2 = causal_call(seed=1)
    flex(q2, k2, v2, block_mask=block_mask2, scale=None)
    assert _flex.flex_compiles() == {key: 1}
    # The drop-in's bucket of the same shapes is another one, still cold: decide() is
    # charged the whole compile for it.
    charge, bucket = _flex.flex_compile_charge(masklens.inspect(mask).structure, q, k, v)
    assert bucket.key != key and not bucket.warm and charge == _flex.flex_compile_ms()


def test_cp_buckets_are_keyed_by_the_tile_size(fresh_flex, dynamo_eager):
    q, k, v, mask, block_mask = causal_call()
    flex = _cp_flex.flex_for(True, "cpu")
    flex(q, k, v, block_mask=block_mask)
    flex(q, k, v, block_mask=masklens.torch.block_mask(mask, 16))
    assert sorted(key[-2] for key in _flex.flex_compiles()) == [(16, 16), (32, 32)]


def test_cp_buckets_are_keyed_by_the_rule_of_the_block_mask(fresh_flex, dynamo_eager):
    """Two rules, each BlockMask built as a rank builds it (one rank, contiguous): a bucket
    each, compiled once; a second BlockMask of the first rule reuses its bucket."""
    q, k, v, causal, _ = causal_call()
    i, j = rows_cols(*causal.shape)
    window = causal & (i - j < 20)
    flex = _cp_flex.flex_for(True, "cpu")

    def rank_block_mask(mask):
        structure = masklens.inspect(mask).structure
        return _cp_block_mask.build_block_mask(structure, mask, "cpu", rank=0, world_size=1, sharding="contiguous",
                                               block_size=(32, 32))
    masks = [rank_block_mask(m) for m in (causal, window, causal)]
    assert _cp_block_mask.rule_of(masks[0]) == _cp_block_mask.rule_of(masks[2]) != _cp_block_mask.rule_of(masks[1])
    for mask, block_mask in zip((causal, window, causal), masks):
        out = flex(q, k, v, block_mask=block_mask)
        torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    compiles = _flex.flex_compiles()
    assert len(compiles) == 2 and set(compiles.values()) == {1}, compiles


def test_compiled_cp_flex_run_uncompiled_raises_naming_the_fallback(fresh_flex, dynamo_eager, monkeypatch):
    q, k, v, _, block_mask = causal_call()
    flex = _cp_flex.flex_for(True, "cpu")
    unfused = []
    real_flex = _flex._flex_attention or fa.flex_attention
    monkeypatch.setattr(_flex, "_flex_attention", lambda *a, **kw: unfused.append(a) or real_flex(*a, **kw))
    with torch.compiler.set_stance("force_eager"):  # Dynamo runs the bucket's function as Python
        with pytest.raises(masklens.MaskError, match=r"^flex_uncompiled: .*pass compiled=False"):
            flex(q, k, v, block_mask=block_mask)
    assert unfused == []  # flex's unfused path never ran
    # The bucket is broken: a later call raises without running it.
    with pytest.raises(masklens.MaskError, match=r"^flex_uncompiled: "):
        flex(q, k, v, block_mask=block_mask)
    assert unfused == [] and all(b.broken for b in _flex._flex_buckets.values())


def test_compiled_cp_flex_on_the_cpu_refuses_a_backward():
    q, k, v, _, block_mask = causal_call()
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: .*no backward on the CPU"):
        _cp_flex.flex_for(True, "cpu")(q.requires_grad_(), k, v, block_mask=block_mask)


def test_eager_cp_flex_is_torch_flex_attention():
    assert _cp_flex.flex_for(False, "cuda") is fa.flex_attention
    assert _cp_flex.flex_for(None, "cpu") is fa.flex_attention
    assert _cp_flex.flex_for(None, "cuda") is _cp_flex.flex_for(True, "cpu")
