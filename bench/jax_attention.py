"""masklens.jax against jax's own dense-mask call, in the same run: a sliding window and
a right-padded causal batch at 8192 and 32768 tokens, forward and backward (jax.grad of a
sum), the dense and prepared sides jitted. Three ways per case:
  dense     jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=I)  (jax's own)
  prepared  masklens.jax.prepare(mask, q, k) once, then jax.jit(attention) (the scan
            timed apart: `prepare_ms`, the first call on a new mask, cached after)
  drop-in   masklens.jax.dot_product_attention(q, k, v, mask=mask) outside jit, as an
            eager caller writes it: jax.value_and_grad of it, not jitted (the mask proven
            on the first call and cached, then the decided call, op by op)
The dense side takes its mask and the prepared side its pytree as arguments of the jitted
step, so compiling folds no [T, S] constant.
A benchmark, not a test: it prints and writes figures, and asserts only that the three
agree. Run on a GPU (docs/jax.md); --quick: 1024 and 2048 tokens on any device.

    PYTHONPATH=build-py/python python3 bench/jax_attention.py --json jax_attention.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import jax
import jax.numpy as jnp

import masklens
import masklens.jax as mj
from jax_cudnn_forms import timed  # bench/, the script's own folder


def masks(kind, batch, length, window, rng):
    t = np.arange(length)
    causal = t[None, :] <= t[:, None]
    if kind == "window":
        m = causal & (t[None, :] > t[:, None] - window)
        return np.broadcast_to(m[None, None], (1, 1, length, length)), None
    lengths = rng.integers(length // 2, length + 1, size=batch)
    lengths[0] = length
    m = causal[None] & (t[None, None, :] < lengths[:, None, None])
    return m[:, None], lengths


def fwd_bwd(attend, jit=True):
    def loss(q, k, v, extra):
        return jnp.sum(attend(q, k, v, extra).astype(jnp.float32))
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    return jax.jit(step) if jit else step


def run_case(kind, length, args, rng):
    batch = 1 if kind == "window" else args.batch
    mask_np, lengths = masks(kind, batch, length, args.window, rng)
    dtype = jnp.bfloat16 if args.dtype == "bf16" else jnp.float16
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (batch, length, args.heads, args.head_dim), dtype)
    k = jax.random.normal(keys[1], (batch, length, args.kv_heads, args.head_dim), dtype)
    v = jax.random.normal(keys[2], (batch, length, args.kv_heads, args.head_dim), dtype)
    mask = jnp.asarray(mask_np)
    row = {"case": kind, "tokens": length, "batch": batch, "heads": args.heads, "kv_heads": args.kv_heads,
           "head_dim": args.head_dim, "dtype": args.dtype, "window": args.window if kind == "window" else None,
           "lengths": None if lengths is None else [int(x) for x in lengths], "device": str(q.devices())}
    report = mj.inspect(mask, q, k, v, training=True)
    row["structure"] = report.structure.describe()
    row["decision"] = report.policy.call.backend if report.policy else None
    row["args"] = report.to_dict()["policy"]["args"] if report.policy else None

    t0 = time.perf_counter()
    prepared = mj.prepare(mask, q, k, v)
    row["prepare_ms"] = (time.perf_counter() - t0) * 1e3
    row["prepare_timing"] = masklens.last_timing()

    sides = {  # name: (attend(q, k, v, extra), extra)
        "dense": (lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m, implementation=args.implementation),
                  mask),
        "prepared": (lambda q, k, v, p: mj.attention(q, k, v, p), prepared),
    }
    if not args.no_drop_in:
        sides["drop-in"] = (lambda q, k, v, m: mj.dot_product_attention(q, k, v, mask=m), mask)
    outputs = {}
    for name, (attend, extra) in sides.items():
        step = fwd_bwd(attend, jit=name != "drop-in")
        try:
            row[f"{name}_ms"] = timed(step, q, k, v, extra, reps=args.reps)
            outputs[name] = step(q, k, v, extra)
        except Exception as e:  # an out-of-memory dense call at 32768, say
            row[f"{name}_ms"] = None
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if "dense" in outputs:
        (l0, g0) = outputs["dense"]
        for name in ("prepared", "drop-in"):
            if name in outputs:
                l1, g1 = outputs[name]
                row[f"{name}_loss_rel"] = float(abs(l1 - l0) / max(abs(float(l0)), 1e-6))
                row[f"{name}_grad_q_max_abs"] = float(jnp.max(jnp.abs(g1[0].astype(jnp.float32) -
                                                                      g0[0].astype(jnp.float32))))
    if row.get("dense_ms") and row.get("prepared_ms"):
        row["speedup"] = row["dense_ms"] / row["prepared_ms"]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    p.add_argument("--cases", nargs="+", default=["window", "padded"], choices=["window", "padded"])
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4, help="the padded batch's size")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--implementation", choices=["cudnn", "xla"], default="cudnn",
                   help="jax's dense-mask call: cuDNN with the mask as a bias (default), or XLA")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--no-drop-in", action="store_true", help="leave out the eager drop-in")
    p.add_argument("--quick", action="store_true", help="1024 and 2048 tokens, window 256, 3 reps")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    if args.quick:
        args.lengths, args.window, args.reps = [1024, 2048], 256, 3
    rng = np.random.default_rng(0)
    rows = []
    print(f"jax {jax.__version__} on {jax.devices()[0]}; masklens {masklens.__version__}")
    for kind in args.cases:
        for length in args.lengths:
            row = run_case(kind, length, args, rng)
            rows.append(row)
            print(f"{kind:7s} {length:6d}  {row['structure']:.60s}  -> {row['decision']}  "
                  f"dense {row.get('dense_ms')} ms  prepared {row.get('prepared_ms')} ms  "
                  f"drop-in {row.get('drop-in_ms')} ms  (prepare {row['prepare_ms']:.2f} ms)"
                  + (f"  dense error: {row['dense_error']}" if "dense_error" in row else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
