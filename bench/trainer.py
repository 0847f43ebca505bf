"""transformers' Trainer with attn_implementation="masklens" against "sdpa", in one run.

SFT-style training of models built from configs (random weights, nothing downloaded) on
random tokens whose lengths are drawn log-normal (median --median, clipped to
[--min-len, --max-len]), for --steps steps each:
  padding     Llama, dynamic padding (each batch right-padded to its longest)
  packing     Llama, padding-free: DataCollatorWithFlattening (one row, position_ids)
  sliding     Mistral with a --window sliding window, dynamic padding
Per case and implementation: the losses and grad norms Trainer logs (masklens' must equal
sdpa's within bf16 tolerance: the largest relative differences are printed), the median
time per step (a callback around each optimizer step, CUDA synchronised), and scans.

usage: python3 bench/trainer.py [--device cuda|cpu] [--quick] [--cases padding,packing,sliding]
                             [--torch-compile [--compile-backend B] [--one-graph]] [--json OUT]
  --device cpu --quick: tiny fp32 models, a smoke test.
  --torch-compile: both sides with Trainer's torch_compile (Inductor, or --compile-backend);
  --one-graph: masklens' side in one graph (masklens.torch.set_one_graph; docs/python.md).
Needs accelerate (Trainer's). Run against the in-tree build with PYTHONPATH=build-dir/python.
"""
import argparse
import copy
import json
import statistics
import tempfile
import time

import numpy as np
import torch

import masklens
import masklens._one_graph
import masklens.torch
import masklens.transformers  # noqa: F401  (registers "masklens")
from transformers import (AutoModelForCausalLM, DataCollatorWithFlattening, LlamaConfig, MistralConfig, Trainer,
                          TrainerCallback, TrainingArguments)
from transformers.trainer_callback import PrinterCallback

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--device", default="cuda")
parser.add_argument("--quick", action="store_true")
parser.add_argument("--cases", default="padding,packing,sliding")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--median", type=int, default=1500, help="median example length (tokens)")
parser.add_argument("--min-len", type=int, default=64)
parser.add_argument("--max-len", type=int, default=8192)
parser.add_argument("--window", type=int, default=1024)
parser.add_argument("--torch-compile", action="store_true", help="Trainer's torch_compile on both sides")
parser.add_argument("--compile-backend", default="inductor", help="with --torch-compile")
parser.add_argument("--one-graph", action="store_true", help="masklens decides in the compiled graph")
parser.add_argument("--json", help="write the results here")
args = parser.parse_args()
if args.one_graph and not args.torch_compile:
    parser.error("--one-graph needs --torch-compile (one graph is a way of compiling)")

cuda = args.device.startswith("cuda")
if args.quick:
    args.steps = 20
    if not cuda:
        args.batch, args.median, args.min_len, args.max_len, args.window = 4, 16, 6, 40, 8
tiny = not cuda
width = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=97) if tiny else
         dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=8, head_dim=128, vocab_size=32000))
width["max_position_embeddings"] = max(args.max_len, 256)


def examples(n, seed=0):
    g = np.random.default_rng(seed)
    lengths = np.clip(np.round(g.lognormal(np.log(args.median), 0.7, n)), args.min_len, args.max_len).astype(int)
    return [{"input_ids": (ids := g.integers(3, width["vocab_size"], m).tolist()), "labels": ids} for m in lengths]


def pad_to_longest(features):
    L = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), L, dtype=torch.long)
    labels = torch.full((len(features), L), -100)
    attention = torch.zeros(len(features), L, dtype=torch.long)
    for b, f in enumerate(features):
        n = len(f["input_ids"])
        ids[b, :n], labels[b, :n], attention[b, :n] = torch.tensor(f["input_ids"]), torch.tensor(f["labels"]), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": attention}


CASES = {
    "padding": (lambda: LlamaConfig(**width), pad_to_longest),
    "packing": (lambda: LlamaConfig(**width), DataCollatorWithFlattening(return_position_ids=True)),
    "sliding": (lambda: MistralConfig(**width, sliding_window=args.window), pad_to_longest),
}


class StepTimer(TrainerCallback):
    def __init__(self):
        self.times, self.t0 = [], None

    def on_step_begin(self, *a, **k):
        if cuda:
            torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def on_step_end(self, *a, **k):
        if cuda:
            torch.cuda.synchronize()
        self.times.append((time.perf_counter() - self.t0) * 1e3)


def train(case, impl, data):
    make_config, collator = CASES[case]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(make_config()), attn_implementation=impl).float()
    timer = StepTimer()
    compiled = {}
    if args.torch_compile:
        torch._dynamo.reset()  # each side compiles from nothing (its first step says so),
        masklens._one_graph.graph_forms = masklens._one_graph.DEFAULT_FORMS  # without a flex branch yet
        compiled = dict(torch_compile=True, torch_compile_backend=args.compile_backend)
    masklens.torch.set_one_graph(args.one_graph and impl == "masklens")
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, per_device_train_batch_size=args.batch, max_steps=args.steps,
                                  logging_steps=1, learning_rate=3e-4, seed=0, report_to=[], save_strategy="no",
                                  use_cpu=not cuda, bf16=cuda, disable_tqdm=True, dataloader_num_workers=0,
                                  remove_unused_columns=False, **compiled)
        trainer = Trainer(model=model, args=targs, train_dataset=data, data_collator=collator, callbacks=[timer])
        trainer.remove_callback(PrinterCallback)  # the per-step logs: compared below instead
        before = masklens.scan_count()
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {"loss": [h["loss"] for h in logs], "grad_norm": [h["grad_norm"] for h in logs],
            "step_ms": statistics.median(timer.times[2:] or timer.times), "first_step_ms": timer.times[0],
            "scans": masklens.scan_count() - before}


def relative(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b) / (np.abs(b) + 1e-12)))


data = examples(args.steps * args.batch)
results = {}
compile_note = (f"; torch_compile ({args.compile_backend}{', masklens in one graph' if args.one_graph else ''})"
                if args.torch_compile else "")
print(f"Trainer, {args.steps} steps of {args.batch} examples (lengths log-normal, median {args.median}, "
      f"[{args.min_len}, {args.max_len}]), {'bf16 on ' + args.device if cuda else 'fp32 on the CPU'}{compile_note}")
for case in args.cases.split(","):
    ref = train(case, "sdpa", data)
    ours = train(case, "masklens", data)
    results[case] = {"sdpa": ref, "masklens": ours, "loss_rel": relative(ours["loss"], ref["loss"]),
                     "grad_norm_rel": relative(ours["grad_norm"], ref["grad_norm"]),
                     "speedup": ref["step_ms"] / ours["step_ms"]}
    r = results[case]
    print(f"  {case:8s} sdpa {ref['step_ms']:8.2f} ms/step  masklens {ours['step_ms']:8.2f} ms/step  "
          f"({r['speedup']:.2f}x; first steps {ref['first_step_ms']:.0f} / {ours['first_step_ms']:.0f} ms)  "
          f"scans {ours['scans']}  max rel. difference: loss {r['loss_rel']:.2g}, grad norm {r['grad_norm_rel']:.2g}")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"config": vars(args), "results": results}, f, indent=1)
