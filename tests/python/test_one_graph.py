"""torch.compile(model) with masklens.torch.set_one_graph(True): the mask proven and the
layers' form decided by an op of the graph, the forms chosen by torch.cond. No graph
break (fullgraph=True), one graph for every padding, forward and backward equal to
sdpa's, one scan per forward and mask kind, the FlexAttention branch added once; and a
one-token decode step under torch.compile, in either mode, breaks nothing and scans
nothing. Tiny models from configs, random weights, CPU, fp32."""
import unittest.mock

import numpy as np
import pytest
import torch

import masklens

transformers = pytest.importorskip("transformers")
import masklens._one_graph as one_graph  # noqa: E402
import masklens.transformers  # noqa: E402,F401  (registers "masklens")
from torch._dynamo.utils import counters  # noqa: E402
from transformers import DynamicCache, Gemma3TextConfig, LlamaConfig, MistralConfig  # noqa: E402

from models import (SMALL, assert_matches_reference, break_sites, forward_backward, left_padded,  # noqa: E402
                    max_grad_difference, pair)


def taken_since(before):
    return {form: n - before.get(form, 0) for form, n in one_graph.forms_taken.items() if n - before.get(form, 0)}


def proofs_since(before):
    """(scans, definitions read) since `before` (a proofs_now())."""
    scans, definitions = proofs_now()
    return scans - before[0], definitions - before[1]


def proofs_now():
    return masklens.scan_count(), masklens.transformers.definition_count()


@pytest.mark.parametrize("backend,reading", [("aot_eager", "definition"), ("inductor", "definition"),
                                             ("aot_eager", "scan")])
def test_fullgraph_model_equals_sdpa_without_a_break(one_graph_mode, monkeypatch, backend, reading):
    """fullgraph=True compiles (it refuses the default path's break); plain causal and
    padded batches take the causal and dense branches of one graph, new padding compiles
    nothing, forward and backward equal sdpa's (eager). The mask is read once a forward:
    from its definition (transformers' composition, read by the op: no scan), or, with
    from_definition off, by one scan of sdpa_mask's tensor in the op."""
    monkeypatch.setattr(masklens.transformers, "from_definition", reading == "definition")
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled = torch.compile(ours, backend=backend, fullgraph=True)
    steps = [((0, 0, 0), "causal"), ((0, 4, 9), "dense"), ((2, 0, 7), "dense"), ((0, 0, 0), "causal")]
    for step, (pads, form) in enumerate(steps):
        ids, attention = left_padded(pads, seed=step)
        counters.clear()
        before, taken = proofs_now(), dict(one_graph.forms_taken)
        b = forward_backward(compiled, ids, attention)
        assert proofs_since(before) == ((0, 1) if reading == "definition" else (1, 0)), "one reading a forward"
        assert taken_since(taken) == {form: 1}
        assert not break_sites()
        if step:
            assert not counters["stats"]["unique_graphs"], "a new padding compiled again"
        assert_matches_reference(ref, ours, ids, attention, b)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_flex_branch_is_added_once_and_equals_sdpa(one_graph_mode, gpu_environment, backend):
    """Decided as on an H100 with FlexAttention only: the first forward's graph has no flex
    branch, so the op answers dense (right) and adds it; the next forward compiles once
    more, and from then on the layers run FlexAttention on the op's BlockMask and row
    bounds, new padding and all, without compiling. Forward only: torch 2.11 has no
    FlexAttention backward on the CPU."""
    gpu_environment({"flex"})
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled = torch.compile(ours, backend=backend, fullgraph=True)
    L = 150  # two BlockMask blocks of 128, the second ragged
    with torch.no_grad():
        for step, pads in enumerate([(0, 4, 9), (2, 0, 7), (0, 0, 0), (5, 1, 130)]):
            ids, attention = left_padded(pads, L=L, seed=step)
            counters.clear()
            taken = dict(one_graph.forms_taken)
            b = compiled(input_ids=ids, attention_mask=attention).logits
            assert taken_since(taken) == {"dense" if step == 0 else "flex": 1}
            assert bool(one_graph.graph_forms >> one_graph.FLEX & 1)
            assert not break_sites()
            compiled_now = bool(counters["stats"]["unique_graphs"])
            assert compiled_now == (step <= 1), "compiled at first, then once for the branch"
            assert_matches_reference(ref, ours, ids, attention, b, grads=False)


def test_dynamic_true_compiles_with_symbolic_floats(one_graph_mode):
    """torch.compile(dynamic=True) makes the layers' `scaling` a symbolic float, which
    torch.cond's branches may not close over: the default scale is taken as the constant
    it equals. Padded and unpadded batches of new lengths, forward and backward."""
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled = torch.compile(ours, backend="aot_eager", dynamic=True, fullgraph=True)
    for step, (pads, L) in enumerate([((0, 4, 9), 20), ((0, 0, 0), 26), ((3, 0, 1), 17)]):
        ids, attention = left_padded(pads, L=L, seed=step)
        counters.clear()
        b = forward_backward(compiled, ids, attention)
        assert not break_sites()
        assert_matches_reference(ref, ours, ids, attention, b)


def test_dynamic_true_with_flex_and_a_scale_of_its_own(one_graph_mode, gpu_environment):
    """Gemma3 (scale 1/sqrt(query_pre_attn_scalar), not 1/sqrt(head_dim)) under
    dynamic=True, decided as on an H100 without grad: the sliding layers take the flex
    branch once it is there, closing over the scale as a constant."""
    gpu_environment({"flex"})
    cfg = Gemma3TextConfig(**SMALL, head_dim=16, sliding_window=6, query_pre_attn_scalar=256,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    ref, ours = pair(cfg)
    compiled = torch.compile(ours, backend="aot_eager", dynamic=True, fullgraph=True)
    with torch.no_grad():
        for step, (pads, L) in enumerate([((0, 4, 9), 20), ((2, 0, 7), 26), ((0, 0, 3), 23)]):
            ids, attention = left_padded(pads, L=L, seed=step)
            b = compiled(input_ids=ids, attention_mask=attention).logits
            assert_matches_reference(ref, ours, ids, attention, b, grads=False)
    assert one_graph.forms_taken["flex"] > 0


def test_prefill_over_a_cache_decides_and_gets_the_flex_branch(one_graph_mode, gpu_environment):
    """Chunks of 6 queries over a cache (Q != K: no is_causal branch): the op runs though a
    graph without the FlexAttention branch reads no answer of it (it is not dead code: its
    answer is the branch's request), so the next chunk compiles once more and runs flex;
    the chunks' logits equal sdpa's. Decided as on an H100, without grad."""
    gpu_environment({"flex"})
    ref, ours = pair(LlamaConfig(**SMALL))
    ids, attention = left_padded((0, 30), L=140)
    caches = [DynamicCache(config=ref.config), DynamicCache(config=ours.config)]
    with torch.no_grad():
        for model, cache in zip((ref, ours), caches):
            model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True)
        compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
        for step in range(3):
            chunk = torch.randint(3, 97, (2, 6), generator=torch.Generator().manual_seed(step))
            attention = torch.cat([attention, torch.ones(2, 6, dtype=attention.dtype)], 1)
            taken, before = dict(one_graph.forms_taken), proofs_now()
            a = ref(input_ids=chunk, attention_mask=attention, past_key_values=caches[0], use_cache=True).logits
            b = compiled(input_ids=chunk, attention_mask=attention, past_key_values=caches[1], use_cache=True).logits
            assert proofs_since(before) == (0, 1), "read from its definition (offsets from the cache)"
            assert taken_since(taken) == {"dense" if step == 0 else "flex": 1}
            assert (a - b).abs().max().item() < 1e-4


def test_hybrid_model_decides_once_per_mask_kind(one_graph_mode):
    """Gemma3's sliding and full layers: two ops a forward (two definitions read), one graph."""
    cfg = Gemma3TextConfig(**SMALL, head_dim=16, sliding_window=6,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    ref, ours = pair(cfg)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    for step, pads in enumerate([(0, 4, 9), (3, 0, 11)]):
        ids, attention = left_padded(pads, seed=step)
        counters.clear()
        before = proofs_now()
        b = forward_backward(compiled, ids, attention)
        assert proofs_since(before) == (0, 2)
        assert not break_sites()
        assert_matches_reference(ref, ours, ids, attention, b)


@pytest.mark.parametrize("available", [None, {"flex"}])
def test_graph_form_op_passes_opcheck(available, gpu_environment):
    """The ops' schemas, fake kernels and autograd registration, as torch checks them: with
    the CPU's decision (dense or causal) and with FlexAttention's (the BlockMask filled)."""
    if available:
        gpu_environment(available)
    i, j = torch.arange(40)[:, None], torch.arange(40)[None]
    forms = one_graph.DEFAULT_FORMS | 1 << one_graph.FLEX
    for mask in ((j <= i)[None, None].expand(2, 1, 40, 40).contiguous(), (j <= i + 3)[None, None]):
        args = (mask, 2, 4, 2, 16, 16, torch.float32, False, forms)
        torch.library.opcheck(torch.ops.masklens.graph_form.default, args)
    q, k, v = (torch.randn(2, 4, 40, 16).transpose(1, 2) for _ in range(3))
    torch.library.opcheck(torch.ops.masklens.graph_operands.default, (q, k, v))


def test_graph_form_gives_the_rows_bounds_and_blocks_of_a_flex_answer(gpu_environment):
    """The op's FlexAttention answer: each row's first and last key (a padded row's none:
    first past last) and a BlockMask whose partial blocks and full blocks are the mask's."""
    gpu_environment({"flex"})
    i, j = torch.arange(200)[:, None], torch.arange(200)[None]
    mask = ((j <= i) & (j >= torch.tensor([0, 70])[:, None, None]))[:, None]  # batch 1 left-padded by 70
    code, bounds, *arrays = torch.ops.masklens.graph_form(mask, 2, 4, 4, 16, 16, torch.bfloat16, False,
                                                          one_graph.DEFAULT_FORMS | 1 << one_graph.FLEX)
    assert code.item() == one_graph.FLEX and code.device.type == "cpu"
    assert bounds[0, 0, 5].tolist() == [0, 5] and bounds[1, 0, 150].tolist() == [70, 150]
    assert bounds[1, 0, 10, 0] > bounds[1, 0, 10, 1], "a padded row attends nothing"
    from torch.nn.attention.flex_attention import create_block_mask
    fields = dict(zip(masklens._block_mask.BLOCK_MASK_FIELDS, arrays))
    want = create_block_mask(lambda b, h, q, kv: mask[b, 0, q, kv], 2, None, 200, 200, device="cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        assert fields[name].tolist() == getattr(want, name).tolist(), name


def test_graph_form_outputs_share_no_storage_when_the_read_writes_one_allocation(gpu_environment, monkeypatch):
    """masklens._cuda's read writes the BlockMask's eight tensors as views of one allocation
    (_block_mask_storage); an op's outputs may share no storage, so the op copies them.
    The read stood in for on the CPU with the real allocator."""
    import numpy as np
    from masklens import _block_mask, _scan
    gpu_environment({"flex"})

    def read_into_one_allocation(mask, with_tiles):
        verdict, tiles = _scan.scan_with_tiles(mask, (one_graph.BLOCK, one_graph.BLOCK), -1e8)
        t = tiles.block_mask()
        db, dh, nq = t.kv_num_blocks.shape
        _, _, views = _block_mask._block_mask_storage(mask.device, db, dh, nq, t.kv_indices.shape[-1])
        arrays = views()
        for name in _block_mask.BLOCK_MASK_FIELDS:
            arrays[name].copy_(torch.from_numpy(np.ascontiguousarray(getattr(t, name))))
        return verdict, lambda: one_graph._host_bounds(mask), arrays
    monkeypatch.setattr(one_graph, "_read", read_into_one_allocation)
    i, j = torch.arange(200)[:, None], torch.arange(200)[None]
    forms = one_graph.DEFAULT_FORMS | 1 << one_graph.FLEX
    for mask in (((j <= i) & (j >= torch.tensor([0, 70])[:, None, None]))[:, None], (j <= i)[None, None]):
        code, *outputs = torch.ops.masklens.graph_form(mask, mask.shape[0], 4, 4, 16, 16, torch.bfloat16, False, forms)
        assert code.item() == one_graph.FLEX
        assert len({t.untyped_storage().data_ptr() for t in outputs}) == len(outputs)


@pytest.mark.parametrize("mode", ["outside the graph", "one graph"])
def test_compiled_decode_step_breaks_nothing_and_scans_nothing(mode, monkeypatch):
    """A one-token step through a compiled model (a cache of an eager prefill): the mask of
    one row is sdpa_mask's, traced; no break (fullgraph=True), no scan, the tokens sdpa's.
    The default path broke the graph there and scanned every step."""
    monkeypatch.setattr(one_graph, "enabled", mode == "one graph")
    torch._dynamo.reset()
    ref, ours = pair(LlamaConfig(**SMALL))
    ids, attention = left_padded((0, 4, 7), L=12)

    def decode(model, compiled):
        cache, tokens, scans = DynamicCache(config=model.config), [], 0
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True).logits
            a = attention
            for _ in range(4):
                token = logits[:, -1:].argmax(-1)
                tokens.append(token)
                a = torch.cat([a, torch.ones(3, 1, dtype=a.dtype)], 1)
                before = masklens.scan_count()
                logits = compiled(input_ids=token, attention_mask=a, past_key_values=cache, use_cache=True).logits
                scans += masklens.scan_count() - before
        return torch.cat(tokens, 1), scans

    want, _ = decode(ref, ref)
    counters.clear()
    got, scans = decode(ours, torch.compile(ours, backend="aot_eager", fullgraph=True))
    assert torch.equal(got, want)
    assert scans == 0 and not break_sites()
    torch._dynamo.reset()


def test_the_docs_example_runs(monkeypatch):
    """docs/python.md's "One graph" example, as written (a source checkout only)."""
    import os
    import re
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "python.md")
    if not os.path.exists(docs):
        pytest.skip("no docs/python.md beside the tests")
    section = open(docs).read().split("#### One graph", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.setattr(one_graph, "enabled", False)  # the example turns it on
    torch._dynamo.reset()
    counters.clear()
    exec(compile(code, "docs/python.md", "exec"), {})
    assert one_graph.enabled and not break_sites()
    torch._dynamo.reset()


@pytest.mark.parametrize("case", ["dynamic padding", "padding-free packing", "sliding window"])
def test_trainer_compiled_in_one_graph_matches_sdpa(one_graph_mode, tmp_path, case):
    """transformers' Trainer with torch_compile, lengths new nearly every step (dynamic
    padding, padding-free packing through position_ids, a Mistral sliding window): 20
    steps with no graph break and at most two graphs (the first shape's, then Dynamo's
    dynamic one: the op's fake kernel takes symbolic sizes), a reading a step, the losses and
    gradient norms of eager sdpa."""
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    from test_training import flattening, pad_to_longest, train
    cfg = MistralConfig(**SMALL, sliding_window=8) if case == "sliding window" else LlamaConfig(**SMALL)
    collator = flattening() if case == "padding-free packing" else pad_to_longest
    ref_loss, ref_norm, _ = train(cfg, "sdpa", collator, tmp_path)
    torch._dynamo.reset()
    counters.clear()
    loss, norm, scans = train(cfg, "masklens", collator, tmp_path, compile_backend="aot_eager")
    assert len(loss) == 20 and scans == 20
    assert not break_sites() and counters["stats"]["unique_graphs"] <= 2
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-4)
    np.testing.assert_allclose(norm, ref_norm, rtol=1e-3)


# --- the drop-in inside torch.compile ---------------------------------------------------

class Layers(torch.nn.Module):
    """Three attention layers calling the drop-in with one mask (a model of one's own)."""

    def __init__(self, heads=4, kv_heads=2, dim=16):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim
        self.proj = torch.nn.ModuleList(torch.nn.Linear(64, (heads + 2 * kv_heads) * dim) for _ in range(3))

    def forward(self, x, mask):
        from masklens.torch import scaled_dot_product_attention
        B, L, _ = x.shape
        for proj in self.proj:
            q, k, v = proj(x).view(B, L, -1, self.dim).transpose(1, 2).split(
                [self.heads, self.kv_heads, self.kv_heads], dim=1)
            out = scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            x = x + out.transpose(1, 2).reshape(B, L, -1)
        return x


def window_masks(L=40):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None]
    causal = j <= i
    padded = causal[None, None] & (j[None, None] >= torch.tensor([0, 6])[:, None, None, None])
    return [("causal 2-D", causal, "causal"), ("left padded", padded, "dense"),
            ("window 8, additive", torch.zeros(L, L).masked_fill(~(causal & (i - j < 8)), float("-inf")), "dense")]


def test_drop_in_inside_compile_decides_in_the_graph(one_graph_mode):
    """masklens.torch.scaled_dot_product_attention in a compiled model of one's own, one
    graph on: no break (fullgraph=True), one graph for every mask, forward and backward
    equal torch's. Each mask is scanned once a forward though three layers read it: the
    op is pure, and AOTAutograd's CSE of a training graph computes it once (an inference
    graph keeps the three: the next test)."""
    torch.manual_seed(0)
    model = Layers()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for step, (name, mask, form) in enumerate(window_masks()):
        x = torch.randn(2, 40, 64, requires_grad=True)
        counters.clear()
        before, taken = masklens.scan_count(), dict(one_graph.forms_taken)
        out = compiled(x, mask)
        out.square().sum().backward()
        grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
        model.zero_grad()
        x.grad = None
        assert masklens.scan_count() - before == 1, name
        assert taken_since(taken) == {form: 1}, name
        assert not break_sites()
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):  # torch's own, eagerly
            with unittest.mock.patch.object(one_graph, "enabled", False):
                ref = model(x, mask)
        ref.square().sum().backward()
        ref_grads = [p.grad for p in model.parameters()] + [x.grad]
        assert (out - ref).abs().max().item() < 1e-4, name
        assert max((a - b).abs().max().item() for a, b in zip(grads, ref_grads)) < 1e-3, name
        model.zero_grad()


def test_drop_in_given_a_scale_runs_torchs_call_inside_one_graph(one_graph_mode):
    """A scale given to the drop-in may be a symbolic float inside the trace (Dynamo makes
    a float argument that changed symbolic), which torch.cond's branches may not close
    over: the call is torch's own (no op, no error), as without one graph."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16) for _ in range(3))
    mask = torch.ones(32, 32, dtype=torch.bool).tril()

    def attend(q, k, v, mask, scale):
        from masklens.torch import scaled_dot_product_attention
        return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    taken = dict(one_graph.forms_taken)
    for scale in (0.2, 0.3, 0.25):
        out = compiled(q, k, v, mask, scale)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        assert (out - ref).abs().max().item() < 1e-5
    assert taken_since(taken) == {}


def test_drop_in_inside_compile_runs_flex_on_the_graphs_block_mask(one_graph_mode, gpu_environment):
    """Decided as on an H100 with FlexAttention only, without grad (no flex backward on the
    CPU): the first forward answers dense and adds the branch, later ones run FlexAttention
    on the op's BlockMask, equal to the drop-in's eager result; each layer's call is an op
    of its own here (no CSE in an inference graph): a scan per layer."""
    gpu_environment({"flex"})
    torch.manual_seed(0)
    model = Layers()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    L = 150
    i, j = torch.arange(L)[:, None], torch.arange(L)[None]
    with torch.no_grad():
        for step, start in enumerate([0, 9, 130]):
            mask = (j <= i) & (i - j < 40) & (j >= start)
            x = torch.randn(2, L, 64)
            taken = dict(one_graph.forms_taken)
            out = compiled(x, mask)
            assert taken_since(taken) == {"dense" if step == 0 else "flex": 3}
            ref = model(x, mask)  # eager: the drop-in as it runs outside a graph
            assert (out - ref).abs().max().item() < 1e-4


# --- on a GPU: Inductor's CUDA kernels, the FlexAttention branch's backward, CUDA graphs --

@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_one_graph_on_a_gpu_equals_compiled_sdpa(one_graph_mode, mode):
    """A bf16 Llama on the GPU, left-padded batches, forward and backward: one graph
    (fullgraph=True, Inductor; with "reduce-overhead" the op's host work stays out of the
    CUDA graphs) against compiled sdpa, whatever form the GPU's decision takes."""
    cfg = LlamaConfig(**{**SMALL, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 512,
                         "head_dim": 64, "max_position_embeddings": 4096})
    ref, ours = pair(cfg)
    ref, ours = ref.cuda().bfloat16(), ours.cuda().bfloat16()
    compiled_ref = torch.compile(ref, mode=mode)
    compiled = torch.compile(ours, mode=mode, fullgraph=True)
    for step, pads in enumerate([(0, 300, 900, 1500), (100, 0, 1200, 40), (0, 0, 0, 0), (7, 0, 1300, 600)]):
        ids, attention = left_padded(pads, L=2048, seed=step)
        ids, attention = ids.cuda(), attention.cuda()
        counters.clear()
        b = forward_backward(compiled, ids, attention).float()
        assert not break_sites()
        a = forward_backward(compiled_ref, ids, attention).float()
        keep = attention.bool()
        assert (a - b).abs()[keep].max().item() < 0.1
        assert max_grad_difference(ref, ours) < 0.1
        ref.zero_grad()
        ours.zero_grad()
    assert sum(one_graph.forms_taken.values()) == 4
