"""torch BlockMasks of dense masks, three ways side by side in one run, and flex attention
on masklens' BlockMask against the dense mask on torch's default dispatch.

    python3 bench/tiles_torch.py [--device cuda] [--lengths 32768,65536] [--reps 5] [--quick]
                                 [--flex-length 69632] [--no-flex] [--masklens PATH] [--split]
                                 [--stalls CALLS] [--steps CALLS] [--timeline CALLS]

Per mask (sliding window 4096, packed documents, random block-sparse; bool [1, 1, L, L]):
  masklens, from structure   the structure's tile ranges (tiles.hpp, no read of the mask;
                             32 bytes a q tile) and the eight tensors written from them on
                             the device: BlockMask(...) with the q side
  masklens, tile states      the same from the structure's tile states (a byte a tile
                             crosses; the way before the ranges)
  masklens, scan + structure masklens.torch.block_mask(mask) on an exact structure: with
                             masklens._cuda, one device read that proves the structure
                             and writes the eight tensors (its rule is the mask_mod);
                             without, the scan then the above
  masklens, device scan      CUDA, arbitrary masks, where masklens._cuda is built:
                             masklens.torch.block_mask(mask), one device read that gives
                             the verdict and writes the eight tensors on the device
                             (scan_runs planned with tiles; one synchronisation)
  masklens, host scan        one host read that gives spans and tiles (scan_with_tiles); a
                             CUDA mask is copied to the host first (the copy is counted):
                             what block_mask() does for an arbitrary CUDA mask without
                             masklens._cuda
  create_block_mask (rule)   torch's, with the mask function equivalent to the mask, from
                             indices alone (the window's and the documents' rules, the
                             block-sparse mask's 128-block table): the baseline the ratios
                             are to (what a user of flex writes)
  create_block_mask (dense)  torch's, mask_mod = lambda b, h, q, kv: mask[b, h, q, kv]: it
                             materialises int64 index grids of the mask's size, so it runs
                             out of memory past about 2^31 elements (pytorch#134756); shown
                             where it fits
  torch pad+sum              the dense mask padded to whole tiles, summed per tile, sorted
                             into the same eight tensors: the fastest plain-torch baseline
  plain read (baseline)      one read of the mask's bytes (their maximum as 8-byte words):
                             every way's time is also given as a multiple of it
Every BlockMask is checked equal to the pad+sum one (and create_block_mask's). Then, at
--flex-length with a 4096 window: compiled flex_attention on masklens' BlockMask against
F.scaled_dot_product_attention with the dense bool mask (default dispatch), forward +
backward, bf16, [1, 8, L, 128], with the BlockMask built once and built in every step
(the summary's read included); the run fails where the output or a gradient is more
than 2e-2 (relative, in norm) from the dense call's. --quick: 3 repetitions (fits in
about 3 minutes on an H200; masklens' own ways on the GPU, a fraction of a millisecond
each, take 11). Prints median milliseconds and each way's ratio to create_block_mask
(rule).
--split instead times masklens' ways step by step (tiles, tensors, mask_mod, BlockMask;
the device read and its verdict) and prints torch.profiler's table of one device read.
--stalls CALLS instead times every step of both CUDA ways over CALLS BlockMasks of the
window mask, with each step's median and maximum and the calls a millisecond or more
over the median (the host-side stalls bench/README.md traces).
--steps CALLS instead times one device read (masklens.torch.block_mask on the CUDA mask)
function by function: each function it calls, wrapped with perf_counter stamps, with its
start after the call's and its duration (minimum and median of CALLS calls).

--timeline CALLS instead gives one device read's timeline from torch.profiler over CALLS
calls: each CUDA runtime call and each device operation (kernel, memset, copy) with its
start after the call's and its duration, the call nearest the median shown in order, and
the device's idle gaps between its operations summed.

--masklens PATH checks `masklens inspect --tiles 128 --json` against create_block_mask on
small masks (the CLI's JSON), as before."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

FIELDS = ["kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"]


def masks(L, device, window=4096):
    """(name, dense bool [1, 1, L, L] mask, the equivalent mask function from indices)."""
    i = torch.arange(L, device=device)
    causal = i[None, :] <= i[:, None]
    yield ("window 4096", (causal & (i[:, None] - i[None, :] < window))[None, None],
           lambda b, h, q, kv: (kv <= q) & (q - kv < window))
    del causal
    gen = torch.Generator().manual_seed(14)
    cuts = torch.sort(torch.randint(1, L, (max(L // 4096, 2),), generator=gen)).values.to(device)
    docs = torch.bucketize(i, cuts, right=True)
    yield ("packed documents", ((i[None, :] <= i[:, None]) & (docs[:, None] == docs[None, :]))[None, None],
           lambda b, h, q, kv: (kv <= q) & (docs[q] == docs[kv]))
    n = (L + 127) // 128
    keep = torch.rand(n, n, generator=gen) < 0.25
    keep |= torch.eye(n, dtype=torch.bool)
    keep = keep.to(device)
    yield ("block-sparse", keep.repeat_interleave(128, 0).repeat_interleave(128, 1)[:L, :L][None, None],
           lambda b, h, q, kv: keep[q // 128, kv // 128])


def timed(fn, reps, device, before=None):
    """Median milliseconds of `reps` calls after one untimed warm-up call. Each call ends
    when the device has finished its work: torch.cuda.synchronize(index), given the index
    (without one, torch finds the current device through several Python layers, ~25 us
    of host time inside every measurement on an H200 host, whichever way is timed)."""
    times, out = [], None
    index = torch.cuda.current_device() if device == "cuda" else None
    for rep in range(reps + 1):
        if before is not None:
            before()
        out = None
        if device == "cuda":
            torch.cuda.synchronize(index)
        start = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize(index)
        if rep:
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3, out


def ordered(states):
    """torch's _dense_to_ordered: per row, the count and the indices of the set tiles
    ascending, then the others ascending (a stable descending sort of the 0/1 row)."""
    num = states.sum(-1, dtype=torch.int32)
    idx = torch.argsort(states.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num, idx


def pad_sum_block_mask(m, block=128):
    """The baseline: tile counts by a padded sum of the dense mask, then the eight tensors."""
    B, H, Q, K = m.shape
    nq, nk = -(-Q // block), -(-K // block)
    if (nq * block, nk * block) != (Q, K):
        m = F.pad(m, (0, nk * block - K, 0, nq * block - Q))
    counts = m.view(B, H, nq, block, nk, block).sum(dim=(3, 5), dtype=torch.int32)
    full = counts == block * block
    partial = (counts > 0) & ~full
    kv_num, kv_idx = ordered(partial)
    fkv_num, fkv_idx = ordered(full)
    q_num, q_idx = ordered(partial.transpose(-1, -2))
    fq_num, fq_idx = ordered(full.transpose(-1, -2))
    return dict(zip(FIELDS, (kv_num, kv_idx, fkv_num, fkv_idx, q_num, q_idx, fq_num, fq_idx)))


def plain_read(m):
    """One read of the mask's bytes: their maximum as 8-byte words (bytes where they do
    not divide), the floor under any pass over the mask, timed in the same run."""
    b = m.view(torch.uint8).reshape(-1)
    return (b.view(torch.int64) if b.numel() % 8 == 0 else b).amax()


def same(bm, tensors):
    get = (lambda f: getattr(bm, f)) if not isinstance(bm, dict) else bm.__getitem__
    return all(torch.equal(get(f).expand(tensors[f].shape), tensors[f]) for f in FIELDS)


def bench_block_masks(L, device, reps, check_create):
    import masklens
    import masklens.torch as mt
    from masklens import _block_mask, _core, _scan
    # masklens' ways on a GPU take a fraction of a millisecond: a median of 3 is at the
    # mercy of one slow host step, and more calls cost little. (Not the host scans: they
    # read the whole mask.)
    fast = max(reps, 11) if device == "cuda" else reps
    print(f"\nBlockMask of a bool [1, 1, {L}, {L}] mask ({L * L / 2**30:.1f} GiB), BLOCK_SIZE 128, median of {reps} "
          f"(masklens' ways: of {fast}):")
    print(f"  {'mask':18s} {'way':28s} {'ms':>10s} {'vs create_block_mask (rule)':>29s} {'x plain read':>13s}")
    for name, m, rule in masks(L, device):
        rows = []
        read_ms, _ = timed(lambda: plain_read(m), fast, device)
        ref_ms, ref = timed(lambda: pad_sum_block_mask(m), reps, device)
        structure = masklens.scan(m).structure
        exact = structure.kind != "arbitrary"
        if exact:
            ms, bm = timed(lambda: _block_mask.block_mask_from_structure(structure, (128, 128),
                                                                  _block_mask.mask_mod_for(structure, device), device),
                           fast, device)
            rows.append(("masklens, from structure", ms, same(bm, ref)))
            ms, bm = timed(lambda: _block_mask.block_mask_from_tiles(_core.tiles_from_structure(structure, 128, 128),
                                                              _block_mask.mask_mod_for(structure, device), device),
                           fast, device)
            rows.append(("masklens, tile states", ms, same(bm, ref)))
            ms, bm = timed(lambda: mt.block_mask(m, 128), fast, device, before=masklens.forget)
            rows.append(("masklens, scan + structure", ms, same(bm, ref)))
        if device == "cuda" and not exact and _scan.has_device_tiles():
            ms, bm = timed(lambda: mt.block_mask(m, 128), fast, device, before=masklens.forget)
            rows.append(("masklens, device scan", ms, same(bm, ref)))
        if device == "cpu" or not exact:
            ms, bm = timed(lambda: _block_mask.block_mask_from_tiles(_scan.scan_with_tiles(m, (128, 128))[1], None, device),
                           reps, device)
            rows.append(("masklens, host scan" + (" (copy)" if device == "cuda" else ""), ms, same(bm, ref)))
        rows.append(("torch pad+sum", ref_ms, True))
        rows.append(("plain read (baseline)", read_ms, None))
        del ref
        cb_ms, cb = timed(lambda: create_block_mask(rule, 1, 1, L, L, device=device, BLOCK_SIZE=128), reps, device)
        rule_ok = same(cb, pad_sum_block_mask(m)) if check_create else None
        del cb
        rows.append(("create_block_mask (rule)", cb_ms, rule_ok))
        try:
            dense_ms, cb = timed(lambda: create_block_mask(lambda b, h, q, kv: m[b, h, q, kv], 1, 1, L, L,
                                                           device=device, BLOCK_SIZE=128), reps, device)
            rows.append(("create_block_mask (dense)", dense_ms, same(cb, pad_sum_block_mask(m)) if check_create else None))
            del cb
        except torch.OutOfMemoryError:
            rows.append(("create_block_mask (dense)", None, None))
        if device == "cuda":
            torch.cuda.empty_cache()
        for way, ms, ok in rows:
            if ms is None:
                print(f"  {name:18s} {way:28s} {'out of memory':>10s}")
                continue
            print(f"  {name:18s} {way:28s} {ms:10.2f} {cb_ms / ms:28.1f}x {ms / read_ms:12.2f}x"
                  f"{'  MISMATCH' if ok is False else ''}")
        if any(ok is False for _, _, ok in rows):
            raise SystemExit(f"{name}: a BlockMask differs from the pad+sum reference")
        del m
        if device == "cuda":
            torch.cuda.empty_cache()


def relative_error(got, want):
    """||got - want|| / ||want|| in fp32: one figure for a whole output or gradient."""
    got, want = got.float(), want.float()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def bench_flex(L, device, reps, window=4096, heads=8, dim=128, tolerance=2e-2):
    """Compiled flex on masklens' BlockMask against SDPA with the dense mask (default
    dispatch), forward + backward: timed with the BlockMask built once, and again with it
    built from the dense mask inside every step (masklens' whole cache cleared first, so
    the step pays a cold call's scan, classification and BlockMask: the summary's cost
    included); right when the output and the three gradients are within `tolerance`
    (relative, in norm) of the dense call's, else the run fails. A compile inside the
    timed steps (a new BlockMask's mask_mod failing Dynamo's guards) would make the
    figures a compiler's: counted, and the run fails on one."""
    import masklens
    import masklens.torch as mt
    print(f"\nflex_attention at [1, {heads}, {L}, {dim}] bf16, window {window}: forward + backward, median of {reps}")
    i = torch.arange(L, device=device)
    dense = ((i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window))[None, None]
    bm = mt.block_mask(dense, 128)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, L, dim, device=device, dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    w = torch.randn(1, heads, L, dim, device=device, dtype=torch.bfloat16, generator=g)
    flex = torch.compile(flex_attention, dynamic=False)

    def step(fn):
        def run():
            out = fn()
            q.grad = k.grad = v.grad = None
            (out * w).sum().backward()
            return out.detach(), q.grad, k.grad, v.grad
        return run

    def with_summary():
        masklens.forget()  # the BlockMask built again from the dense mask: one read, in the step
        return flex(q, k, v, block_mask=mt.block_mask(dense, 128))
    from torch._dynamo.utils import counters
    t0 = time.perf_counter()
    step(lambda: flex(q, k, v, block_mask=bm))()  # compile
    compile_s = time.perf_counter() - t0
    graphs = counters["stats"]["unique_graphs"]
    step(with_summary)()  # a BlockMask built anew: compiles again only if its mask_mod fails the guards
    first_rebuild = counters["stats"]["unique_graphs"] - graphs
    graphs = counters["stats"]["unique_graphs"]
    flex_ms, got = timed(step(lambda: flex(q, k, v, block_mask=bm)), reps, device)
    summary_ms, got_again = timed(step(with_summary), reps, device)
    recompiles = counters["stats"]["unique_graphs"] - graphs
    dense_ms, want = timed(step(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)), reps, device)
    def errors_of(results):  # the output and the three gradients against the dense call's
        return {name: relative_error(a, b) for name, a, b in zip(("out", "dq", "dk", "dv"), results, want)}
    errors, errors_again = errors_of(got), errors_of(got_again)
    print(f"  compiled flex on masklens' BlockMask     {flex_ms:10.2f} ms  (compile {compile_s:.1f} s) "
          f"-> {dense_ms / flex_ms:.1f}x faster")
    print(f"  the same, BlockMask built in each step   {summary_ms:10.2f} ms  -> {dense_ms / summary_ms:.1f}x faster")
    print(f"  SDPA, dense bool mask (default dispatch) {dense_ms:10.2f} ms")
    print("  relative error against the dense call: " +
          ", ".join(f"{n} {e:.2e} / {errors_again[n]:.2e}" for n, e in errors.items()) + f" (limit {tolerance:g})")
    print(f"  compiles for the first BlockMask built anew: {first_rebuild}; inside the timed steps: {recompiles}")
    if recompiles:
        raise SystemExit("flex compiled again inside the timed steps: the figures are not the kernel's")
    if max(max(errors.values()), max(errors_again.values())) > tolerance:
        raise SystemExit("flex on masklens' BlockMask differs from the dense call past the limit")


def bench_split(L, device, reps):
    """Where a BlockMask's milliseconds go, step by step (each step synchronised and timed
    alone, median of `reps`), for the two masklens ways above: from the structure (its
    tile ranges on the host, the eight tensors written on the device from them, the
    mask_mod, torch's BlockMask) and one device read (the tile pass with its verdict, the mask_mod, the
    BlockMask); and the whole call beside the sum of its steps."""
    import masklens
    import masklens.torch as mt
    from masklens import _block_mask, _core, _scan
    print(f"\nsplit, bool [1, 1, {L}, {L}], BLOCK_SIZE 128, ms (median of {reps}, each step synchronised):")
    for name, m, _ in masks(L, device):
        structure = masklens.scan(m).structure
        line = [f"  {name:18s}"]
        if structure.kind != "arbitrary":
            t_ranges, _ = timed(lambda: _core.structure_tile_ranges(structure, 128, 128), reps, device)
            t_mod, mod = timed(lambda: _block_mask.mask_mod_for(structure, device), reps, device)
            if device == "cuda" and _scan.has_structure_writer():
                t_tensors, (arrays, _) = timed(
                    lambda: _block_mask.device_block_mask_from_structure(structure, (128, 128), device), reps, device)
            else:  # as block_mask_from_structure off CUDA: the host writer once, its arrays shared
                def host_tensors():
                    written = _core.tiles_from_structure(structure, 128, 128).block_mask()
                    return {f: torch.from_numpy(getattr(written, f)).to(device) for f in FIELDS}
                t_tensors, arrays = timed(host_tensors, reps, device)
            t_bm, _ = timed(lambda: _block_mask.from_arrays(arrays, (L, L), (128, 128), mod), reps, device)
            t_all, _ = timed(lambda: _block_mask.block_mask_from_structure(structure, (128, 128),
                                                                    _block_mask.mask_mod_for(structure, device), device),
                             reps, device)
            line.append(f"from structure {t_all:.3f} = mask_mod {t_mod:.3f} + tensors {t_tensors:.3f} (of which "
                        f"the ranges {t_ranges:.3f}) + BlockMask {t_bm:.3f};")
        if device == "cuda" and _scan.has_device_tiles():
            t_read, (verdict, arrays) = timed(
                lambda: _block_mask.device_scan_tiles(m, (128, 128), classify_many_runs=False), reps, device)
            scan_ms, classify_ms = _scan.timing.get("scan_ms", 0.0), _scan.timing.get("classify_ms", 0.0)
            prepare_ms = _scan.timing.get("prepare_ms", 0.0)
            reads = verdict is not None and verdict.structure.kind == "arbitrary" or verdict is None
            kept = verdict.structure if verdict is not None else None
            t_mod, mod = timed(lambda: _block_mask.mask_mod_for(kept, device, m if reads else None), reps, device)
            t_bm, _ = timed(lambda: _block_mask.from_arrays(arrays, (L, L), (128, 128), mod), reps, device)
            t_all, _ = timed(lambda: mt.block_mask(m, 128), reps, device, before=masklens.forget)
            line.append(f"one device read {t_all:.3f} = read + tiles + verdict {t_read:.3f} (last call: prepare "
                        f"{prepare_ms:.3f}, device part {scan_ms:.3f}, classify {classify_ms:.3f}) + mask_mod "
                        f"{t_mod:.3f} + BlockMask {t_bm:.3f}")
        if len(line) == 1:  # an arbitrary mask off CUDA (or without masklens._cuda): neither way applies
            line.append("arbitrary: no structure to tile, and no device read here")
        print(" ".join(line))
        del m
        if device == "cuda":
            torch.cuda.empty_cache()


def profile_device_read(L, device):
    """torch.profiler's table of one masklens.torch.block_mask(mask) on the documents mask
    (the host-side calls and the kernels with their times), and cProfile's of ten calls of
    it and of the BlockMask from the structure."""
    import masklens
    import masklens.torch as mt
    from masklens import _block_mask, _core
    it = masks(L, device)
    next(it)
    name, m, _ = next(it)  # the documents: the slowest from the structure (bench/README.md)
    structure = masklens.scan(m).structure
    for _ in range(3):
        masklens.forget()
        mt.block_mask(m, 128)
    torch.cuda.synchronize()
    masklens.forget()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        mt.block_mask(m, 128)
        torch.cuda.synchronize()
    print(f"\nprofile of masklens.torch.block_mask on the {name} mask at {L}:")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
    # The Python side, function by function (cumulative wall time of 10 calls each).
    import cProfile
    import pstats
    for label, fn in (("one device read", lambda: mt.block_mask(m, 128)),
                      ("from structure", lambda: _block_mask.block_mask_from_structure(
                          structure, (128, 128), _block_mask.mask_mod_for(structure, device),
                          device))):
        fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            masklens.forget()
            fn()
            torch.cuda.synchronize()
        prof.disable()
        print(f"\ncProfile, 10 calls of {label} on the {name} mask at {L}, cumulative:")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(22)


def bench_stalls(L, device, calls):
    """Where the host-side stalls are: `calls` BlockMasks of the window mask each way, every
    step timed on its own clock (perf_counter; the GPU synchronised after each call, as
    `timed` does), and a CUDA event pair around each call's GPU work. Prints each step's
    median and maximum, how many calls took over 1 ms more than the median and in which
    step, the Python threads alive and the GIL's switch interval: a stall inside a step
    that releases the GIL (a CUDA call) while another thread holds it lasts up to that
    interval."""
    import threading
    import masklens
    import masklens.torch as mt
    from masklens import _block_mask, _scan
    if device != "cuda" or not _scan.has_device_tiles():
        raise SystemExit("--stalls times the CUDA ways: it needs a GPU and masklens._cuda")
    it = masks(L, device)
    name, m, _ = next(it)
    structure = masklens.scan(m).structure
    threads = [t.name for t in threading.enumerate()]
    print(f"\nstalls, {name} bool [1, 1, {L}, {L}], {calls} calls each way; threads {threads}, "
          f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms")

    def report(label, records):
        steps = list(records[0])
        total = sorted(sum(r.values()) for r in records)
        median = total[len(total) // 2]
        slow = [r for r in records if sum(r.values()) > median + 1.0]
        where = {}
        for r in slow:
            worst = max(r, key=r.get)
            where[worst] = where.get(worst, 0) + 1
        cells = ", ".join(f"{k} {np.median([r[k] for r in records]):.3f}/{max(r[k] for r in records):.3f}"
                          for k in steps)
        print(f"  {label}: total median {median:.3f} max {total[-1]:.3f} ms; steps median/max: {cells}; "
              f"calls > median + 1 ms: {len(slow)} (slowest step: {where})")

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for label in ("from structure", "one device read"):
        records, gpu = [], []  # host steps per call; the events' span (beside the steps, not in the total)
        for call in range(calls + 3):
            masklens.forget()
            torch.cuda.synchronize()
            r = {}
            t = time.perf_counter()
            start.record()
            if label == "from structure":
                mod = _block_mask.mask_mod_for(structure, device)
                r["mask_mod"], t = (time.perf_counter() - t) * 1e3, time.perf_counter()
                arrays, lengths = _block_mask.device_block_mask_from_structure(structure, (128, 128), device)
                r["ranges + tensors"], t = (time.perf_counter() - t) * 1e3, time.perf_counter()
                _block_mask.from_arrays(arrays, lengths, (128, 128), mod)
                r["BlockMask"], t = (time.perf_counter() - t) * 1e3, time.perf_counter()
            else:
                mt.block_mask(m, 128)
                whole = (time.perf_counter() - t) * 1e3
                for k in ("prepare_ms", "kernels_ms", "scan_ms", "classify_ms"):
                    r[k[:-3]] = _scan.timing.get(k, 0.0)
                r["scan"] -= r["kernels"]  # the block's allocation and the layout around the C++ call
                r["rest"] = whole - sum(r.values())  # the mask_mod, the BlockMask, block_mask()'s own code
                t = time.perf_counter()
            end.record()
            torch.cuda.synchronize()
            r["sync"] = (time.perf_counter() - t) * 1e3
            if call >= 3:  # three warm-up calls
                records.append(r)
                gpu.append(start.elapsed_time(end))
        report(label, records)
        gpu.sort()
        print(f"    GPU work between the events: median {gpu[len(gpu) // 2]:.3f}, max {gpu[-1]:.3f} ms")


def bench_steps(L, device, calls):
    """One device read's host steps: every function masklens.torch.block_mask calls on a CUDA
    mask (masklens._cuda's entry points among them) wrapped to record when it starts and how
    long it takes, per call; printed as the median start and the minimum / median duration
    over `calls` calls, after three untimed ones. The wrappers add about a microsecond each."""
    import masklens
    import masklens.torch as mt
    from masklens import _block_mask, _device_tiles, _scan
    if device != "cuda" or _scan.cuda_module() is None:
        print("--steps times the device read: it needs CUDA and masklens._cuda")
        return
    log = []

    def wrapped(fn, label):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                log.append((label, t0, time.perf_counter()))
        return call

    class Module:  # masklens._cuda with its scan's entry points wrapped
        def __init__(self, module):
            self._module = module
            for name in ("plan_runs", "scan_runs", "wait_runs"):
                setattr(self, name, wrapped(getattr(module, name), "_cuda." + name))

        def __getattr__(self, name):
            return getattr(self._module, name)
    targets = [(mt, "block_mask"), (_block_mask, "_device_block_mask"), (_block_mask, "_structure_slices"),
               (_block_mask, "device_scan_tiles"), (_scan, "device_runs"), (_device_tiles, "_block_mask_storage"),
               (_scan, "stream_of"), (_scan, "counted_scan"),
               (_block_mask, "rule_reads_tables"), (_block_mask, "span_mask_mod"), (_block_mask, "mask_mod_for"),
               (_block_mask, "from_arrays")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in targets] + [(_scan, "_cuda", _scan._cuda)]
    index = torch.cuda.current_device()
    try:
        _scan._cuda = Module(_scan._cuda)
        for obj, name in targets:
            setattr(obj, name, wrapped(getattr(obj, name), name))
        for name, m, _ in masks(L, device):
            for _ in range(3):
                masklens.forget()
                mt.block_mask(m, 128)
            per, totals = {}, []
            for _ in range(calls):
                masklens.forget()
                torch.cuda.synchronize(index)
                log.clear()
                t0 = time.perf_counter()
                mt.block_mask(m, 128)
                torch.cuda.synchronize(index)
                totals.append((time.perf_counter() - t0) * 1e6)
                for label, a, b in log:
                    per.setdefault(label, []).append(((a - t0) * 1e6, (b - a) * 1e6))
                per.setdefault("(verdict: classify, from timing)", []).append((0.0, _scan.timing["classify_ms"] * 1e3))
            totals.sort()
            print(f"\none device read of the {name} mask at {L}: {totals[0]:.0f} us at least, "
                  f"{totals[len(totals) // 2]:.0f} us median (to the device's end), step by step in us:")
            print(f"  {'step':34s} {'starts at':>10s} {'min':>8s} {'median':>8s}")
            for label, v in sorted(per.items(), key=lambda kv: sorted(x[0] for x in kv[1])[len(kv[1]) // 2]):
                starts, lasts = sorted(x[0] for x in v), sorted(x[1] for x in v)
                print(f"  {label:34s} {starts[len(v) // 2]:10.1f} {lasts[0]:8.1f} {lasts[len(v) // 2]:8.1f}")
            del m
            torch.cuda.empty_cache()
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def bench_timeline(L, device, calls):
    """One device read's timeline (masklens.torch.block_mask on each CUDA mask), from
    torch.profiler: the runtime calls (launches, the memset, the copy, the wait) and the
    device's operations, each with its start after the call's and its duration, for the
    call of median length among `calls` (after three untimed ones); then that call's
    first device operation, its last one's end and the device's idle time between them."""
    import masklens
    import masklens.torch as mt
    from masklens import _scan
    from torch.autograd import DeviceType
    if device != "cuda" or _scan.cuda_module() is None:
        print("--timeline times the device read: it needs CUDA and masklens._cuda")
        return
    index = torch.cuda.current_device()
    marker = "masklens one device read"

    def short(name):
        return re.split(r"[<(]", name, maxsplit=1)[0].replace("void ", "").replace("masklens::gpu::detail::", "")

    for name, m, _ in masks(L, device):
        for _ in range(3):
            masklens.forget()
            mt.block_mask(m, 128)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                masklens.forget()
                torch.cuda.synchronize(index)
                with torch.profiler.record_function(marker):
                    mt.block_mask(m, 128)
                    torch.cuda.synchronize(index)
        events = list(prof.events())
        # The marker's host range (the profiler also lists it on the device, over its work).
        windows = sorted((e.time_range.start, e.time_range.end) for e in events
                         if e.name == marker and e.device_type != DeviceType.CUDA)
        per_call = []
        for start, end in windows:
            inside = []
            for e in events:
                t0, t1 = e.time_range.start, e.time_range.end
                if not start <= t0 <= end or e.name == marker:
                    continue
                on_device = e.device_type == DeviceType.CUDA
                if on_device or e.name.startswith("cuda"):
                    inside.append((t0 - start, t1 - t0, "device" if on_device else "host", short(e.name)))
            inside.sort()
            ops = [x for x in inside if x[2] == "device"]
            # Idle: before each operation, after every earlier one ended (chained kernels
            # overlap: a long one may still run past a short one's end).
            gaps, busy_to = 0.0, None
            for t0, dt, _, _ in ops:
                if busy_to is not None:
                    gaps += max(0.0, t0 - busy_to)
                busy_to = t0 + dt if busy_to is None else max(busy_to, t0 + dt)
            per_call.append((end - start, inside, ops, gaps, busy_to))
        if per_call:
            per_call.sort(key=lambda c: c[0])
            total, inside, ops, gaps, busy_to = per_call[len(per_call) // 2]
            print(f"\none device read of the {name} mask at {L}: the median call of {len(per_call)} "
                  f"({per_call[0][0]:.0f} us at least), {total:.0f} us, us after the call's start:")
            print(f"  {'where':6s} {'what':44s} {'starts at':>10s} {'lasts':>8s}")
            for t0, dt, where, what in inside:
                print(f"  {where:6s} {what[:44]:44s} {t0:10.1f} {dt:8.1f}")
            if ops:
                print(f"  device: first operation at {ops[0][0]:.1f} us, last one ends at {busy_to:.1f} us, idle "
                      f"between operations {gaps:.1f} us; the call ends at {total:.1f} us")
        else:
            print(f"\nno profiled call of the {name} mask at {L}")
        del m
        torch.cuda.empty_cache()


def check_cli(cli):
    import masklens  # noqa: F401
    small = 1024
    with tempfile.TemporaryDirectory() as tmp:
        for name, m, _ in masks(small, "cpu", window=300):
            path = os.path.join(tmp, "m.npy")
            np.save(path, m.numpy())
            doc = json.loads(subprocess.run([cli, "inspect", path, "--json", "--tiles", "128"],
                                            capture_output=True, text=True, check=True).stdout)
            bm = create_block_mask(lambda b, h, q, kv: m[b, h, q, kv], 1, 1, small, small, device="cpu",
                                   BLOCK_SIZE=128)
            ok = all(getattr(bm, f).tolist() == doc["tiles"][f] for f in FIELDS)
            print(f"  {name:18s} masklens --tiles == create_block_mask at {small}: {ok}")
            if not ok:
                raise SystemExit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lengths", default="32768,65536")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 repetitions")
    ap.add_argument("--flex-length", type=int, default=69632)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-create-check", action="store_true", help="skip comparing create_block_mask's tensors")
    ap.add_argument("--masklens", help="the masklens command, to compare its JSON tiles with create_block_mask")
    ap.add_argument("--split", action="store_true",
                    help="only where masklens' milliseconds go, step by step (and a profile at the largest length)")
    ap.add_argument("--stalls", type=int, default=0, metavar="CALLS",
                    help="only the host-side stalls: CALLS BlockMasks of the window mask each way, step by step")
    ap.add_argument("--steps", type=int, default=0, metavar="CALLS",
                    help="only one device read's host steps, function by function, over CALLS calls")
    ap.add_argument("--timeline", type=int, default=0, metavar="CALLS",
                    help="only one device read's timeline from torch.profiler, over CALLS calls")
    args = ap.parse_args()
    reps = 3 if args.quick else args.reps
    import masklens
    dev = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, masklens {masklens.__version__}, {dev}; "
          f"device scan: {masklens.has_cuda_scan()}")
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.stalls:
        for L in lengths:
            bench_stalls(L, args.device, args.stalls)
        return
    if args.steps:
        for L in lengths:
            bench_steps(L, args.device, args.steps)
        return
    if args.timeline:
        for L in lengths:
            bench_timeline(L, args.device, args.timeline)
        return
    if args.split:
        for L in lengths:
            bench_split(L, args.device, max(reps, 5))
        if args.device == "cuda":
            profile_device_read(max(lengths), args.device)
        return
    for L in lengths:
        bench_block_masks(L, args.device, reps, not args.no_create_check)
    if not args.no_flex and args.device == "cuda":
        bench_flex(args.flex_length, args.device, reps)
    if args.masklens:
        check_cli(args.masklens)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
