"""attn_implementation="masklens" reads transformers' masks from their definition: a forward
and backward of each model family that builds its masks with transformers' mask functions
equals "sdpa"'s, and allocates no [B, 1, Q, K] tensor (a TorchDispatchMode watches every
op's outputs for storage of Q·K elements or more laid out as a mask)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

transformers = pytest.importorskip("transformers")
import masklens  # noqa: E402
import masklens.transformers  # noqa: E402  (registers "masklens")
from models import max_grad_difference, pair  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=97, max_position_embeddings=256)


class MaskAllocations(TorchDispatchMode):
    """Counts op outputs that hold a [B, 1, Q, K] mask's worth of storage: a tensor whose
    last two dims are (Q, K), one head (or none), and at least Q·K elements of storage."""

    def __init__(self, q_len, k_len):
        super().__init__()
        self.q_len, self.k_len = q_len, k_len
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if (isinstance(t, torch.Tensor) and t.dim() >= 2 and tuple(t.shape[-2:]) == (self.q_len, self.k_len)
                    and (t.dim() < 4 or t.shape[1] == 1)
                    and t.untyped_storage().nbytes() >= self.q_len * self.k_len * t.element_size()):
                self.seen.append((str(func), tuple(t.shape), t.dtype))
        return out


def _configs():
    c = {
        "llama": transformers.LlamaConfig(**SMALL),
        "mistral sliding window": transformers.MistralConfig(**SMALL, sliding_window=5),
        "qwen3": transformers.Qwen3Config(**SMALL, head_dim=16),
        "gemma3 sliding and full": transformers.Gemma3TextConfig(
            **SMALL, head_dim=16, sliding_window=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    }
    if hasattr(transformers, "Qwen3_5TextConfig"):
        c["qwen3.5 hybrid"] = transformers.Qwen3_5TextConfig(
            **{**SMALL, "num_hidden_layers": 4}, head_dim=16,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
    if hasattr(transformers, "Llama4TextConfig"):
        c["llama4 chunked"] = transformers.Llama4TextConfig(
            **{**SMALL, "num_hidden_layers": 2}, head_dim=16, attention_chunk_size=6, num_local_experts=2,
            intermediate_size_mlp=128, no_rope_layers=[1, 0], interleave_moe_layer_step=2)
    return c


def _run(model, inputs, keep, q_len):
    with MaskAllocations(q_len, q_len) as watch:
        logits = model(**inputs).logits
        logits[keep].logsumexp(-1).sum().backward()
    return logits.detach(), watch.seen


def _batch(kind, L=20):
    g = torch.Generator().manual_seed(1)
    if kind == "packed":
        ids = torch.randint(3, 97, (1, L), generator=g)
        position_ids = torch.tensor([list(range(7)) + list(range(9)) + list(range(L - 16))])
        return dict(input_ids=ids, position_ids=position_ids, use_cache=False), torch.ones(1, L, dtype=torch.bool)
    ids = torch.randint(3, 97, (3, L), generator=g)
    attention = torch.ones(3, L, dtype=torch.long)
    for b, n in enumerate((0, 4, 9)):
        if kind == "left":
            attention[b, :n] = 0
        else:
            attention[b, L - n:] = 0
    return dict(input_ids=ids, attention_mask=attention), attention.bool()


CASES = [(name, kind) for name in _configs() for kind in ("left", "right", "packed")
         if not (kind == "packed" and name in ("qwen3.5 hybrid", "llama4 chunked"))]


@pytest.fixture
def never_build(monkeypatch):
    """The CPU's math kernel with the mask kept beats a plan of is_causal slices on these
    small batches: the tests ask for no build at all (on a GPU the calls that win drop
    the mask anyway: varlen_attn, FlexAttention, is_causal)."""
    monkeypatch.setattr(masklens.transformers, "build_masks", "never")


def _watch_pending(monkeypatch):
    """A list that gets, for each call of the registered mask function, whether it returned
    a DefinedMask whose read was still pending."""
    made = []
    real = masklens.transformers.masklens_mask

    def watched(*a, **kw):
        out = real(*a, **kw)
        made.append(isinstance(out, masklens.transformers.DefinedMask) and out.definition.pending)
        return out
    monkeypatch.setitem(transformers.masking_utils.AttentionMaskInterface._global_mapping, "masklens", watched)
    return made


@pytest.fixture(params=["never", "always"])
def defer(request, monkeypatch):
    """The tables read in the mask function, and read where the first layer waits for them
    (defer_reads="always": on the CPU, where its default reads at once, the deferred path a
    GPU takes by default). Yields the mode; after the test, every mask function call was
    pending (deferred) or none was."""
    monkeypatch.setattr(masklens.transformers, "defer_reads", request.param)
    made = _watch_pending(monkeypatch)
    yield request.param
    assert made and all(made) == (request.param == "always") and any(made) == all(made), made


@pytest.mark.parametrize("name,kind", CASES)
def test_forward_and_backward_equal_sdpa_without_a_dense_mask(name, kind, never_build, defer):
    ref, ours = pair(_configs()[name])
    inputs, keep = _batch(kind)
    L = inputs["input_ids"].shape[1]
    a, ref_masks = _run(ref, inputs, keep, L)
    masklens.transformers._masks.clear()
    b, our_masks = _run(ours, inputs, keep, L)
    assert ref_masks, "sdpa built no mask: the count would prove nothing"
    assert our_masks == [], our_masks
    assert any(how == "definition" for how, _ in masklens.transformers.masks()), masklens.transformers.masks()
    assert all(how == "definition" for how, _ in masklens.transformers.masks()), masklens.transformers.masks()
    err = (a - b).abs()[keep].max().item()
    assert err < 1e-4, err
    assert max_grad_difference(ref, ours) < 1e-3


def test_gradient_checkpointing(never_build, defer):
    ref, ours = pair(_configs()["llama"])
    for m in (ref, ours):
        m.gradient_checkpointing_enable()
        m.train()
    inputs, keep = _batch("left")
    a, _ = _run(ref, inputs, keep, 20)
    b, ours_masks = _run(ours, inputs, keep, 20)
    assert ours_masks == []
    assert (a - b).abs()[keep].max().item() < 1e-4
    assert max_grad_difference(ref, ours) < 1e-3


def test_a_build_that_is_cheaper_is_made_once_per_forward():
    """By default a call that keeps the mask may still win where building it costs less
    than what dropping it would (the CPU's math kernel on a small batch): then the mask is
    built once for the forward, and every layer reads that one."""
    ref, ours = pair(_configs()["llama"])
    inputs, keep = _batch("left")
    a, _ = _run(ref, inputs, keep, 20)
    b, seen = _run(ours, inputs, keep, 20)
    # sdpa_mask's last step: the causal rows AND each batch's padding, [3, 1, 20, 20].
    builds = [s for s in seen if s[0] == "aten.bitwise_and.Tensor" and s[1] == (3, 1, 20, 20)]
    assert len(builds) == 1, seen
    assert (a - b).abs()[keep].max().item() < 1e-4


def test_prefill_over_a_cache_and_decode():
    """A second chunk of prompt over a cache (q_offset, kv_offset: Q != K), then decode
    steps: tokens equal sdpa's."""
    ref, ours = pair(_configs()["mistral sliding window"])
    inputs, _ = _batch("left", L=12)
    kwargs = dict(**inputs, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ref.generate(**kwargs), ours.generate(**kwargs))
    # Prefill in two chunks: the second's mask is [B, 1, 5, 12], offsets from the cache.
    for model in (ref, ours):
        model.train(False)
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    outs = []
    for model in (ref, ours):
        masklens.transformers._masks.clear()
        cache = transformers.DynamicCache(config=model.config)
        model(input_ids=ids[:, :7], attention_mask=attention[:, :7], past_key_values=cache, use_cache=True)
        outs.append(model(input_ids=ids[:, 7:], attention_mask=attention, past_key_values=cache,
                          use_cache=True).logits)
    assert any(how == "definition" for how, _ in masklens.transformers.masks())
    keep = attention[:, 7:].bool()
    assert (outs[0] - outs[1]).abs()[keep].max().item() < 1e-4


def test_a_mask_touched_by_model_code_is_built_once():
    """Code that reads the mask between the mask function and attention gets the dense
    mask transformers would have built (and masklens says why it built it)."""
    import transformers.masking_utils as mu
    am = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]).bool()
    kw = dict(batch_size=2, q_length=5, kv_length=5, attention_mask=am, mask_function=mu.causal_mask_function,
              device=torch.device("cpu"))
    dm = masklens.transformers.masklens_mask(**kw)
    dense = mu.sdpa_mask(**kw, allow_is_causal_skip=False)
    assert isinstance(dm, masklens.transformers.DefinedMask) and not dm.built
    assert dm.shape == dense.shape and dm.dtype == torch.bool and dm.device == dense.device
    assert torch.equal(dm[:, :, :, :3], dense[:, :, :, :3])
    assert dm.built
    assert torch.equal(torch.where(dm, 1.0, 0.0), dense.float())
    assert torch.equal(dm.float() + 0, dense.float())
    assert torch.equal(~dm, ~dense)


def test_an_unrecognised_function_is_built_and_named():
    import transformers.masking_utils as mu
    fn = mu.or_masks(mu.causal_mask_function, lambda b, h, q, k: q == k)
    masklens.transformers._masks.clear()
    out = masklens.transformers.masklens_mask(batch_size=1, q_length=4, kv_length=4, mask_function=fn,
                                              allow_is_causal_skip=False, device=torch.device("cpu"))
    assert isinstance(out, torch.Tensor) and out.shape == (1, 1, 4, 4)
    (how, why), = masklens.transformers.masks()
    assert how == "built" and "lambda" in why and "not a recognised mask primitive" in why


def _defined(B=2, Q=5, K=5, pads=(2, 0)):
    import transformers.masking_utils as mu
    am = torch.ones((B, K), dtype=torch.bool)
    for b, n in enumerate(pads):
        am[b, :n] = False
    kw = dict(batch_size=B, q_length=Q, kv_length=K, attention_mask=am, mask_function=mu.causal_mask_function,
              device=torch.device("cpu"))
    return masklens.transformers.masklens_mask(**kw), mu.sdpa_mask(**kw, allow_is_causal_skip=False)


def test_a_defined_mask_in_torch_functions_and_containers():
    dm, dense = _defined()
    other = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    assert torch.equal(torch.cat([dm, other], dim=-1), torch.cat([dense, other], dim=-1))
    assert torch.equal(torch.stack((dm, dm)), torch.stack((dense, dense)))
    assert torch.equal(dm.float() / 2, dense.float() / 2)
    assert torch.equal(1 ^ dm, 1 ^ dense)
    assert (True in dm) == (True in dense)
    import copy
    import pickle
    assert torch.equal(copy.deepcopy(dm), dense)
    assert torch.equal(pickle.loads(pickle.dumps(dm)), dense)


def test_what_a_defined_mask_answers_without_building():
    dm, _ = _defined()
    assert not hasattr(dm, "_hf_hook")          # accelerate's question: no build
    moved = dm.to("cpu")
    assert moved is dm
    assert dm.to(torch.device("cpu"), non_blocking=True) is dm   # as accelerate's send_to_device moves it
    meta = dm.to(torch.device("meta"))
    assert isinstance(meta, masklens.transformers.DefinedMask) and meta.device.type == "meta"
    assert dm.shape == (2, 1, 5, 5) and dm.dim() == 4 and dm.size(-1) == 5 and dm.dtype == torch.bool
    assert not dm.built and not dm.touched


class _Layer(torch.nn.Module):
    num_key_value_groups = 1

    def __init__(self):
        super().__init__()
        self.config = None


def test_a_mask_written_by_the_models_code_is_the_mask_attended():
    """A write into the mask between the mask function and attention (as a model's own
    code may make) is what the layer attends: the written dense tensor, not the verdict
    of the definition."""
    dm, dense = _defined()
    dm[:, :, 3, :] = False              # a row the definition lets attend, now masked
    written = dense.clone()
    written[:, :, 3, :] = False
    assert dm.touched
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    out, _ = masklens.transformers.masklens_attention_forward(_Layer(), q, k, v, dm)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=written)
    # Rows that attend nothing are 0 in masklens' result (torch's math kernel gives NaN there).
    rows = written.any(-1, keepdim=True).expand(2, 4, 5, 1)
    assert torch.allclose(out.transpose(1, 2)[rows.expand_as(ref)], ref[rows.expand_as(ref)], atol=1e-5)
    assert (out.transpose(1, 2)[~rows.expand_as(ref)] == 0).all()


def test_generate_with_a_static_cache():
    """generate() makes the masks ahead of the forward and hands them back to the model's
    own create_causal_mask: a DefinedMask passes through as a ready 4-D mask does."""
    ref, ours = pair(_configs()["llama"])
    inputs, _ = _batch("left", L=12)
    kwargs = dict(**inputs, max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation="static")
    assert torch.equal(ref.generate(**kwargs), ours.generate(**kwargs))


def _recording_backend(shapes):
    """aot_eager, recording the shape of every value of every graph it compiles."""
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        for node in gm.graph.nodes:
            shapes.extend(tuple(t.shape) for t in tree_leaves(node.meta.get("val"))
                          if isinstance(t, torch.Tensor))
        return gm
    return aot_autograd(fw_compiler=record, bw_compiler=record)


def _mask_shaped(shape, q_len, k_len):
    """MaskAllocations' test on a shape: last dims (Q, K), one head or none."""
    return len(shape) >= 2 and tuple(shape[-2:]) == (q_len, k_len) and (len(shape) < 4 or shape[1] == 1)


def test_a_compiled_model_decides_from_the_definition(gpu_environment):
    """torch.compile: the mask proven outside the graph from its definition (no scan), the
    layers given FlexAttention's form, logits equal to sdpa's; no value of a compiled graph
    and no op run outside them is a [B, 1, Q, K] mask."""
    import torch._dynamo
    gpu_environment({"flex"})
    torch._dynamo.reset()
    ref, ours = pair(_configs()["llama"])
    shapes = []
    compiled = torch.compile(ours, backend=_recording_backend(shapes), dynamic=False)
    inputs, keep = _batch("left")
    L = inputs["input_ids"].shape[1]
    with torch.no_grad():  # torch 2.11's FlexAttention has no backward on the CPU
        a = ref(**inputs).logits
        scans = masklens.scan_count()
        masklens.transformers._masks.clear()
        b = compiled(**inputs).logits
    assert masklens.scan_count() == scans
    assert [how for how, _ in masklens.transformers.masks()] == ["definition"]
    assert (a - b).abs()[keep].max().item() < 1e-4
    assert any(s[-2:] == (L, 16) for s in shapes), "the graphs hold the attention's [.., L, head_dim] values"
    assert [s for s in shapes if _mask_shaped(s, L, L)] == []


class _LayersMasks:
    """The masks transformers' own sdpa layer receives from masklens' layers (None where
    they run sdpa's is_causal, as "sdpa" does)."""

    def __init__(self, monkeypatch):
        self.seen = []
        real = masklens.transformers.sdpa_attention_forward

        def watched(module, q, k, v, mask, *a, **kw):
            self.seen.append(mask)
            return real(module, q, k, v, mask, *a, **kw)
        monkeypatch.setattr(masklens.transformers, "sdpa_attention_forward", watched)


def test_a_deferred_read_waits_at_the_first_layer_and_stands_for_none(monkeypatch):
    """With the tables' read deferred, the mask function returns a DefinedMask at once and
    its read is waited for at the first layer: where that read says sdpa_mask gives none
    (a padding mask all True), the layers run sdpa's own call with no mask, as "sdpa" does."""
    monkeypatch.setattr(masklens.transformers, "defer_reads", "always")
    import transformers.masking_utils as mu
    kw = dict(batch_size=1, q_length=6, kv_length=6, attention_mask=torch.ones(1, 6, dtype=torch.bool),
              device=torch.device("cpu"))
    masklens.transformers._masks.clear()
    dm = masklens.transformers.masklens_mask(**kw)
    assert isinstance(dm, masklens.transformers.DefinedMask) and dm.definition.pending
    assert dm.outcome()[0] == "none" and not dm.definition.pending
    assert [how for how, _ in masklens.transformers.masks()] == ["none"]
    assert mu.sdpa_mask(**kw) is None

    ref, ours = pair(_configs()["llama"])
    inputs = dict(input_ids=torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(0)),
                  attention_mask=torch.ones(2, 12, dtype=torch.long))
    layers = _LayersMasks(monkeypatch)
    masklens.transformers._masks.clear()
    a, b = ref(**inputs).logits, ours(**inputs).logits
    assert layers.seen == [None] * SMALL["num_hidden_layers"]
    assert [how for how, _ in masklens.transformers.masks()] == ["none"]
    assert (a - b).abs().max().item() < 1e-4


def test_a_layer_compiled_on_its_own_waits_outside_its_graph(monkeypatch):
    """Layers compiled one by one (their mask function runs eagerly, its read deferred) wait
    for the read outside their graphs: a mask that stands for None reaches sdpa as None,
    and nothing builds the dense mask."""
    monkeypatch.setattr(masklens.transformers, "defer_reads", "always")
    torch._dynamo.reset()
    ref, ours = pair(_configs()["llama"])
    for layer in ours.model.layers:
        layer.compile(backend="eager")
    made = []
    real = masklens.transformers.masklens_mask

    def watched(*a, **kw):
        made.append(real(*a, **kw))
        return made[-1]
    monkeypatch.setitem(transformers.masking_utils.AttentionMaskInterface._global_mapping, "masklens", watched)
    inputs = dict(input_ids=torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(0)),
                  attention_mask=torch.ones(2, 12, dtype=torch.long))
    masklens.transformers._masks.clear()
    try:
        a, b = ref(**inputs).logits, ours(**inputs).logits
    finally:
        torch._dynamo.reset()
    (dm,) = made
    assert isinstance(dm, masklens.transformers.DefinedMask) and not dm.built
    assert [how for how, _ in masklens.transformers.masks()] == ["none"]
    assert (a - b).abs().max().item() < 1e-4


def test_a_deferred_read_that_finds_holes_builds_the_mask_at_the_first_layer(monkeypatch, never_build):
    """Only the tables' values say a padding mask has holes: with the read deferred that is
    known at the first layer, which then builds sdpa_mask's mask (once a forward) and
    proves it by a scan; the result is "sdpa"'s and the note names the holes."""
    monkeypatch.setattr(masklens.transformers, "defer_reads", "always")
    ref, ours = pair(_configs()["llama"])
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[0, 3] = 0  # a hole: not one interval of keys a row
    attention[1, :2] = 0
    inputs = dict(input_ids=torch.randint(3, 97, (2, 12), generator=torch.Generator().manual_seed(0)),
                  attention_mask=attention)
    masklens.transformers._masks.clear()
    a = ref(**inputs).logits
    with MaskAllocations(12, 12) as watch:
        b = ours(**inputs).logits
    (how, why), = masklens.transformers.masks()
    assert how == "built" and "hole" in why, why
    builds = [s for s in watch.seen if s[0] == "aten.bitwise_and.Tensor" and s[1] == (2, 1, 12, 12)]
    assert len(builds) == 1, watch.seen
    keep = attention.bool()
    assert (a - b).abs()[keep].max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["left", "right", "packed", "holed", "all ones"])
def test_on_a_gpu_the_read_is_deferred_to_the_first_layer(kind, monkeypatch):
    """By default (defer_reads="cuda") a CUDA model's mask function enqueues the tables' device
    pass and returns at once; the first layer waits for its copy. Forward and backward equal
    "sdpa"'s for padded and packed batches, a padding mask with holes (built there, proven by
    a scan) and one all True (sdpa's own call with no mask), and no [B, 1, Q, K] mask is
    allocated where the definition is read back."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from masklens import _scan
    if _scan.cuda_module() is None:
        pytest.skip(_scan.cuda_reason())
    assert masklens.transformers.defer_reads == "cuda"
    monkeypatch.setattr(masklens.transformers, "build_masks", "never")
    ref, ours = pair(_configs()["llama"])
    ref, ours = ref.cuda(), ours.cuda()
    inputs, keep = _batch("left" if kind in ("holed", "all ones") else kind)
    if kind == "holed":
        inputs["attention_mask"][1, 10] = 0
        keep = inputs["attention_mask"].bool()
    if kind == "all ones":
        inputs["attention_mask"].fill_(1)
        keep = inputs["attention_mask"].bool()
    inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    keep = keep.cuda()
    made = _watch_pending(monkeypatch)
    L = inputs["input_ids"].shape[1]
    a, _ = _run(ref, inputs, keep, L)
    masklens.transformers._masks.clear()
    b, seen = _run(ours, inputs, keep, L)
    assert made == [True], made  # the mask function returned with the read pending
    (how, why), = masklens.transformers.masks()
    assert how == {"holed": "built", "all ones": "none"}.get(kind, "definition"), (how, why)
    if how == "definition":  # "none" runs sdpa's own call, whose math kernel makes its causal mask as "sdpa"'s does
        assert seen == [], seen
    assert (a - b).abs()[keep].max().item() < 1e-3
    assert max_grad_difference(ref, ours) < 1e-2


def test_none_where_sdpa_mask_gives_none():
    """The layers run what "sdpa" runs: where transformers' sdpa_mask skips the mask (sdpa's
    is_causal, Q = K, whatever the offsets), the mask function gives None too."""
    import transformers.masking_utils as mu
    for kw in (dict(batch_size=2, q_length=4, kv_length=4), dict(batch_size=1, q_length=4, kv_length=4, q_offset=2),
               dict(batch_size=1, q_length=6, kv_length=6, attention_mask=torch.ones(1, 6, dtype=torch.bool))):
        kw["device"] = torch.device("cpu")
        assert mu.sdpa_mask(**kw) is None
        assert masklens.transformers.masklens_mask(**kw) is None, kw
