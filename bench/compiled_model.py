"""torch.compile(model) with attn_implementation="masklens" against "sdpa", in one run.

A Llama-like model (4 layers, 8 heads of 128, random weights from a config), batch
4 x 8192 left-padded (padding drawn per step from --pads), forward + backward in bf16:
compiled sdpa, compiled masklens (the mask proven outside the graph once per forward,
the layers given None / a BlockMask / varlen rows / the dense mask: docs/python.md,
"Compiled models"), and both eager. Each side's step time is the median over --steps
steps after --warm warm-up steps (compiles included only there); the first step
(compile) is reported apart. Also: the form the layers got, scans per forward, graph
breaks on the timed steps (must be 0: no recompile for a new padding), and the largest
logits difference on real tokens against compiled sdpa. Goal (issue 31): compiled
masklens >= 1.3x compiled sdpa. --one-graph adds compiled masklens in one graph
(masklens.torch.set_one_graph: decided by an op of the graph, torch.cond over the
forms, no graph break), compiled with fullgraph=True.

usage: python3 bench/compiled_model.py [--device cuda|cpu] [--quick] [--one-graph] [--json OUT]
  --device cpu --quick: a tiny model on the CPU (Dynamo's aot_eager backend), a smoke test.
Run against the in-tree build with PYTHONPATH=build-dir/python (bench/README.md).
"""
import argparse
import copy
import json
import statistics
import time

import torch

import masklens
import masklens._one_graph as one_graph
import masklens.torch as mt
import masklens.transformers  # noqa: F401  (registers "masklens")
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--device", default="cuda")
parser.add_argument("--quick", action="store_true", help="a tiny model on few steps (a smoke test)")
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--L", type=int, default=8192)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--warm", type=int, default=2)
parser.add_argument("--pads", default="0,1200,2800,5000", help="left padding per batch row (each step shifts it)")
parser.add_argument("--backend", help="torch.compile backend (default: inductor; aot_eager with --device cpu --quick)")
parser.add_argument("--one-graph", action="store_true", help="also compiled masklens in one graph (fullgraph=True)")
parser.add_argument("--json", help="write the results here")
args = parser.parse_args()

device = torch.device(args.device)
cuda = device.type == "cuda"
if args.quick:
    args.steps, args.warm = 3, 1
    if not cuda:
        args.L, args.batch = 64, 4
        args.pads = "0,5,17,30"
backend = args.backend or ("aot_eager" if not cuda and args.quick else "inductor")
dtype = torch.bfloat16 if cuda else torch.float32
tiny = not cuda and args.quick
config = LlamaConfig(hidden_size=128 if tiny else 1024, intermediate_size=256 if tiny else 2816,
                     num_hidden_layers=args.layers, num_attention_heads=4 if tiny else 8,
                     num_key_value_heads=4 if tiny else 8, head_dim=32 if tiny else 128,
                     vocab_size=1000 if tiny else 32000, max_position_embeddings=max(args.L, 256))
pads = [int(p) for p in args.pads.split(",")]
if len(pads) < args.batch:
    pads = (pads * args.batch)[:args.batch]


def batch(step):
    """Left-padded ids and attention mask; the padding moves each step (new mask contents)."""
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(3, config.vocab_size, (args.batch, args.L), generator=g)
    attention = torch.ones(args.batch, args.L, dtype=torch.long)
    for b, p in enumerate(pads[:args.batch]):
        attention[b, :max(0, min(args.L - 1, p + 7 * (step % 5)))] = 0
    return ids.to(device), attention.to(device)


def sync():
    if cuda:
        torch.cuda.synchronize()


def step_fn(model):
    def run(ids, attention):
        logits = model(input_ids=ids, attention_mask=attention).logits
        keep = attention.bool()
        logits[keep].float().logsumexp(-1).mean().backward()
        return logits.detach()
    return run


def measure(name, model):
    run = step_fn(model)
    out = {"name": name}
    ids, attention = batch(0)
    sync()
    t0 = time.perf_counter()
    run(ids, attention)
    sync()
    out["first_step_ms"] = (time.perf_counter() - t0) * 1e3
    for s in range(1, args.warm):
        run(*batch(s))
    sync()
    times, scans, breaks = [], 0, 0
    for s in range(args.steps):
        ids, attention = batch(args.warm + s)
        counters.clear()
        before = masklens.scan_count()
        sync()
        t0 = time.perf_counter()
        run(ids, attention)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        scans += masklens.scan_count() - before
        breaks += sum(counters["graph_break"].values())
        model.zero_grad(set_to_none=True)
    out.update(step_ms=statistics.median(times), scans_per_step=scans / args.steps, graph_breaks=breaks)
    return out


torch.manual_seed(0)
base = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa").to(device, dtype)
ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="masklens").to(device, dtype)
ours.load_state_dict(base.state_dict())

forms = []
prepare = masklens.transformers.prepare_compiled


def recording_prepare(*a, **k):
    form = prepare(*a, **k)
    forms.append(form)
    return form


masklens.transformers.prepare_compiled = recording_prepare
results = [measure("compiled sdpa", torch.compile(base, backend=backend)),
           measure("compiled masklens", torch.compile(ours, backend=backend))]
form = forms[-1] if forms else None
form_name = ("None (is_causal)" if form is None else f"CompiledMask {form.kind}"
             if isinstance(form, mt.CompiledMask) else "dense mask")
if args.one_graph:
    # Set before compiling: Dynamo may have marked the mask function's frame as one to run
    # eagerly (it held nothing but the break), so the switch needs a fresh cache.
    torch._dynamo.reset()
    mt.set_one_graph(True)
    taken = dict(one_graph.forms_taken)
    results.append(measure("compiled one graph", torch.compile(ours, backend=backend, fullgraph=True)))
    form_name += ("; one graph's op answered " +
                  ", ".join(f"{name} {n - taken.get(name, 0)}x" for name, n in one_graph.forms_taken.items()))
    mt.set_one_graph(False)
results += [measure("eager sdpa", base), measure("eager masklens", ours)]

# Equality on real tokens: one more batch through both compiled models, no grad.
ids, attention = batch(99)
with torch.no_grad():
    a = torch.compile(base, backend=backend)(input_ids=ids, attention_mask=attention).logits.float()
    b = torch.compile(ours, backend=backend)(input_ids=ids, attention_mask=attention).logits.float()
error = (a - b).abs()[attention.bool()].max().item()

by = {r["name"]: r for r in results}
speedup = by["compiled sdpa"]["step_ms"] / by["compiled masklens"]["step_ms"]
one_graph_speedup = by["compiled sdpa"]["step_ms"] / by["compiled one graph"]["step_ms"] if args.one_graph else None
print(f"{args.batch} x {args.L} left-padded {pads[:args.batch]}, {args.layers} layers, {config.num_attention_heads} "
      f"heads of {config.head_dim}, {dtype}, {device}, backend {backend}; forward + backward")
for r in results:
    print(f"  {r['name']:18s} {r['step_ms']:9.2f} ms/step  (first step {r['first_step_ms']:9.1f} ms)  "
          f"scans/step {r['scans_per_step']:.1f}  graph breaks on timed steps {r['graph_breaks']}")
print(f"  compiled masklens vs compiled sdpa: {speedup:.2f}x (goal >= 1.3x); layers got: {form_name}; "
      f"max |logits difference| on real tokens {error:.3g}")
if one_graph_speedup is not None:
    print(f"  compiled one graph vs compiled sdpa: {one_graph_speedup:.2f}x")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"config": vars(args), "backend": backend, "results": results, "speedup": speedup,
                   "one_graph_speedup": one_graph_speedup, "form": form_name, "max_logits_difference": error}, f,
                  indent=1)
