"""What each structure costs through jax's cuDNN attention as a dense mask and in the
native arguments masklens gives it (is_causal, local_window_size, key_value_seq_lengths),
forward and forward+backward, in the same run: the figures behind the jax.cudnn row's
cost rates (include/masklens/backends/registry.hpp). Masks and lengths are arguments of
the jitted step, not constants, so compiling does not fold a [T, S] constant.

A benchmark, not a test: it prints one line per (structure, form) and writes JSON; it
asserts only that each native form equals the dense-mask call. Run on a GPU:

    PYTHONPATH=build-py/python python3 bench/jax_cudnn_forms.py --json jax_cudnn_forms.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import jax
import jax.numpy as jnp


def timed(fn, *args, reps, warmup=2):
    """Median milliseconds of fn(*args) over `reps`, after `warmup` calls (the first
    compiles). bench/jax_attention.py times with it too."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def structures(length, window, batch, rng):
    """(name, dense mask [B or 1, 1, T, T], native keyword arguments, batch)."""
    t = np.arange(length)
    causal = t[None, :] <= t[:, None]
    lengths = rng.integers(length // 2, length + 1, size=batch).astype(np.int32)
    lengths[0] = length
    padded = causal[None] & (t[None, None, :] < lengths[:, None, None])
    out = [("full", np.ones((1, 1, length, length), bool), {}, 1),
           ("causal", causal[None, None], {"is_causal": True}, 1)]
    for w in window:
        band = causal & (t[None, :] > t[:, None] - w)
        out.append((f"window {w}", band[None, None], {"is_causal": True, "local_window_size": (w - 1, 0)}, 1))
    out.append((f"causal, right padding x{batch}", padded[:, None],
                {"is_causal": True, "key_value_seq_lengths": jnp.asarray(lengths)}, batch))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    p.add_argument("--windows", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="1024 tokens, window 256, 3 reps (any device)")
    p.add_argument("--json")
    args = p.parse_args()
    if args.quick:
        args.lengths, args.windows, args.reps = [1024], [256], 3
    implementation = "cudnn" if jax.devices()[0].platform == "gpu" else "xla"
    print(f"jax {jax.__version__} on {jax.devices()[0]}, implementation={implementation}", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for length in args.lengths:
        for name, mask, native, batch in structures(length, args.windows, args.batch, rng):
            keys = jax.random.split(jax.random.PRNGKey(0), 3)
            q, k, v = (jax.random.normal(kk, (batch, length, args.heads, args.head_dim), jnp.bfloat16) for kk in keys)
            arrays = {n: a for n, a in native.items() if isinstance(a, jax.Array)}
            static = {n: a for n, a in native.items() if not isinstance(a, jax.Array)}

            def dense_call(q, k, v, mask):
                return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)

            def native_call(q, k, v, arrays):
                return jax.nn.dot_product_attention(q, k, v, implementation=implementation, **static, **arrays)

            def both(call):
                fwd = jax.jit(call)
                bwd = jax.jit(jax.grad(lambda q, k, v, extra: jnp.sum(call(q, k, v, extra).astype(jnp.float32)),
                                       argnums=(0, 1, 2)))
                return fwd, bwd

            row = {"tokens": length, "structure": name, "batch": batch, "heads": args.heads,
                   "head_dim": args.head_dim, "native": {n: (a if n in static else "array") for n, a in native.items()}}
            m = jnp.asarray(mask)
            for form, call, extra in (("dense", dense_call, m), ("native", native_call, arrays)):
                fwd, bwd = both(call)
                try:
                    row[f"{form}_fwd_ms"] = timed(fwd, q, k, v, extra, reps=args.reps)
                    row[f"{form}_fwd_bwd_ms"] = timed(bwd, q, k, v, extra, reps=args.reps)
                    row[f"{form}_out"] = fwd(q, k, v, extra)
                except Exception as e:  # noqa: BLE001 - a form cuDNN refuses is a row, not a crash
                    row[f"{form}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if "dense_out" in row and "native_out" in row:
                a, b = (np.asarray(row.pop(f"{f}_out"), np.float32) for f in ("dense", "native"))
                row["max_abs_diff"] = float(np.abs(a - b).max())
                assert row["max_abs_diff"] <= 3e-2 * max(1.0, float(np.abs(a).max())), row
            row.pop("dense_out", None), row.pop("native_out", None)
            if row.get("native_fwd_bwd_ms") and row.get("dense_fwd_bwd_ms"):
                row["native_over_dense_fwd_bwd"] = row["native_fwd_bwd_ms"] / row["dense_fwd_bwd_ms"]
            rows.append(row)
            print(f"{length:6d} {name:28s} dense fwd {row.get('dense_fwd_ms', float('nan')):7.3f} "
                  f"fwd+bwd {row.get('dense_fwd_bwd_ms', float('nan')):7.3f} ms | native fwd "
                  f"{row.get('native_fwd_ms', float('nan')):7.3f} fwd+bwd {row.get('native_fwd_bwd_ms', float('nan')):7.3f}"
                  f" ms {row.get('native_error', '')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
