"""The drop-in's Python overhead per call: masklens.torch.scaled_dot_product_attention
beside the bare torch call it stands for, on tensors so small that the kernel costs
next to nothing, so the difference is the drop-in's own host work.

  cached       the same mask again (no scan, no decision): a causal mask [1, 1, L, L]
               and [L, L] (dropped for is_causal=True) against F.sdpa(is_causal=True);
               a mask whose rows 0..3 attend to nothing (the decided call, then those
               rows zeroed) and a sliding window, each against F.sdpa(attn_mask=mask)
  first call   masklens.forget(mask) before each call: scan + classify + decide + the
               call, against the same baseline
  switches     selecting one SDPA kernel for a call: the sdpa_kernel context manager
               against the torch.backends.cuda switches the drop-in sets (no kernel
               runs; process state only, so measurable on the CPU)

Each figure is the median over rounds of the mean of N calls; baseline and drop-in
alternate within every round. On CUDA the N calls are followed by one synchronisation:
with kernels this small the host is what the time measures.

usage: python3 bench/dropin_overhead.py [--device cpu|cuda] [--calls N] [--rounds R] [--json OUT]
Run against the in-tree build with PYTHONPATH=build-dir/python (bench/README.md).
"""
import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import masklens
from masklens import _run
from masklens.torch import inspect as dropin_policy
from masklens.torch import scaled_dot_product_attention as dropin

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--calls", type=int, default=2000, help="calls per round")
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--json", help="write the results here")
ARGS = parser.parse_args()
DEV = ARGS.device
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
B, H, L, D = 1, 2, 16, 16


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def per_call_us(fn, calls):
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def compare(baseline, candidate, calls=None):
    """Median per-call µs of each over the rounds, the two alternating within a round."""
    calls = calls or ARGS.calls
    for fn in (baseline, candidate):  # warm-up: first calls, caches, allocator
        for _ in range(min(calls, 200)):
            fn()
    base, cand = [], []
    for _ in range(ARGS.rounds):
        base.append(per_call_us(baseline, calls))
        cand.append(per_call_us(candidate, calls))
    return statistics.median(base), statistics.median(cand)


def main():
    if DEV == "cpu":
        torch.set_num_threads(1)  # tensors this small run on one thread anyway; no pool to wake
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device=DEV, dtype=DTYPE, generator=g) for _ in range(3))
    i = torch.arange(L, device=DEV)
    causal = (i[None, :] <= i[:, None])[None, None]
    masks = {
        "causal (dropped: is_causal=True)": (causal, dict(is_causal=True)),
        "causal as a 2-D [L, L] mask (dropped)": (causal[0, 0], dict(is_causal=True)),
        "causal, rows 0..3 attend to nothing": (causal & (i[None, :] >= 4), None),
        "sliding window 4": (causal & (i[:, None] - i[None, :] < 4), None),
    }
    report = {"date": time.strftime("%Y-%m-%d"), "device": DEV, "cpu": cpu_name(), "cores": os.cpu_count(),
              "gpu": torch.cuda.get_device_name() if DEV == "cuda" else None, "torch": torch.__version__,
              "masklens": masklens.__file__, "tensors": [B, H, L, D], "dtype": str(DTYPE), "calls": ARGS.calls,
              "rounds": ARGS.rounds, "load": os.getloadavg(), "rows": {}}
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))
    print(f"\n{'case':58s} {'bare':>9s} {'drop-in':>9s} {'overhead':>9s}  (µs per call)")

    def row(name, base, cand, **extra):
        report["rows"][name] = {"bare_us": base, "dropin_us": cand, "overhead_us": cand - base, **extra}
        more = "  ".join(f"{k} {v}" for k, v in extra.items())
        print(f"{name:58s} {base:9.2f} {cand:9.2f} {cand - base:9.2f}  {more}")

    with torch.no_grad():
        for name, (mask, bare_kwargs) in masks.items():
            bare_kwargs = bare_kwargs or dict(attn_mask=mask)
            policy, verdict = dropin_policy(q, k, v, mask)
            before = masklens.scan_count()
            base, cand = compare(lambda: F.scaled_dot_product_attention(q, k, v, **bare_kwargs),
                                 lambda: dropin(q, k, v, attn_mask=mask))
            row(f"cached: {name}", base, cand, backend=policy.backend + (" plan" if policy.is_plan else ""),
                scans=masklens.scan_count() - before)
        for name, (mask, bare_kwargs) in list(masks.items())[:1]:
            def first_call():
                masklens.forget(mask)
                return dropin(q, k, v, attn_mask=mask)
            before = masklens.scan_count()
            calls = max(1, ARGS.calls // 10)
            base, cand = compare(lambda: F.scaled_dot_product_attention(q, k, v, **bare_kwargs), first_call, calls)
            row(f"first call: {name}", base, cand,
                scans_per_call=(masklens.scan_count() - before) / (ARGS.rounds * calls + min(calls, 200)))

    if not hasattr(_run, "_sdpa_on_kernels"):  # a masklens from before the switches (a "before" run)
        return finish(report)
    kernels, flags = [SDPBackend.CUDNN_ATTENTION], _run.SDPA_KERNEL_FLAGS["torch.sdpa.cudnn"]

    def context():
        with sdpa_kernel(kernels):
            pass

    def switches():
        _run._sdpa_on_kernels(flags, q, k, v, None, 0.0, False, None, False)
    real = _run.F.scaled_dot_product_attention
    _run.F.scaled_dot_product_attention = lambda *a, **kw: None  # the switches alone, no kernel
    try:
        base, cand = compare(context, switches)
    finally:
        _run.F.scaled_dot_product_attention = real
    row("switches: sdpa_kernel context (bare) vs the drop-in's", base, cand)
    finish(report)


def finish(report):
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
