"""Masks read from their definition against masks built and scanned, in one run on one GPU.

A 4-layer Llama-like model (hidden 1024, 8 heads of 128, bf16, gradient checkpointing,
a 1024-token vocabulary so that the logits do not dominate) trains one step at a time at
batch 1 on --lengths tokens, in two batches per length:
  packed  4 documents of equal length through position_ids (use_cache=False)
  padded  the first 1/16 of the tokens left-padded (attention_mask)
and four ways per batch:
  sdpa        attn_implementation="sdpa": transformers' sdpa_mask builds [1, 1, L, L]
  scan        "masklens" with masklens.transformers.from_definition = False: the mask is
              built by sdpa_mask and proven by a scan (the way before definitions)
  definition  "masklens": the mask read from its definition, no [1, 1, L, L] tensor
  no mask     "sdpa" given no mask at all (plain causal: a lower bound, not the same
              attention for these batches)
  one graph   "masklens" compiled with fullgraph=True in one graph (masklens.torch.
              set_one_graph(True); Inductor on a GPU, aot_eager on the CPU): the
              composition read while tracing, the op masklens::graph_form_defined deciding
              from the O(B·L) metadata, the mask built only in a dense branch; its mask
              time and bytes are the op's own (host time, its one synchronisation
              included; bytes of its outputs: row bounds and BlockMask tensors)
Per way: the mask function's time (synchronised) and the bytes it allocates (and, in the
JSON, layer_builds: masks read from their definition that a layer built after all), the median
time of a training step (forward + backward + an SGD step) over --steps after --warm, its
peak memory, and the gradient norm. For the packed batch the reference gradient norm is
the documents trained one by one (plain causal each, the same weights): the true one.
Goals (docs/python.md): the mask <= 0.1 ms and 0 bytes per forward at every length, peak
memory within 1 % of "no mask", step time no worse than "scan".

--qwen35: also a Qwen3.5 text config (hybrid linear and full layers) packed at the
largest length, "definition" only, with its true gradient norm (--ways "" runs it alone).

usage: python3 bench/zero_byte.py [--lengths 32768,65536,131072] [--steps 3] [--warm 1] [--qwen35] [--json OUT]
  --quick: 2048 and 4096 tokens (a smoke test; runs on the CPU too with --device cpu).
"""
import argparse
import copy
import gc
import json
import statistics
import time

import torch
import transformers
import transformers.masking_utils as mu

import masklens._graph_definition as graph_definition
import masklens._one_graph as one_graph_forms
import masklens.torch as mt
import masklens.transformers as mlt
import llama_like
from llama_like import BATCHES, config

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--lengths", default="32768,65536,131072")
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--warm", type=int, default=1)
ap.add_argument("--quick", action="store_true")
ap.add_argument("--qwen35", action="store_true")
ap.add_argument("--ways", default="sdpa,scan,definition,no mask,one graph")
ap.add_argument("--json")
args = ap.parse_args()
if args.quick:
    args.lengths, args.steps = "2048,4096", 2
dev = torch.device(args.device)
dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
cuda = dev.type == "cuda"


def sync():
    if cuda:
        torch.cuda.synchronize()


# The mask functions timed: what each registered function takes and allocates per call.
mask_calls = []


def timed(fn):
    def wrapper(*a, **kw):
        sync()
        before = torch.cuda.memory_allocated() if cuda else 0
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        held = out.untyped_storage().nbytes() if isinstance(out, torch.Tensor) else 0
        grown = (torch.cuda.memory_allocated() - before) if cuda else held
        mask_calls.append((ms, max(held, grown)))
        return out
    return wrapper


mu.AttentionMaskInterface._global_mapping["sdpa"] = timed(mu.sdpa_mask)
mu.AttentionMaskInterface._global_mapping["masklens"] = timed(mlt.masklens_mask)

# Masks read from their definition that the layers built after all (a call that keeps the
# mask): counted, since the mask function's own bytes do not show them.
builds = [0]
_materialise = mlt.DefinedMask.materialise


def counted_materialise(self, why):
    builds[0] += not self.built
    return _materialise(self, why)


mlt.DefinedMask.materialise = counted_materialise


def make(cfg, impl, state=None):
    return llama_like.make(cfg, impl, dev, dtype, state)


def grad_norm(model):
    return torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None)).item()


def step(model, inputs):
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    return grad_norm(model)


def run_way(cfg, state, way, inputs):
    impl = "sdpa" if way in ("sdpa", "no mask") else "masklens"
    mlt.from_definition = way != "scan"
    if way == "no mask":
        inputs = {k: v for k, v in inputs.items() if k not in ("attention_mask", "position_ids")}
    model = make(cfg, impl, state)
    one_graph = way == "one graph"
    if one_graph:
        # The op times itself (graph_definition.timings): a timed mask function would break the graph.
        mu.AttentionMaskInterface._global_mapping["masklens"] = mlt.masklens_mask
        mt.set_one_graph(True)
        torch._dynamo.reset()
        # transformers' hub-kernels layer sets a context variable in each checkpointed layer's
        # forward, which Dynamo refuses inside torch.utils.checkpoint unless told not to
        # replay it in the backward (as its own message suggests); masklens mutates nothing there.
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
        model = torch.compile(model, backend="inductor" if cuda else "aot_eager", fullgraph=True)
        # What transformers sets under gradient checkpointing, given here: its warning would break the graph.
        inputs = {**inputs, "use_cache": False}
    row = {"way": way}
    try:
        for _ in range(args.warm):
            step(model, inputs)
        # One graph: a forward that decides FlexAttention for a graph without that branch
        # runs the dense one and asks for it; the next forward compiles it. Warm until no
        # forward asks for another branch, so the timed steps compile nothing.
        while one_graph:
            forms = one_graph_forms.graph_forms
            step(model, inputs)
            if one_graph_forms.graph_forms == forms:
                break
        times, norms = [], []
        mask_calls.clear()
        graph_definition.timings.clear()
        builds[0] = 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(args.steps):
            sync()
            t0 = time.perf_counter()
            norms.append(step(model, inputs))
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        if one_graph:
            mask_calls.extend(graph_definition.timings)
        row.update(step_ms=statistics.median(times), grad_norm=norms[-1],
                   peak_gb=(torch.cuda.max_memory_allocated() / 1e9) if cuda else None,
                   mask_ms=statistics.median(ms for ms, _ in mask_calls) if mask_calls else 0.0,
                   mask_bytes=max((b for _, b in mask_calls), default=0), layer_builds=builds[0],
                   masks=[how for how, _ in mlt.masks()[-1:]] if impl == "masklens" else None)
    except torch.OutOfMemoryError as e:
        row["error"] = f"out of memory: {str(e).splitlines()[0][:120]}"
    finally:
        del model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        if one_graph:
            mt.set_one_graph(False)
            mu.AttentionMaskInterface._global_mapping["masklens"] = timed(mlt.masklens_mask)
            torch._dynamo.reset()
    mlt.from_definition = True
    return row


def true_norm_packed(cfg, state, inputs, docs=4):
    """The packed batch's gradient norm with each document trained as its own sequence
    (plain causal, the same weights): the loss is the same mean over the same tokens."""
    model = make(cfg, "sdpa", state)
    ids, pos = inputs["input_ids"], inputs["position_ids"]
    starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
    total = sum(max(e - s - 1, 0) for s, e in zip(starts, starts[1:]))
    model.zero_grad(set_to_none=True)
    for s, e in zip(starts, starts[1:]):
        if e - s < 2:
            continue
        part = ids[:, s:e]
        loss = model(input_ids=part, labels=part).loss * ((e - s - 1) / total)
        loss.backward()
    norm = grad_norm(model)
    del model
    gc.collect()
    return norm


rows = []
ways = [w for w in args.ways.split(",") if w]  # --ways "" with --qwen35: Qwen3.5 alone
for L in (int(x) for x in args.lengths.split(",") if ways):
    cfg = config(L)
    torch.manual_seed(0)
    state = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).state_dict()
    for kind in BATCHES:
        inputs = llama_like.batch(kind, L, dev)
        ref = true_norm_packed(cfg, state, inputs) if kind == "packed" else None
        for way in ways:
            row = {"length": L, "batch": kind, **run_way(cfg, state, way, inputs)}
            if ref is not None and "grad_norm" in row:
                row["true_grad_norm"] = ref
            rows.append(row)
            print(json.dumps(row), flush=True)

if args.qwen35 and hasattr(transformers, "Qwen3_5TextConfig"):
    L = max(int(x) for x in args.lengths.split(","))
    cfg = transformers.Qwen3_5TextConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                                         vocab_size=1024, max_position_embeddings=L,
                                         layer_types=["linear_attention", "full_attention"] * 2)
    torch.manual_seed(0)
    state = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).state_dict()
    inputs = llama_like.batch("packed", L, dev)
    row = {"length": L, "batch": "packed", "model": "qwen3.5", **run_way(cfg, state, "definition", inputs)}
    try:
        row["true_grad_norm"] = true_norm_packed(cfg, state, inputs)
    except torch.OutOfMemoryError:
        row["true_grad_norm"] = None
    rows.append(row)
    print(json.dumps(row), flush=True)

print(f"\n{'length':>7} {'batch':<7} {'way':<11} {'mask ms':>8} {'mask MB':>9} {'step ms':>9} {'peak GB':>8} "
      f"{'grad norm':>10} {'true':>10}")
for r in rows:
    if "error" in r:
        print(f"{r['length']:>7} {r['batch']:<7} {r['way']:<11} {r['error']}")
        continue
    peak = f"{r['peak_gb']:.2f}" if r.get("peak_gb") is not None else "-"
    true = f"{r['true_grad_norm']:.4f}" if r.get("true_grad_norm") else "-"
    print(f"{r['length']:>7} {r['batch']:<7} {r['way']:<11} {r['mask_ms']:>8.3f} {r['mask_bytes'] / 1e6:>9.1f} "
          f"{r['step_ms']:>9.1f} {peak:>8} {r['grad_norm']:>10.4f} {true:>10}")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                   "transformers": transformers.__version__, "rows": rows}, f, indent=1)
