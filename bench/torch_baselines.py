"""What users write today to check a mask, timed on the same GPU and data as
bench/device_scan: torch.equal against a built tril (with and without building it) and
per-row statistics (sum, first/last allowed index). Prints ratios against the masklens
figures in the JSON that device_scan wrote (argv[1])."""
import json
import sys

import torch


def event_ms(fn):
    """One call of fn, timed between CUDA events on the current stream."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def median_ms(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    times = sorted(event_ms(fn) for _ in range(reps))
    return times[len(times) // 2]


def row_stats(m):
    # The per-row statistics a classifier needs: count, first and last allowed key.
    k = torch.arange(m.shape[-1], device=m.device)
    count = m.sum(-1)
    first = torch.where(m, k, m.shape[-1]).amin(-1)
    last = torch.where(m, k, -1).amax(-1)
    return count, first, last


def main():
    ours = {}
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            for line in f:
                row = json.loads(line)
                ours[row["case"]] = row
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    L = 65536
    mask = torch.ones(L, L, dtype=torch.bool, device="cuda").tril_()
    tril = torch.ones(L, L, dtype=torch.bool, device="cuda").tril_()
    results = {
        "build tril 65536^2": median_ms(lambda: torch.ones(L, L, dtype=torch.bool, device="cuda").tril_()),
        "torch.equal, tril prebuilt": median_ms(lambda: torch.equal(mask, tril)),
        "torch.equal incl. building tril": median_ms(
            lambda: torch.equal(mask, torch.ones(L, L, dtype=torch.bool, device="cuda").tril_())),
    }
    del tril
    torch.cuda.empty_cache()
    # Row stats on a 16384-row slab at a time keeps memory bounded; scale to the whole mask.
    slab = 8192
    results["per-row stats (sum, first, last)"] = median_ms(
        lambda: [row_stats(mask[i:i + slab]) for i in range(0, L, slab)], reps=3)
    scan = ours.get("bool 65536^2 causal (4 GiB)", {}).get("scan_ms")
    for name, ms in results.items():
        ratio = f"  masklens scan is {ms / scan:6.1f}x faster" if scan else ""
        print(f"{name:40s} {ms:9.3f} ms{ratio}")
    del mask
    torch.cuda.empty_cache()
    L2 = 32768
    add = torch.zeros(L2, L2, dtype=torch.bfloat16, device="cuda")
    add.masked_fill_(~torch.ones(L2, L2, dtype=torch.bool, device="cuda").tril_(), torch.finfo(torch.bfloat16).min)
    ref = add.clone()
    eq = median_ms(lambda: torch.equal(add, ref))
    scan2 = ours.get("bf16 32768^2 causal, masked finfo.min (2 GiB)", {}).get("scan_ms")
    ratio = f"  masklens scan is {eq / scan2:6.1f}x faster" if scan2 else ""
    print(f"{'bf16 32768^2 torch.equal, prebuilt':40s} {eq:9.3f} ms{ratio}")


if __name__ == "__main__":
    main()
