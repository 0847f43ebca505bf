"""On a CUDA device (skipped without one): the drop-in runs the kernels it decides —
is_causal on cuDNN/flash, plans, torch's varlen_attn, compiled FlexAttention — and
matches an fp32 reference forward and backward; the second call on a mask costs no scan."""
import warnings

import pytest
import torch

import masklens
from helpers import assert_close, rows_cols, tensors_held
from masklens.torch import scaled_dot_product_attention as sdpa

pytestmark = pytest.mark.gpu
DEV = "cuda"


def assert_forward_backward(out, ref, tensors):
    """out (a bf16 kernel's) against the fp32 reference `ref` of the same inputs: the
    output within 2e-2, and each gradient (of a random weighting of both) its reference's
    shape and within 5e-2 of its scale."""
    assert_close(out.float(), ref, 2e-2)
    w = torch.randn_like(ref)
    g1 = torch.autograd.grad((out.float() * w).sum(), tensors)
    g2 = torch.autograd.grad((ref * w).sum(), tensors)
    for a, b in zip(g1, g2):
        assert a.shape == b.shape
        assert_close(a.float(), b.float(), 5e-2 * max(1.0, b.abs().max().item()))


def reference32(q, k, v, mask):
    from helpers import reference
    return reference(q.float(), k.float(), v.float(), mask)


def masks(L=2048):
    i, j = rows_cols(L, L)
    i, j = i.to(DEV), j.to(DEV)
    c = j <= i
    docs = torch.bucketize(torch.arange(L, device=DEV), torch.tensor([300, 1200], device=DEV), right=True)
    start = torch.tensor([0, 100], device=DEV)
    length = torch.tensor([L, L - 300], device=DEV)
    return {
        "causal": c.expand(2, 1, L, L),
        "sliding window 256": (c & (i - j < 256)).expand(2, 1, L, L),
        "packed documents": (c & (docs[:, None] == docs[None, :])).expand(2, 1, L, L),
        "left padded causal": (c[None] & (j[None] >= start[:, None, None]))[:, None],
        # A batch's rows and keys past its length attend nothing: rows of no keys (q_valid).
        "right padded, empty rows": (c[None] & (torch.maximum(i, j)[None] < length[:, None, None]))[:, None],
    }


NAMES = ["causal", "sliding window 256", "packed documents", "left padded causal", "right padded, empty rows"]


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
    if flex:  # every one of these masks is a structure: its mask_mod replaces the mask
        from masklens.torch import inspect
        policy = inspect(q, k, v, mask)[0]
        assert policy.backend == "torch.flex_attention"
        assert policy.call.mask == "replace" and not policy.call.args.mask_mod_reads_mask
    assert_forward_backward(out, ref, (q, k, v))
    before = masklens.scan_count()
    sdpa(q, k, v, attn_mask=mask)
    assert masklens.scan_count() == before


@pytest.mark.parametrize("name,family,backend", [
    ("packed documents", "torch", "torch.varlen_attn"),
    ("sliding window 256", "torch", "torch.varlen_attn"),
    ("packed documents", "flex", "torch.flex_attention"),
    ("left padded causal", "flex", "torch.flex_attention"),
])
def test_gqa_runs_without_expanding_kv(name, family, backend, monkeypatch):
    """8 query heads over 2 key heads with enable_gqa=True: torch's varlen_attn and
    compiled FlexAttention take K and V with their 2 heads (no repeat_interleave), and
    output and gradients (of K and V too, summed over each group) match the reference."""
    from masklens import _env, _run
    from masklens.torch import inspect
    real = _env.environment
    monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": {family}}))

    def refuse(q, k, v):
        raise AssertionError(f"K/V expanded from {k.shape[1]} to {q.shape[1]} heads")
    monkeypatch.setattr(_run, "_expand_kv", refuse)
    mask = masks()[name]
    B, _, Q, K = mask.shape
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(B, h, n, 128, device=DEV, generator=g, dtype=torch.bfloat16).requires_grad_()
               for h, n in ((8, Q), (2, K), (2, K)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        policy = inspect(q, k, v, mask, enable_gqa=True)[0]
        out = sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    assert policy.backend == backend and not policy.is_plan
    assert not any(h.kind == "gqa_expand" for h in policy.hazards)
    ref = reference32(q, k, v, mask)
    assert_forward_backward(out, ref, (q, k, v))


def test_seed_case_drops_the_mask_for_is_causal():
    L = 8192
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril()
    q = torch.randn(1, 4, L, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    from masklens.torch import inspect
    policy, verdict = inspect(q, q, q, mask)
    assert verdict.structure.kind == "causal"
    assert policy.call.mask == "drop" and policy.call.args.is_causal


# --- The device scanner (masklens._cuda) against the host scanner ------------------------

needs_cuda_scan = pytest.mark.skipif(not masklens.has_cuda_scan(), reason="masklens was built without _cuda")


def structures(Q=777, K=1029):
    """A mask of every structure, element type and layout the scanners take, on the GPU:
    odd lengths, K != Q, stride-0 broadcasts on every dim, offsets and strided keys."""
    i, j = rows_cols(Q, K)
    i, j = i.to(DEV), j.to(DEV)
    d = K - Q
    tl, br = j <= i, j <= i + d
    g = torch.Generator(device=DEV).manual_seed(0)
    docs = torch.bucketize(torch.arange(K, device=DEV), torch.tensor([100, 400, 900], device=DEV), right=True)
    sq = torch.ones(Q, Q, dtype=torch.bool, device=DEV).tril()
    blocks = torch.zeros(Q, K, dtype=torch.bool, device=DEV)
    for s, e in ((200, 260), (500, 560)):  # bidirectional blocks (image tokens) in a causal mask
        blocks |= (j >= s) & (j < e) & (i + d >= s) & (i + d < e)
    neg = torch.finfo(torch.bfloat16).min
    add = torch.zeros(Q, K, device=DEV).masked_fill(~br, float("-inf"))
    return {
        "full": torch.ones(1, 1, Q, K, dtype=torch.bool, device=DEV),
        "causal top-left": tl[None, None],
        "causal bottom-right, stride-0 batch and heads": br.expand(3, 4, Q, K),
        "sliding window 64": (br & (i + d - j < 64))[None, None],
        "chunked 128": (br & ((j // 128) == ((i + d) // 128)))[None, None],
        "prefix-lm 300": (br | (j < 300))[None, None],
        "causal blocks": (br | blocks)[None, None],
        "packed documents": (sq & (docs[:Q, None] == docs[None, :Q]))[None, None],
        "left padding per batch": torch.stack([br & (j >= s) for s in (0, 5, 300)])[:, None],
        "empty rows": (br & (i % 7 != 0))[None, None],
        "arbitrary": (torch.rand(2, 2, Q, K, device=DEV, generator=g) < 0.5),
        "uint8 causal": br.to(torch.uint8)[None, None],
        "int8 window, stride-0 heads": (br & (i + d - j < 33)).to(torch.int8)[None, None].expand(1, 5, Q, K),
        "float32 additive -inf": add[None, None],
        "bfloat16 finfo.min": torch.zeros(Q, K, dtype=torch.bfloat16, device=DEV).masked_fill(~br, neg)[None, None],
        "float16 -65504, stride-0 batch": torch.zeros(Q, K, dtype=torch.float16, device=DEV)
        .masked_fill(~tl, -65504.0).expand(2, 1, Q, K),
        "float32 bias": (torch.rand(Q, K, device=DEV, generator=g) * 0.5).masked_fill(~br, float("-inf"))[None, None],
        "key padding row, stride-0 query": (j[0] < 1000)[None, None, None].expand(2, 1, Q, K),
        "stride-0 keys": (i < 400).expand(Q, K)[None, None],
        "strided keys (transposed)": torch.ones(K, Q, dtype=torch.bool, device=DEV).triu(-d).t()[None, None],
        "storage offset, odd base": torch.ones(Q + 3, K + 1, dtype=torch.bool, device=DEV).tril(d)[3:, 1:][None, None],
    }


def same_verdict(a, b):
    sa, sb = a.structure, b.structure
    fields = ("batch", "heads", "q_len", "k_len", "kind", "alignment", "window", "chunk", "prefix", "blocks",
              "segments", "kv_valid", "empty_rows", "finite_masked_rows", "bias")
    assert {f: getattr(sa, f) for f in fields} == {f: getattr(sb, f) for f in fields}
    assert (a.attending_rows() == b.attending_rows()).all()


# Named here, built inside the test: collection must not touch the GPU.
STRUCTURES = ["full", "causal top-left", "causal bottom-right, stride-0 batch and heads", "sliding window 64",
              "chunked 128", "prefix-lm 300", "causal blocks", "packed documents", "left padding per batch",
              "empty rows", "arbitrary", "uint8 causal", "int8 window, stride-0 heads", "float32 additive -inf",
              "bfloat16 finfo.min", "float16 -65504, stride-0 batch", "float32 bias",
              "key padding row, stride-0 query", "stride-0 keys", "strided keys (transposed)",
              "storage offset, odd base"]


@needs_cuda_scan
@pytest.mark.parametrize("name", STRUCTURES)
def test_device_and_host_verdicts_agree(name):
    from masklens import _scan
    built = structures()
    assert sorted(built) == sorted(STRUCTURES)
    mask = built[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the device scan copies nothing to the host: no warning
        device = _scan.scan(mask)
    assert masklens.last_timing()["device"] == "cuda"
    host = _scan.scan(mask, device=False)
    same_verdict(device, host)


@needs_cuda_scan
@pytest.mark.parametrize("rows", [200, 300, 5000])
def test_device_runs_past_the_first_copy_and_the_room(rows):
    """Rows with holes are a run each: 200 come with the count (one synchronisation),
    300 need a second copy, 5000 exceed the block's room and are reduced again. The
    verdict, its rows that attend nothing and its runs equal the host's."""
    from masklens import _scan
    i, j = rows_cols(rows, 64)
    mask = ((j % 3 != 1) & (i % 7 != 0)).to(DEV)[None, None]  # holes in every row, every 7th row empty
    device = _scan.scan(mask)
    assert masklens.last_timing()["device"] == "cuda"
    assert device.run_count == rows
    host = _scan.scan(mask, device=False)
    same_verdict(device, host)
    assert [r[0] for r in device.runs] == list(range(rows))


@needs_cuda_scan
def test_device_runs_of_structured_masks_are_few():
    from masklens import _scan
    L = 8192
    i, j = (t.to(DEV) for t in rows_cols(L, L))
    c = j <= i
    assert _scan.scan(c[None, None].expand(2, 4, L, L)).run_count == 1  # broadcast: one slice, one run
    assert _scan.scan((c & (i - j < 4096))[None, None]).run_count == 2


@needs_cuda_scan
def test_device_scan_names_a_nan_row():
    mask = torch.zeros(2, 1, 64, 64, device=DEV)
    mask[1, 0, 9, 2] = float("nan")
    from masklens import _scan
    with pytest.raises(masklens.MaskError, match=r"mask row \[1, 0, 9\] holds NaN"):
        _scan.scan(mask)
    q = torch.randn(2, 2, 64, 16, device=DEV)
    # The drop-in runs a mask it cannot prove as torch runs it, warning with the row.
    with pytest.warns(RuntimeWarning, match=r"mask row \[1, 0, 9\]"):
        out = sdpa(q, q, q, attn_mask=mask)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask),
                               equal_nan=True)


@needs_cuda_scan
def test_device_scan_on_the_current_stream_with_torch_memory():
    """A mask written on a side stream is scanned on that stream (ordered after the write,
    no device-wide synchronisation), in one block of torch's caching allocator."""
    from masklens import _scan
    L = 4096
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        mask = torch.ones(L, L, dtype=torch.bool, device=DEV)
        torch.cuda._sleep(50_000_000)  # keeps the stream busy, so an unordered scan would read the ones
        mask.tril_()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        verdict = _scan.scan(mask)
        after = torch.cuda.memory_stats()["allocation.all.allocated"]
    assert verdict.structure.kind == "causal"
    assert after - before == 1


@needs_cuda_scan
def test_drop_in_scans_on_the_device_once():
    L = 2048
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril()
    q = torch.randn(1, 4, L, 64, device=DEV, dtype=torch.bfloat16)
    before = masklens.scan_count()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = sdpa(q, q, q, attn_mask=mask)
    t = masklens.last_timing()
    assert t["scanned"] and t["device"] == "cuda" and t["decide_ms"] > 0
    sdpa(q, q, q, attn_mask=mask)
    assert not masklens.last_timing()["scanned"] and masklens.last_timing()["decide_ms"] == 0
    assert masklens.scan_count() == before + 1
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert_close(out.float(), ref.float(), 1e-2)


def test_without_the_cuda_module_a_cuda_mask_is_copied_once_with_a_warning(monkeypatch):
    from masklens import _scan
    monkeypatch.setattr(_scan, "_cuda", None)
    monkeypatch.setattr(_scan, "_cuda_reason", "masklens._cuda could not be loaded: (test)")
    monkeypatch.setattr(_scan, "_warned_cuda", False)
    mask = torch.ones(300, 300, dtype=torch.bool, device=DEV).tril()[None, None].expand(2, 3, 300, 300)
    with pytest.warns(RuntimeWarning, match=r"could not be loaded: \(test\): CUDA masks are copied to the host"):
        verdict = _scan.scan(mask)
    assert masklens.last_timing()["device"] == "host"
    assert verdict.structure.kind == "causal"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        _scan.scan(mask)


needs_device_tiles = pytest.mark.skipif(not masklens.has_cuda_scan(), reason="masklens was built without _cuda")
BM_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
             "full_q_num_blocks", "full_q_indices")


def tile_masks(L=1000):
    """Ragged lengths (not a multiple of 128) on purpose, on the device."""
    i, j = (t.to(DEV) for t in rows_cols(L, L))
    c = j <= i
    docs = torch.bucketize(torch.arange(L, device=DEV), torch.tensor([300, 700], device=DEV), right=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    tiles_on = torch.rand(2, 1, 8, 8, device=DEV, generator=g) < 0.4
    sparse = tiles_on.repeat_interleave(128, 2).repeat_interleave(128, 3)[:, :, :L, :L] | (j == i)
    return {
        "causal": c[None, None],
        "sliding window 256": (c & (i - j < 256))[None, None],
        "packed documents": (c & (docs[:, None] == docs[None, :]))[None, None],
        "left padded causal": torch.stack([c & (j >= s) for s in (0, 100)])[:, None],
        "block sparse": sparse,
    }


TILE_MASKS = ["causal", "sliding window 256", "packed documents", "left padded causal", "block sparse"]


@pytest.mark.parametrize("name", TILE_MASKS)
@pytest.mark.parametrize("size", [128, (128, 64)])
def test_block_mask_from_masklens_tiles_equals_create_block_mask(name, size):
    """BlockMask from masklens' tiles (from_kv_blocks' layout, q side included) on the
    device: every tensor equals torch's create_block_mask of the dense mask."""
    import masklens.torch as mt
    from torch.nn.attention.flex_attention import create_block_mask, create_mask
    mask = tile_masks()[name]
    B, H, Q, K = mask.shape
    bq, bk = (size, size) if isinstance(size, int) else size
    ours = mt.block_mask(mask, size)
    theirs = create_block_mask(lambda b, h, q, kv: mask[b, h, q.clamp(max=Q - 1), kv.clamp(max=K - 1)], B, H, Q, K,
                               device=DEV, BLOCK_SIZE=(bq, bk))
    assert tuple(ours.BLOCK_SIZE) == tuple(theirs.BLOCK_SIZE) and tuple(ours.seq_lengths) == tuple(theirs.seq_lengths)
    # The mask_mod (the rule, the read's spans or a lookup) is the mask, element for element.
    assert torch.equal(create_mask(ours.mask_mod, B, H, Q, K, device=DEV), mask.expand(B, H, Q, K))
    for f in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
              "full_q_num_blocks", "full_q_indices"):
        a, b = getattr(ours, f), getattr(theirs, f)
        assert a.device.type == "cuda" and a.dtype == torch.int32
        assert torch.equal(a.expand(b.shape), b), f


def structure_masks(L=1000):
    """Every exact kind and per-batch modifiers, ragged at 128, on the device."""
    i, j = (t.to(DEV) for t in rows_cols(L, L))
    c = j <= i
    blocks = torch.zeros(L, dtype=torch.long, device=DEV)
    blocks[200:330], blocks[600:777] = 1, 2
    same_block = (blocks[:, None] == blocks[None, :]) & (blocks[:, None] > 0)
    doc_starts = ([0, 300, 700], [0, 129, 500, 999])

    def docs(starts):
        d = torch.bucketize(torch.arange(L, device=DEV), torch.tensor(starts[1:], device=DEV), right=True)
        return d[:, None] == d[None, :]
    return {
        "causal": c[None, None],
        "sliding window 256": (c & (i - j < 256))[None, None],
        "chunked 200": (c & (i // 200 == j // 200))[None, None],
        "prefix-LM 300": (c | (j < 300))[None, None],
        "VLM blocks": (c | same_block)[None, None],
        "documents per batch": torch.stack([c & docs(s) for s in doc_starts])[:, None],
        "right padded, per batch": torch.stack([c & (i < n) & (j < n) for n in (1000, 640)])[:, None],
        "bottom-right causal 700 x 1000": (j[:700] <= i[:700] + 300)[None, None],
    }


STRUCTURE_MASKS = ["causal", "sliding window 256", "chunked 200", "prefix-LM 300", "VLM blocks", "documents per batch",
                   "right padded, per batch", "bottom-right causal 700 x 1000"]


@needs_device_tiles
@pytest.mark.parametrize("name", STRUCTURE_MASKS)
@pytest.mark.parametrize("size", [128, (64, 128)])
def test_block_mask_of_a_structure_from_its_ranges_equals_the_states_writer_and_create_block_mask(name, size):
    """An exact structure's BlockMask on the device from its tile ranges
    (_cuda.write_block_mask_from_ranges: 32 bytes a q tile cross) equals the one written
    from its tile states and torch's create_block_mask of the dense mask, every field."""
    import masklens.torch as mt
    from masklens import _block_mask, _core, _scan
    from torch.nn.attention.flex_attention import create_block_mask
    mask = structure_masks()[name]
    B, H, Q, K = mask.shape
    bq, bk = (size, size) if isinstance(size, int) else size
    report = masklens.inspect(mask)
    assert report.structure.kind != "arbitrary", name
    assert _scan.has_structure_writer()
    ours = mt.block_mask(report, size, device=DEV)  # no tiles counted: from the ranges
    mod = _block_mask.mask_mod_for(report.structure, DEV)
    from_states = _block_mask.block_mask_from_tiles(_core.tiles_from_structure(report.structure, bq, bk), mod, DEV)
    theirs = create_block_mask(lambda b, h, q, kv: mask[b, h, q.clamp(max=Q - 1), kv.clamp(max=K - 1)], B, H, Q, K,
                               device=DEV, BLOCK_SIZE=(bq, bk))
    assert tuple(ours.BLOCK_SIZE) == (bq, bk) and tuple(ours.seq_lengths) == (Q, K)
    for f in BM_FIELDS:
        a = getattr(ours, f)
        assert a.device.type == "cuda" and a.dtype == torch.int32 and a.is_contiguous(), f
        assert torch.equal(a, getattr(from_states, f)), f
        assert torch.equal(a.expand(getattr(theirs, f).shape), getattr(theirs, f)), f


@pytest.mark.parametrize("name", TILE_MASKS)
def test_compiled_flex_on_masklens_block_mask_matches_the_dense_reference(name):
    import masklens.torch as mt
    from torch.nn.attention.flex_attention import flex_attention
    mask = tile_masks()[name]
    B, _, Q, K = mask.shape
    g = torch.Generator(device=DEV).manual_seed(1)
    q, k, v = (torch.randn(B, 4, n, 64, device=DEV, generator=g, dtype=torch.bfloat16).requires_grad_()
               for n in (Q, K, K))
    bm = mt.block_mask(mask, 128)
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=bm)
    ref = reference32(q, k, v, mask)
    assert_forward_backward(out, ref, (q, k, v))


# --- BlockMask tensors written on the device (masklens._cuda.scan_runs planned with tiles) ----



def random_block_sparse(B, H, Q, K, bq, bk, density, seed, dtype=torch.bool):
    """Random bq x bk tiles switched on, some with holes, cut to Q x K (ragged where Q, K are
    not multiples), plus the diagonal so that no row is empty; on the device."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    nq, nk = -(-Q // bq), -(-K // bk)
    on = torch.rand(B, H, nq, nk, device=DEV, generator=g) < density
    dense = on.repeat_interleave(bq, 2).repeat_interleave(bk, 3)[:, :, :Q, :K]
    holes = (torch.rand(B, H, Q, K, device=DEV, generator=g) < 0.1) & (torch.rand(B, H, nq, nk, device=DEV, generator=g)
                                                                       < 0.5).repeat_interleave(bq, 2).repeat_interleave(bk, 3)[:, :, :Q, :K]
    i, j = (t.to(DEV) for t in rows_cols(Q, K))
    m = (dense & ~holes) | (i == j)
    if dtype == torch.bool:
        return m
    return torch.zeros(m.shape, dtype=dtype, device=DEV).masked_fill(~m, float("-inf"))


DEVICE_TILE_CASES = {  # name: (mask builder, tile size)
    "square 128": (lambda: random_block_sparse(1, 1, 1024, 1024, 128, 128, 0.3, 0), (128, 128)),
    "ragged, per head": (lambda: random_block_sparse(2, 3, 1000, 777, 128, 64, 0.4, 1), (128, 64)),
    "ragged, stride-0 heads": (lambda: random_block_sparse(2, 1, 900, 1300, 64, 128, 0.5, 2).expand(2, 4, 900, 1300),
                               (64, 128)),
    "stride-0 batch, float additive": (
        lambda: random_block_sparse(1, 2, 517, 517, 128, 128, 0.4, 3, torch.float32).expand(3, 2, 517, 517), 128),
    "tiny tiles, 3-D": (lambda: random_block_sparse(1, 2, 200, 190, 16, 32, 0.3, 4)[0], (16, 32)),
}


@needs_device_tiles
@pytest.mark.parametrize("name", list(DEVICE_TILE_CASES))
def test_device_block_mask_equals_create_block_mask_and_host_tiles(name):
    """An arbitrary CUDA mask's BlockMask comes from one device read (scan_count + 1, the
    device scanner's timing) and its eight tensors, on the device, equal torch's
    create_block_mask over every batch and head and masklens' host tiles of the same mask."""
    import masklens.torch as mt
    from masklens import _core, _scan
    from torch.nn.attention.flex_attention import create_block_mask
    build, size = DEVICE_TILE_CASES[name]
    mask = build()
    assert _scan.has_device_tiles()
    m4 = mask
    while m4.dim() < 4:
        m4 = m4.unsqueeze(0)
    B, H, Q, K = m4.shape
    bq, bk = (size, size) if isinstance(size, int) else size
    before = masklens.scan_count()
    ours = mt.block_mask(mask, size)
    assert masklens.scan_count() == before + 1 and masklens.last_timing()["device"] == "cuda"
    attends = m4 if m4.dtype == torch.bool else m4 > -1000
    theirs = create_block_mask(lambda b, h, q, kv: attends[b, h, q.clamp(max=Q - 1), kv.clamp(max=K - 1)], B, H, Q, K,
                               device=DEV, BLOCK_SIZE=(bq, bk))
    assert tuple(ours.BLOCK_SIZE) == (bq, bk) and tuple(ours.seq_lengths) == (Q, K)
    _, host = _core.scan_with_tiles(_scan.host_array(m4, warn=False), bq, bk, -1000.0)  # broadcast dims kept
    host = host.block_mask()
    distinct = (1 if m4.stride(0) == 0 else B, 1 if m4.stride(1) == 0 else H)
    for f in BM_FIELDS:
        a, b = getattr(ours, f), getattr(theirs, f)
        assert a.device.type == "cuda" and a.dtype == torch.int32 and a.is_contiguous(), f
        assert tuple(a.shape[:2]) == distinct, f  # a broadcast dimension stored once
        assert torch.equal(a.expand(b.shape), b), f
        assert torch.equal(a.cpu(), torch.from_numpy(getattr(host, f))), f
    # From a report of the mask (no tiles counted): the same device read.
    report = masklens.inspect(mask)
    before = masklens.scan_count()
    again = mt.block_mask(report, size, mask=mask)
    assert masklens.scan_count() == before + 1 and masklens.last_timing()["device"] == "cuda"
    for f in BM_FIELDS:
        assert torch.equal(getattr(again, f), getattr(ours, f)), f


@needs_device_tiles
def test_a_tile_scan_enqueued_without_waiting_is_waited_for_once():
    """scan_runs(wait=False) on a plan with tiles returns before the synchronisation;
    wait_runs() then gives the run count, and the head and the tensors, of a scan with
    wait=True; another scan on the thread before it, or a second wait_runs(), is refused
    by name."""
    from masklens import _block_mask, _cuda
    i, j = (t.to(DEV) for t in rows_cols(1000, 1000))
    mask = ((j <= i) & (i - j < 300)).expand(2, 1, 1000, 1000).contiguous()  # a window: few runs, all in the head
    args = (mask.data_ptr(), "bool", list(mask.shape), list(mask.stride()), -1000.0, 128, 128)
    stream = torch.cuda.current_stream().cuda_stream

    def scan(wait):
        runs = _cuda.plan_runs(*args)
        block = torch.empty(runs.block_bytes, dtype=torch.uint8, device=DEV)
        arrays, pointers, nbytes = _block_mask._block_mask_tensors(mask.device, *runs.tile_grid)
        count = _cuda.scan_runs(runs, block.data_ptr(), runs.block_bytes, stream, 0, pointers, nbytes, wait=wait)
        return runs, block, arrays, pointers, nbytes, count

    runs, _, want, _, _, count = scan(True)
    later, block, got, pointers, nbytes, none = scan(False)
    try:
        assert none is None and 0 < count <= later.eager
        with pytest.raises(masklens.MaskError, match=r"^invalid_argument: a scan enqueued with wait=False on this "
                                                     r"thread was not waited for: call wait_runs first"):
            _cuda.scan_runs(later, block.data_ptr(), later.block_bytes, stream, 0, pointers, nbytes)
        with pytest.raises(masklens.MaskError, match="^invalid_argument: these DeviceRuns are not the scan pending "
                                                     "on this thread"):
            _cuda.wait_runs(runs)
    finally:
        waited = _cuda.wait_runs(later)  # whatever failed above: the thread is free again
    assert waited == count
    with pytest.raises(masklens.MaskError, match="^invalid_argument: no scan enqueued with wait=False is pending"):
        _cuda.wait_runs(later)
    for f in BM_FIELDS:
        assert torch.equal(got[f], want[f]), f
    verdict = later.finish()  # from the head wait_runs() copied
    assert verdict.structure.kind == "sliding_window" and verdict.structure.window == 300
    assert verdict.structure.describe() == runs.finish().structure.describe()


@needs_device_tiles
@pytest.mark.parametrize("seed", range(6))
def test_block_mask_written_on_the_device_from_host_tiles_equals_the_host_writer(seed):
    """A host tile summary's BlockMask tensors written on the GPU (its states copied over,
    masklens._cuda.write_block_mask) equal the host writer's, every field, broadcast dims
    and ragged tiles included, and lines longer than a warp's chunk (over 256 tiles)."""
    from masklens import _block_mask, _core
    g = torch.Generator().manual_seed(seed)
    B, H = (1, 1) if seed % 2 else (2, 3)
    Q, K = [(300, 9000), (9000, 257), (513, 513), (40, 40000), (1000, 1000), (129, 4097)][seed]
    bq, bk = [(16, 32), (32, 16), (64, 64), (32, 128), (128, 128), (8, 16)][seed]
    nq, nk = -(-Q // bq), -(-K // bk)
    tile_on = torch.rand(1 if seed % 3 == 0 else B, H, nq, nk, generator=g) < 0.4
    mask = tile_on.repeat_interleave(bq, 2).repeat_interleave(bk, 3)[:, :, :Q, :K]
    holed = (torch.rand(tile_on.shape, generator=g) < 0.5).repeat_interleave(bq, 2).repeat_interleave(bk, 3)
    mask = mask & ~(holed[:, :, :Q, :K] & (torch.rand(mask.shape, generator=g) < 0.01))  # half the tiles partial
    mask = mask.expand(B, H, Q, K)
    _, tiles = _core.scan_with_tiles(mask, bq, bk, -1000.0)
    ours = _block_mask.device_block_mask_tensors(tiles, DEV)
    host = tiles.block_mask()
    for f in BM_FIELDS:
        assert ours[f].device.type == "cuda" and ours[f].dtype == torch.int32, f
        assert torch.equal(ours[f].cpu(), torch.from_numpy(getattr(host, f))), f


@needs_device_tiles
@pytest.mark.parametrize("name", list(DEVICE_TILE_CASES))
def test_inspect_tiles_of_a_cuda_mask_come_from_one_device_read(name):
    """inspect(cuda_mask, tiles=) reads the mask once on its device (scan_count + 1, the
    device's timing) and reports what the host reports for the same mask: the tiles (the
    JSON's "tiles"), the structure with its tile fractions."""
    from masklens import _scan
    build, size = DEVICE_TILE_CASES[name]
    mask = build()
    before = masklens.scan_count()
    ours = masklens.inspect(mask, tiles=size)
    assert masklens.scan_count() == before + 1 and masklens.last_timing()["device"] == "cuda"
    host = masklens.inspect(_scan.host_array(mask, warn=False), tiles=size)  # stride-0 dims kept
    assert ours.to_dict()["tiles"] == host.to_dict()["tiles"]
    assert ours.structure.describe() == host.structure.describe()
    f, g = ours.structure.tile_fractions, host.structure.tile_fractions
    assert (f.partial, f.full) == (g.partial, g.full)


@needs_device_tiles
def test_device_block_mask_of_a_float_mask_names_a_nan_row():
    """A block-sparse mask's BlockMask takes no verdict (its runs are many), yet a float
    mask's NaN row is an error that names the row, found by the run reduction on the device."""
    import masklens.torch as mt
    from masklens import _block_mask
    mask = random_block_sparse(2, 1, 512, 512, 64, 64, 0.4, 7, torch.float32)
    assert _block_mask.device_scan_tiles(mask, (64, 64), classify_many_runs=False)[0] is None  # many runs: no verdict
    mask[1, 0, 300, 5] = float("nan")
    masklens.forget()
    with pytest.raises(masklens.MaskError, match=r"^invalid_value: mask row \[1, 0, 300\] holds NaN or \+inf"):
        mt.block_mask(mask, 64)


@needs_device_tiles
def test_device_block_mask_of_documents_reads_the_spans_of_its_one_read():
    """Packed documents on a CUDA mask: the mask_mod compares keys with the spans the read
    left (no document table is built after it), holds no reference to the mask, and is
    the mask; the tensors are create_block_mask's."""
    import masklens.torch as mt
    from torch.nn.attention.flex_attention import create_block_mask, create_mask
    L = 1000
    i, j = (t.to(DEV) for t in rows_cols(L, L))
    positions = torch.arange(L, device=DEV)
    packed = []
    for starts in ([130, 600, 601], [500]):  # two batches, packed apart (a one-token document)
        docs = torch.bucketize(positions, torch.tensor(starts, device=DEV), right=True)
        packed.append((j <= i) & (docs[:, None] == docs[None, :]))
    mask = torch.stack(packed)[:, None]
    assert masklens.scan(mask).structure.segments is not None
    masklens.forget()
    bm = mt.block_mask(mask, 128)
    held = tensors_held(bm.mask_mod)
    assert held and all(t.dtype == torch.int64 and t.data_ptr() != mask.data_ptr() for t in held)
    assert torch.equal(create_mask(bm.mask_mod, 2, 1, L, L, device=DEV), mask)
    theirs = create_block_mask(lambda b, h, q, kv: mask[b, 0, q, kv], 2, 1, L, L, device=DEV)
    for f in BM_FIELDS:
        assert torch.equal(getattr(bm, f).expand(getattr(theirs, f).shape), getattr(theirs, f)), f


@needs_device_tiles
def test_device_block_mask_of_an_exact_structure_takes_its_rule_and_the_tensors_of_its_one_read(monkeypatch):
    """An exact structure's BlockMask on a CUDA mask: one tile scan writes the tensors
    (nothing tiled again from the fields), and the mask_mod is the structure's rule,
    holding no reference to the mask."""
    import masklens.torch as mt
    from masklens import _block_mask, _core
    from torch.nn.attention.flex_attention import create_block_mask
    scans, from_fields = [], []
    real_scan, real_fields = _block_mask.device_scan_tiles, _core.tiles_from_structure
    monkeypatch.setattr(_block_mask, "device_scan_tiles", lambda *a, **kw: scans.append(a) or real_scan(*a, **kw))
    monkeypatch.setattr(_core, "tiles_from_structure", lambda *a, **kw: from_fields.append(a) or real_fields(*a, **kw))
    L = 1000
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril()
    ours = mt.block_mask(mask, 128)
    assert len(scans) == 1 and from_fields == []
    assert tensors_held(ours.mask_mod) == []
    theirs = create_block_mask(lambda b, h, q, kv: kv <= q, 1, 1, L, L, device=DEV)
    for f in BM_FIELDS:
        assert torch.equal(getattr(ours, f), getattr(theirs, f)), f


@needs_device_tiles
@pytest.mark.parametrize("shape", [(2, 1, 1000, 1000), (2, 4, 777, 1029)])
def test_drop_in_flex_on_a_block_sparse_cuda_mask_uses_device_tiles(shape, monkeypatch):
    """The drop-in on an arbitrary CUDA mask with only FlexAttention: compiled flex over the
    BlockMask masklens wrote on the device (no create_block_mask call, one tile scan,
    memoised with the verdict), matching the dense reference forward and backward."""
    import torch.nn.attention.flex_attention as fa
    from masklens import _block_mask, _env
    real = _env.environment
    monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": {"flex"}}))
    created, tile_scans = [], []
    monkeypatch.setattr(fa, "create_block_mask", lambda *a, **kw: created.append(a) or pytest.fail("create_block_mask"))
    real_tiles = _block_mask.device_scan_tiles
    monkeypatch.setattr(_block_mask, "device_scan_tiles", lambda *a, **kw: tile_scans.append(a) or real_tiles(*a, **kw))
    B, H, Q, K = shape
    mask = random_block_sparse(B, H, Q, K, 128, 128, 0.4, 11)
    masklens.forget()
    g = torch.Generator(device=DEV).manual_seed(2)
    q, k, v = (torch.randn(B, 4, n, 64, device=DEV, generator=g, dtype=torch.bfloat16).requires_grad_()
               for n in (Q, K, K))
    policy, verdict = masklens.torch.inspect(q, k, v, mask)
    assert verdict.structure.kind == "arbitrary" and policy.backend == "torch.flex_attention"
    out = sdpa(q, k, v, attn_mask=mask)
    assert created == [] and len(tile_scans) == 1
    sdpa(q, k, v, attn_mask=mask)  # memoised: no second tile scan
    assert len(tile_scans) == 1
    ref = reference32(q, k, v, mask)
    assert_forward_backward(out, ref, (q, k, v))


def test_drop_in_compiles_flex_once_forward_and_backward(monkeypatch):
    """Compiled FlexAttention (Inductor) in training: the first call compiles one Dynamo
    frame; its backward, a new mask tensor of the same structure (new BlockMask, new
    mask_mod closure) and cached calls compile no other frame, and the result matches the
    dense reference forward and backward."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from masklens import _env
    real = _env.environment
    monkeypatch.setattr(_env, "environment", lambda *a, **kw: real(*a, **{**kw, "available": {"flex"}}))
    mask = masks(1024)["sliding window 256"]
    g = torch.Generator(device=DEV).manual_seed(3)
    q, k, v = (torch.randn(2, 4, 1024, 64, device=DEV, generator=g, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    assert masklens.torch.inspect(q, k, v, mask)[0].backend == "torch.flex_attention"
    torch._dynamo.reset()
    counters.clear()
    try:
        fresh = mask.clone()
        outs = [sdpa(q, k, v, attn_mask=m) for m in (mask, fresh, mask)]
        ref = reference32(q, k, v, mask)
        w = torch.randn_like(ref)
        grads = [torch.autograd.grad((out.float() * w).sum(), (q, k, v)) for out in outs]
        frames, graphs = counters["frames"]["ok"], counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()  # the next user of the compiled flex compiles it again
    assert (frames, graphs) == (1, 1), f"flex_attention compiled {frames} frames, {graphs} graphs"
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for out, g_out in zip(outs, grads):
        assert_close(out.float(), ref, 2e-2)
        for a, b in zip(g_out, g_ref):
            assert_close(a.float(), b.float(), 5e-2 * max(1.0, b.abs().max().item()))


def test_host_tables_cross_through_the_pinned_staging_intact():
    """masklens._scan.to_device (masklens._cuda.upload): every dtype a BlockMask's tables
    take, sizes past a slot's first capacity (it grows), more copies than the four slots
    reserve_uploads() allocates (the ring grows while their copies are queued), on a side
    stream too; each tensor equals its source after the copies finish, though each source
    is overwritten right after its call (the staging took a copy)."""
    import numpy as np
    from masklens import _scan
    rng = np.random.default_rng(7)
    sources, copies = [], []
    side = torch.cuda.Stream()
    for i in range(3 * 4 + 1):
        n = int(rng.integers(0, 3 << 18)) if i % 3 else int(rng.integers(1, 64))
        dtype = (np.int32, np.int64, np.uint8, np.bool_)[i % 4]
        a = rng.integers(0, 2 if dtype is np.bool_ else 1000, size=(n,)).astype(dtype)
        if i % 5 == 0:
            a = a[: n - n % 2].reshape(2, -1) if n >= 2 else a
        with torch.cuda.stream(side if i % 2 else torch.cuda.current_stream()):
            copies.append(_scan.to_device(a, DEV))
        sources.append(a.copy())
        a[...] = 0  # the caller may reuse its array at once
    torch.cuda.synchronize()
    for a, t in zip(sources, copies):
        assert t.device.type == "cuda" and tuple(t.shape) == a.shape and t.dtype == torch.from_numpy(a).dtype
        assert np.array_equal(t.cpu().numpy(), a)
