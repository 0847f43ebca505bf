"""masklens under context parallelism on the GPUs of one host: what one rank's scan of its
shard costs, and what the agreement costs beside it (docs/distributed.md).

Per mask kind and sharding, with W ranks (spawned; rank r on cuda:(r % GPUs), so ranks
share a GPU where there are fewer GPUs than ranks):
  shard scan     this rank's rows [Q/W, Q] scanned into span runs (the device scanner
                 where masklens._cuda is built; masklens.distributed._scan_shard)
  agreement      the all_gather of every rank's runs, the merge in global row order and
                 the classification of the merged runs (no scan)
  distributed    masklens.distributed.scan(): both, as a training step pays them
  whole scan     rank 0 alone: masklens' scan of the whole mask [Q, Q] in one process,
                 the figure the distributed verdict replaces
Every timed call starts after a barrier, so the agreement does not wait on a late rank;
each figure is the median over --repeat calls, in milliseconds (rank 0's; the slowest
rank's agreement too).

--check instead runs torch's CP engine through ContextParallel.attention() and holds its
output and the gradients of q, k and v to the single-GPU reference (SDPA with the dense
mask on the whole sequence): a plain causal mask on the SDPA ring, a sliding window,
packed documents and an arbitrary mask on FlexAttention CP, both shardings.

usage: python3 bench/distributed.py [--world 2] [--backend gloo|nccl] [--q-len 65536]
                                    [--kinds causal,sliding_window,documents,arbitrary]
                                    [--repeat 20] [--json OUT] [--check] [--device cpu]
(--device cpu: a smoke run of the script itself on the host scanner, no GPU figures.)
NCCL takes one GPU per rank (it refuses two ranks on one device): on one GPU run
--world 1 --backend nccl (the collective's own cost, one rank) and --world 2 --backend gloo
(two ranks sharing the GPU; the runs cross through host memory, the masks stay on the
GPU). Run against the in-tree build with PYTHONPATH=build-dir/python (bench/README.md).
"""
import argparse
import json
import os
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

KINDS = ("causal", "sliding_window", "documents", "arbitrary")


def local_rows(kind, q_len, rows, device, seed=0):
    """Rows `rows` (global positions, int64 tensor) of the whole [Q, Q] mask of `kind`, as a
    bool tensor on `device`: only a rank's own rows are ever made."""
    q = rows.to(device)[:, None]
    k = torch.arange(q_len, device=device)[None, :]
    causal = k <= q
    if kind == "causal":
        return causal
    if kind == "sliding_window":
        return causal & (q - k < 4096)
    if kind == "documents":  # eight packed documents
        size = -(-q_len // 8)
        return causal & (q // size == k // size)
    if kind == "arbitrary":  # causal block-sparse tiles (the same on every rank), and the diagonal
        gen = torch.Generator(device=device).manual_seed(seed)
        tiles = torch.rand(-(-q_len // 128), -(-q_len // 128), generator=gen, device=device) < 0.3
        return (tiles[q // 128, k // 128] & causal) | (k == q)
    raise ValueError(kind)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeat, group, device):
    """Median ms of fn() over `repeat` calls, each after a synchronisation and (group not
    None) a barrier of the group."""
    times = []
    for _ in range(repeat):
        if group is not None:
            dist.barrier(group=group)
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(rank, world, args, device):
    import masklens
    from masklens import _scan
    import masklens.distributed as mld
    group = dist.group.WORLD
    rows_out = []
    for kind in args.kinds:
        for sharding in mld.SHARDINGS:
            rows = torch.as_tensor(mld.positions(args.q_len, world, rank, sharding))
            local = local_rows(kind, args.q_len, rows, device)
            collective = mld._collective_device(group, local)
            header, runs, error = mld._scan_shard(local, -1000.0)
            shard_ms = timed(lambda: mld._scan_shard(local, -1000.0), args.repeat, group, device)

            def agree():
                headers, gathered = mld._gather(header, runs, error, group, collective)
                table, merged = mld.merge_runs(headers, gathered, sharding)
                return masklens._core.classify_runs(table, merged)
            agree_ms = timed(agree, args.repeat, group, device)
            verdict = mld.scan(local, sharding=sharding)
            total_ms = timed(lambda: mld.scan(local, sharding=sharding), args.repeat, group, device)
            slowest = [None] * world
            dist.all_gather_object(slowest, agree_ms)
            del local
            whole_ms = None
            if rank == 0:
                whole = local_rows(kind, args.q_len, torch.arange(args.q_len), device)
                assert _scan.scan(whole).structure.describe() == verdict.structure.describe()
                whole_ms = timed(lambda: _scan.scan(whole), args.repeat, None, device)
                del whole
            dist.barrier()
            rows_out.append({"kind": kind, "sharding": sharding, "structure": verdict.structure.describe(),
                             "runs_this_rank": int(header[7]), "runs_merged": verdict.run_count,
                             "shard_scan_ms": shard_ms, "agreement_ms": agree_ms,
                             "agreement_slowest_rank_ms": max(slowest), "distributed_scan_ms": total_ms,
                             "whole_scan_ms": whole_ms})
            if rank == 0:
                r = rows_out[-1]
                print(f"{kind:15s} {sharding:13s} runs {r['runs_this_rank']:6d}/{r['runs_merged']:<6d} "
                      f"shard {shard_ms:8.3f}  agree {agree_ms:7.3f} (slowest {max(slowest):7.3f})  "
                      f"distributed {total_ms:8.3f}  whole {whole_ms:8.3f} ms", flush=True)
    return rows_out


def check(rank, world, args, device):
    """ContextParallel.attention's output and gradients against the single-GPU reference."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    import masklens.distributed as mld
    Q = args.check_len
    mesh = init_device_mesh("cuda", (world,))
    gen = torch.Generator(device=device).manual_seed(1)
    q, k, v = (torch.randn(1, 4, Q, 64, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(3))
    results = []
    for kind in args.kinds:
        whole = local_rows(kind, Q, torch.arange(Q), device)[None, None]
        ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_in, attn_mask=whole)
        ref.float().square().sum().backward()
        for sharding in mld.SHARDINGS:
            cp = mld.ContextParallel(mesh, sharding=sharding)
            local = cp.shard(whole, -2)
            lq, lk, lv = (cp.shard(t, 2).detach().clone().requires_grad_() for t in (q, k, v))
            with cp:
                report = cp.inspect(local, lq, lk, lv)
                out = cp.attention(lq, lk, lv, report, local)
                out.float().square().sum().backward()
            def relative(mine, theirs):  # bf16: the largest difference over the largest value
                return ((mine.float() - theirs.float()).abs().max() / theirs.float().abs().max()).item()
            errors = {"out": relative(out, cp.shard(ref, 2))}
            for name, mine, theirs in zip("qkv", (lq, lk, lv), ref_in):
                errors["grad_" + name] = relative(mine.grad, cp.shard(theirs.grad, 2))
            path = "sdpa ring" if cp.uses_ring(report.structure, device) else "flex cp"
            results.append({"kind": kind, "sharding": sharding, "path": path, "max_relative_error": errors})
            if rank == 0:
                print(f"{kind:15s} {sharding:13s} {path:9s} " +
                      "  ".join(f"{n} {e:.2e}" for n, e in errors.items()), flush=True)
            assert max(errors.values()) < 2e-2, (kind, sharding, errors)
    return results


def worker(rank, world, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.device == "cpu":  # a smoke run of the script itself (host scanner, gloo)
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    try:
        import masklens
        masklens.load_kernels(device)
        rows = check(rank, world, args, device) if args.check else measure(rank, world, args, device)
        if rank == 0 and args.json:
            import platform
            with open(args.json, "w") as f:
                json.dump({"world": world, "backend": args.backend, "q_len": args.q_len,
                           "gpus": torch.cuda.device_count(),
                           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                           "host": platform.node(), "torch": torch.__version__,
                           "has_cuda_scan": masklens.has_cuda_scan(), "rows": rows}, f, indent=1)
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--q-len", type=int, default=65536)
    parser.add_argument("--check-len", type=int, default=4096)
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run of this script on the host scanner (gloo), no figures")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/distributed.py measures the device scanner: it needs a CUDA device")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
