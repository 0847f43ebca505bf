"""Masks read from their definition (masklens._definition) against transformers' own.

transformers' create_*_mask functions compose the mask function and hand it, with the
lengths, offsets and the 2-D padding mask, to the registered mask function. A probe
registered as a mask function records those arguments; the test then reads them back
with masklens._definition.recognise() and compares, element for element, the structure
it proves (rendered row by row by the C++ rule) and its row intervals with the
[B, 1, Q, K] tensor transformers' sdpa_mask builds from the same arguments, and the
verdict with a scan of that tensor. Compositions it does not read back (a model's own
lambda, padding with holes) must say so, never guess.
"""
import itertools
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mu = pytest.importorskip("transformers.masking_utils")
transformers = pytest.importorskip("transformers")

import masklens  # noqa: E402
from masklens import _definition, _table_runs  # noqa: E402

_seen = []
# The cache's keyword in the create_*_mask functions: "cache" since transformers renamed
# past_key_values (which 5.17 still takes).
import inspect  # noqa: E402
CACHE = "cache" if "cache" in inspect.signature(mu.create_causal_mask).parameters else "past_key_values"
# Tests that compose remap_positions_for_packed_sequence, which older transformers lack.
needs_remap = pytest.mark.skipif(not hasattr(mu, "remap_positions_for_packed_sequence"),
                                 reason="this transformers has no remap_positions_for_packed_sequence")


def _probe(*args, **kwargs):
    _seen.append(kwargs)
    return None


mu.AttentionMaskInterface.register("masklens_probe", _probe)
transformers.AttentionInterface.register("masklens_probe", lambda *a, **k: None)


def _config(window, chunk, is_causal=True):
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=1, sliding_window=window,
                                   attention_chunk_size=chunk)
    cfg._attn_implementation = "masklens_probe"
    cfg.is_causal = is_causal
    return cfg


def _padding(rng, B, L):
    """A 2-D attention mask [B, L] (long, as tokenizers give it): left, right, holed, full
    or one row with nothing valid."""
    am = torch.ones((B, L), dtype=torch.long)
    kind = rng.choice(["left", "right", "holed", "full", "mixed"])
    for b in range(B):
        k = kind if kind != "mixed" else rng.choice(["left", "right", "full", "none"])
        n = rng.randrange(0, L)
        if k == "left":
            am[b, :n] = 0
        elif k == "right":
            am[b, L - n:] = 0
        elif k == "holed" and L > 2:
            s = rng.randrange(1, L - 1)
            am[b, s:s + rng.randrange(1, L - s)] = 0
        elif k == "none":
            am[b] = 0
    return am, kind


def _positions(rng, B, L):
    """Packed position_ids [B, L]: documents of random lengths, each counting from 0 (or
    from a random start: a continuation)."""
    rows = []
    for _ in range(B):
        pos = []
        while len(pos) < L:
            n = rng.randrange(1, max(2, L // 2))
            start = 0 if rng.random() < 0.8 else rng.randrange(0, 5)
            pos.extend(range(start, start + n))
        rows.append(pos[:L])
    return torch.tensor(rows)


def _blocks(rng, B, L):
    """block_sequence_ids [B, L]: -1 (text) with runs of image tokens numbered per batch."""
    ids = torch.full((B, L), -1, dtype=torch.long)
    for b in range(B):
        at, n = 0, 0
        while at < L:
            at += rng.randrange(0, 8)
            length = rng.randrange(1, 10)
            if at < L and rng.random() < 0.6:
                ids[b, at:at + length] = n
                n += 1
            at += length
    return ids


def _cache(cfg, B, past):
    cache = transformers.DynamicCache(config=cfg)
    if past:
        for layer in range(cfg.num_hidden_layers):
            cache.update(torch.zeros(B, 1, past, 2), torch.zeros(B, 1, past, 2), layer)
    return cache


def _case(rng):
    """One composition as a create_*_mask function makes it: the arguments transformers
    hands the mask function."""
    B = rng.randrange(1, 5)
    L = rng.randrange(1, 97)
    window, chunk = rng.randrange(1, 40), rng.randrange(1, 40)
    maker = rng.choice(["causal", "causal", "sliding", "chunked", "bidirectional", "bidirectional_sliding",
                        "blocks", "or_blocks", "lambda"])
    if maker == "bidirectional_sliding" and not hasattr(mu, "create_bidirectional_sliding_window_mask"):
        maker = "sliding"
    cfg = _config(window, chunk)
    emb = torch.zeros((B, L, 8))
    packed = rng.random() < 0.3 and maker in ("causal", "sliding", "chunked", "blocks")
    past = 0 if packed or maker.startswith("bidirectional") or rng.random() < 0.7 else rng.randrange(1, 40)
    attention_mask = None
    if not packed and rng.random() < 0.7:
        attention_mask, _ = _padding(rng, B, L + past)
    kwargs = dict(config=cfg, inputs_embeds=emb, attention_mask=attention_mask)
    if maker in ("causal", "sliding", "chunked", "blocks", "or_blocks", "lambda"):
        kwargs[CACHE] = _cache(cfg, B, past) if past else None
        if packed:
            kwargs["position_ids"] = _positions(rng, B, L)
    _seen.clear()
    if maker == "causal":
        mu.create_causal_mask(**kwargs)
    elif maker == "sliding":
        mu.create_sliding_window_causal_mask(**kwargs)
    elif maker == "chunked":
        mu.create_chunked_causal_mask(**kwargs)
    elif maker == "blocks":
        mu.create_causal_mask(**kwargs, block_sequence_ids=_blocks(rng, B, L + past))
    elif maker == "or_blocks":  # Gemma3's sliding layers: blockwise_overlay as or_mask_function
        mu.create_sliding_window_causal_mask(**kwargs, or_mask_function=mu.blockwise_overlay(_blocks(rng, B, L + past)))
    elif maker == "lambda":  # a model's own function: never read back
        mu.create_causal_mask(**kwargs, or_mask_function=lambda b, h, q, k: q == k)
    elif maker == "bidirectional":
        mu.create_bidirectional_mask(config=cfg, inputs_embeds=emb, attention_mask=attention_mask)
    else:
        mu.create_bidirectional_sliding_window_mask(config=cfg, inputs_embeds=emb, attention_mask=attention_mask)
    return maker, (_seen[-1] if _seen else None)


def _dense(kw):
    kw = {k: v for k, v in kw.items() if k not in ("config", "dtype")}
    kw.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return mu.sdpa_mask(**kw).expand(kw["batch_size"], 1, kw["q_length"], kw["kv_length"])


def _per_batch(value, B):
    return None if value is None else [tuple(v) for v in (value if len(value) == B else value * B)]


def _same_verdict(a, b):
    """Two structures equal batch by batch (one entry for every batch = that entry B times)."""
    B = a.batch
    fields = ("batch", "heads", "q_len", "k_len", "kind", "alignment", "window", "chunk", "prefix", "empty_rows")
    return (all(getattr(a, f) == getattr(b, f) for f in fields) and a.blocks == b.blocks
            and all(_per_batch(getattr(a, m), B) == _per_batch(getattr(b, m), B)
                    for m in ("segments", "kv_valid", "q_valid")))


def _holed(kw):
    am = kw.get("attention_mask")
    if am is None:
        return False
    am = am.bool()
    for row in am:
        idx = row.nonzero().flatten()
        if idx.numel() and idx[-1] - idx[0] + 1 != idx.numel():
            return True
    return False


def test_recognised_compositions_equal_transformers_masks():
    rng = random.Random(20261206)
    counts = {"recognised": 0, "unrecognised": 0, "skipped": 0}
    reasons = {}
    for i in range(10_000):
        maker, kw = _case(rng)
        if kw is None:  # transformers made no mask (an early exit)
            counts["skipped"] += 1
            continue
        dense = _dense(kw)
        try:
            d = _definition.recognise(**kw)
        except _definition.Unrecognised as e:
            counts["unrecognised"] += 1
            reasons.setdefault(maker, set()).add(str(e).split(":")[0])
            # Only what cannot be one interval per row, or a function of the model's own.
            assert maker == "lambda" or _holed(kw) or "two separate" in str(e), (i, maker, str(e))
            continue
        assert maker != "lambda", i
        counts["recognised"] += 1
        B, Q, K = kw["batch_size"], kw["q_length"], kw["kv_length"]
        begin, end = _definition.row_intervals(d.tree, B, Q, K, int(kw.get("q_offset", 0)),
                                               int(kw.get("kv_offset", 0)))
        keys = np.arange(K)
        rows = (keys >= begin[..., None]) & (keys < end[..., None])
        assert np.array_equal(rows, dense[:, 0].numpy()), (i, maker)
        s = d.verdict.structure
        scanned = masklens._core.scan(dense.numpy()).structure
        assert _same_verdict(s, scanned), (i, maker, s.describe(), scanned.describe())
        if s.kind != "arbitrary":
            for b in range(B):
                for q in range(Q):
                    r = s.row(b, q)
                    want = dense[b, 0, q].nonzero().flatten()
                    got = (r[0], r[1]) if r else None
                    assert got == ((int(want[0]), int(want[-1]) + 1) if want.numel() else None), (i, b, q)
    assert counts["recognised"] >= 6_000, counts
    assert counts["unrecognised"] >= 500, (counts, reasons)


def _post_order(tree):
    name, _, children = tree
    return [n for child in children for n in _post_order(child)] + [name]


def test_the_mask_functions_one_walk_reads_what_the_tree_reads(monkeypatch):
    """recognise's one walk (parse with a _Walk) gathers the tables _tables() finds, the same
    tensors in the same order, and every node for pin() children first, each under pin()'s
    own key (once pinned, a walk finds it pinned); the mask function's recognise_arguments()
    gives what recognise() gives, or the same reason."""
    monkeypatch.setattr(_definition, "_pinned", set())
    rng = random.Random(41)
    walked = 0
    for i in range(300):
        maker, kw = _case(rng)
        if kw is None:
            continue
        _definition._pinned.clear()  # this test's own set: every node asks again
        try:
            walk = _definition._Walk()
            tree = _definition.parse(kw["mask_function"], None, walk)
        except _definition.Unrecognised:
            continue
        walked += 1
        want = _definition._tables(tree)
        assert list(walk.tables) == list(want), (i, maker)
        assert all(walk.tables[k] is want[k] for k in want), (i, maker)
        assert [n[0] for n in walk.unpinned] == _post_order(tree), (i, maker)
        try:
            a = _definition.recognise(**kw)
        except _definition.Unrecognised as e:
            with pytest.raises(_definition.Unrecognised) as got:
                _definition.recognise_arguments(kw, torch.device("cpu"))
            assert str(got.value) == str(e), i
            continue
        # recognise() pinned every node by pin()'s key: a walk now finds none to pin, so the
        # walk's own keys (written out per primitive) are pin()'s.
        again = _definition._Walk()
        _definition.parse(kw["mask_function"], None, again)
        assert again.unpinned == [], (i, maker, [n[0] for n in again.unpinned])
        b = _definition.recognise_arguments(kw, "cpu")
        assert _same_verdict(a.verdict.structure, b.verdict.structure), (i, maker)
        assert np.array_equal(a.pieces.pieces, b.pieces.pieces), (i, maker)
    assert walked >= 150, walked


def test_arguments_that_make_no_mask_are_named():
    """A device that is none, or an argument sdpa_mask always has missing: Unrecognised
    naming it (the caller builds the mask with sdpa_mask, which says what is wrong)."""
    with pytest.raises(_definition.Unrecognised, match="could not be read.*bogus"):
        _definition.recognise(batch_size=1, q_length=4, kv_length=4, device="bogus")
    with pytest.raises(_definition.Unrecognised, match="sdpa_mask called without batch_size"):
        _definition.recognise_arguments(dict(q_length=4, kv_length=4), torch.device("cpu"))
    with pytest.raises(_definition.Unrecognised, match="does not read: cache_position"):
        _definition.recognise_arguments(dict(batch_size=1, cache_position=torch.arange(4), kv_length=4), "cpu")


def test_a_models_own_function_is_named():
    cfg = _config(4, 4)
    _seen.clear()
    mu.create_causal_mask(config=cfg, inputs_embeds=torch.zeros(1, 5, 8), attention_mask=None, **{CACHE: None},
                          or_mask_function=lambda b, h, q, k: q == k)
    with pytest.raises(_definition.Unrecognised, match="lambda.*not a recognised mask primitive"):
        _definition.recognise(**_seen[-1])


def test_a_primitive_laid_out_otherwise_is_named_not_read(monkeypatch):
    """A closure whose code is a primitive's but that holds none of the variable the
    primitive's reading takes (a transformers that renamed one) is not read: Unrecognised
    names the function and the variable, in parse and through recognise."""
    def make():
        other = (mu.causal_mask_function,)

        def inner(batch_idx, head_idx, q_idx, kv_idx):
            return other
        return inner
    fn = make()
    _definition._primitives()
    for name, var in (("and", "mask_functions"), ("sliding", "sliding_window"), ("padding", "padding_mask")):
        monkeypatch.setitem(_definition._primitive_codes, id(fn.__code__), name)
        with pytest.raises(_definition.Unrecognised, match=f"inner holds no '{var}'"):
            _definition.parse(fn)
        with pytest.raises(_definition.Unrecognised, match=f"holds no '{var}'"):
            _definition.recognise(batch_size=1, q_length=4, kv_length=4, mask_function=fn)


def test_holed_padding_is_not_guessed():
    am = torch.tensor([[1, 1, 0, 1, 1]])
    with pytest.raises(_definition.Unrecognised, match="holes"):
        _definition.recognise(batch_size=1, q_length=5, kv_length=5, attention_mask=am.bool())


@pytest.mark.parametrize("case,reason", [
    ("negative positions", "negative position_ids"),
    ("documents not the packed mask's", "documents are not the packed_sequence_mask's"),
    ("a document in two runs", "two separate runs"),
    ("block ids in two runs", "two separate runs"),
    ("two ranges of an or", "or_masks: a row attends two separate key ranges"),
    ("positions indexed outside", "of length 8 is indexed outside it"),
    ("too few batch rows", "packed_sequence_mask has 1 batch rows"),
    ("an empty table", "packed_sequence_mask is empty"),
])
def test_what_only_the_values_say_is_read_with_the_runs_and_named(case, reason):
    """The checks on the metadata's values are read back in the runs' one copy: each
    still raises, naming what it found; nothing is indexed outside a table meanwhile."""
    if not all(hasattr(mu, name) for name in ("remap_positions_for_packed_sequence", "blockwise_overlay")):
        pytest.skip("this transformers lacks a primitive the case composes")
    L, batch, q_length = 8, 1, 8
    causal = mu.causal_mask_function
    if case == "negative positions":
        pos = torch.tensor([[0, 1, 2, 3, -4, 5, 6, 7]])
        psm = torch.tensor([[0, 0, 0, 0, 1, 2, 2, 2]])  # the documents the positions start
        fn = mu.and_masks(mu.packed_sequence_mask_function(psm),
                          mu.remap_positions_for_packed_sequence(causal, pos))
    elif case == "documents not the packed mask's":
        pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
        psm = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
        fn = mu.and_masks(mu.packed_sequence_mask_function(psm),
                          mu.remap_positions_for_packed_sequence(causal, pos))
    elif case == "a document in two runs":
        fn = mu.and_masks(causal, mu.packed_sequence_mask_function(torch.tensor([[0, 0, 1, 1, 0, 0, 2, 2]])))
    elif case == "block ids in two runs":
        fn = mu.or_masks(causal, mu.blockwise_overlay(torch.tensor([[-1, 3, 3, -1, 3, 3, -1, -1]])))
    elif case == "two ranges of an or":
        # keys [q - 1, q] or, shifted by 4, [q - 5, q - 4]: two ranges
        window = mu.sliding_window_causal_mask_function(2)
        fn = mu.or_masks(window, mu.add_offsets_to_mask_function(window, 0, 4))
    elif case == "positions indexed outside":
        # 10 queries over 8 positions: queries 8 and 9 index past position_ids
        pos, psm = torch.arange(L).view(1, -1), torch.zeros((1, L), dtype=torch.long)
        fn = mu.and_masks(mu.packed_sequence_mask_function(psm),
                          mu.remap_positions_for_packed_sequence(causal, pos))
        q_length = 10
    elif case == "too few batch rows":
        fn = mu.and_masks(causal, mu.packed_sequence_mask_function(torch.zeros((1, L), dtype=torch.long)))
        batch = 2
    else:
        fn = mu.and_masks(causal, mu.packed_sequence_mask_function(torch.zeros((1, 0), dtype=torch.long)))
    with pytest.raises(_definition.Unrecognised, match=reason):
        _definition.recognise(batch_size=batch, q_length=q_length, kv_length=L, mask_function=fn)


def test_an_or_of_three_is_read_in_every_order():
    """An OR joins all its children at once, a nested OR's too: windows of keys [q - 1, q],
    [q - 5, q - 4] and [q - 3, q - 2] make one range together although the first two alone
    are apart, so every order and nesting is read, and equals sdpa_mask's tensor; without
    the bridge it is refused."""
    window = mu.sliding_window_causal_mask_function(2)
    parts = [window, mu.add_offsets_to_mask_function(window, 0, 4), mu.add_offsets_to_mask_function(window, 0, 2)]
    flat = [mu.or_masks(*order) for order in itertools.permutations(parts)]
    nested = [mu.or_masks(mu.or_masks(a, b), c) for a, b, c in itertools.permutations(parts)]
    for fn in flat + nested:
        kw = dict(batch_size=1, q_length=12, kv_length=12, mask_function=fn)
        d = _definition.recognise(**kw)
        dense = mu.sdpa_mask(**kw, allow_is_causal_skip=False)
        assert _same_verdict(d.verdict.structure, masklens._core.scan(dense.numpy()).structure)
        assert d.verdict.structure.kind == "sliding_window" and d.verdict.structure.window == 6  # keys [q - 5, q]
    with pytest.raises(_definition.Unrecognised, match="two separate key ranges"):
        _definition.recognise(batch_size=1, q_length=12, kv_length=12, mask_function=mu.or_masks(*parts[:2]))


def test_a_float_table_is_not_read():
    """Document ids or positions in a float tensor would be rounded into one another: the
    definition is not read, the mask is built."""
    psm = torch.tensor([[0.2, 0.2, 0.7, 0.7]])
    fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(psm))
    with pytest.raises(_definition.Unrecognised, match="packed_sequence_mask is a torch.float32 tensor"):
        _definition.recognise(batch_size=1, q_length=4, kv_length=4, mask_function=fn)


@needs_remap
@pytest.mark.parametrize("read", ["torch", "c++"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_positions_that_wrap_around_their_type_are_read_right_or_not_at_all(monkeypatch, read, dtype):
    """position_ids past the type's largest value wrap to its smallest: transformers' own
    documents (a diff in the table's type) join across the wrap, but the remapped mask
    compares the positions as values, so the rows are not one document's. Every read
    takes the values in int64 and names the document it cannot say; none gives a verdict
    that is not the built mask's."""
    if read == "torch":
        monkeypatch.setattr(_table_runs, "_host_read", lambda tables, room: None)
    top = torch.iinfo(dtype).max
    pos = torch.tensor([[top - 2, top - 1, top, -top - 1, 0, 1, 2, 3]]).to(dtype)
    psm = mu.find_packed_sequence_indices(pos)
    assert psm.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    fn = mu.and_masks(mu.remap_positions_for_packed_sequence(mu.causal_mask_function, pos),
                      mu.packed_sequence_mask_function(psm))
    kw = dict(batch_size=1, q_length=8, kv_length=8, mask_function=fn)
    dense = mu.sdpa_mask(**kw, allow_is_causal_skip=False).expand(1, 1, 8, 8)
    try:
        d = _definition.recognise(**kw)
    except _definition.Unrecognised as e:
        assert "position" in str(e)
        return
    begin, end = (torch.from_numpy(r) for r in d.pieces.rows())
    keys = torch.arange(8)
    assert torch.equal((keys >= begin[..., None]) & (keys < end[..., None]), dense[:, 0])


@pytest.mark.parametrize("read", ["torch", "in place"])
def test_a_definition_is_read_back_in_one_copy(monkeypatch, read):
    """Once its primitives are pinned, a packed and padded definition crosses to the host
    once (the runs, their flags and the checks together): no other copy, item or truth
    value of a tensor is taken on the way (each is a synchronisation on a GPU). That is
    torch's way (a GPU without masklens._cuda); CPU tables are read where they lie by the
    C++ read, with no copy and no tensor operation at all."""
    from masklens import _table_runs
    if read == "torch":
        monkeypatch.setattr(_table_runs, "_host_read", lambda tables, room: None)
    L = 24
    psm = torch.tensor([[0] * 7 + [1] * 9 + [2] * 8] * 2)
    fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(psm))
    attention_mask = torch.ones((2, L), dtype=torch.bool)
    attention_mask[1, :3] = False
    kw = dict(batch_size=2, q_length=L, kv_length=L, mask_function=fn, attention_mask=attention_mask)
    _definition.recognise(**kw)  # pins the primitives (grids on the host, once per process)
    reads = []
    for name in ("cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__index__", "__float__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    d = _definition.recognise(**kw)
    monkeypatch.undo()
    # torch's: the payload's copy, viewed as NumPy; in place: nothing (C++ reads the memory).
    assert reads == (["cpu", "numpy"] if read == "torch" else []), reads
    dense = mu.sdpa_mask(**kw, allow_is_causal_skip=False)
    assert d.verdict.structure.describe() == masklens._core.scan(dense.numpy()).structure.describe()


@pytest.mark.parametrize("read", ["torch", "c++"])
def test_more_table_changes_than_the_first_copy_holds_are_read_exactly(monkeypatch, read):
    """Past _TABLE_ROOM changes a table is read again exactly on torch's way (one copy
    more), and at once by the C++ read of a CPU table: its runs are the table's, and the
    verdict is the scan's of the built mask."""
    if read == "torch":
        monkeypatch.setattr(_table_runs, "_host_read", lambda tables, room: None)
    L = 2 * _definition._TABLE_ROOM + 6
    ids = torch.arange(L).view(1, -1) * 2 // 3  # documents of 2 and 1 tokens
    (runs,) = _table_runs.read_runs([(ids, False)], room=_definition._TABLE_ROOM)
    if read == "c++":
        runs = runs.runs()
    starts = np.flatnonzero(np.diff(ids[0].numpy(), prepend=-1) != 0)
    assert len(starts) > _definition._TABLE_ROOM
    assert np.array_equal(runs.start, starts) and np.array_equal(runs.value, ids[0].numpy()[starts])
    fn = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids))
    d = _definition.recognise(batch_size=1, q_length=L, kv_length=L, mask_function=fn)
    dense = mu.sdpa_mask(batch_size=1, q_length=L, kv_length=L, mask_function=fn, allow_is_causal_skip=False)
    assert d.verdict.structure.describe() == masklens._core.scan(dense.numpy()).structure.describe()


def test_every_batch_one_table_when_the_same():
    d = _definition.recognise(batch_size=3, q_length=6, kv_length=6,
                              mask_function=mu.sliding_window_causal_mask_function(2))
    assert d.verdict.structure.describe() == "sliding_window top_left window 2"
    assert d.verdict.structure.batch == 3


def test_a_primitive_that_changed_is_turned_off(monkeypatch):
    """A transformers whose sliding_window_overlay meant `kv > q - W - 1` (a window one
    longer than the rule here): pinning finds it, warns, and the mask is built instead."""
    real = mu.sliding_window_overlay

    def shifted(sliding_window):
        def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
            return kv_idx > q_idx - sliding_window - 1
        return inner_mask
    monkeypatch.setattr(_definition, "_primitive_codes", None)
    monkeypatch.setattr(_definition, "_pinned", set())
    monkeypatch.setattr(_definition, "_disabled", set())
    monkeypatch.setattr(mu, "sliding_window_overlay", shifted)
    try:
        fn = mu.and_masks(shifted(3), mu.causal_mask_function)
        with pytest.warns(RuntimeWarning, match="'sliding'.*differ"):
            with pytest.raises(_definition.Unrecognised):
                _definition.recognise(batch_size=1, q_length=8, kv_length=8, mask_function=fn)
        with pytest.raises(_definition.Unrecognised, match="off for this process"):
            _definition.recognise(batch_size=1, q_length=8, kv_length=8, mask_function=fn)
    finally:
        monkeypatch.setattr(mu, "sliding_window_overlay", real)
        _definition._primitive_codes = None


@needs_remap
def test_compositions_transformers_never_makes_are_read_right_or_not_at_all():
    """Offsets around a remap inside the documents' AND, a long attention mask with a 2 in
    it (sdpa_mask ANDs it as it is), negative offsets, an argument sdpa_mask may grow: each
    equals sdpa_mask's tensor or is not read."""
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    psm = mu.find_packed_sequence_indices(pos)
    cases = [
        dict(batch_size=1, q_length=7, kv_length=7, mask_function=mu.and_masks(mu.add_offsets_to_mask_function(
            mu.remap_positions_for_packed_sequence(mu.causal_mask_function, pos), 1, 1),
            mu.packed_sequence_mask_function(psm))),
        dict(batch_size=1, q_length=5, kv_length=5, attention_mask=torch.tensor([[1, 1, 2, 2, 1]])),
        dict(batch_size=1, q_length=4, kv_length=4, q_offset=-1),
    ]
    for kw in cases:
        try:
            d = _definition.recognise(**kw)
        except _definition.Unrecognised:
            continue
        dense = mu.sdpa_mask(**kw, allow_is_causal_skip=False).expand(kw["batch_size"], 1, kw["q_length"],
                                                                      kw["kv_length"])
        assert _same_verdict(d.verdict.structure, masklens._core.scan(dense.numpy()).structure), kw
    with pytest.raises(_definition.Unrecognised, match="does not read: window_shape"):
        _definition.recognise(batch_size=1, q_length=4, kv_length=4, window_shape=(2, 2))


def test_a_pending_read_resolves_once_and_keeps_its_failure():
    """A Definition whose read is pending (recognise(defer=True)) reads it at the first use
    of its verdict, once; a read that fails stays failed (Unrecognised at every use, never a
    verdict of None); an interrupt leaves the read to be made again."""
    import transformers.masking_utils as mu
    am = torch.ones((2, 6), dtype=torch.bool)
    am[0, :2] = False
    d = _definition.recognise(batch_size=2, q_length=6, kv_length=6, attention_mask=am,
                              mask_function=mu.causal_mask_function, defer=True)
    assert d.pending
    v = d.verdict
    assert not d.pending and d.verdict is v and d.failure() is None and d.entry.verdict is v
    assert v.structure.kv_valid is not None

    calls = []

    def read(outcome):
        def go():
            calls.append(outcome)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return go
    failing = _definition.Definition(1, 4, 4, None, read(ValueError("bad table")))
    for _ in range(2):
        with pytest.raises(_definition.Unrecognised, match="bad table"):
            failing.verdict
    assert isinstance(failing.failure(), _definition.Unrecognised) and len(calls) == 1

    answers = iter([KeyboardInterrupt(), (v, d.pieces)])
    interrupted = _definition.Definition(2, 6, 6, None, lambda: read(next(answers))())
    with pytest.raises(KeyboardInterrupt):
        interrupted.verdict
    assert interrupted.pending
    assert interrupted.verdict is v and not interrupted.pending
