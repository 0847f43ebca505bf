"""Tiny transformers models for the package's training and compiled-model tests: a pair of
models of one config and weights ("sdpa" and masklens), left-padded batches, forward +
backward, gradient comparison, Dynamo's break sites. (conftest.py's gpu_environment
decides as on an H100.)"""
import copy

import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


def pair(cfg, impl="masklens"):
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sdpa").float()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl).float()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def left_padded(pads, L=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 97, (len(pads), L), generator=g)
    attention = torch.ones(len(pads), L, dtype=torch.long)
    for b, n in enumerate(pads):
        attention[b, :n] = 0
    return ids, attention


def max_grad_difference(ref, ours):
    worst = 0.0
    for p, q in zip(ref.parameters(), ours.parameters()):
        if p.grad is not None:
            worst = max(worst, (p.grad - q.grad).abs().max().item() / (p.grad.abs().max().item() + 1e-6))
    return worst


def forward_backward(model, ids, attention):
    logits = model(input_ids=ids, attention_mask=attention).logits
    keep = attention.bool()
    logits[keep].logsumexp(-1).sum().backward()
    return logits.detach()


def proofs() -> int:
    """Masks proven so far: scanned, or read from their definition (masklens.transformers)."""
    import masklens
    import masklens.transformers
    return masklens.scan_count() + masklens.transformers.definition_count()


def break_sites():
    """The graph breaks Dynamo recorded, by reason (one reason per site)."""
    return {reason.split("\n")[0]: n for reason, n in counters["graph_break"].items()}


def assert_matches_reference(ref, ours, ids, attention, logits, grads=True):
    """ref's logits on the batch (forward and backward where grads) equal `logits`, ours'
    (already run), on the real tokens; so do the gradients. Both models' zeroed after."""
    a = forward_backward(ref, ids, attention) if grads else ref(input_ids=ids, attention_mask=attention).logits
    keep = attention.bool()
    assert (a - logits).abs()[keep].max().item() < 1e-4
    if grads:
        assert max_grad_difference(ref, ours) < 1e-3
        ref.zero_grad()
        ours.zero_grad()
