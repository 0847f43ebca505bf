"""The model and batches that zero_byte.py and mask_cost.py train, in one place so that
their figures stay comparable: a Llama-like model (4 layers, hidden 1024, 8 heads of 128,
a 1024-token vocabulary so that the logits do not dominate, gradient checkpointing) and,
at batch 1 on L tokens, a packed batch (4 documents through position_ids) and a
left-padded one (the first 1/16 of the tokens). On the CPU `small=True` gives a model
that trains in milliseconds (hidden 256, 2 layers of 2 heads) for smoke runs."""
import copy

import torch
import transformers

BATCHES = ("packed", "padded")


def config(L, small=False):
    size = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=2) if small \
        else dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8)
    return transformers.LlamaConfig(**size, num_key_value_heads=size["num_attention_heads"], head_dim=128,
                                    vocab_size=1024, max_position_embeddings=L)


def make(cfg, impl, device, dtype, state=None):
    """The model with attn_implementation `impl`, seeded (or loaded from `state`), training."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
    if state is not None:
        model.load_state_dict(state)
    model = model.to(device, dtype)
    model.gradient_checkpointing_enable()
    model.train()
    return model


def batch(kind, L, device, docs=4):
    """The model's keyword arguments for one batch of `kind` ("packed" or "padded")."""
    g = torch.Generator().manual_seed(L)
    ids = torch.randint(0, 1024, (1, L), generator=g)
    if kind == "packed":
        n = L // docs
        pos = torch.cat([torch.arange(n)] * docs + [torch.arange(L - n * docs)]).view(1, L)
        # As DataCollatorWithFlattening: no label predicts a document's first token from the last one's.
        labels = ids.masked_fill(pos == 0, -100)
        return dict(input_ids=ids.to(device), position_ids=pos.to(device), labels=labels.to(device), use_cache=False)
    if kind != "padded":
        raise ValueError(f"batch kind must be one of {BATCHES}, got {kind!r}")
    am = torch.ones((1, L), dtype=torch.long)
    am[:, :L // 16] = 0
    labels = ids.masked_fill(am == 0, -100)
    return dict(input_ids=ids.to(device), attention_mask=am.to(device), labels=labels.to(device))
