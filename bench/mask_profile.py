"""Where the registered mask function's host time goes, warm: a profile of one call.

Trains the zero_byte model (bench/llama_like.py) one step on each batch (packed: 4
documents through position_ids; padded: the first 1/16 of the tokens left-padded) to
capture the arguments transformers hands masklens_mask, then, per batch, the same call
repeated back to back:
  mask function                  masklens_mask alone (on a GPU the tables' read is
                                 enqueued and not waited for: defer_reads' default)
  mask function + first layer    and the DefinedMask's outcome(), what the first attention
                                 layer waits for (the read's copy, definition.hpp's rows
                                 and classification)
Each: the median host time of --calls calls after 50 warm ones (the queue drained before
and after, never inside), then cProfile's top --top functions by their own time over as
many calls. The baseline is mask_cost.py's "warm" with the read inside the mask function
(defer_reads = "never"), which --never gives here.

usage: python3 bench/mask_profile.py [--length 32768] [--calls 300] [--top 22] [--device cuda|cpu] [--never]
  on the CPU the model is smaller (hidden 256, 2 layers) and --length defaults to 1024.
"""
import argparse
import cProfile
import pstats
import statistics
import time

import torch
import transformers.masking_utils as mu

import masklens.transformers as mlt

import llama_like

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--length", type=int)
ap.add_argument("--calls", type=int, default=300)
ap.add_argument("--top", type=int, default=22)
ap.add_argument("--never", action="store_true", help="read the tables inside the mask function (the baseline)")
args = ap.parse_args()
dev = torch.device(args.device)
cuda = dev.type == "cuda"
L = args.length or (32768 if cuda else 1024)
if args.never:
    mlt.defer_reads = "never"


def sync():
    if cuda:
        torch.cuda.synchronize()


model = llama_like.make(llama_like.config(L, small=not cuda), "masklens", dev,
                        torch.bfloat16 if cuda else torch.float32)
for kind in llama_like.BATCHES:
    captured = {}

    def grab(*a, **kw):
        captured.update(args=a, kwargs=kw)
        return mlt.masklens_mask(*a, **kw)
    mu.AttentionMaskInterface._global_mapping["masklens"] = grab
    model(**llama_like.batch(kind, L, dev)).loss.backward()
    mu.AttentionMaskInterface._global_mapping["masklens"] = mlt.masklens_mask

    def call():
        return mlt.masklens_mask(*captured["args"], **captured["kwargs"])
    for name, fn in (("mask function", call), ("mask function + first layer", lambda: call().outcome())):
        for _ in range(50):
            fn()
        sync()
        times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        sync()
        print(f"== {kind} {L} {name}: warm median {statistics.median(times):.4f} ms, {mlt.masks()[-1]}", flush=True)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        sync()
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
