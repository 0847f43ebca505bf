"""Tile summaries in Python (tiles.hpp, docs/tiles.md), on the CPU: the bindings (no
copies, shapes, errors), tiles from a structure against tiles of a scan, torch
BlockMasks from masklens' tiles against torch's own create_block_mask for every
structure kind and random block-sparse masks with ragged lengths, and the drop-in's
flex runner (eager flex) on masklens' BlockMask against the dense reference."""
import numpy as np
import pytest
import torch

import masklens
import masklens.torch
from masklens import _block_mask, _core, _env, _flex
from helpers import assert_close, qkv, reference, rows_cols

fa = pytest.importorskip("torch.nn.attention.flex_attention")
FIELDS = ["kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"]


def structured(Q=100, K=100):
    """Masks of every exact kind (and modifiers), ragged lengths on purpose."""
    i, j = rows_cols(Q, K)
    d = K - Q
    tl, br = j <= i, j <= i + d
    docs = torch.bucketize(torch.arange(max(Q, K)), torch.tensor([17, 60]), right=True)
    blocks = torch.bucketize(torch.arange(K), torch.tensor([30, 45]), right=True)
    start = torch.tensor([0, 9, 40])
    return {
        "full": torch.ones(Q, K, dtype=torch.bool),
        "causal": tl,
        "causal bottom-right": br,
        "sliding window 23": tl & (i - j < 23),
        "chunked 24": tl & (i // 24 == j // 24),
        "prefix-lm 33": tl | (j < 33),
        "causal blocks": tl | ((blocks[None, :] == blocks[:, None][:Q]) & (j >= 30) & (j < 45) & (i >= 30) & (i < 45)),
        "packed documents": tl & (docs[:Q, None] == docs[None, :K]),
        "left padding per batch": torch.stack([tl & (j >= s) for s in start])[:, None],
        "query padding (q_valid)": torch.stack([tl & (i < e) for e in (Q, 70)])[:, None],
        "bottom-right Q<K": rows_cols(40, K)[1] <= rows_cols(40, K)[0] + (K - 40),
    }


def block_sparse(B, H, Q, K, bq, bk, density, seed):
    """Random tiles of bq x bk switched on (some whole, some with holes), cut to Q x K."""
    g = torch.Generator().manual_seed(seed)
    nq, nk = -(-Q // bq), -(-K // bk)
    on = torch.rand(B, H, nq, nk, generator=g) < density
    dense = on.repeat_interleave(bq, 2).repeat_interleave(bk, 3)[:, :, :Q, :K]
    holes = torch.rand(B, H, Q, K, generator=g) < 0.1
    half = (torch.rand(B, H, nq, nk, generator=g) < 0.5).repeat_interleave(bq, 2).repeat_interleave(bk, 3)[:, :, :Q, :K]
    return dense & ~(holes & half)


def as4(m):
    while m.dim() < 4:
        m = m.unsqueeze(0)
    return m


def torch_block_mask(mask, bq, bk):
    """torch's own BlockMask of a dense mask: create_block_mask over every (batch, head)."""
    m = as4(mask)
    B, H, Q, K = m.shape

    def lookup(b, h, q, kv):
        return m[b, h, q.clamp(max=Q - 1), kv.clamp(max=K - 1)]
    return fa.create_block_mask(lookup, B, H, Q, K, device="cpu", BLOCK_SIZE=(bq, bk))


def assert_same_block_mask(ours, theirs):
    """Equal tensors, ours broadcast (a stride-0 batch or head is stored once) to torch's."""
    assert tuple(ours.BLOCK_SIZE) == tuple(theirs.BLOCK_SIZE)
    assert tuple(ours.seq_lengths) == tuple(theirs.seq_lengths)
    for name in FIELDS:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype == torch.int32, name
        assert torch.equal(a.expand(b.shape), b), name


def test_tensors_are_numpy_arrays_over_masklens_memory():
    m = structured()["sliding window 23"]
    _, tiles = _core.scan_with_tiles(m, 32, 16)
    t = tiles.block_mask()
    assert t.fields == FIELDS
    assert t.block_size == (32, 16) and t.seq_lengths == (100, 100)
    kv = t.kv_indices
    assert kv.dtype == np.int32 and kv.shape == (1, 1, 4, 7)
    assert t.kv_num_blocks.shape == (1, 1, 4) and t.q_indices.shape == (1, 1, 7, 4)
    # Two reads are views of the same memory (no copy), alive after the object is dropped.
    assert t.kv_indices.__array_interface__["data"][0] == kv.__array_interface__["data"][0]
    del t
    assert kv.sum() >= 0
    shared = torch.from_numpy(kv)
    assert shared.data_ptr() == kv.__array_interface__["data"][0]
    assert tiles.states.shape == (1, 1, 4, 7) and tiles.states.dtype == np.uint8
    counts = tiles.counts
    assert counts == {s: int((tiles.states == v).sum()) for s, v in (("empty", 0), ("partial", 1), ("full", 2))}
    assert sum(counts.values()) == 28
    f = tiles.fractions()
    assert (f.block_q, f.block_k) == (32, 16) and f.partial == counts["partial"] / 28 and f.full == counts["full"] / 28


@pytest.mark.parametrize("name", list(structured()))
@pytest.mark.parametrize("size", [(16, 16), (32, 16), (128, 128), (7, 50)])
def test_tiles_from_structure_equal_the_tiles_of_a_scan(name, size):
    mask = structured()[name]
    verdict, scanned = _core.scan_with_tiles(mask, *size)
    s = verdict.structure
    assert s.kind != "arbitrary", name
    assert s.tile_fractions is None  # only an arbitrary mask is charged on counted tiles
    derived = _core.tiles_from_structure(s, *size)
    B, H = as4(mask).shape[:2]
    a = torch.from_numpy(np.array(derived.states)).expand(B, H, -1, -1)
    b = torch.from_numpy(np.array(scanned.states)).expand(B, H, -1, -1)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(structured()))
@pytest.mark.parametrize("size", [(16, 16), (32, 16), (7, 50)])
def test_structure_tile_ranges_are_the_states_tiles_from_structure_fills(name, size):
    """structure_tile_ranges gives per q tile the k tiles it touches and fills: filled in,
    the states of tiles_from_structure, tile for tile; and the grid of the summary."""
    s = masklens.scan(structured()[name]).structure
    grid, ranges = _core.structure_tile_ranges(s, *size)
    tiles = _core.tiles_from_structure(s, *size)
    db, dh, nq, nk = tiles.states.shape
    assert grid == [tiles.batch, tiles.heads, tiles.q_len, tiles.k_len, *size, db, dh]
    assert ranges.dtype == np.int64 and ranges.shape == (db * dh * nq, 4)
    states = np.zeros((db * dh * nq, nk), dtype=np.uint8)
    for line, (touched_begin, touched_end, full_begin, full_end) in enumerate(ranges):
        assert 0 <= touched_begin <= full_begin <= full_end <= touched_end <= nk or full_begin == full_end == 0
        states[line, touched_begin:touched_end] = 1
        states[line, full_begin:full_end] = 2
    assert np.array_equal(states.reshape(tiles.states.shape), tiles.states)


def test_structure_tile_ranges_and_their_device_writer_refuse_bad_input():
    arbitrary = masklens.scan(torch.rand(8, 8) < 0.5).structure
    with pytest.raises(masklens.MaskError, match="^invalid_argument: tiles_from_structure needs an exact structure"):
        _core.structure_tile_ranges(arbitrary)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: tile size must be two integers >= 1"):
        _core.structure_tile_ranges(masklens.scan(structured()["causal"]).structure, 0, 16)
    if not masklens.has_cuda_scan():  # the errors above are checked; the writer's need the module
        pytest.skip("masklens was built without _cuda")
    from masklens import _cuda as cuda
    grid, ranges = _core.structure_tile_ranges(masklens.scan(structured()["causal"]).structure, 32, 32)
    n = {"kv_num_blocks": 4, "kv_indices": 16, "q_num_blocks": 4, "q_indices": 16}
    nbytes = [4 * n[f.replace("full_", "")] for f in FIELDS]
    good = dict(h_ranges=ranges.ctypes.data, ranges_bytes=ranges.nbytes, d_ranges=1 << 20, grid=grid,
                arrays=[1 << 16] * 8, array_bytes=nbytes, stream=0, device=0)

    def call(**kw):
        cuda.write_block_mask_from_ranges(**{**good, **kw})
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: ranges hold 96 bytes; this grid has 4 q tiles "
                                                 r"\(128 bytes\)"):
        call(ranges_bytes=96)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: host ranges are null"):
        call(h_ranges=0)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: device ranges are null"):
        call(d_ranges=0)
    with pytest.raises(masklens.MaskError, match="^misaligned_pointer: device ranges are not aligned to 8 bytes"):
        call(d_ranges=(1 << 20) + 4)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: grid is \\[batch, heads"):
        call(grid=grid[:7])
    with pytest.raises(masklens.MaskError, match="^invalid_argument: kv_indices holds 4 bytes"):
        call(array_bytes=nbytes[:1] + [4] + nbytes[2:])
    if not torch.cuda.is_available():  # every argument right: the first CUDA call names the failure
        with pytest.raises(masklens.MaskError, match=r"^device_error: cuda\w+"):
            call()


@pytest.mark.parametrize("name", list(structured()))
@pytest.mark.parametrize("size", [(16, 16), (32, 16), (128, 128)])
def test_block_mask_of_a_structure_equals_create_block_mask(name, size):
    mask = structured()[name]
    ours = masklens.torch.block_mask(mask, size)
    assert_same_block_mask(ours, torch_block_mask(mask, *size))
    # From a report: the structure's tiles, no mask needed.
    report = masklens.inspect(mask)
    assert_same_block_mask(masklens.torch.block_mask(report, size), torch_block_mask(mask, *size))
    # The mask_mod is the structure's rule: the dense mask it describes.
    m = as4(mask)
    B, H, Q, K = m.shape
    dense = fa.create_mask(ours.mask_mod, B, H, Q, K, device="cpu")
    assert torch.equal(dense, m.expand(B, H, Q, K))


@pytest.mark.parametrize("shape,size,density,seed", [
    ((1, 1, 256, 256), (64, 64), 0.3, 0),
    ((2, 3, 200, 130), (32, 16), 0.4, 1),   # ragged in both lengths, per head
    ((2, 1, 77, 301), (16, 64), 0.5, 2),
    ((1, 2, 129, 129), (128, 128), 0.7, 3),
])
def test_block_mask_of_a_block_sparse_mask_equals_create_block_mask(shape, size, density, seed):
    mask = block_sparse(*shape, *size, density, seed)
    assert masklens.scan(mask).structure.kind == "arbitrary"
    ours = masklens.torch.block_mask(mask, size)
    assert_same_block_mask(ours, torch_block_mask(mask, *size))
    report = masklens.inspect(mask, tiles=size)
    assert report.structure.tile_fractions is not None
    assert report.structure.tile_fractions.partial == report.tiles.fractions().partial
    assert_same_block_mask(masklens.torch.block_mask(report, size, mask=mask), torch_block_mask(mask, *size))
    with pytest.raises(masklens.MaskError, match="pass mask="):
        masklens.torch.block_mask(report, size)


@pytest.mark.parametrize("mask_kind", ["structure", "block-sparse"])
def test_from_kv_blocks_over_masklens_tiles_equals_create_block_mask(mask_kind, monkeypatch):
    """BlockMask.from_kv_blocks on masklens' kv side (the path a torch whose BlockMask
    constructor takes no q side uses, and what a caller holding the four kv tensors
    writes): the q side torch derives, and every tensor, equal create_block_mask's."""
    from masklens import _block_mask
    monkeypatch.setattr(_block_mask, "_BLOCK_MASK_TAKES_Q_SIDE", False)
    built = []
    real = fa.BlockMask.from_kv_blocks
    monkeypatch.setattr(fa.BlockMask, "from_kv_blocks", lambda *a, **kw: built.append(1) or real(*a, **kw))
    if mask_kind == "structure":
        mask, size = structured()["sliding window 23"], (32, 16)
    else:
        mask, size = block_sparse(2, 3, 200, 130, 32, 16, 0.4, 1), (32, 16)
    ours = masklens.torch.block_mask(mask, size)
    assert built, "from_kv_blocks was not called"
    assert_same_block_mask(ours, torch_block_mask(mask, *size))


@pytest.mark.parametrize("layout", ["[B, H, Q, K]", "expanded [1, 1] to [B, H]", "[B, 1, Q, K]", "[Q, K]",
                                    "per-batch padding"])
def test_a_structure_tiled_from_its_fields_is_laid_out_as_the_scan_of_its_mask(layout):
    """A CUDA mask's exact structure is tiled from its fields where masklens._cuda is not
    built: laid out over the slices the mask stores, it equals the scan's summary (the
    CLI's --tiles JSON), shape and states, whichever way the mask is stored."""
    Q = K = 70
    i, j = rows_cols(Q, K)
    causal = j <= i
    masks = {
        "[B, H, Q, K]": causal.expand(2, 3, Q, K).contiguous(),
        "expanded [1, 1] to [B, H]": causal.view(1, 1, Q, K).expand(2, 3, Q, K),
        "[B, 1, Q, K]": causal.expand(2, 1, Q, K).contiguous(),
        "[Q, K]": causal,
        "per-batch padding": torch.stack([causal & (j >= 5), causal & (j >= 20)]).unsqueeze(1).expand(2, 3, Q, K),
    }
    mask, size = masks[layout], (16, 32)
    verdict = masklens.scan(mask)
    assert verdict.structure.kind != "arbitrary"
    ours = masklens._block_mask.structure_tiles_as_stored(verdict.structure, size, mask)
    scanned = masklens.inspect(mask, tiles=size).tiles
    assert ours.shape == scanned.shape
    assert np.array_equal(ours.states, scanned.states)
    assert (ours.batch, ours.heads) == (scanned.batch, scanned.heads)


def numpy_tile_states(attend, bq, bk):
    """The numpy reference: [B, H, Q, K] bool padded with masked elements to whole tiles,
    attending elements summed per tile; 0 empty, 2 full (every element of a whole tile),
    1 partial."""
    B, H, Q, K = attend.shape
    nq, nk = -(-Q // bq), -(-K // bk)
    padded = np.zeros((B, H, nq * bq, nk * bk), dtype=np.int64)
    padded[:, :, :Q, :K] = attend
    counts = padded.reshape(B, H, nq, bq, nk, bk).sum(axis=(3, 5))
    return np.where(counts == 0, 0, np.where(counts == bq * bk, 2, 1)).astype(np.uint8)


@pytest.mark.parametrize("seed", range(12))
def test_random_block_structured_masks_with_ragged_tiles_equal_a_numpy_reference(seed):
    """Blocks of random size that do not line up with the tiles, each empty, full or
    half dense; ragged last tiles in both lengths; numpy masks of bool, uint8 and additive
    float32, and a stride-0 (broadcast) head dimension."""
    rng = np.random.default_rng(seed)
    B, H = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    Q, K = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    bq, bk = int(rng.integers(1, 70)), int(rng.integers(1, 70))
    gq, gk = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    heads_stored = 1 if seed % 3 == 0 else H
    modes = rng.integers(0, 3, size=(B, heads_stored, -(-Q // gq), -(-K // gk)))
    grid = modes.repeat(gq, axis=2).repeat(gk, axis=3)[:, :, :Q, :K]
    attend = (grid == 1) | ((grid == 2) & (rng.random((B, heads_stored, Q, K)) < 0.5))
    if heads_stored != H:
        attend = np.broadcast_to(attend, (B, H, Q, K))  # stride 0 over the heads
    kind = ("bool", "uint8", "float32")[seed % 3]
    mask = {"bool": attend, "uint8": attend.astype(np.uint8),
            "float32": np.where(attend, 0.0, -np.inf).astype(np.float32)}[kind]
    if heads_stored != H and kind != "bool":
        mask = np.broadcast_to(mask[:, :1], (B, H, Q, K))
    tiles = masklens.inspect(mask, tiles=(bq, bk)).tiles
    want = numpy_tile_states(np.asarray(attend), bq, bk)
    got = tiles.states
    assert tiles.shape[2:] == want.shape[2:]
    # A stride-0 head dimension is summarised once: broadcast it to compare.
    assert np.array_equal(np.broadcast_to(got, want.shape), want), (kind, B, H, Q, K, bq, bk)
    assert tiles.shape[1] == (1 if heads_stored != H else H)


def test_cute_names_hand_the_same_tensors_to_flash_attn():
    """BlockMaskTensors.cute(side): flash-attn's CuTe names (BlockSparseTensorsTorch) over
    the same arrays, the kv side for its forward and the q side for its backward."""
    mask = block_sparse(1, 2, 200, 130, 32, 16, 0.4, 1)
    t = masklens.inspect(mask, tiles=(32, 16)).tiles.block_mask()
    names = ["mask_block_cnt", "mask_block_idx", "full_block_cnt", "full_block_idx"]
    for side, fields in (("kv", FIELDS[:4]), ("q", FIELDS[4:])):
        cute = t.cute(side)
        assert list(cute) == names
        for name, field in zip(names, fields):
            assert np.array_equal(cute[name], getattr(t, field)), (side, name)
    assert list(t.cute()) == names and np.array_equal(t.cute()["mask_block_idx"], t.kv_indices)
    with pytest.raises(masklens.MaskError, match="side must be 'kv'"):
        t.cute("k")


def test_broadcast_dims_are_stored_once():
    L = 96
    i, j = rows_cols(L, L)
    g = torch.Generator().manual_seed(5)
    base = torch.rand(1, 3, L, L, generator=g) < 0.3
    mask = base.expand(4, 3, L, L)  # stride-0 batch
    ours = masklens.torch.block_mask(mask, 32)
    assert ours.kv_num_blocks.shape == (1, 3, 3)
    assert_same_block_mask(ours, torch_block_mask(mask, 32, 32))


def test_bad_tile_sizes_and_structures_are_refused():
    m = structured()["causal"]
    for bad in ((16,), "16", 2.5, True, (16, None)):
        with pytest.raises(masklens.MaskError, match="^invalid_argument: tiles must be a tile size N or"):
            masklens.inspect(m, tiles=bad)
    for bad in (0, (16, 0), (-1, 16)):
        with pytest.raises(masklens.MaskError, match="^invalid_argument: tile size must be two integers >= 1"):
            masklens.torch.block_mask(m, bad)
    s = masklens.scan(torch.rand(8, 8) < 0.5).structure
    with pytest.raises(masklens.MaskError, match="^invalid_argument: tiles_from_structure needs an exact structure"):
        _core.tiles_from_structure(s)
    exact = masklens.scan(m).structure
    exact.tile_fractions = _core.TileFractions()
    with pytest.raises(masklens.MaskError, match="tile_fractions are derived from an exact structure"):
        _core.tiles_from_structure(exact)
    exact.tile_fractions = None
    # 100 x 100 causal at 16: 7 diagonal tiles and the 6 others of the ragged last q tile are partial
    assert _core.tiles_from_structure(exact, 16, 16).counts == {"empty": 21, "partial": 13, "full": 15}


def test_inspect_tiles_of_a_float_mask_use_the_threshold():
    i, j = rows_cols(64, 64)
    add = torch.zeros(64, 64).masked_fill(~(j <= i), -1e9)
    r = masklens.inspect(add, tiles=16)
    assert r.structure.kind == "causal" and r.tiles.counts == {"empty": 6, "partial": 4, "full": 6}
    assert r.to_dict()["tiles"]["kv_num_blocks"] == [[[1, 1, 1, 1]]]


def flex_only(monkeypatch):
    """Decide as on an H100 with only FlexAttention, and run flex eagerly on the CPU."""
    real = _env.environment
    monkeypatch.setattr(_env, "environment",
                        lambda *a, **kw: real(*a, **{**kw, "sm": 90, "available": {"flex"}}))
    monkeypatch.setattr(_flex, "_compiled_flex", fa.flex_attention)
    built = []
    real_from_tiles = _block_mask.from_tiles

    def from_tiles(*a, **kw):
        built.append(real_from_tiles(*a, **kw))
        return built[-1]
    monkeypatch.setattr(_block_mask, "from_tiles", from_tiles)
    created = []
    real_create = fa.create_block_mask
    monkeypatch.setattr(fa, "create_block_mask", lambda *a, **kw: created.append(a) or real_create(*a, **kw))
    return built, created


DROPIN = {**{k: structured()[k] for k in ("causal", "sliding window 23", "packed documents", "left padding per batch",
                                          "query padding (q_valid)", "chunked 24")},
          "block sparse": block_sparse(2, 1, 100, 100, 16, 16, 0.4, 7)}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", list(DROPIN))
def test_drop_in_flex_runs_on_masklens_block_mask(name, monkeypatch):
    mask = DROPIN[name]
    built, created = flex_only(monkeypatch)
    B = as4(mask).shape[0] if as4(mask).shape[0] > 1 else 2  # a mask of batch 1 broadcast over 2
    q, k, v = qkv(B, 2, mask.shape[-2], mask.shape[-1], dtype=torch.float32, grad=False)  # no CPU backward
    masklens.forget()
    policy, _ = masklens.torch.inspect(q, k, v, mask)
    assert policy.backend == "torch.flex_attention"
    out = masklens.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(out, reference(q, k, v, mask), 1e-5)
    assert len(built) == 1 and created == []  # masklens' tiles, not create_block_mask
    # Memoised with the verdict: the second call builds nothing.
    masklens.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert len(built) == 1
    bm = built[0]
    assert_same_block_mask(bm, torch_block_mask(as4(mask).expand(B, 1, *mask.shape[-2:]), *bm.BLOCK_SIZE))
