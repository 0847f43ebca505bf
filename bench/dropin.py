"""The Python drop-in on the GPU: masklens.torch.scaled_dot_product_attention and
attn_implementation="masklens", each beside its baseline measured in the same run.

  seed        1 x 4 x 69632 x 256 bf16, dense bool causal mask [1, 1, L, L], forward +
              backward: F.sdpa with the mask (default dispatch; forced to the efficient
              kernel, whose result is wrong), is_causal=True bare (default dispatch, and
              forced to the kernel the drop-in runs), the drop-in on its first call
              (device scan + classify + decide + the call) and cached (no scan), with
              the masklens step split from masklens.last_timing().
  ab          the seed shape again: the drop-in's cached call against bare is_causal=True,
              forward + backward, in --ab-pairs interleaved pairs (each pair's order
              alternates), CUDA events; the median of the per-pair ratios (goal: within
              1 % of bare is_causal) and the scans in the pairs (must be 0).
  structures  1 x 4 x 69632 x 128 bf16, forward + backward: three packed documents, a
              4096 sliding window, left-padded causal (1000 pad rows): the drop-in vs
              the dense mask on the default dispatch and vs the best native call,
              errors against that native call (rows that attend to something).
  llama       a 28-layer Llama of tiny width, 32k tokens, batch 1, left padding through
              attention_mask: forward with attn_implementation="masklens" vs "sdpa",
              scans per forward, logits difference.
  flex        (not in the default --cases) 1 x 4 x 16384 x 128 bf16, a 1024 sliding
              window with only FlexAttention available: the drop-in's first call
              (scan + decide + BlockMask + torch.compile of flex_attention), its first
              backward (compiles the backward), a new mask tensor of the same structure
              (no compile) and warm calls, beside a user's own compiled flex_attention
              measured the same way. Each side runs in a fresh process (its first call
              is the process's first compile) with Inductor's caches disabled: the
              first call of a program's first run.

Every time is the median of several runs after a warm-up (CUDA events around whole
calls, Python included: the GPU idles while the host works, and the events see it).

usage: python3 bench/dropin.py [--quick] [--json OUT] [--cases seed,ab,structures,llama,flex] [--L N] [--flex-L N]
                               [--ab-pairs N]
Run against the in-tree build with PYTHONPATH=build-dir/python (bench/README.md).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baselines import event_ms as cuda_event_ms, median_ms  # noqa: E402  (one timing loop for every bench script)
from backend_costs import flex_runner, varlen  # noqa: E402

import masklens  # noqa: E402
from masklens import _block_mask, _run  # noqa: E402
from masklens.torch import scaled_dot_product_attention as dropin  # noqa: E402

# Without CUDA the script runs its logic on the CPU at the sizes given (a smoke test of
# the script: wall-clock times, no efficient kernel, no varlen or flex baselines).
DEV = "cuda" if torch.cuda.is_available() else "cpu"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--quick", action="store_true", help="fewer repetitions (3 timed runs, 1 warm-up)")
parser.add_argument("--json", help="write the results here")
parser.add_argument("--cases", default="seed,ab,structures,llama")
parser.add_argument("--ab-pairs", type=int, default=20, help="interleaved pairs of the ab case")
parser.add_argument("--L", type=int, default=69632, help="tokens of the seed and structure cases")
parser.add_argument("--llama-L", type=int, default=32768, help="tokens of the llama case")
parser.add_argument("--no-flex", action="store_true", help="skip the compiled flex_attention baseline")
parser.add_argument("--flex-L", type=int, default=16384, help="tokens of the flex case")
parser.add_argument("--flex-part", choices=["own", "dropin"], help=argparse.SUPPRESS)  # the flex case's child run
ARGS = parser.parse_args()
REPS, WARM = (3, 1) if ARGS.quick else (7, 2)


def timed(fn, reps=REPS, warm=WARM):
    for _ in range(warm - 1):  # median_ms runs fn once itself before timing
        fn()
    if DEV == "cpu":
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return median_ms(fn, reps)


def empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def rel(a, ref):
    """||a - ref|| / ||ref|| in fp32, NaN-honest."""
    a, ref = a.float(), ref.float()
    return ((a - ref).norm() / ref.norm()).item()


def max_err(a, ref):
    return (a.float() - ref.float()).abs().max().item()


def table(title, rows, baseline_key="baseline"):
    print(f"\n{title}")
    for name, r in rows.items():
        extra = []
        if r.get(baseline_key):
            b = rows[r[baseline_key]]["ms"]
            extra.append(f"{r['ms'] / b:5.2f}x the time of '{r[baseline_key]}'")
        for k in ("rel_err", "max_err", "dq_norm", "grad_max_err", "overhead_ms", "overhead_vs_same_kernel_ms",
                  "scans_per_forward"):
            if r.get(k) is not None:
                extra.append(f"{k} {r[k]:.4g}")
        print(f"  {name:58s} {r['ms']:9.2f} ms  " + "  ".join(extra))


def qkv(L, D, H=4, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(1, H, L, D, device=DEV, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3)]


def grads_of(make_out, tensors, go):
    """forward + backward as one callable: the output and the gradients of (q, k, v)."""
    def run():
        out = make_out()
        return out, torch.autograd.grad(out, tensors, go)
    return run


def seed(report):
    L, D = ARGS.L, 256
    q, k, v = qkv(L, D)
    go = torch.randn_like(q)
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril_()[None, None]
    rows = {}
    causal = grads_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), go)
    ref_out, ref_g = causal()

    def measure(name, run, reps=REPS, baseline="F.sdpa is_causal=True (no mask)", **extra):
        ms = timed(run, reps=reps)
        out, g = run()
        rows[name] = {"ms": ms, "baseline": baseline, "rel_err": rel(out, ref_out),
                      "dq_norm": g[0].float().norm().item(),
                      "grad_max_err": max(max_err(a, b) for a, b in zip(g, ref_g)), **extra}
        del out, g

    measure("F.sdpa is_causal=True (no mask)", causal, baseline=None)
    measure("F.sdpa attn_mask, default dispatch", grads_of(
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (q, k, v), go))

    def efficient():
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if DEV == "cuda":
        measure("F.sdpa attn_mask, EFFICIENT_ATTENTION forced", grads_of(efficient, (q, k, v), go), reps=2)
        empty_cache()

    split = []

    def first_call():
        masklens.forget(mask)  # the verdict and the decision are made again: a first call
        out = dropin(q, k, v, attn_mask=mask)
        split.append(masklens.last_timing())
        return out
    measure("drop-in, first call on the mask (scan + decide + call)", grads_of(first_call, (q, k, v), go))
    where = "cuda" if mask.is_cuda and masklens.has_cuda_scan() else "host"
    assert all(t["scanned"] and t["device"] == where for t in split), split
    before = masklens.scan_count()
    measure("drop-in, cached (same mask again)", grads_of(lambda: dropin(q, k, v, attn_mask=mask), (q, k, v), go))
    cached_scans = masklens.scan_count() - before
    policy, verdict = masklens.torch.inspect(q, k, v, mask)
    same_kernel = None
    if policy.backend in _run.SDPA_KERNELS and DEV == "cuda":
        # The bare call on the kernel the drop-in runs: what is left over it is the
        # drop-in's host work, not a kernel choice (the default dispatch may pick another).
        same_kernel = f"F.sdpa is_causal=True forced to the drop-in's kernel ({policy.backend})"

        def forced():
            with sdpa_kernel(_run.SDPA_KERNELS[policy.backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        measure(same_kernel, grads_of(forced, (q, k, v), go))
    base = rows["F.sdpa is_causal=True (no mask)"]["ms"]
    for name in ("drop-in, first call on the mask (scan + decide + call)", "drop-in, cached (same mask again)"):
        rows[name]["overhead_ms"] = rows[name]["ms"] - base
        if same_kernel:
            rows[name]["overhead_vs_same_kernel_ms"] = rows[name]["ms"] - rows[same_kernel]["ms"]
    step = {k: statistics.median(t[k] for t in split) for k in ("scan_ms", "classify_ms", "decide_ms")}
    # The scan's baseline: one read of the mask's bytes (a sum over them), same device.
    read_ms = timed(lambda: mask.view(torch.uint8).sum(dtype=torch.int64))
    step["read_ms"] = read_ms
    step["runs"] = verdict.run_count
    report["seed"] = {"shape": [1, 4, L, D], "rows": rows, "step_ms": step, "scans_when_cached": cached_scans,
                      "structure": verdict.structure.describe(), "backend": policy.backend,
                      "mask_use": policy.call.mask, "scan_on": split[-1]["device"]}
    table(f"seed: 1 x 4 x {L} x {D} bf16, dense bool causal mask, forward + backward", rows)
    print(f"  masklens step (median of first calls): scan {step['scan_ms']:.3f} ms on {split[-1]['device']} "
          f"({step['scan_ms'] / read_ms:.2f}x one read of the mask, {read_ms:.3f} ms; "
          f"{step['runs']} runs to the host), "
          f"classify {step['classify_ms']:.3f} ms, decide {step['decide_ms']:.3f} ms; "
          f"decision {verdict.structure.describe()} -> {policy.backend} (mask {policy.call.mask}); "
          f"scans in {REPS + 1} cached calls: {cached_scans}")
    del mask, ref_out, ref_g
    empty_cache()


def event_ms(fn):
    """One call's time between CUDA events (wall-clock on the CPU)."""
    if DEV == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return cuda_event_ms(fn)


def ab(report):
    """The drop-in's cached call against bare is_causal on the seed shape, interleaved:
    pairs alternate which side runs first, so clock and thermal drift fall on both sides;
    the figure is the median of the per-pair ratios (a regression of a few tenths of a
    percent shows here, where two separate medians drift by more)."""
    L, D = ARGS.L, 256
    q, k, v = qkv(L, D)
    go = torch.randn_like(q)
    mask = torch.ones(L, L, dtype=torch.bool, device=DEV).tril_()[None, None]
    bare = grads_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), go)
    cached = grads_of(lambda: dropin(q, k, v, attn_mask=mask), (q, k, v), go)
    for _ in range(WARM + 1):  # the first drop-in call scans; the rest hit the cache
        bare(), cached()
    before = masklens.scan_count()
    ratios, bare_ms, dropin_ms = [], [], []
    for i in range(ARGS.ab_pairs):
        if i % 2 == 0:
            b_ms = event_ms(bare)
            d_ms = event_ms(cached)
        else:
            d_ms = event_ms(cached)
            b_ms = event_ms(bare)
        bare_ms.append(b_ms)
        dropin_ms.append(d_ms)
        ratios.append(d_ms / b_ms)
    scans = masklens.scan_count() - before
    result = {"shape": [1, 4, L, D], "pairs": ARGS.ab_pairs, "bare_ms": statistics.median(bare_ms),
              "dropin_ms": statistics.median(dropin_ms), "ratio_median": statistics.median(ratios),
              "ratio_min": min(ratios), "ratio_max": max(ratios), "scans_in_pairs": scans}
    report["ab"] = result
    print(f"\nab: 1 x 4 x {L} x {D} bf16, forward + backward, {ARGS.ab_pairs} interleaved pairs")
    print(f"  F.sdpa is_causal=True (no mask) {result['bare_ms']:9.2f} ms   "
          f"drop-in, cached {result['dropin_ms']:9.2f} ms   ratio median {result['ratio_median']:.4f}x "
          f"(min {result['ratio_min']:.4f}, max {result['ratio_max']:.4f}); scans in the pairs: {scans}")
    assert scans == 0, "the cached drop-in scanned the mask again"
    del mask
    empty_cache()


def structures(report):
    L, D = ARGS.L, 128
    W, PAD = min(4096, L // 4), min(1000, L // 8)  # smaller only in a shortened (--L) run
    q, k, v = qkv(L, D)
    i = torch.arange(L, device=DEV)
    cuts = [0, L // 3, 2 * L // 3, L]
    cu_full = torch.tensor([0, L], dtype=torch.int32, device=DEV)
    report["structures"] = {"shape": [1, 4, L, D]}

    def packed_native():
        outs = [F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True)
                for s, e in zip(cuts, cuts[1:])]
        return torch.cat(outs, dim=2)

    def padded_native():
        tail = F.scaled_dot_product_attention(q[:, :, PAD:], k[:, :, PAD:], v[:, :, PAD:], is_causal=True)
        return torch.cat([tail.new_zeros(1, 4, PAD, D), tail], dim=2)

    def window_native():
        if DEV == "cpu":  # varlen_attn is CUDA-only: the dense mask on the math kernel
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return varlen(q, k, v, cu_full, L, (W - 1, 0)).transpose(0, 1)[None]

    cases = {
        "3 packed documents": (lambda: (i[None, :] <= i[:, None]) & (
            torch.bucketize(i, torch.tensor(cuts[1:-1], device=DEV), right=True)[:, None] ==
            torch.bucketize(i, torch.tensor(cuts[1:-1], device=DEV), right=True)[None, :]),
            {"3 is_causal calls": packed_native}, 0),
        f"sliding window {W}": (lambda: (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W),
                               {"torch.varlen_attn window_size": window_native}, 0),
        f"left-padded causal, {PAD} pad rows": (lambda: (i[None, :] <= i[:, None]) & (i[None, :] >= PAD),
                                                {"is_causal on the unpadded slice": padded_native}, PAD),
    }
    if not ARGS.no_flex and DEV == "cuda":
        flex_w = flex_runner(L, lambda b, h, qi, ki: (ki <= qi) & (qi - ki < W))
        cases[f"sliding window {W}"][1]["compiled flex_attention (BlockMask)"] = lambda: flex_w(q, k, v)
    mask = None
    for title, (build, natives, empty) in cases.items():
        mask = build()[None, None]
        go = torch.randn_like(q)
        go[:, :, :empty] = 0  # rows that attend to nothing carry no gradient
        rows = {}
        dense = "dense mask, default dispatch"
        ref_name = next(iter(natives))
        ref_out, ref_g = grads_of(natives[ref_name], (q, k, v), go)()

        def measure(name, make, baseline=dense):
            run = grads_of(make, (q, k, v), go)
            ms = timed(run)
            out, g = run()
            rows[name] = {"ms": ms, "baseline": baseline, "max_err": max_err(out[:, :, empty:], ref_out[:, :, empty:]),
                          "grad_max_err": max(max_err(a, b) for a, b in zip(g, ref_g))}
            del out, g

        measure(dense, lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), baseline=None)
        for name, make in natives.items():
            measure(name, make)
        before = masklens.scan_count()
        measure("drop-in", lambda: dropin(q, k, v, attn_mask=mask))
        policy, verdict = masklens.torch.inspect(q, k, v, mask)
        best = min((n for n in rows if n not in (dense, "drop-in")), key=lambda n: rows[n]["ms"])
        rows["drop-in"]["vs_best_native"] = rows["drop-in"]["ms"] / rows[best]["ms"]
        report["structures"][title] = {"rows": rows, "reference": ref_name, "best_native": best,
                                       "structure": verdict.structure.describe(), "backend": policy.backend,
                                       "plan_calls": len(policy.plan) if policy.is_plan else 0,
                                       "scans": masklens.scan_count() - before}
        table(f"{title}: 1 x 4 x {L} x {D} bf16, forward + backward (errors vs {ref_name})", rows)
        print(f"  drop-in ran {policy.backend}" + (f" as a plan of {len(policy.plan)} calls" if policy.is_plan else "")
              + f" for {verdict.structure.describe()}; {rows['drop-in']['vs_best_native']:.2f}x of the best native "
              f"call ({best}); scans {masklens.scan_count() - before}")
        del mask, ref_out, ref_g, go
        empty_cache()


def llama(report):
    import masklens.transformers  # noqa: F401  (registers "masklens")
    from transformers import AutoModelForCausalLM, LlamaConfig

    L, PAD = ARGS.llama_L, min(1000, ARGS.llama_L // 8)
    cfg = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=28, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1024, max_position_embeddings=L)
    torch.manual_seed(0)
    models = {}
    for impl in ("sdpa", "masklens"):
        models[impl] = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation=impl).to(
            DEV, torch.bfloat16).eval()
    models["masklens"].load_state_dict(models["sdpa"].state_dict())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1024, (1, L), generator=g).to(DEV)
    attention = torch.ones(1, L, dtype=torch.long, device=DEV)
    attention[:, :PAD] = 0  # left padding
    rows, logits = {}, {}
    for impl, model in models.items():
        def forward(model=model):
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=attention).logits
        before = masklens.scan_count()
        logits[impl] = forward()
        scans = masklens.scan_count() - before
        rows[f'attn_implementation="{impl}"'] = {"ms": timed(forward), "scans_per_forward": scans,
                                                 "baseline": None if impl == "sdpa" else 'attn_implementation="sdpa"'}
    rows['attn_implementation="masklens"']["max_err"] = max_err(logits["masklens"][:, PAD:], logits["sdpa"][:, PAD:])
    report["llama"] = {"layers": 28, "tokens": L, "pad": PAD, "config": cfg, "rows": rows}
    table(f"llama: 28 layers, hidden 128, 4 heads / 2 kv heads, {L} tokens, {PAD} left-padded, bf16 forward "
          "(max_err: logits of the unpadded positions vs sdpa)", rows)
    del models, logits
    empty_cache()


def flex_part(part):
    """One side of the flex case, in a process of its own (the first call is a process's
    first compile): "own" times a user's own compiled flex_attention, "dropin" the
    drop-in with only FlexAttention available. Prints one JSON line of wall ms.

    Both sides' first forward holds the same steps, timed alike: the `torch.compile(...)`
    call (it imports Dynamo and Inductor: most of a second), the BlockMask (own:
    create_block_mask; drop-in: environment, scan, decide and masklens' BlockMask) and
    the call, whose Dynamo frame compile is read from torch._dynamo's own timers."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import compilation_time_metrics, counters
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from masklens import _env
    inductor_config.force_disable_caches = True  # compile cold: nothing from an earlier run
    L, D = ARGS.flex_L, 128
    W = min(1024, L // 4)
    training = DEV == "cuda"  # flex has no CPU backward: a CPU smoke run times forwards
    q, k, v = qkv(L, D)
    if not training:
        q, k, v = (t.detach() for t in (q, k, v))
    go = torch.randn_like(q)
    i = torch.arange(L, device=DEV)
    mask = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < W))[None, None]

    def mod(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < W)

    phases = {}  # ms spent in each step of the first forward

    def timing(name, fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + (time.perf_counter() - t0) * 1e3
        return run

    # The drop-in makes its torch.compile wrapper on its first flex call; the own side
    # makes it in its first call too, so that both first calls import Dynamo and Inductor.
    torch.compile = timing("torch.compile() call", torch.compile)

    def wall_ms(fn):
        if DEV == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if DEV == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3, out

    def first(make_out):
        fwd_ms, out = wall_ms(make_out)
        bwd_ms = wall_ms(lambda: torch.autograd.grad(out, (q, k, v), go))[0] if training else 0.0
        return fwd_ms, bwd_ms

    def warm(make_out):
        return timed(grads_of(make_out, (q, k, v), go) if training else make_out)

    def frame_compile_ms():
        return sum(compilation_time_metrics.get("_compile.compile_inner", [])) * 1e3

    result = {"L": L, "window": W, "training": training}
    if part == "own":
        compiled = []

        def own(*args, **kwargs):
            if not compiled:
                compiled.append(torch.compile(flex_attention, dynamic=False))
            return compiled[0](*args, **kwargs)
        block_mask_of = timing("BlockMask (create_block_mask)", create_block_mask)
        result["first_fwd_ms"], result["first_bwd_ms"] = first(
            lambda: own(q, k, v, block_mask=block_mask_of(mod, None, None, L, L, device=DEV)))
        result["fwd_frame_compile_ms"] = frame_compile_ms()
        result["phases_ms"] = dict(phases)
        result["new_mask_ms"] = sum(first(lambda: own(q, k, v, block_mask=create_block_mask(
            mod, None, None, L, L, device=DEV))))
        block_mask = create_block_mask(mod, None, None, L, L, device=DEV)
        result["warm_ms"] = warm(lambda: own(q, k, v, block_mask=block_mask))
    else:
        real_environment = _env.environment
        # Only flex offered (sm 90 claimed on a CPU smoke run, where flex is otherwise refused).
        only_flex = {"available": {"flex"}, **({} if DEV == "cuda" else {"sm": 90})}
        _env.environment = timing("environment", lambda *a, **kw: real_environment(*a, **{**kw, **only_flex}))
        _block_mask.flex_block_mask = timing("BlockMask (masklens tiles)", _block_mask.flex_block_mask)
        result["first_fwd_ms"], result["first_bwd_ms"] = first(lambda: dropin(q, k, v, attn_mask=mask))
        result["fwd_frame_compile_ms"] = frame_compile_ms()
        step = masklens.last_timing()
        result["phases_ms"] = {**phases, **{k: step[k] for k in ("scan_ms", "classify_ms", "decide_ms")}}
        policy, verdict = masklens.torch.inspect(q, k, v, mask)
        result["backend"], result["structure"] = policy.backend, verdict.structure.describe()
        fresh = mask.clone()  # a new tensor, the same structure: a scan and a BlockMask, nothing compiled
        result["new_mask_ms"] = sum(first(lambda: dropin(q, k, v, attn_mask=fresh)))
        before = masklens.scan_count()
        result["warm_ms"] = warm(lambda: dropin(q, k, v, attn_mask=fresh))
        result["scans_when_cached"] = masklens.scan_count() - before
    # Dynamo frames compiled and graphs made over the whole run (first call, new mask,
    # warm calls): one each where nothing recompiled.
    result["frames_compiled"] = counters["frames"]["ok"]
    result["graphs"] = counters["stats"]["unique_graphs"]
    print("FLEX_PART " + json.dumps(result), flush=True)


def flex(report):
    """First call vs warm of the drop-in running compiled FlexAttention, beside a user's
    own compiled flex_attention, each side in a fresh process (module docstring)."""
    import subprocess
    parts = {}
    for part in ("own", "dropin"):
        cmd = [sys.executable, os.path.abspath(__file__), "--flex-part", part, "--flex-L", str(ARGS.flex_L)]
        if ARGS.quick:
            cmd.append("--quick")
        run = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("FLEX_PART ")]
        if run.returncode != 0 or not lines:
            raise RuntimeError(f"flex part {part} failed ({run.returncode}):\n{run.stdout[-2000:]}\n"
                               f"{run.stderr[-4000:]}")
        parts[part] = json.loads(lines[-1][len("FLEX_PART "):])
    own, ml = parts["own"], parts["dropin"]
    assert ml["backend"] == "torch.flex_attention", ml["backend"]
    both = " + backward" if ml["training"] else ""
    own_first = "own compiled flex_attention: first call, forward (torch.compile() + BlockMask + compile)"
    rows = {
        own_first: {"ms": own["first_fwd_ms"]},
        "drop-in: first call, forward (torch.compile() + scan + decide + BlockMask + compile)": {
            "ms": ml["first_fwd_ms"], "baseline": own_first},
    }
    if ml["training"]:
        own_bwd = "own compiled flex_attention: first backward (compile)"
        rows[own_bwd] = {"ms": own["first_bwd_ms"]}
        rows["drop-in: first backward (compile)"] = {"ms": ml["first_bwd_ms"], "baseline": own_bwd}
    rows[f"own compiled flex_attention: new BlockMask, forward{both}"] = {"ms": own["new_mask_ms"]}
    rows[f"drop-in: new mask tensor, same structure (scan + BlockMask), forward{both}"] = {
        "ms": ml["new_mask_ms"], "baseline": f"own compiled flex_attention: new BlockMask, forward{both}"}
    rows[f"own compiled flex_attention: warm, forward{both}"] = {"ms": own["warm_ms"]}
    rows[f"drop-in: warm (cached), forward{both}"] = {"ms": ml["warm_ms"],
                                                    "baseline": f"own compiled flex_attention: warm, forward{both}"}
    # The first forward split into its steps (the rest: the kernel's run, guards, Python).
    split = {}
    for side, r in (("own", own), ("drop-in", ml)):
        steps = {**r["phases_ms"], "Dynamo frame compile (trace + AOT + Inductor)": r["fwd_frame_compile_ms"]}
        steps["rest"] = r["first_fwd_ms"] - sum(v for n, v in steps.items() if n != "environment")
        split[side] = steps
    report["flex"] = {"shape": [1, 4, ml["L"], 128], "window": ml["window"], "training": ml["training"],
                      "structure": ml["structure"], "scans_when_cached": ml["scans_when_cached"], "rows": rows,
                      "first_forward_split_ms": split,
                      "compiled": {side: {"frames": r["frames_compiled"], "graphs": r["graphs"]}
                                   for side, r in (("own", own), ("drop-in", ml))}}
    table(f"flex: 1 x 4 x {ml['L']} x 128 bf16, sliding window {ml['window']}, only FlexAttention available; each "
          "side in a fresh process, Inductor's caches disabled (cold compile); first calls in wall ms", rows)
    for side, steps in split.items():
        print(f"  first forward, {side}: " + ", ".join(f"{n} {v:.1f} ms" for n, v in steps.items()))
    print("  (decide_ms includes the environment; the rest is the call itself past its compile)")
    print(f"  decision {ml['structure']} -> {ml['backend']}; scans in warm calls: {ml['scans_when_cached']}; "
          f"Dynamo frames compiled / graphs: own {own['frames_compiled']} / {own['graphs']}, "
          f"drop-in {ml['frames_compiled']} / {ml['graphs']}")
    assert (ml["frames_compiled"], ml["graphs"]) == (own["frames_compiled"], own["graphs"]) == (1, 1), \
        "a side compiled flex_attention more than once"


def main():
    if ARGS.flex_part:
        return flex_part(ARGS.flex_part)
    import importlib.metadata
    gpu = torch.cuda.get_device_name() if DEV == "cuda" else "none: a CPU smoke run, figures meaningless"
    report = {"date": time.strftime("%Y-%m-%d"), "gpu": gpu, "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "masklens": masklens.__file__,
              "cuda_scan": masklens.has_cuda_scan(), "cuda_scan_unavailable": masklens.cuda_scan_unavailable(),
              "reps": REPS, "warm_up": WARM}
    try:
        report["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pass
    print(json.dumps(report))
    t0 = time.perf_counter()
    for case in ARGS.cases.split(","):
        start = time.perf_counter()
        {"seed": seed, "ab": ab, "structures": structures, "llama": llama, "flex": flex}[case](report)
        report.setdefault("wall_s", {})[case] = time.perf_counter() - start
        print(f"  ({case}: {report['wall_s'][case]:.1f} s)")
    report["wall_s"]["total"] = time.perf_counter() - t0
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
