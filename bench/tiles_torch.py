"""What torch users write today to get a BlockMask's tiles from a dense mask, the baselines
of masklens' tile summary (bench/tiles.cpp on the host, bench/device_tiles.cu on the GPU),
on the same kinds of masks: bool causal and bool block-sparse at L x L.

    python3 bench/tiles_torch.py [--device cpu|cuda] [--length 16384] [--reps 3]

Times, median of --reps (synchronised on the GPU):
  create_block_mask  torch's own, with mask_mod = lambda b, h, q, kv: mask[b, h, q, kv]
                     (BLOCK_SIZE 128; it evaluates the mask_mod on every pair, then reduces)
  pad + sum          the reduction written by hand on the dense mask: pad to whole
                     tiles, sum each 128 x 128 tile, compare with 0 and 128 * 128, and
                     order the indices as torch does (a stable descending argsort)
Out of memory is reported as such, not as a time (create_block_mask materialises the
mask_mod's batched indices). Both are checked against each other at a small length
first, and against `masklens inspect --tiles 128 --json` there when --masklens names the
command. masklens' device path is bench/device_tiles.cu (the same GPU, the same kinds)."""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask

FIELDS = ["kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"]


def masks(L, device):
    i = torch.arange(L, device=device)
    causal = (i[None, :] <= i[:, None])[None, None]
    gen = torch.Generator().manual_seed(14)
    n = (L + 127) // 128
    keep = torch.rand(n, n, generator=gen) < 0.25
    keep |= torch.eye(n, dtype=torch.bool)
    keep = torch.tril(keep).to(device)
    blocks = keep.repeat_interleave(128, 0).repeat_interleave(128, 1)[:L, :L]
    yield "bool causal", causal
    del causal
    yield "bool block-sparse", (blocks & (i[None, :] <= i[:, None]))[None, None]


def ordered(marks):
    """torch's _dense_to_ordered: the count of marked tiles per row, and the indices of
    the marked ones ascending, then the others ascending (a stable descending argsort)."""
    count = marks.sum(-1, dtype=torch.int32)
    index = torch.argsort(marks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count, index


def pad_sum_tiles(m, block=128):
    """The eight BlockMask tensors of a dense bool mask [B, H, Q, K], by hand."""
    B, H, Q, K = m.shape
    pq, pk = -Q % block, -K % block
    x = m if pq == 0 and pk == 0 else torch.nn.functional.pad(m.to(torch.uint8), (0, pk, 0, pq))
    nq, nk = (Q + pq) // block, (K + pk) // block
    counts = x.view(B, H, nq, block, nk, block).sum(dim=(3, 5))
    full = counts == block * block  # padding is masked: a ragged tile is never full
    partial = (counts > 0) & ~full
    out = {}
    out["kv_num_blocks"], out["kv_indices"] = ordered(partial)
    out["full_kv_num_blocks"], out["full_kv_indices"] = ordered(full)
    out["q_num_blocks"], out["q_indices"] = ordered(partial.transpose(-1, -2))
    out["full_q_num_blocks"], out["full_q_indices"] = ordered(full.transpose(-1, -2))
    return out


def block_mask_of(m, L, device):
    return create_block_mask(lambda b, h, q, kv: m[b, h, q, kv], 1, 1, L, L, device=device, BLOCK_SIZE=128)


def timed(fn, reps, device):
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        del out
    times.sort()
    return times[len(times) // 2] * 1e3


def timed_or_oom(fn, reps, device):
    try:
        return f"{timed(fn, reps, device):10.1f} ms"
    except torch.OutOfMemoryError:
        if device == "cuda":
            torch.cuda.empty_cache()
        return "out of memory"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--masklens", help="the masklens command, to compare tensors")
    args = ap.parse_args()
    L = args.length
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, L = {L}")
    small = 1000  # ragged: 8 tiles a side, the last one 104 wide
    for name, m in masks(small, args.device):
        bm, mine = block_mask_of(m, small, args.device), pad_sum_tiles(m)
        if not all(torch.equal(getattr(bm, f), mine[f]) for f in FIELDS):
            raise SystemExit(f"{name}: pad + sum != create_block_mask at {small}")
    print(f"  pad + sum == create_block_mask at {small} on both masks")
    for name, m in masks(L, args.device):
        cbm = timed_or_oom(lambda: block_mask_of(m, L, args.device), args.reps, args.device)
        pad_sum = timed_or_oom(lambda: pad_sum_tiles(m), args.reps, args.device)
        print(f"  {name:20s} create_block_mask {cbm:>14s}   pad + sum {pad_sum:>14s}"
              f"   ({m.numel() / 2**20:.0f} MiB mask)")
    if args.masklens:
        small = 1024
        with tempfile.TemporaryDirectory() as tmp:
            for name, m in masks(small, "cpu"):
                path = os.path.join(tmp, "m.npy")
                np.save(path, m.numpy())
                doc = json.loads(subprocess.run([args.masklens, "inspect", path, "--json", "--tiles", "128"],
                                                capture_output=True, text=True, check=True).stdout)
                bm = create_block_mask(lambda b, h, q, kv: m[b, h, q, kv], 1, 1, small, small, device="cpu",
                                       BLOCK_SIZE=128)
                same = all(getattr(bm, f).tolist() == doc["tiles"][f] for f in FIELDS)
                print(f"  {name:20s} masklens --tiles == create_block_mask at {small}: {same}")
                if not same:
                    raise SystemExit(1)


if __name__ == "__main__":
    main()
