"""The verdict cache (one scan per mask tensor until it changes) and bad input (torch's
error type, RuntimeError, with a message that names the problem)."""
import pytest
import torch
import torch.nn.functional as F

import masklens
import masklens.torch
from helpers import assert_close, assert_same_outcome, outcome, qkv, reference, rows_cols
from masklens.torch import scaled_dot_product_attention as sdpa

L = 32


def causal_mask(B=2):
    i, j = rows_cols(L, L)
    return (j <= i).expand(B, 1, L, L)


def test_one_scan_per_mask_tensor():
    mask = causal_mask().clone()
    q, k, v = qkv(2, 4, L, L, grad=False)
    before = masklens.scan_count()
    for _ in range(5):
        sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() - before == 1


def test_in_place_write_rescans_and_changes_the_verdict():
    mask = causal_mask().clone()
    q, k, v = qkv(2, 4, L, L, grad=False)
    sdpa(q, k, v, attn_mask=mask)
    before = masklens.scan_count()
    mask[1, 0, :, :3] = False  # row 1's first keys become padding: no longer plain causal
    out = sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() - before == 1
    assert masklens.scan(mask).structure.kv_valid == [(0, L), (3, L)]
    ref = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert_close(out, ref, 1e-5)


def test_same_shape_new_tensor_is_a_new_entry():
    q, k, v = qkv(2, 4, L, L, grad=False)
    a = causal_mask().clone()
    sdpa(q, k, v, attn_mask=a)
    b = a.clone()
    b[0, 0, 5, 0] = False
    before = masklens.scan_count()
    out = sdpa(q, k, v, attn_mask=b)
    assert masklens.scan_count() - before == 1
    assert_close(out, torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=b)), 1e-5)


def test_writes_torch_cannot_see_need_forget():
    mask = causal_mask(1).clone().contiguous()
    assert masklens.scan(mask).structure.kind == "causal"
    mask.numpy()[0, 0, 10, 0] = False  # through a numpy alias: _version does not move
    assert masklens.scan(mask).structure.kind == "causal"  # the documented blind spot
    masklens.forget(mask)
    assert masklens.scan(mask).structure.kind == "arbitrary"


def test_inference_mode_masks_are_kept_for_one_forward():
    # A transformers forward marks its start and nothing marks its end (the next forward's
    # start does): close any a test before this one left open.
    masklens._verdicts.end_forward()
    q, k, v = qkv(2, 4, L, L, grad=False)
    with torch.inference_mode():
        mask = causal_mask().clone()
        before = masklens.scan_count()
        sdpa(q, k, v, attn_mask=mask)
        sdpa(q, k, v, attn_mask=mask)
        assert masklens.scan_count() - before == 2  # no forward marked: every call scans
        with masklens.forward():
            before = masklens.scan_count()
            for _ in range(3):
                sdpa(q, k, v, attn_mask=mask)
            assert masklens.scan_count() - before == 1
        with masklens.forward():
            before = masklens.scan_count()
            sdpa(q, k, v, attn_mask=mask)
            assert masklens.scan_count() - before == 1  # a new forward scans again


def test_passthrough_cases_do_not_scan():
    q, k, v = qkv(2, 4, L, L, grad=False)
    before = masklens.scan_count()
    assert_close(sdpa(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True), 0)
    sdpa(q, k, v)
    sdpa(q.double(), k.double(), v.double(), attn_mask=causal_mask())  # float64: torch's own call
    assert masklens.scan_count() == before


# Bad input is torch's: the drop-in hands what it does not take to torch's own call, which
# raises its own exception (or runs); test_dropin_contract.py holds many more such cases.
@pytest.mark.parametrize("mask", [
    torch.ones(L, L, dtype=torch.int64), torch.ones(L, L, dtype=torch.int32), torch.ones(L, L, dtype=torch.complex64),
    torch.ones(L, L, dtype=torch.uint8), torch.ones(3, 1, L, L, dtype=torch.bool),
    torch.ones(L, L + 1, dtype=torch.bool),
], ids=["int64", "int32", "complex64", "uint8", "3 batches for 2", "33 keys for 32"])
def test_masks_torch_refuses_raise_torchs_error(mask):
    q, k, v = qkv(2, 4, L, L)
    assert outcome(F.scaled_dot_product_attention, q, k, v, attn_mask=mask)[0] is not None
    before = masklens.scan_count()
    assert_same_outcome((q, k, v), {"attn_mask": mask})
    assert masklens.scan_count() == before  # refused before any scan


def test_gqa_without_enable_gqa_is_torchs_error():
    q, k, v = qkv(2, 4, L, L, Hk=2)
    with pytest.raises(RuntimeError):
        sdpa(q, k, v, attn_mask=causal_mask())


def test_torch_inspect_says_why_a_call_is_torchs():
    q, k, v = qkv(2, 4, L, L)
    with pytest.raises(masklens.MaskError, match=r"does not broadcast to .* \(2, 4, 32, 32\)"):
        masklens.torch.inspect(q, k, v, torch.ones(3, 1, L, L, dtype=torch.bool))
    with pytest.raises(masklens.MaskError, match="torch.uint8 with a torch.float32 query"):
        masklens.torch.inspect(q, k, v, causal_mask().to(torch.uint8))


def test_strict_raises_where_no_backend_is_correct(monkeypatch):
    from masklens import torch as mt
    q, k, v = qkv(2, 4, L, L, grad=False)
    mask = causal_mask().clone()

    def refuse(*a, **kw):
        raise masklens.MaskError("invalid_argument: no available backend computes this mask correctly")
    monkeypatch.setattr(mt._core, "decide", refuse)
    out = sdpa(q, k, v, attn_mask=mask)  # not strict: torch's own dispatch, same result
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 1e-6)
    masklens.set_strict(True)
    try:
        with pytest.raises(RuntimeError, match="strict"):
            sdpa(q, k, v, attn_mask=mask.clone())
    finally:
        masklens.set_strict(False)


def test_each_new_decision_is_logged_once(caplog, monkeypatch):
    from masklens import torch as mt
    monkeypatch.setattr(mt, "_logged", set())  # the process's decisions so far: another test's may be this one
    q, k, v = qkv(2, 4, 24, 24, grad=False)
    i, j = rows_cols(24, 24)
    mask = ((j <= i) & (i - j < 5)).expand(2, 1, 24, 24)
    with caplog.at_level("INFO", logger="masklens"):
        sdpa(q, k, v, attn_mask=mask)
        sdpa(q, k, v, attn_mask=mask.clone())
    lines = [r.getMessage() for r in caplog.records if "sliding_window" in r.getMessage()]
    assert len(lines) == 1 and "->" in lines[0]


def test_torch_compile_keeps_the_decision_out_of_the_graph():
    """Under torch.compile the drop-in is torch's own call with the mask: no scan, no
    host work traced into the graph, the same result."""
    import torch._dynamo
    torch._dynamo.reset()
    q, k, v = qkv(2, 4, L, L, grad=False)
    mask = causal_mask().clone()
    f = torch.compile(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), backend="eager", fullgraph=True)
    before = masklens.scan_count()
    out = f(q, k, v, mask)
    assert masklens.scan_count() == before
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 1e-6)


def counting_decide(monkeypatch):
    """Counts masklens._core.decide calls made by the drop-in."""
    from masklens import torch as mt
    calls = []
    real = mt._core.decide

    def decide(*args):
        calls.append(1)
        return real(*args)
    monkeypatch.setattr(mt._core, "decide", decide)
    return calls


def test_a_cached_call_neither_scans_nor_decides(monkeypatch):
    """The second call on a mask costs no scan and no decision, for each call kind the
    mask meets (training and inference decide apart, each once), with masks taking
    turns (a model's full and sliding layers) and a mask that needs zeroed rows."""
    decides = counting_decide(monkeypatch)
    i, j = rows_cols(L, L)
    causal = causal_mask().clone()
    padded = ((j <= i) & (j >= 4)).expand(2, 1, L, L).clone()  # rows 0..3 attend to nothing
    window = ((j <= i) & (i - j < 8)).expand(2, 1, L, L).clone()
    q, k, v = qkv(2, 4, L, L)
    before = masklens.scan_count()
    for mask in (causal, padded, window):
        sdpa(q, k, v, attn_mask=mask)  # training: q requires grad
        with torch.no_grad():
            sdpa(q, k, v, attn_mask=mask)
    assert (masklens.scan_count() - before, len(decides)) == (3, 6)
    for _ in range(3):
        for mask in (causal, padded, window):
            out = sdpa(q, k, v, attn_mask=mask)
            assert not masklens.last_timing()["scanned"] and masklens.last_timing()["decide_ms"] == 0
            assert_close(out, reference(q, k, v, mask), 1e-5)
            with torch.no_grad():
                assert_close(sdpa(q, k, v, attn_mask=mask), reference(q, k, v, mask), 1e-5)
    assert (masklens.scan_count() - before, len(decides)) == (3, 6)


def test_forget_reaches_the_drop_ins_fast_path():
    """A write torch cannot see, then masklens.forget: the next drop-in call scans again
    and follows the new mask (the memo of the last mask is dropped with the entry)."""
    mask = causal_mask(1).clone().contiguous()
    q, k, v = qkv(1, 4, L, L, grad=False)
    sdpa(q, k, v, attn_mask=mask)
    mask.numpy()[0, 0, 10, :] = False  # row 10 attends to nothing now; _version does not move
    before = masklens.scan_count()
    sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() == before  # the documented blind spot
    masklens.forget(mask)
    out = sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() == before + 1
    assert_close(out, reference(q, k, v, mask), 1e-5)
    assert torch.all(out[0, :, 10] == 0)


def test_the_last_mask_memo_lets_the_entry_die_with_its_mask():
    """What was derived from a mask (here the rows that attend, a tensor on the mask's
    device) is freed when the mask is, although the drop-in remembers the last mask."""
    import gc
    import weakref
    from masklens import _verdicts
    i, j = rows_cols(L, L)
    mask = ((j <= i) & (j >= 4)).expand(2, 1, L, L).clone()
    q, k, v = qkv(2, 4, L, L, grad=False)
    sdpa(q, k, v, attn_mask=mask)
    sdpa(q, k, v, attn_mask=mask)
    derived = [t for t in _verdicts.cached_entry(mask, (2, 1, L, L), masklens.torch.DROPIN_MASKED_THRESHOLD).derived.values() if isinstance(t, torch.Tensor)]
    assert derived
    refs = [weakref.ref(t) for t in derived]
    del derived, mask
    gc.collect()
    assert all(r() is None for r in refs)
