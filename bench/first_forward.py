"""The process's first forward with attn_implementation="masklens" on a GPU: what CUDA's
lazy loading of masklens' kernels costs it, and what loading them ahead saves.

Each mode runs in a fresh process (its first forward is the process's first scan), a
Llama of --layers layers on a left-padded batch (the mask is scanned on the device):
  lazy         masklens.transformers.preload_kernels = False: the first scan loads them
  background   the default: the mask function, seeing the CUDA device first, loads them
               on a background thread while transformers builds the mask
  start-up     masklens.load_kernels() after the model is on its device (not timed)
The forward before it warms torch (its own kernels, cuBLAS) with attn_implementation=
"sdpa" on the same batch, so that only masklens' first call differs. Per mode: the first
masklens forward, the second (warm), and masklens.last_timing() of the first scan
(scan_ms, kernels_ms), the medians of --runs processes.

usage: python3 bench/first_forward.py [--runs N] [--L N] [--json OUT]
Run against the in-tree build with PYTHONPATH=build-dir/python (bench/README.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--runs", type=int, default=5, help="processes per mode")
parser.add_argument("--L", type=int, default=4096)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--json", help="write the results here")
parser.add_argument("--child", choices=["lazy", "background", "start-up"], help=argparse.SUPPRESS)
args = parser.parse_args()


def child(mode):
    import torch
    import masklens
    import masklens.transformers
    from transformers import AutoModelForCausalLM, LlamaConfig
    masklens.transformers.preload_kernels = mode == "background"
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=8, head_dim=128, vocab_size=32000,
                         max_position_embeddings=args.L)
    torch.manual_seed(0)
    models = {impl: AutoModelForCausalLM.from_config(config, attn_implementation=impl).cuda().bfloat16()
              for impl in ("sdpa", "masklens")}
    ids = torch.randint(3, 32000, (2, args.L), device="cuda")
    attention = torch.ones(2, args.L, dtype=torch.long, device="cuda")
    attention[1, :args.L // 3] = 0
    with torch.no_grad():
        models["sdpa"](input_ids=ids, attention_mask=attention)  # torch's first calls
        torch.cuda.synchronize()
        if mode == "start-up":
            masklens.load_kernels()
        out = {}
        for name in ("first", "second"):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            models["masklens"](input_ids=ids, attention_mask=attention)
            torch.cuda.synchronize()
            out[name + "_ms"] = (time.perf_counter() - t0) * 1e3
            if name == "first":
                out["first_scan"] = masklens.last_timing()
    print(json.dumps(out))


if args.child:
    child(args.child)
    sys.exit(0)

results = {}
for mode in ("lazy", "background", "start-up"):
    runs = []
    for _ in range(args.runs):
        cmd = [sys.executable, __file__, "--child", mode, "--L", str(args.L), "--layers", str(args.layers)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    results[mode] = {
        "first_ms": statistics.median(r["first_ms"] for r in runs),
        "second_ms": statistics.median(r["second_ms"] for r in runs),
        "first_scan_ms": statistics.median(r["first_scan"]["scan_ms"] for r in runs),
        "first_kernels_ms": statistics.median(r["first_scan"].get("kernels_ms", 0.0) for r in runs),
    }
print(f"first forward of a {args.layers}-layer Llama, 2 x {args.L} left-padded, bf16, no grad; "
      f"median of {args.runs} processes")
for mode, r in results.items():
    print(f"  {mode:10s} first {r['first_ms']:8.2f} ms  second {r['second_ms']:8.2f} ms  first scan "
          f"{r['first_scan_ms']:.3f} ms (kernels {r['first_kernels_ms']:.3f} ms)")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"config": vars(args), "results": results}, f, indent=1)
