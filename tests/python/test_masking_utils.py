"""Masks made by transformers' own masking_utils get the right structure, and the
drop-in equals F.scaled_dot_product_attention with the dense mask, forward and backward."""
import pytest
import torch
import torch.nn.functional as F

import masklens
from helpers import assert_close, grads, qkv, reference
from masklens.torch import scaled_dot_product_attention

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.masking_utils import (create_bidirectional_mask, create_causal_mask,  # noqa: E402
                                        create_chunked_causal_mask, create_sliding_window_causal_mask,
                                        causal_mask_function, sdpa_mask)

B, L, HIDDEN = 2, 24, 32


def config(**extra):
    cfg = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                      intermediate_size=64, vocab_size=64, **extra)
    cfg._attn_implementation = "sdpa"
    return cfg


def embeds(q_len=L):
    return torch.zeros(B, q_len, HIDDEN)


def left_pad(n, total=L):
    pad = torch.ones(B, total, dtype=torch.long)
    pad[1, :n] = 0
    return pad


def masks():
    """(name, mask, expected structure fields)."""
    out = []
    out.append(("causal with padding", create_causal_mask(config(), embeds(), left_pad(5), None),
                {"kind": "causal", "kv_valid": [(0, L), (5, L)], "empty_rows": 5}))
    cfg = config(sliding_window=6)
    out.append(("sliding window", create_sliding_window_causal_mask(cfg, embeds(), None, None),
                {"kind": "sliding_window", "window": 6, "kv_valid": None}))
    out.append(("sliding window with padding", create_sliding_window_causal_mask(cfg, embeds(), left_pad(3), None),
                {"kind": "sliding_window", "window": 6, "kv_valid": [(0, L), (3, L)]}))
    cfg = config(attention_chunk_size=8)
    out.append(("chunked", create_chunked_causal_mask(cfg, embeds(), None, None), {"kind": "chunked", "chunk": 8}))
    pos = torch.tensor([list(range(7)) + list(range(10)) + list(range(7))] * B)
    packed = create_causal_mask(config(), embeds(), None, None, position_ids=pos)
    out.append(("packed via position_ids", packed, {"segments_rows": [0, 7, 17, L]}))
    out.append(("bidirectional padding", create_bidirectional_mask(config(), embeds(), left_pad(4)),
                {"kind": "full", "kv_valid": [(0, L), (4, L)]}))
    enc_pad = torch.ones(B, 9, dtype=torch.long)
    enc_pad[0, 6:] = 0
    cross = create_bidirectional_mask(config(), embeds(), enc_pad, encoder_hidden_states=torch.zeros(B, 9, HIDDEN))
    out.append(("cross-attention", cross, {"kind": "full", "kv_valid": [(0, 6), (0, 9)]}))
    # Decode with a cache: one new token after L cached ones, row 1 left-padded by 5.
    pad = left_pad(5, L + 1)
    decode = sdpa_mask(batch_size=B, q_length=1, kv_length=L + 1, q_offset=L, mask_function=causal_mask_function,
                       attention_mask=pad.bool(), allow_is_causal_skip=False)
    out.append(("decode with cache", decode, {"kind": "full",  # one row of bottom-right causal: every key
                                                "kv_valid": [(0, L + 1), (5, L + 1)]}))
    # A chunk of 4 new tokens after L cached ones (prefill with a cache): bottom-right causal.
    chunk = sdpa_mask(batch_size=B, q_length=4, kv_length=L + 4, q_offset=L, mask_function=causal_mask_function,
                      allow_is_causal_skip=False)
    out.append(("prefill with cache", chunk, {"kind": "causal", "alignment": "bottom_right"}))
    # Gemma3-style token_type_ids: image tokens 4..9 and 14..17 see each other both ways.
    types = torch.zeros(B, L, dtype=torch.long)
    types[:, 4:10] = 1
    types[:, 14:18] = 1
    ids = torch.full((B, L), -1)
    ids[:, 4:10] = 0
    ids[:, 14:18] = 1
    gemma = create_causal_mask(config(), embeds(), left_pad(2), None, block_sequence_ids=ids)
    out.append(("gemma3 token_type_ids", gemma, {"kind": "causal_blocks", "blocks": [(4, 10), (14, 18)],
                                                 "kv_valid": [(0, L), (2, L)]}))
    return out


CASES = masks()


@pytest.mark.parametrize("name,mask,want", CASES, ids=[c[0] for c in CASES])
def test_structure(name, mask, want):
    assert mask is not None and mask.dtype == torch.bool
    s = masklens.scan(mask).structure
    for field, value in want.items():
        if field == "segments_rows":
            # Packed documents: whatever the shortest description, row 10 (second document)
            # attends keys 7..10 and row 20 keys 17..20.
            assert s.kind != "arbitrary" and s.row(0, 10) == (7, 11) and s.row(1, 20) == (17, 21), s.describe()
        else:
            assert getattr(s, field) == value, f"{field}: {s.describe()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,mask,want", CASES, ids=[c[0] for c in CASES])
def test_drop_in_equals_dense_sdpa(name, mask, want, dtype):
    Bm, _, Q, K = mask.shape
    q, k, v = qkv(B, 4, Q, K, Hk=2, dtype=dtype)
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    # torch's math kernel gives 0 on rows that attend to nothing; the reference says so too.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert_close(out, torch.nan_to_num(ref), tol)
    assert_close(out, reference(q, k, v, mask), tol)
    g_out, g_ref = grads(out, (q, k, v)), grads(torch.nan_to_num(ref), (q, k, v))
    for a, b in zip(g_out, g_ref):
        assert_close(a, b, tol * 4)
