"""Tiny randomly initialised transformers models (from configs, no downloads):
attn_implementation="masklens" gives the logits, gradients and generated tokens of
"sdpa", and a model whose layers share one mask pays one scan per forward."""
import copy

import pytest
import torch

import masklens

transformers = pytest.importorskip("transformers")
import masklens.transformers  # noqa: E402,F401  (registers "masklens")
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,  # noqa: E402
                          Qwen2Config)

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


def configs():
    return {
        "llama": LlamaConfig(**SMALL),
        "mistral sliding window": MistralConfig(**SMALL, sliding_window=5),
        "gemma3 local/global": Gemma3TextConfig(**SMALL, head_dim=16, sliding_window=6,
                                                layer_types=["sliding_attention", "sliding_attention",
                                                             "full_attention"]),
        "qwen2": Qwen2Config(**SMALL),
    }


def pair(cfg):
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa").float()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="masklens").float()
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == "masklens"
    return ref, ours


def batch(B=3, L=20, pad=(0, 4, 9), seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 97, (B, L), generator=g)
    attention = torch.ones(B, L, dtype=torch.long)
    for b, n in enumerate(pad):
        attention[b, :n] = 0  # left padding
    return ids, attention


def compare(ref, ours, tol=1e-4, expect_mask=True, **inputs):
    ref.train(False)
    ours.train(False)
    a = ref(**inputs).logits
    before = masklens.scan_count()
    masklens.transformers._masks.clear()
    b = ours(**inputs).logits
    if expect_mask:
        read = any(how == "definition" for how, _ in masklens.transformers.masks())
        assert read or masklens.scan_count() > before, \
            "masklens did not see a mask: the comparison would prove nothing"
    valid = inputs.get("attention_mask")
    keep = valid.bool() if valid is not None else torch.ones(a.shape[:2], dtype=torch.bool)
    # Padded query positions: both attend to nothing or to pad keys; only real tokens count.
    err = (a - b).abs()[keep].max().item()
    assert err < tol, f"logits differ by {err}"
    # Gradients through every path (loss on real tokens only).
    ref.zero_grad()
    ours.zero_grad()
    a[keep].logsumexp(-1).sum().backward()
    b[keep].logsumexp(-1).sum().backward()
    worst = 0.0
    for (name, p), (_, p2) in zip(ref.named_parameters(), ours.named_parameters()):
        if p.grad is not None:
            worst = max(worst, (p.grad - p2.grad).abs().max().item() / (p.grad.abs().max().item() + 1e-6))
    assert worst < 1e-3, f"gradients differ (relative {worst})"


@pytest.mark.parametrize("name", list(configs()))
def test_left_padded_batch_logits_and_gradients(name):
    ref, ours = pair(configs()[name])
    ids, attention = batch()
    compare(ref, ours, input_ids=ids, attention_mask=attention)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_unpadded_batch(name):
    ref, ours = pair(configs()[name])
    ids, _ = batch(pad=(0, 0, 0))
    # No padding: transformers passes no mask (is_causal), and masklens leaves the call as it is.
    compare(ref, ours, expect_mask=False, input_ids=ids, attention_mask=torch.ones_like(ids))


def test_packed_batch_through_position_ids():
    ref, ours = pair(configs()["llama"])
    ids, _ = batch(B=1, L=24, pad=(0,))
    position_ids = torch.tensor([list(range(8)) + list(range(10)) + list(range(6))])
    # Without a cache transformers turns the position_ids into a packed-documents mask.
    compare(ref, ours, input_ids=ids, position_ids=position_ids, use_cache=False)


def test_one_scan_per_forward(monkeypatch):
    """The layers of a forward share one mask: one scan where it is built (a definition
    is read once, and not scanned at all: test_zero_byte.py)."""
    monkeypatch.setattr(masklens.transformers, "from_definition", False)
    ref, ours = pair(LlamaConfig(**{**SMALL, "num_hidden_layers": 6}))
    ids, attention = batch()
    ours.train(False)
    with torch.no_grad():
        ours(input_ids=ids, attention_mask=attention)  # warm: decisions made
        before = masklens.scan_count()
        ours(input_ids=ids, attention_mask=attention)
        assert masklens.scan_count() - before == 1  # six layers, one mask tensor
    with torch.inference_mode():
        before = masklens.scan_count()
        ours(input_ids=ids, attention_mask=attention)
        assert masklens.scan_count() - before == 1


@pytest.mark.parametrize("name", ["llama", "mistral sliding window", "gemma3 local/global"])
def test_left_padded_generation_of_8_tokens(name):
    ref, ours = pair(configs()[name])
    ids, attention = batch(L=12, pad=(0, 3, 6))
    kwargs = dict(input_ids=ids, attention_mask=attention, max_new_tokens=8, do_sample=False, pad_token_id=0)
    a = ref.generate(**kwargs)
    b = ours.generate(**kwargs)
    assert a.shape[1] == 12 + 8
    assert torch.equal(a, b)
