"""The structure's rule is written once (mask_rule.hpp): the mask_mod masklens.torch
compiles from it and the mask_mod the masklens command prints both give, element for
element, the rows the structure's interval form gives (MaskStructure.row, a separate
implementation), over random structures of every kind, alignment and modifier."""
import random

import pytest
import torch

from masklens import _core, _mask_mods

flex = pytest.importorskip("torch.nn.attention.flex_attention")

KINDS = ["full", "causal", "sliding_window", "chunked", "prefix_lm", "causal_blocks"]


def random_ranges(rng, B, n, per_batch):
    def one():
        start = rng.randint(0, n - 1)
        return (start, rng.randint(start + 1, n))
    return [one() for _ in range(B if per_batch else 1)]


def random_structure(rng):
    s = _core.MaskStructure()
    s.kind = rng.choice(KINDS)
    square = rng.random() < 0.5
    s.batch = rng.randint(1, 3)
    s.q_len = rng.randint(1, 24)
    s.k_len = s.q_len if square else rng.randint(1, 24)
    s.alignment = rng.choice(["top_left", "bottom_right"])
    if s.kind == "sliding_window":
        s.window = rng.randint(1, s.k_len + 2)
    if s.kind == "chunked":
        s.chunk = rng.randint(1, s.k_len + 2)
    if s.kind == "prefix_lm":
        s.prefix = rng.randint(1, s.k_len)
    if s.kind == "causal_blocks":
        edges = sorted(rng.sample(range(s.k_len + 1), min(s.k_len + 1, 2 * rng.randint(1, 3))))
        s.blocks = [(a, b) for a, b in zip(edges[::2], edges[1::2]) if b - a >= 2] or [(0, min(2, s.k_len))]
    if square and rng.random() < 0.4:
        def documents():
            inner = sorted(rng.sample(range(1, s.q_len), rng.randint(0, min(3, s.q_len - 1)))) if s.q_len > 1 else []
            return [0, *inner, s.q_len]
        s.segments = [documents() for _ in range(s.batch if rng.random() < 0.5 else 1)]
    if rng.random() < 0.4:
        s.kv_valid = random_ranges(rng, s.batch, s.k_len, rng.random() < 0.5)
    if rng.random() < 0.3:
        s.q_valid = random_ranges(rng, s.batch, s.q_len, rng.random() < 0.5)
    return s


def expected(s):
    """[B, 1, Q, K] from the structure's interval form (row), not from the rule."""
    out = torch.zeros(s.batch, 1, s.q_len, s.k_len, dtype=torch.bool)
    for b in range(s.batch):
        for q in range(s.q_len):
            r = s.row(b, q)
            if r is not None:
                out[b, 0, q, r[0]:r[1]] = True
    return out


def printed_mask_mod(s):
    """Run the masklens command's text: it builds its tables on q.device, then mask_mod."""
    source, names = _core.mask_mod_source(s, printed=True)
    assert names == []
    scope = {"torch": torch, "q": torch.empty(0)}
    exec(compile(source, "<printed>", "exec"), scope)
    return scope["mask_mod"]


def padded_grid(mod, s, b):
    """The mask_mod over whole 16-element tiles past Q and K, as create_block_mask evaluates
    it (lookups must clamp there), cut back to [Q, K]."""
    q = torch.arange(-(-s.q_len // 16) * 16 + 16)[:, None]
    k = torch.arange(-(-s.k_len // 16) * 16 + 16)[None, :]
    return mod(torch.tensor(b), torch.tensor(0), q, k).expand(q.shape[0], k.shape[1])[:s.q_len, :s.k_len]


def test_both_spellings_of_the_rule_give_the_structure_rows():
    rng = random.Random(20261206)
    for trial in range(300):
        s = random_structure(rng)
        want = expected(s)
        for name, mod in (("compiled", _mask_mods.mask_mod_for(s, "cpu")), ("printed", printed_mask_mod(s))):
            got = flex.create_mask(mod, s.batch, 1, s.q_len, s.k_len, device="cpu")
            why = (trial, name, repr(s), _core.mask_mod_source(s, printed=name == "printed")[0])
            assert torch.equal(got, want), why
            for b in range(s.batch):
                assert torch.equal(padded_grid(mod, s, b), want[b, 0]), why


def test_one_rule_shares_one_code_object_and_names_what_it_reads():
    """Two structures of one rule (other lengths, offsets and padding) give mask_mods of one
    code object, so a compiled flex does not trace a new function for each mask; the window is
    written in the source, so another window is another rule."""
    def padded_window(Q, K, window, kv):
        s = _core.MaskStructure()
        s.kind, s.alignment, s.q_len, s.k_len, s.window, s.batch = "sliding_window", "bottom_right", Q, K, window, 2
        s.kv_valid = kv
        return s
    a, b = padded_window(8, 12, 4, [(1, 12), (0, 9)]), padded_window(5, 30, 4, [(0, 30), (3, 20)])
    (src_a, names_a), (src_b, names_b) = _mask_mods.rule_source(a), _mask_mods.rule_source(b)
    assert src_a == src_b and names_a == names_b == ("offset", "kv_start", "kv_end")
    assert _mask_mods.mask_mod_for(a, "cpu").__code__ is _mask_mods.mask_mod_for(b, "cpu").__code__
    assert _mask_mods.rule_source(padded_window(8, 12, 5, [(1, 12), (0, 9)]))[0] != src_a
    prefixes = []
    for prefix in (2, 7):  # a prefix changes with each prompt: a tensor, not a new source
        s = _core.MaskStructure()
        s.kind, s.q_len, s.k_len, s.prefix = "prefix_lm", 9, 9, prefix
        prefixes.append(_mask_mods.rule_source(s))
    assert prefixes[0] == prefixes[1] and "prefix" in prefixes[0][1]
    assert _mask_mods.rule_reads_tables(a)
    plain = _core.MaskStructure()
    plain.kind, plain.alignment, plain.q_len, plain.k_len = "causal", "bottom_right", 4, 9
    assert _mask_mods.rule_source(plain)[1] == ("offset",) and not _mask_mods.rule_reads_tables(plain)


def test_an_invalid_structure_is_refused_by_name():
    s = _core.MaskStructure()
    s.kind, s.q_len, s.k_len, s.window = "sliding_window", 4, 4, 0
    with pytest.raises(Exception, match="window"):
        _core.mask_mod_source(s)
