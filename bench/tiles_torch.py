"""torch's create_block_mask on a dense mask (mask_mod = lambda b, h, q, kv: mask[b, h, q, kv]),
the baseline of the tile summary (bench/tiles.cpp on the host; the device scanner's
tiles when it has them), on the same masks: bool causal and bool block-sparse at L x L.

    python3 bench/tiles_torch.py [--device cpu|cuda] [--length 16384] [--reps 3]

Prints the median milliseconds of create_block_mask (BLOCK_SIZE 128) and checks its
tensors against `masklens inspect --tiles 128 --json` on the same mask when --masklens
names the command (a small L keeps the JSON readable: the comparison runs at 1024)."""
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
    yield "bool block-sparse", (blocks & causal[0, 0])[None, None]


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
    times.sort()
    return times[len(times) // 2] * 1e3, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--masklens", help="the masklens command, to compare tensors")
    args = ap.parse_args()
    L = args.length
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, L = {L}")
    for name, m in masks(L, args.device):
        ms, _ = timed(lambda: create_block_mask(lambda b, h, q, kv: m[b, h, q, kv], 1, 1, L, L,
                                                device=args.device, BLOCK_SIZE=128), args.reps, args.device)
        print(f"  {name:20s} create_block_mask {ms:10.1f} ms  ({m.numel() / 2**20:.0f} MiB mask)")
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
