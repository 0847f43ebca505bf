"""What masklens' mask function costs inside a training step, against the same call warm.

zero_byte times the registered mask function (masklens.transformers.masklens_mask) once a
forward inside a training step; this benchmark asks why that figure is above the same call
timed on its own. It trains the zero_byte model (bench/llama_like.py: 4 layers, hidden
1024, 8 heads of 128, gradient checkpointing) at batch 1 on --length tokens, packed (4
documents through position_ids) and left-padded (the first 1/16 of the tokens), and
reports per batch, side by side in one process:
  in step        the mask function's median time inside the training steps
  warm           the same call (its captured arguments) repeated back to back
  after a step   the same call once right after each training step, outside the model
  one read       on a GPU, a one-element read right after a step: one small kernel, a
                 pageable copy to the host (.cpu()) and its wait
and the parts inside the step (the closures' parse, the pin check (pin() runs for a node
not yet pinned; since the tree walk gathers the nodes to pin, the check of pinned ones is
inside the parse and pin() shows only where a tree asks for one), the tables' read and,
within it on a GPU, masklens._cuda's device pass with its copy and wait, definition.hpp's
rows and classification), each between synchronisations on a GPU. CPU
tables are read by C++ inside "rows and classification" (their "tables' read" is their
views alone). The baseline is "warm": what the call costs when its code and data are in
the caches. These figures read the tables in the mask function
(masklens.transformers.defer_reads = "never").

Then the read deferred to the first layer (defer_reads = "always", on a GPU the default
"cuda": the device pass enqueued in the mask function, its copy waited for where the first
attention layer needs the verdict; on the CPU the C++ read moved there) against the read
in the mask function ("never"), the two alternating
step by step in one process, with no synchronisation inside a step:
  step            a training step's median time (synchronised at its end only), and the
                  median and range of the paired differences (each deferred step minus the
                  step beside it that read in the mask function)
  mask function   the mask function's host time (no synchronisation: its wait, if any, inside)
  first-layer wait  the host time the first layer spends waiting for the read and working
                  out the rows and classification (deferred only)
  warm            the same call repeated back to back (host time), alone and with the
                  first layer's wait for its outcome
  parts           the deferred mask function's parts inside the step, host time, no
                  synchronisation: recognise, within it parse, pin and the read's start
                  (_table_runs._device_start) and, on a GPU, its CUDA calls
                  (masklens._cuda.table_runs_begin: the kernel and the event; an
                  older build's table_runs_start: the memset, the kernels, the copy, the
                  event)

usage: python3 bench/mask_cost.py [--length 32768] [--steps 8] [--device cuda|cpu] [--torch-read] [--json OUT]
  --torch-read: the tables read by torch operations (a GPU's way without masklens._cuda;
  on the CPU the way before the C++ read): the baseline of the tables' read.
  on the CPU the model is smaller (hidden 256, 2 layers) and --length defaults to 1024.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
import transformers.masking_utils as mu

import masklens._definition as definition
import masklens._table_runs as table_runs
import masklens.transformers as mlt

import llama_like

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--length", type=int)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--torch-read", action="store_true",
                help="read the tables by torch operations (a GPU's way without masklens._cuda; "
                     "on the CPU the way before the C++ read): the read's baseline")
ap.add_argument("--json")
args = ap.parse_args()
dev = torch.device(args.device)
cuda = dev.type == "cuda"
mlt.defer_reads = "never"  # the parts below are the read in the mask function's
L = args.length or (32768 if cuda else 1024)
if not cuda:
    torch.set_num_threads(1)
if args.torch_read:
    table_runs._device_start = table_runs._host_read = lambda tables, room: None


def sync():
    if cuda:
        torch.cuda.synchronize()


def ms_of(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return (time.perf_counter() - t0) * 1e3, out


def device_entry(module):
    """masklens._cuda's enqueue of a definition's tables: table_runs_begin (one kernel and an
    event), or an older build's table_runs_start (a memset, a kernel a table, a copy, an
    event); None without masklens._cuda."""
    return next((name for name in ("table_runs_begin", "table_runs_start") if hasattr(module, name)), None)


# zero_byte's model and batches (llama_like.py); on the CPU its small model.
model = llama_like.make(llama_like.config(L, small=not cuda), "masklens", dev,
                        torch.bfloat16 if cuda else torch.float32)
batches = {kind: llama_like.batch(kind, L, dev) for kind in llama_like.BATCHES}

mask_fn = mlt.masklens_mask
in_step, captured = [], {}


def timed_mask(*a, **kw):
    ms, out = ms_of(lambda: mask_fn(*a, **kw))
    in_step.append(ms)
    captured.update(args=a, kwargs=kw)
    return out


# The parts, each between synchronisations, recorded only while `recording`.
parts, recording = {}, [False]


def wrap(owner, name, label):
    real = getattr(owner, name)

    def wrapper(*a, **kw):
        if not recording[0]:
            return real(*a, **kw)
        ms, out = ms_of(lambda: real(*a, **kw))
        parts.setdefault(label, []).append(ms)
        return out
    setattr(owner, name, wrapper)


wrap(definition, "parse", "parse")
wrap(definition, "pin", "pin")
_start_read = table_runs.start_read


def timed_start_read(*a, **kw):
    """The tables' read: start_read and the wait of the function it returns, each between
    synchronisations (read in the mask function, the two follow each other)."""
    if not recording[0]:
        return _start_read(*a, **kw)
    ms, finish = ms_of(lambda: _start_read(*a, **kw))

    def timed_finish():
        waited, out = ms_of(finish)
        parts.setdefault("tables' read", []).append(ms + waited)
        return out
    return timed_finish


table_runs.start_read = timed_start_read
wrap(definition._core, "read_definition", "rows and classification")
if cuda and not args.torch_read:
    import masklens._scan as scan
    device_module = scan.cuda_module()
    entry = device_entry(device_module)
    if entry:
        # Inside the tables' read: masklens._cuda's pass enqueued and, with the
        # synchronisation after it, run (the runs landed; its finish() only parses).
        wrap(device_module, entry, "device pass")


def step(kw):
    model.zero_grad(set_to_none=True)
    model(**kw).loss.backward()


rows = []
mu.AttentionMaskInterface._global_mapping["masklens"] = timed_mask
for kind, kw in batches.items():
    for _ in range(2):
        step(kw)
    in_step.clear()
    for _ in range(args.steps):
        step(kw)
    inside = statistics.median(in_step)
    call = lambda: mask_fn(*captured["args"], **captured["kwargs"])  # noqa: E731
    warm = statistics.median(ms_of(call)[0] for _ in range(30))
    after = []
    for _ in range(args.steps):
        step(kw)
        after.append(ms_of(call)[0])
    # A one-element read of device values: one small kernel, a pageable copy to the host and
    # its wait, once right after each step (as "after a step").
    probe, one_read = torch.zeros(1, device=dev), []
    for _ in range(args.steps if cuda else 0):
        step(kw)
        one_read.append(ms_of(lambda: probe.add(1).cpu())[0])
    parts.clear()
    recording[0] = True
    for _ in range(args.steps):
        step(kw)
    recording[0] = False
    row = {"batch": kind, "length": L, "in_step_ms": inside, "warm_ms": warm,
           "after_step_ms": statistics.median(after), "one_read_after_step_ms": statistics.median(one_read) if one_read else None,
           "parts_in_step_ms": {k: statistics.median(v) for k, v in parts.items()},
           "how": mlt.masks()[-1][0]}
    rows.append(row)
    print(json.dumps(row), flush=True)


# The read deferred to the first layer against the read in the mask function, alternating
# step by step, no synchronisation inside a step: host times only.
host_times = {}


def host_timed(owner, name, label):
    real = getattr(owner, name)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        out = real(*a, **kw)
        host_times.setdefault(label, []).append((time.perf_counter() - t0) * 1e3)
        return out
    setattr(owner, name, wrapper)
    return real


recording[0] = False
mu.AttentionMaskInterface._global_mapping["masklens"] = mask_fn
plain_mask_fn = mask_fn


def host_mask_fn(*a, **kw):
    t0 = time.perf_counter()
    out = plain_mask_fn(*a, **kw)
    host_times.setdefault("mask function", []).append((time.perf_counter() - t0) * 1e3)
    captured.update(args=a, kwargs=kw)
    return out


def warm_host_ms(fn, n=100):
    """fn's median host time repeated back to back (no synchronisation inside; the queue
    drained before and after)."""
    for _ in range(10):
        fn()
    sync()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    sync()
    return statistics.median(times)


real_resolve = host_timed(definition.Definition, "_resolve", "first-layer wait")


def host_timed_outer(owner, name, label):
    """host_timed, the outermost call of a recursion only (parse calls itself)."""
    real, depth = getattr(owner, name), [0]

    def wrapper(*a, **kw):
        depth[0] += 1
        t0 = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                host_times.setdefault(label, []).append((time.perf_counter() - t0) * 1e3)
    setattr(owner, name, wrapper)


# The deferred mask function's parts inside the step, host time, no synchronisation: where
# the call's time goes when the step has left the caches cold.
DEFERRED_PARTS = ["recognise", "parse", "pin", "read's start"]
host_timed_outer(definition, "_recognised", "recognise")  # recognise() and recognise_arguments() alike
host_timed_outer(definition, "parse", "parse")
host_timed_outer(definition, "pin", "pin")
host_timed_outer(table_runs, "_device_start", "read's start")
if cuda and not args.torch_read:
    import masklens._scan as scan
    entry = device_entry(scan.cuda_module())
    if entry:
        DEFERRED_PARTS.append("its CUDA calls")
        host_timed_outer(scan.cuda_module(), entry, "its CUDA calls")
deferred = []
MODES = ("never", "always")
for kind, kw in batches.items():
    per = {mode: {"step": [], "mask function": [], "first-layer wait": []} for mode in MODES}
    parts_deferred = {label: [] for label in DEFERRED_PARTS}
    for timed_mask_fn in (False, True):
        mu.AttentionMaskInterface._global_mapping["masklens"] = host_mask_fn if timed_mask_fn else plain_mask_fn
        for i in range(args.steps + 2):
            # Alternating which goes first, so that neither always follows the other.
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                mlt.defer_reads = mode
                host_times.clear()
                sync()
                t0 = time.perf_counter()
                step(kw)
                sync()
                ms = (time.perf_counter() - t0) * 1e3
                if i < 2:  # warm
                    continue
                if not timed_mask_fn:
                    per[mode]["step"].append(ms)
                    continue
                per[mode]["mask function"] += host_times.get("mask function", [])
                if mode != "never":  # read in the mask function, the first layer waits for nothing
                    # The first wait of a forward: gradient checkpointing's recompute finds the verdict known.
                    waits = host_times.get("first-layer wait", [])
                    per[mode]["first-layer wait"].append(sum(waits[:1]))
                    for label in DEFERRED_PARTS:
                        parts_deferred[label].append(sum(host_times.get(label, [])))
    # Steps paired in time: the difference of each pair (deferred - in the mask function).
    paired = sorted(b - a for a, b in zip(per["never"]["step"], per["always"]["step"]))
    call = lambda: plain_mask_fn(*captured["args"], **captured["kwargs"])  # noqa: E731
    timed_resolve, definition.Definition._resolve = definition.Definition._resolve, real_resolve  # warm: untimed
    for mode, figures in per.items():
        mlt.defer_reads = mode
        row = {"batch": kind, "length": L, "defer_reads": mode,
               **{k + "_ms": statistics.median(v) if v else None for k, v in figures.items()},
               # The same call warm, alone and with what the first layer does with it.
               "warm_mask_function_ms": warm_host_ms(call),
               "warm_with_first_layer_ms": warm_host_ms(lambda: call().outcome())}
        if mode == "always":
            row.update(step_difference_ms=statistics.median(paired), step_difference_range_ms=[paired[0], paired[-1]],
                       mask_function_parts_ms={k: statistics.median(v) for k, v in parts_deferred.items() if v})
        deferred.append(row)
        print(json.dumps(row), flush=True)
    definition.Definition._resolve = timed_resolve
mlt.defer_reads = "cuda"

print(f"\n{'batch':<7} {'L':>7} {'in step':>8} {'after a step':>13} {'warm':>7} {'one read':>9}  parts in the step (ms)")
for r in rows:
    p = ", ".join(f"{k} {v:.3f}" for k, v in r["parts_in_step_ms"].items())
    print(f"{r['batch']:<7} {r['length']:>7} {r['in_step_ms']:>8.3f} {r['after_step_ms']:>13.3f} {r['warm_ms']:>7.3f}"
          f" {r['one_read_after_step_ms'] or float('nan'):>9.3f}  {p}")
print(f"\n{'batch':<7} {'L':>7} {'read':<22} {'step':>9} {'mask function':>14} {'first-layer wait':>17}"
      f" {'warm: mask fn':>14} {'+ first layer':>14}  {'step - in mask fn (paired: median [min, max])'}  (ms)")
for r in deferred:
    how = "at the first layer" if r["defer_reads"] == "always" else "in the mask function"
    wait = r["first-layer wait_ms"]
    diff = (f"  {r['step_difference_ms']:+.3f} [{r['step_difference_range_ms'][0]:+.3f}, "
            f"{r['step_difference_range_ms'][1]:+.3f}]") if "step_difference_ms" in r else ""
    print(f"{r['batch']:<7} {r['length']:>7} {how:<22} {r['step_ms']:>9.3f} {r['mask function_ms']:>14.3f}"
          f" {'-' if wait is None else f'{wait:.3f}':>17} {r['warm_mask_function_ms']:>14.3f}"
          f" {r['warm_with_first_layer_ms']:>14.3f}{diff}")
    if r.get("mask_function_parts_ms"):
        print(f"{'':<7} {'':>7} {'':<22} mask function's parts in the step: "
              + ", ".join(f"{k} {v:.3f}" for k, v in r["mask_function_parts_ms"].items()))
if args.json:
    with open(args.json, "w") as f:
        json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                   "transformers": transformers.__version__, "torch_read": args.torch_read, "rows": rows,
                   "deferred": deferred}, f, indent=1)
