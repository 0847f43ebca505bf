"""One graph with no dense mask (masklens._graph_definition): with one graph on, a compiled
model's mask function reads transformers' composition while tracing (the primitive
factories give objects Dynamo reads) and hands its O(B·L) tensors to the op
masklens::graph_form_defined; the [B, 1, Q, K] mask is built only inside the layers' dense
branch. Compositions made by transformers' own create_*_mask functions, rebuilt and
answered by the op, against sdpa_mask's tensor; compiled models (fullgraph=True) on padded,
holed and packed batches against eager "sdpa", their graphs read value by value."""
import random
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
mu = pytest.importorskip("transformers.masking_utils")
import masklens  # noqa: E402
import masklens._graph_definition as gd  # noqa: E402
import masklens._one_graph as one_graph  # noqa: E402
import masklens.transformers  # noqa: E402,F401  (registers "masklens", installs the factories)
from torch._dynamo.utils import counters  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from transformers import LlamaConfig  # noqa: E402

from models import SMALL, break_sites, left_padded, max_grad_difference, pair  # noqa: E402
from test_definition import _case, _dense, _holed  # noqa: E402

FLEX_FORMS = one_graph.DEFAULT_FORMS | 1 << one_graph.FLEX


def test_factories_give_transformers_closures_outside_a_traced_graph():
    """Installed, the factories are wrapped, and outside Dynamo's tracing (or with one graph
    off) they give transformers' own closures, unchanged: the eager path and the
    outside-the-graph path read those."""
    assert set(gd.install()) >= {"and_masks", "or_masks", "padding_mask_function", "packed_sequence_mask_function",
                                 "remap_positions_for_packed_sequence", "sliding_window_overlay", "chunked_overlay"}
    fn = mu.and_masks(mu.sliding_window_overlay(3), mu.causal_mask_function)
    assert not isinstance(fn, gd.Primitive)
    assert fn.__code__ is gd.original("and_masks")(mu.causal_mask_function).__code__
    assert mu.and_masks._masklens_original is gd.original("and_masks")


def test_a_model_module_that_imported_a_factory_by_name_gets_the_wrapper(monkeypatch):
    """Gemma3's module imports sliding_window_overlay by name: its name is pointed at the
    wrapper (at set_one_graph(True) for a module imported after install), so its sliding
    masks give Primitives while tracing; a module imported later keeps its name until then."""
    import types

    import masklens.torch as mt
    late = types.ModuleType("transformers.models.masklens_late")
    late.sliding_window_overlay = gd.original("sliding_window_overlay")
    late.chunked_overlay = gd.original("chunked_overlay")
    monkeypatch.setitem(sys.modules, late.__name__, late)
    assert late.sliding_window_overlay is not mu.sliding_window_overlay
    mt.set_one_graph(True)
    try:
        assert late.sliding_window_overlay is mu.sliding_window_overlay
        assert late.chunked_overlay is mu.chunked_overlay
        _primitives(monkeypatch)
        assert isinstance(late.sliding_window_overlay(4), gd.Primitive)
    finally:
        mt.set_one_graph(False)
    gemma3 = pytest.importorskip("transformers.models.gemma3.modeling_gemma3")
    gd.install()
    assert gemma3.sliding_window_overlay is mu.sliding_window_overlay


def _primitives(monkeypatch):
    """The factories give Primitives eagerly, as they do while Dynamo traces in one graph."""
    monkeypatch.setattr(gd, "_reading", lambda: True)


def test_compositions_rebuilt_and_answered_by_the_op_equal_transformers_masks(monkeypatch, gpu_environment):
    """Compositions made by transformers' create_*_mask functions (test_definition's
    generator: padding left, right and holed, packed position_ids, windows, chunks, VLM
    blocks, cache offsets, a model's own lambda) with the factories giving Primitives: the
    walk reads every one but the lambda; the composition rebuilt from its spec gives
    sdpa_mask's tensor element for element; the op, decided as on an H100 with
    FlexAttention, answers FLEX with row bounds that are that tensor, or dense where the
    definition cannot be read (holes, two ranges in a row), never a wrong form."""
    _primitives(monkeypatch)
    gpu_environment({"flex"})
    monkeypatch.setattr(one_graph, "forms_taken", __import__("collections").Counter())
    rng = random.Random(41)
    counts = {"flex": 0, "dense": 0, "causal": 0, "lambda": 0}
    for i in range(1500):
        maker, kw = _case(rng)
        if kw is None:
            continue
        dense = _dense(kw)[:, 0]
        tensors, ints = [], []
        spec = gd.spec_of(kw["mask_function"], tensors, ints)
        if maker == "lambda":
            assert spec is None, i
            counts["lambda"] += 1
            continue
        assert spec is not None, (i, maker)
        B, Q, K = kw["batch_size"], kw["q_length"], kw["kv_length"]
        qo, ko = int(kw.get("q_offset", 0)), int(kw.get("kv_offset", 0))
        rebuilt = gd.compose(spec, tensors, ints)
        assert not isinstance(rebuilt, gd.Primitive)
        again = gd.original("sdpa_mask")(batch_size=B, q_length=Q, kv_length=K, q_offset=qo, kv_offset=ko,
                                         mask_function=rebuilt, attention_mask=kw.get("attention_mask"),
                                         allow_is_causal_skip=False)
        assert torch.equal(again.expand(B, 1, Q, K)[:, 0], dense), (i, maker, spec)
        code, bounds, *arrays = torch.ops.masklens.graph_form_defined(
            tensors, kw.get("attention_mask"), spec, ints, B, Q, K, qo, ko, 4, 4, 64, 64, torch.bfloat16, False,
            FLEX_FORMS, torch.device("cpu"))
        assert bounds.shape == (B, 1, Q, 2) and [a.shape[:2] for a in arrays] == [(B, 1)] * 8
        code = code.item()
        keys = torch.arange(K)
        if code == one_graph.FLEX:
            counts["flex"] += 1
            rows = (keys >= bounds[:, 0, :, :1]) & (keys <= bounds[:, 0, :, 1:])
            assert torch.equal(rows, dense), (i, maker, spec)
            assert not _holed(kw)
        elif code == one_graph.CAUSAL:
            counts["causal"] += 1
            assert Q == K and torch.equal(dense, torch.ones(Q, K, dtype=torch.bool).tril().expand(B, Q, K)), i
        else:
            counts["dense"] += 1
    assert counts["flex"] >= 700 and counts["dense"] >= 50 and counts["lambda"] >= 50, counts


def test_graph_form_defined_passes_opcheck(gpu_environment):
    """The op's schema and fake kernel as torch checks them: a padded batch and a packed one,
    with the CPU's decision and with FlexAttention's (BlockMask filled)."""
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1] * 4])
    documents = (torch.diff(pos, prepend=pos[:, :1] - 1) != 1).cumsum(-1)
    am = torch.ones(2, 40, dtype=torch.bool)
    am[1, :13] = False
    cases = [([], am, "causal()", [], 2), ([pos, documents], None, "and(remap(causal()),packed())", [], 1),
             ([], am, "and(sliding(),causal())", [7], 2)]
    for available in (None, {"flex"}):
        if available:
            gpu_environment(available)
        for tensors, mask, spec, ints, B in cases:
            args = (tensors, mask, spec, ints, B, 40, 40, 0, 0, 4, 2, 16, 16, torch.float32, False, FLEX_FORMS,
                    torch.device("cpu"))
            torch.library.opcheck(torch.ops.masklens.graph_form_defined.default, args)


# --- compiled models: the graphs' values -------------------------------------------------

def _recording_backend(graphs):
    """aot_eager (its partitioner too), keeping every graph it compiles."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm)
    return aot_autograd(fw_compiler=record, bw_compiler=record, partition_fn=min_cut_rematerialization_partition)


def _shapes(graph):
    return [tuple(t.shape) for node in graph.nodes for t in tree_leaves(node.meta.get("val"))
            if isinstance(t, torch.Tensor)]


def _masks_in(gm, q_len, k_len):
    """The mask-shaped values (4-D, last dims Q and K: [B, 1, Q, K] or [B, H, Q, K]) of a
    compiled graph outside its torch.cond branches, and those inside each branch."""
    def masks(shapes):
        return [s for s in shapes if len(s) == 4 and s[-2:] == (q_len, k_len)]
    branches = {name: masks(_shapes(sub.graph)) for name, sub in gm.named_modules()
                if name and isinstance(sub, torch.fx.GraphModule)}
    return masks(_shapes(gm.graph)), branches


def _packed(L, seed=1):
    ids = torch.randint(3, 97, (1, L), generator=torch.Generator().manual_seed(seed))
    return torch.tensor([list(range(7)) + list(range(9)) + list(range(L - 16))]), ids


@pytest.mark.parametrize("batch", ["left padded", "packed"])
def test_fullgraph_holds_no_dense_mask_outside_the_dense_branch(one_graph_mode, batch):
    """torch.compile(fullgraph=True) on a padded batch (attention_mask) and a packed one
    (position_ids, as DataCollatorWithFlattening gives them): no graph break, logits and
    gradients equal eager "sdpa"'s, the mask read from its definition (no scan), and no
    value of the forward or backward graphs outside the dense branch is a [B, 1, Q, K]
    or [B, H, Q, K] tensor. The dense branch, which the CPU's decision takes, does hold
    one: the mask is there, built where that branch runs."""
    ref, ours = pair(LlamaConfig(**SMALL))
    graphs = []
    compiled = torch.compile(ours, backend=_recording_backend(graphs), fullgraph=True)
    L = 20
    for step in range(2):
        if batch == "packed":
            pos, ids = _packed(L, seed=step)
            inputs = dict(input_ids=ids, position_ids=pos, use_cache=False)
            keep = torch.ones(1, L, dtype=torch.bool)
        else:
            ids, attention = left_padded([(0, 4, 9), (3, 0, 11)][step], L=L, seed=step)
            inputs = dict(input_ids=ids, attention_mask=attention)
            keep = attention.bool()
        counters.clear()
        scans, definitions = masklens.scan_count(), masklens.transformers.definition_count()
        masklens.transformers._masks.clear()
        logits = compiled(**inputs).logits
        logits[keep].logsumexp(-1).sum().backward()
        assert not break_sites()
        assert masklens.scan_count() == scans and masklens.transformers.definition_count() == definitions + 1
        assert [how for how, _ in masklens.transformers.masks()] == ["definition"]
        a = ref(**inputs).logits
        a[keep].logsumexp(-1).sum().backward()
        assert (a - logits).abs()[keep].max().item() < 1e-4
        assert max_grad_difference(ref, ours) < 1e-3
        ref.zero_grad()
        ours.zero_grad()
        if step:
            assert not counters["stats"]["unique_graphs"], "new padding or documents compiled again"
    assert len(graphs) == 2, "one forward graph and one backward graph"
    for gm in graphs:
        outside, branches = _masks_in(gm, L, L)
        assert outside == [], outside
        assert sum(1 for m in branches.values() if m), "a dense branch builds the mask"
        assert any(s[-2:] == (L, 16) for s in _shapes(gm.graph)), "the graph holds the attention's values"


def test_holed_padding_and_new_documents_stay_right_in_one_graph(one_graph_mode, gpu_environment):
    """Decided as on an H100 with FlexAttention (forward only: torch 2.11 has no flex
    backward on the CPU): padding with a hole cannot be read from the definition (a row of
    two key ranges), so the op answers dense and the branch builds transformers' mask;
    the other batches run FlexAttention on the definition's BlockMask; logits equal
    sdpa's throughout, one graph after the flex branch is added."""
    gpu_environment({"flex"})
    ref, ours = pair(LlamaConfig(**SMALL))
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    L = 150
    holed = torch.ones(3, L, dtype=torch.long)
    holed[1, 40:60] = 0
    steps = [(left_padded((0, 4, 9), L=L), "dense"), (left_padded((2, 0, 7), L=L, seed=2), "flex"),
             ((left_padded((0, 0, 0), L=L)[0], holed), "dense"), (left_padded((5, 1, 130), L=L, seed=3), "flex")]
    with torch.no_grad():
        for step, ((ids, attention), form) in enumerate(steps):
            taken = dict(one_graph.forms_taken)
            masklens.transformers._masks.clear()
            counters.clear()
            b = compiled(input_ids=ids, attention_mask=attention).logits
            a = ref(input_ids=ids, attention_mask=attention).logits
            keep = attention.bool()
            assert (a - b).abs()[keep].max().item() < 1e-4, step
            assert {k: v - taken.get(k, 0) for k, v in one_graph.forms_taken.items() if v - taken.get(k, 0)} == {
                form: 1}, step
            (how, why), = masklens.transformers.masks()
            assert (how, "holes" in why) == (("built", True) if step == 2 else ("definition", False)), (how, why)
            assert not break_sites()
            assert bool(counters["stats"]["unique_graphs"]) == (step <= 1), step


class _Layer(torch.nn.Module):
    """What masklens_attention_forward reads of a transformers attention layer."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads


def _config(impl, **extra):
    cfg = LlamaConfig(**SMALL, **extra)
    cfg._attn_implementation = impl
    return cfg


@pytest.mark.parametrize("case", ["sliding window", "chunked", "vlm blocks", "or lambda"])
def test_each_mask_maker_compiled_equals_sdpa(one_graph_mode, case):
    """transformers' mask makers compiled with the layers' attention (fullgraph=True) on a
    left-padded batch, against sdpa with the mask transformers builds eagerly. A recognised
    composition leaves no mask-shaped value outside the branches; a model's own function
    (an or_mask_function lambda) is not read: sdpa_mask is traced and scanned as before, its
    mask a value of the graph."""
    extra = {"sliding window": dict(sliding_window=6), "chunked": dict(attention_chunk_size=6)}.get(case, {})
    cfg, ref_cfg = _config("masklens", **extra), _config("sdpa", **extra)
    layer = _Layer(cfg)
    L = 24
    _, attention = left_padded((0, 5, 11), L=L)
    blocks = torch.full((3, L), -1, dtype=torch.long)
    blocks[:, 14:19] = 0
    blocks[0, 3:6] = 1

    def make(config, embeds, attention):
        kw = dict(config=config, inputs_embeds=embeds, attention_mask=attention, cache=None)
        if case == "sliding window":
            return mu.create_sliding_window_causal_mask(**kw)
        if case == "chunked":
            return mu.create_chunked_causal_mask(**kw)
        if case == "vlm blocks":
            return mu.create_causal_mask(**kw, block_sequence_ids=blocks)
        return mu.create_causal_mask(**kw, or_mask_function=lambda b, h, q, k: q == k)

    def attend(q, k, v, embeds, attention):
        out, _ = masklens.transformers.masklens_attention_forward(layer, q, k, v, make(cfg, embeds, attention))
        return out

    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, L, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(3, 2, L, 16, generator=g, requires_grad=True) for _ in range(2))
    embeds = torch.zeros(3, L, 64)
    graphs = []
    compiled = torch.compile(attend, backend=_recording_backend(graphs), fullgraph=True)
    counters.clear()
    out = compiled(q, k, v, embeds, attention)
    mask = make(ref_cfg, embeds, attention)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    want, _ = sdpa_attention_forward(_Layer(ref_cfg), q, k, v, mask)
    rows = mask[:, 0].any(-1)  # a row that attends nothing: sdpa gives NaN there, masklens 0
    grads = torch.autograd.grad(out[rows].sum(), (q, k, v))
    want_grads = torch.autograd.grad(want[rows].sum(), (q, k, v))
    assert not break_sites()
    assert (out - want)[rows].abs().max().item() < 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(grads, want_grads)) < 1e-4
    outside = [m for gm in graphs for m in _masks_in(gm, L, L)[0]]
    assert (outside != []) == (case == "or lambda"), outside


@pytest.mark.parametrize("name", ["mistral sliding window", "qwen3", "gemma3 sliding and full", "qwen3.5 hybrid",
                                  "llama4 chunked"])
def test_model_families_compiled_in_one_graph_hold_no_dense_mask(one_graph_mode, name):
    """Each family that makes its masks with transformers' functions (sliding layers,
    hybrid per-layer-type masks, chunked attention), compiled with fullgraph=True on a
    left-padded batch: forward and backward equal eager "sdpa"'s, every mask kind read from
    its definition, and no mask-shaped value outside the dense branches."""
    from test_zero_byte import _configs
    configs = _configs()
    if name not in configs:
        pytest.skip(f"this transformers has no {name} config")
    ref, ours = pair(configs[name])
    graphs = []
    compiled = torch.compile(ours, backend=_recording_backend(graphs), fullgraph=True)
    L = 20
    ids, attention = left_padded((0, 4, 9), L=L)
    keep = attention.bool()
    masklens.transformers._masks.clear()
    counters.clear()
    logits = compiled(input_ids=ids, attention_mask=attention).logits
    logits[keep].logsumexp(-1).sum().backward()
    assert not break_sites()
    kinds = {"gemma3 sliding and full": 2, "llama4 chunked": 2}.get(name, 1)
    assert [how for how, _ in masklens.transformers.masks()] == ["definition"] * kinds
    a = ref(input_ids=ids, attention_mask=attention).logits
    a[keep].logsumexp(-1).sum().backward()
    assert (a - logits).abs()[keep].max().item() < 1e-4
    assert max_grad_difference(ref, ours) < 1e-3
    for gm in graphs:
        outside, branches = _masks_in(gm, L, L)
        assert outside == [], outside


def test_flex_attention_models_compile_once_with_the_factories_wrapped(one_graph_mode):
    """attn_implementation="flex_attention" in the same process, one graph on: its mask
    interface (torch's create_block_mask, a frame of its own after the graph breaks flex's
    CPU path has) is given Primitives as mask_mods; they pass for mask functions, so a new
    padding compiles nothing, and the logits equal the eager model's. Forward only (no
    flex backward on the CPU)."""
    ref, ours = pair(LlamaConfig(**SMALL), impl="flex_attention")
    compiled = torch.compile(ours, backend="aot_eager")
    with torch.no_grad():
        for step, pads in enumerate([(0, 4, 9), (2, 0, 7), (0, 11, 1)]):
            ids, attention = left_padded(pads, L=40, seed=step)
            counters.clear()
            b = compiled(input_ids=ids, attention_mask=attention).logits
            a = ref(input_ids=ids, attention_mask=attention).logits
            assert (a - b).abs()[attention.bool()].max().item() < 1e-4
            if step:
                assert not counters["stats"]["unique_graphs"], f"step {step} compiled again"
