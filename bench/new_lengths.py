"""A training loop whose lengths change every step (issue 31, docs/python.md "Lengths that
change"): masklens.torch.scaled_dot_product_attention against the dense default (torch's
F.scaled_dot_product_attention with the same dense mask), step by step, in one run.

Each step draws a new length (from --min-len to --max-len, at least one past 32768 by
default), builds a new dense bool sliding-window mask [1, 1, L, L] (--window 4096) and
new q, k, v [1, H, L, D] (bf16 on the GPU); train steps (forward + backward) and eval
steps (forward under torch.no_grad()) alternate. Every step is timed whole, as a user
sees it: wall clock between two synchronisations, the first call of each length
included (a scan, a decision, a compile where one happens). The dense default runs the
step first, then the drop-in on the same tensors; the mask is built outside the timing.
Each row prints both, their ratio, the drop-in's backend and its largest difference
from the dense default's output; the totals follow, with the flex compiles per bucket.
The goals it reports on (no assertion: a benchmark, not a test): every step no slower
than the dense default, and the whole loop at least 5x faster at 32768+ tokens.

--available flex decides as if FlexAttention were the only backend (the worst case for
compiles: every step runs flex); --compile-ms sets the compile cost decide() charges a
cold bucket (masklens._flex.set_flex_compile_ms).

usage: python3 bench/new_lengths.py [--device cuda|cpu] [--quick] [--steps N] [--min-len N] [--max-len N]
                                    [--window N] [--heads N] [--dim N] [--available torch,flex] [--compile-ms MS]
                                    [--seed N] [--json OUT]
CPU smoke test of the script: python3 bench/new_lengths.py --device cpu --quick
Run against the in-tree build with PYTHONPATH=build-dir/python (bench/README.md).
"""
import argparse
import json
import random
import time

import torch
import torch.nn.functional as F

import masklens
from masklens import _env, _flex
from masklens.torch import inspect
from masklens.torch import scaled_dot_product_attention as dropin

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--quick", action="store_true",
                    help="a short loop (on the CPU: 6 steps of 160 to 640 tokens, a 48 window, 2 heads of 16)")
parser.add_argument("--steps", type=int, help="new lengths in the loop (default 16; --quick 6)")
parser.add_argument("--min-len", type=int, help="shortest length (default 16384)")
parser.add_argument("--max-len", type=int, help="longest length (default 36864; one step at least is past 32768)")
parser.add_argument("--window", type=int, help="sliding window (default 4096)")
parser.add_argument("--heads", type=int, help="heads (default 4)")
parser.add_argument("--dim", type=int, help="head dim (default 128)")
parser.add_argument("--available", help="decide as if only these families were installed (e.g. flex)")
parser.add_argument("--compile-ms", type=float, help="the cost decide() charges a cold flex bucket")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--json", help="write the rows and totals here")
args = parser.parse_args()

DEV = torch.device(args.device)
CPU_SMOKE = DEV.type == "cpu" and args.quick
STEPS = args.steps or (6 if args.quick else 16)
MIN_LEN = args.min_len or (160 if CPU_SMOKE else 16384)
MAX_LEN = args.max_len or (640 if CPU_SMOKE else 36864)
WINDOW = args.window or (48 if CPU_SMOKE else 4096)
HEADS = args.heads or (2 if CPU_SMOKE else 4)
DIM = args.dim or (16 if CPU_SMOKE else 128)
DTYPE = torch.bfloat16 if DEV.type == "cuda" else torch.float32


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize(DEV)


def lengths():
    """STEPS distinct lengths between MIN_LEN and MAX_LEN, seeded, not multiples of 128
    but by chance (as dynamic padding gives them), the longest past 32768 where the range
    reaches it; in the order drawn."""
    rng = random.Random(args.seed)
    drawn = set()
    while len(drawn) < STEPS:
        drawn.add(rng.randint(MIN_LEN, MAX_LEN))
    out = list(drawn)
    rng.shuffle(out)
    if MAX_LEN > 32768 and max(out) <= 32768:
        out[-1] = rng.randint(32769, MAX_LEN)
    return out


def window_mask(n):
    i = torch.arange(n, device=DEV)
    return ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < WINDOW))[None, None]


def step(attention, q, k, v, mask, train):
    """One attention step, timed whole: (ms, output)."""
    sync()
    t0 = time.perf_counter()
    if train:
        out = attention(q, k, v, attn_mask=mask)
        out.backward(torch.ones_like(out))
    else:
        with torch.no_grad():
            out = attention(q, k, v, attn_mask=mask)
    sync()
    return (time.perf_counter() - t0) * 1e3, out.detach()


def tensors(n, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(1, HEADS, n, DIM, device=DEV, dtype=DTYPE, generator=g).requires_grad_() for _ in range(3)]


def fresh(ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def warm_up_process():
    """The process's own first calls (CUDA context, kernels' modules, masklens' import)
    at a length no step uses: neither side pays them inside the loop."""
    n = 256
    q, k, v = tensors(n, 12345)
    mask = window_mask(n)
    for attention in (F.scaled_dot_product_attention, dropin):
        for train in (True, False):
            step(attention, *fresh((q, k, v)), mask, train)
    masklens.forget()


def decide_with(available):
    """The drop-in decides as if only `available` were installed (on the CPU, as on an
    sm90 GPU: the CPU's own environment runs torch's math kernel only)."""
    real = _env.environment
    extra = {"available": set(available.split(","))}
    if DEV.type == "cpu":
        extra["sm"] = 90
    _env.environment = lambda *a, **kw: real(*a, **{**kw, **extra})


def main():
    warm_up_process()  # as installed: the forced environment below would compile flex here
    if args.available:
        decide_with(args.available)
    if args.compile_ms is not None:
        _flex.set_flex_compile_ms(args.compile_ms)
    print(f"new lengths: {STEPS} steps, {MIN_LEN}..{MAX_LEN} tokens, window {WINDOW}, 1 x {HEADS} x L x {DIM} "
          f"{str(DTYPE).replace('torch.', '')} on {DEV}; train and eval steps alternate; torch {torch.__version__}"
          + (f"; decided as if only {args.available} were installed" if args.available else ""))
    rows = []
    header = f"{'step':>4} {'L':>6} {'mode':>5} {'dense ms':>10} {'masklens ms':>12} {'x':>6}  {'backend':<24} {'max err':>8}"
    print(header)
    for i, n in enumerate(lengths()):
        train = i % 2 == 0
        mask = window_mask(n)
        q, k, v = tensors(n, i)
        dense_ms, ref = step(F.scaled_dot_product_attention, *fresh((q, k, v)), mask, train)
        ours = fresh((q, k, v))
        ours_ms, out = step(dropin, *ours, mask, train)
        with torch.enable_grad() if train else torch.no_grad():
            policy, _ = inspect(*ours, mask)  # the decision the step ran (cached: no scan)
        backend = policy.backend + (" (plan)" if policy.is_plan else "") if policy is not None else "torch"
        err = (out.float() - ref.float()).abs().max().item()
        rows.append({"step": i, "L": n, "train": train, "dense_ms": dense_ms, "masklens_ms": ours_ms,
                     "backend": backend, "max_err": err})
        print(f"{i:>4} {n:>6} {'train' if train else 'eval':>5} {dense_ms:>10.1f} {ours_ms:>12.1f} "
              f"{dense_ms / ours_ms:>6.2f}  {backend:<24} {err:>8.1e}", flush=True)
        masklens.forget(mask)
        del mask, q, k, v, ours, out, ref
    dense_total = sum(r["dense_ms"] for r in rows)
    ours_total = sum(r["masklens_ms"] for r in rows)
    slower = [r["step"] for r in rows if r["masklens_ms"] > r["dense_ms"]]
    long = [r for r in rows if r["L"] > 32768]
    compiles = {f"{k[-1]}": n for k, n in _flex.flex_compiles().items()}
    print(f"total: dense {dense_total:.0f} ms, masklens {ours_total:.0f} ms, {dense_total / ours_total:.2f}x "
          f"(goal >= 5x at 32768+ tokens)")
    if long:
        d, o = sum(r["dense_ms"] for r in long), sum(r["masklens_ms"] for r in long)
        print(f"steps past 32768 tokens: dense {d:.0f} ms, masklens {o:.0f} ms, {d / o:.2f}x")
    print(f"steps where masklens was slower than the dense default: {slower or 'none'} (goal: none)")
    print(f"flex compiles per length bucket: {compiles or 'none'}; broken buckets: "
          f"{[b.key[-1] for b in _flex._flex_buckets.values() if b.broken] or 'none'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"steps": STEPS, "min_len": MIN_LEN, "max_len": MAX_LEN, "window": WINDOW,
                                  "heads": HEADS, "dim": DIM, "dtype": str(DTYPE), "device": str(DEV),
                                  "available": args.available, "torch": torch.__version__},
                       "rows": rows, "dense_total_ms": dense_total, "masklens_total_ms": ours_total,
                       "slower_steps": slower, "flex_compiles": compiles}, f, indent=1)


if __name__ == "__main__":
    main()
