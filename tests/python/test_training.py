"""attn_implementation="masklens" where models are trained: torch.compile(model) (one
graph-break site per mask kind and forward, none in the attention layers, no recompile
for new padding, equal to sdpa forward and backward; the FlexAttention and varlen forms
traced into the graph), gradient checkpointing (recomputed forwards hit the verdict
cache), hybrid models (one verdict per mask kind and forward), and transformers' Trainer
(dynamic padding, padding-free packing, a sliding window) against "sdpa". Tiny models
from configs, random weights, CPU, fp32."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import masklens
import masklens.torch as mt

transformers = pytest.importorskip("transformers")
import masklens.transformers  # noqa: E402,F401  (registers "masklens")
from torch._dynamo.utils import counters  # noqa: E402
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig  # noqa: E402

from models import SMALL, break_sites, forward_backward, left_padded, max_grad_difference, pair, proofs  # noqa: E402

# --- torch.compile(model) ---------------------------------------------------------------

def test_compiled_model_breaks_only_at_the_mask_function_and_equals_sdpa():
    torch._dynamo.reset()
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled_ref = torch.compile(ref, backend="aot_eager")
    compiled = torch.compile(ours, backend="aot_eager")
    for step, pads in enumerate([(0, 4, 9), (2, 0, 7), (5, 1, 0)]):  # new padding each step, one shape
        ids, attention = left_padded(pads, seed=step)
        counters.clear()
        before = proofs()
        b = forward_backward(compiled, ids, attention)
        assert proofs() - before == 1, "one scan per forward, outside the graph"
        sites = break_sites()
        if step == 0:
            # One site: the mask function's call outside the graph. Dynamo records it once
            # for each frame it had inlined (model, decoder, create_causal_mask, ...).
            assert len(sites) == 1 and "disable" in next(iter(sites)), sites
        else:
            assert not sites and not counters["stats"]["unique_graphs"], "a new padding compiled again"
        a = forward_backward(compiled_ref, ids, attention)
        keep = attention.bool()
        assert (a - b).abs()[keep].max().item() < 1e-4
        assert max_grad_difference(ref, ours) < 1e-3
        eager_ref = copy.deepcopy(ref)
        eager_ref.zero_grad()
        c = forward_backward(eager_ref, ids, attention)
        assert (c - b).abs()[keep].max().item() < 1e-4
        ref.zero_grad()
        ours.zero_grad()


def test_compiled_attention_layers_are_one_graph():
    torch._dynamo.reset()
    _, ours = pair(LlamaConfig(**SMALL))
    ids, attention = left_padded((0, 4, 9))
    explained = torch._dynamo.explain(ours)(input_ids=ids, attention_mask=attention)
    with_attention = [g for g in explained.graphs
                      if any("scaled_dot_product_attention" in str(n.target) for n in g.graph.nodes)]
    assert len(with_attention) == 1
    calls = sum("scaled_dot_product_attention" in str(n.target) for n in with_attention[0].graph.nodes)
    assert calls == SMALL["num_hidden_layers"]
    assert all("disable" in str(r.reason) for r in explained.break_reasons)


def captured_forms(monkeypatch):
    """The list each form the mask function prepares for the compiled layers (outside the
    graph: from the definition, or prepare_compiled's of a built mask) is appended to."""
    forms = []
    inner = masklens.transformers._mask_outside_graph

    @torch.compiler.disable
    def capture(*a, **k):
        forms.append(inner(*a, **k))
        return forms[-1]
    monkeypatch.setattr(masklens.transformers, "_mask_outside_graph", capture)
    return forms


def test_compiled_flex_form_is_traced_and_equals_sdpa(gpu_environment, monkeypatch):
    gpu_environment({"flex"})
    forms = captured_forms(monkeypatch)
    torch._dynamo.reset()
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled = torch.compile(ours, backend="aot_eager")
    with torch.no_grad():  # torch 2.11's FlexAttention has no backward on the CPU
        for step, pads in enumerate([(0, 4, 9), (3, 0, 11)]):
            ids, attention = left_padded(pads, seed=step)
            counters.clear()
            a = ref(input_ids=ids, attention_mask=attention).logits
            b = compiled(input_ids=ids, attention_mask=attention).logits
            assert isinstance(forms[-1], mt.CompiledMask) and forms[-1].kind == "flex"
            keep = attention.bool()
            assert (a - b).abs()[keep].max().item() < 1e-4
            if step:
                assert not break_sites(), "new padding (new BlockMask contents) compiled again"


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, window_size=(-1, -1)):
    """torch's varlen_attn (CUDA only) in torch ops: each packed row attends the rows of its
    own sequence within the window (causal for window_size[1] == 0)."""
    rows = torch.arange(q.shape[0])
    seq = torch.searchsorted(cu_q[1:].to(torch.int64), rows, right=True)
    allowed = seq[:, None] == seq[None, :]
    left, right = window_size
    if right >= 0:
        allowed &= rows[None, :] <= rows[:, None] + right
    if left >= 0:
        allowed &= rows[None, :] >= rows[:, None] - left
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=allowed, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out[0].transpose(0, 1)


def test_attend_compiled_refuses_a_call_its_form_was_not_made_for(gpu_environment, monkeypatch):
    """The varlen form's sequences lie over the mask's own rows: a query of another batch,
    or a varlen_attn without the window_size a causal form needs, gets None (the layer then
    runs sdpa with the dense mask) rather than rows of another sequence or no causality."""
    gpu_environment({"torch"})
    monkeypatch.setattr(mt._run, "varlen_params", lambda: (reference_varlen, frozenset({"scale", "window_size"})))
    Q = 32
    i, j = torch.arange(Q)[:, None], torch.arange(Q)[None]
    document = (torch.arange(Q) >= 12).long()
    mask = ((j <= i) & (document[:, None] == document[None]))[None, None]
    cm = mt.prepare_compiled(mask, heads=2, kv_heads=2, head_dim=16, dtype=torch.bfloat16, training=False)
    assert isinstance(cm, mt.CompiledMask) and cm.kind == "varlen"
    q, k, v = (torch.randn(1, 2, Q, 16) for _ in range(3))
    out = mt.attend_compiled(cm, q, k, v)
    assert out is not None
    assert (out - F.scaled_dot_product_attention(q, k, v, attn_mask=mask)).abs().max().item() < 1e-5
    assert mt.attend_compiled(cm, *(torch.randn(2, 2, Q, 16) for _ in range(3))) is None
    monkeypatch.setattr(mt._run, "varlen_params", lambda: (reference_varlen, frozenset({"scale"})))
    assert mt.attend_compiled(cm, q, k, v) is None


def test_compiled_varlen_form_packs_in_place_and_equals_sdpa(gpu_environment, monkeypatch):
    """Padding-free packing (position_ids): the compiled layers run varlen_attn on the rows
    as they lie (cumulative lengths a tensor, the maximum length the sequence's: new
    boundaries reuse the graph); a stand-in computes varlen_attn's result on the CPU."""
    gpu_environment({"torch"})
    # Decided as for a bf16 model (varlen_attn takes no fp32), run in fp32 by the stand-in.
    monkeypatch.setattr(masklens.transformers, "_call_dtype", lambda dtype, device: torch.bfloat16)
    monkeypatch.setattr(mt._run, "varlen_params", lambda: (reference_varlen, frozenset({"scale", "window_size"})))
    forms = captured_forms(monkeypatch)
    torch._dynamo.reset()
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled = torch.compile(ours, backend="aot_eager")
    L = 24
    for step, lengths in enumerate([(5, 11, 8), (9, 4, 6, 5)]):
        ids = torch.randint(3, 97, (1, L), generator=torch.Generator().manual_seed(step))
        position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
        counters.clear()
        a = ref(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        b = compiled(input_ids=ids, position_ids=position_ids, use_cache=False).logits
        form = forms[-1]
        assert isinstance(form, mt.CompiledMask) and form.kind == "varlen"
        assert form.cu_seqlens.tolist() == np.cumsum((0,) + lengths).tolist() and form.rows is None
        assert (a - b).abs().max().item() < 1e-4
        a.logsumexp(-1).sum().backward()
        b.logsumexp(-1).sum().backward()
        assert max_grad_difference(ref, ours) < 1e-3
        ref.zero_grad()
        ours.zero_grad()
        if step:
            assert not break_sites(), "new document boundaries compiled again"


def test_varlen_form_fills_the_gaps_and_zeroes_them():
    # Two batches of 8 rows: sequences [1, 5) and [5, 8) in batch 0, [3, 8) in batch 1.
    tiled = masklens._compiled._sequences_tile([(0, 1, 5, 1, 5), (0, 5, 8, 5, 8), (1, 3, 8, 3, 8)], 2, 8)
    assert tiled == ([0, 1, 5, 8, 11, 16], True)
    assert masklens._compiled._sequences_tile([(0, 0, 8, 0, 8), (1, 0, 8, 0, 8)], 2, 8) == ([0, 8, 16], False)
    assert masklens._compiled._sequences_tile([(0, 2, 8, 0, 8)], 1, 8) is None  # query and key ranges differ


# --- gradient checkpointing ------------------------------------------------------------

@pytest.mark.parametrize("how", ["reentrant", "non-reentrant", "non-reentrant offloaded"])
def test_checkpointed_recompute_does_not_scan_again(how):
    ref, ours = pair(LlamaConfig(**SMALL))
    for model in (ref, ours):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": how == "reentrant"})
        model.train()
    ids, attention = left_padded((0, 4, 9))
    a = forward_backward(ref, ids, attention)
    before = proofs()
    if how.endswith("offloaded"):
        with torch.autograd.graph.save_on_cpu():
            b = forward_backward(ours, ids, attention)
    else:
        b = forward_backward(ours, ids, attention)
    assert proofs() - before == 1, "the recomputed forward scanned the mask again"
    keep = attention.bool()
    assert (a - b).abs()[keep].max().item() < 1e-4
    assert max_grad_difference(ref, ours) < 1e-3


# --- hybrid models -----------------------------------------------------------------------

def hybrid_configs():
    layers = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    linear = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                  head_dim=16, layer_types=layers)
    configs = {
        # sliding and full layers: two mask kinds
        "gemma3": (Gemma3TextConfig(**SMALL, head_dim=16, sliding_window=6,
                                    layer_types=["sliding_attention", "sliding_attention", "full_attention"]), 2),
        "mistral": (MistralConfig(**SMALL, sliding_window=5), 1),
    }
    # linear-attention layers take the 2-D padding mask: one kind (the full layers')
    if hasattr(transformers, "Qwen3NextConfig"):
        configs["qwen3-next"] = (transformers.Qwen3NextConfig(
            **{**SMALL, "num_hidden_layers": 4}, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, **linear), 1)
    if hasattr(transformers, "Qwen3_5TextConfig"):
        configs["qwen3.5"] = (transformers.Qwen3_5TextConfig(**{**SMALL, "num_hidden_layers": 4}, **linear), 1)
    return configs


@pytest.mark.parametrize("name", list(hybrid_configs()))
def test_hybrid_model_scans_once_per_mask_kind_and_forward(name):
    cfg, kinds = hybrid_configs()[name]
    ref, ours = pair(cfg)
    for seed, pads in enumerate([(0, 4, 9), (6, 0, 2)]):
        ids, attention = left_padded(pads, seed=seed)
        a = forward_backward(ref, ids, attention)
        before = proofs()
        b = forward_backward(ours, ids, attention)
        assert proofs() - before == kinds
        keep = attention.bool()
        assert (a - b).abs()[keep].max().item() < 1e-4
        assert max_grad_difference(ref, ours) < 1e-3
        ref.zero_grad()
        ours.zero_grad()


def test_attention_sinks_are_refused_as_sdpa_refuses_them():
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip("no GPT-OSS in this transformers")
    cfg = transformers.GptOssConfig(**{**SMALL, "num_hidden_layers": 2}, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=4,
                                    layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="masklens").float()
    ids, attention = left_padded((0, 4, 9))
    with pytest.raises(ValueError, match="sinks"):
        model(input_ids=ids, attention_mask=attention)


# --- transformers' Trainer ---------------------------------------------------------------

def lengths(n, seed, low=6, high=40):
    """Token counts as SFT data has them: log-normal, most short, a long tail."""
    g = np.random.default_rng(seed)
    return np.clip(np.round(g.lognormal(np.log(16), 0.6, n)), low, high).astype(int).tolist()


def sft_examples(n=80, seed=0):
    g = np.random.default_rng(seed + 1)
    return [{"input_ids": g.integers(3, 97, m).tolist(), "labels": g.integers(3, 97, m).tolist()}
            for m in lengths(n, seed)]


def pad_to_longest(features):
    """Dynamic padding (right, as a tokenizer pads for training): each batch to its longest."""
    L = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), L, dtype=torch.long)
    labels = torch.full((len(features), L), -100)
    attention = torch.zeros(len(features), L, dtype=torch.long)
    for b, f in enumerate(features):
        n = len(f["input_ids"])
        ids[b, :n] = torch.tensor(f["input_ids"])
        labels[b, :n] = torch.tensor(f["labels"])
        attention[b, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attention}


def train(cfg, impl, collator, tmp_path, steps=20, compile_backend=None):
    """(losses, grad norms, scans) of `steps` Trainer steps; compile_backend: with
    torch_compile on that Dynamo backend."""
    from transformers import Trainer, TrainingArguments
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl).float()
    compiled = dict(torch_compile=True, torch_compile_backend=compile_backend) if compile_backend else {}
    args = TrainingArguments(output_dir=str(tmp_path / impl), per_device_train_batch_size=4, max_steps=steps,
                             logging_steps=1, learning_rate=1e-3, seed=0, report_to=[], save_strategy="no",
                             use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False,
                             **compiled)
    trainer = Trainer(model=model, args=args, train_dataset=sft_examples(), data_collator=collator)
    before = proofs()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return [h["loss"] for h in logs], [h["grad_norm"] for h in logs], proofs() - before


def flattening():
    from transformers import DataCollatorWithFlattening
    return DataCollatorWithFlattening(return_position_ids=True)


@pytest.mark.parametrize("case", ["dynamic padding", "padding-free packing", "sliding window"])
def test_trainer_matches_sdpa(case, tmp_path):
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    cfg = MistralConfig(**SMALL, sliding_window=8) if case == "sliding window" else LlamaConfig(**SMALL)
    collator = flattening() if case == "padding-free packing" else pad_to_longest
    ref_loss, ref_norm, _ = train(cfg, "sdpa", collator, tmp_path)
    loss, norm, scans = train(cfg, "masklens", collator, tmp_path)
    assert len(loss) == 20 and scans >= 20, "masklens did not see the masks: the comparison would prove nothing"
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-4)
    np.testing.assert_allclose(norm, ref_norm, rtol=1e-3)


# --- on a GPU: CUDA graphs, decode, compiled forms with Inductor, the first forward ------

def window_mask(L, W, device, dtype=torch.bool):
    i = torch.arange(L, device=device)
    allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W)
    return allowed[None, None] if dtype == torch.bool else torch.where(allowed, 0.0, -torch.inf).to(dtype)[None, None]


@pytest.mark.gpu
def test_cuda_graph_replays_a_call_decided_before_capture():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = window_mask(512, 64, "cuda")
    eager = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scanned and decided here
    unseen = window_mask(512, 32, "cuda")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    before = proofs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # warm the unseen mask's passthrough as torch's own call would be
        F.scaled_dot_product_attention(q, k, v, attn_mask=unseen)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out_unseen = mt.scaled_dot_product_attention(q, k, v, attn_mask=unseen)  # torch's call: no scan
    assert proofs() == before, "a scan ran during capture"
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out_unseen, F.scaled_dot_product_attention(q, k, v, attn_mask=unseen),
                               atol=2e-2, rtol=2e-2)
    assert eager.shape == out.shape


@pytest.mark.gpu
def test_one_token_decode_keeps_sdpa_and_scans_nothing():
    ref, ours = pair(LlamaConfig(**SMALL))
    ref, ours = ref.cuda(), ours.cuda()
    ids, attention = left_padded((0, 4, 9))
    ids, attention = ids.cuda(), attention.cuda()
    out_ref = ref.generate(input_ids=ids, attention_mask=attention, max_new_tokens=8, do_sample=False)
    before = proofs()
    out = ours.generate(input_ids=ids, attention_mask=attention, max_new_tokens=8, do_sample=False)
    assert proofs() - before == 1, "only the prefill's mask is scanned"
    assert torch.equal(out, out_ref)


@pytest.mark.gpu
def test_compiled_model_on_a_gpu_equals_compiled_sdpa():
    torch._dynamo.reset()
    cfg = LlamaConfig(**{**SMALL, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 512,
                         "head_dim": 64, "max_position_embeddings": 4096})
    ref, ours = pair(cfg)
    ref, ours = ref.cuda().bfloat16(), ours.cuda().bfloat16()
    compiled_ref, compiled = torch.compile(ref), torch.compile(ours)
    for step, pads in enumerate([(0, 300, 900, 1500), (100, 0, 1200, 40)]):
        ids, attention = left_padded(pads, L=2048, seed=step)
        ids, attention = ids.cuda(), attention.cuda()
        a = forward_backward(compiled_ref, ids, attention).float()
        b = forward_backward(compiled, ids, attention).float()
        keep = attention.bool()
        assert (a - b).abs()[keep].max().item() < 0.1
        assert max_grad_difference(ref, ours) < 0.1
        ref.zero_grad()
        ours.zero_grad()


@pytest.mark.gpu
def test_first_cuda_forward_loads_the_kernels_in_the_background():
    if not masklens.has_cuda_scan():
        pytest.skip(masklens.cuda_scan_unavailable())
    _, ours = pair(LlamaConfig(**SMALL))
    ours = ours.cuda()
    ids, attention = left_padded((0, 4, 9))
    ours(input_ids=ids.cuda(), attention_mask=attention.cuda())
    loader = masklens.transformers._loaders.get(torch.cuda.current_device())
    assert loader is not None
    loader.join(timeout=30)
    assert not loader.is_alive()
