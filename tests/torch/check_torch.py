"""masklens against real PyTorch on a GPU (exit 77, skipped, without torch or a GPU).

1. Capability rules: for a grid of calls, without and with a dense bool mask, torch's
   own checks (torch.backends.cuda.can_use_{flash,efficient,cudnn}_attention) against
   what masklens accepts of torch.sdpa.{flash,efficient,cudnn}. masklens accepting a call
   torch refuses is a failure (the chosen call would not run); masklens refusing a call
   torch accepts is reported (a conservative rule).
2. Decisions run: masks built in torch from their definitions (causal, windows, chunks,
   prefix, VLM blocks, packed documents, padding, decode, arbitrary) are inspected by
   the masklens command, and the call it chooses (one call or a plan of slices) is run
   with torch and compared with the math kernel on the dense mask (rows with no key: 0).

usage: check_torch.py MASKLENS [--json OUT]
"""
import itertools
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
except ImportError as e:  # CI has no torch: skipped, not passed
    print(f"skipped: {e}")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

EXE = sys.argv[1]
OUT = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
DEV = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
failures, notes, report = [], [], {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                                   "gpu": torch.cuda.get_device_name(), "rules": [], "runs": []}
major, minor = torch.cuda.get_device_capability()
SM = major * 10 + minor
CUDNN = torch.backends.cudnn.version()  # e.g. 91900
CUDNN_TEXT = f"{CUDNN // 10000}.{CUDNN // 100 % 100}.{CUDNN % 100}"
TORCH_TEXT = torch.__version__.split("+")[0]


def masklens(*args):
    p = subprocess.run([EXE, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"masklens {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def call_options(dtype, head_dim, heads, training=False, dropout=0.0):
    opts = ["--dtype", dtype, "--head-dim", str(head_dim), "--heads", str(heads), "--sm", str(SM),
            "--torch", TORCH_TEXT, "--cudnn", CUDNN_TEXT, "--dropout", str(dropout)]
    return opts + (["--training"] if training else [])


# 1. Capability rules ------------------------------------------------------------------
def torch_accepts(dtype, head_dim, q_len, k_len, training, dropout, head_dim_v=None, with_mask=False):
    shape_q, shape_k = (2, 4, q_len, head_dim), (2, 4, k_len, head_dim)
    q = torch.randn(shape_q, device=DEV, dtype=DTYPES[dtype], requires_grad=training)
    k = torch.randn(shape_k, device=DEV, dtype=DTYPES[dtype], requires_grad=training)
    v = torch.randn((2, 4, k_len, head_dim_v or head_dim), device=DEV, dtype=DTYPES[dtype], requires_grad=training)
    # A dense bool mask as frameworks pass it: [B, 1, Q, K], broadcast over heads.
    mask = torch.ones(2, 1, q_len, k_len, device=DEV, dtype=torch.bool) if with_mask else None
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout, False, False)
    return {"torch.sdpa.flash": torch.backends.cuda.can_use_flash_attention(params, False),
            "torch.sdpa.efficient": torch.backends.cuda.can_use_efficient_attention(params, False),
            "torch.sdpa.cudnn": torch.backends.cuda.can_use_cudnn_attention(params, False)}


def check_rules():
    # (q/k head dim, v head dim): equal dims, then MLA-like and other unequal pairs.
    dims = [(d, d) for d in (16, 32, 60, 64, 72, 96, 100, 128, 160, 192, 200, 224, 256, 264, 320, 512)]
    dims += [(192, 128), (128, 64), (64, 128), (256, 128)]
    grid = itertools.product(("bf16", "fp16", "fp32"), dims, ((128, 128), (256, 64), (64, 1)),
                             ((False, 0.0), (True, 0.0), (True, 0.1)), (False, True))
    for dtype, (head_dim, head_dim_v), (q_len, k_len), (training, dropout), with_mask in grid:
        # Without a mask: masklens's capability rules. With a dense bool mask (an arbitrary
        # structure): masklens accepts a backend when it keeps it as a way to run the mask
        # (chosen, or rejected only as slower); defects count as refusals there.
        accepted = torch_accepts(dtype, head_dim, q_len, k_len, training, dropout, head_dim_v, with_mask)
        kind = "arbitrary" if with_mask else "full"
        policy = masklens("policy", "--structure", '{"kind": "%s"}' % kind, "--shape", f"2,4,{q_len},{k_len}",
                          "--json", *call_options(dtype, head_dim, 4, training, dropout),
                          "--head-dim-v", str(head_dim_v), "--mask-dtype", "bool")["policy"]
        if with_mask:
            kept = {policy["backend"]} | {r["backend"] for r in policy["rejected"] if r["kind"] == "slower"}
            refused = {r["backend"]: r.get("rules", [r.get("defect", r["kind"])])
                       for r in policy["rejected"] if r["backend"] not in kept}
        else:
            refused = {r["backend"]: r.get("rules", []) for r in policy["rejected"] if r["kind"] == "refused"}
        for backend, ok in accepted.items():
            ours = backend not in refused
            row = {"dtype": dtype, "head_dim": head_dim, "head_dim_v": head_dim_v, "q": q_len, "k": k_len,
                   "training": training, "dropout": dropout, "mask": with_mask, "backend": backend,
                   "torch": ok, "masklens": ours, "rules": refused.get(backend, [])}
            report["rules"].append(row)
            if ours and not ok:
                failures.append(f"rules: masklens accepts, torch refuses: {row}")
            elif ok and not ours:
                notes.append(f"rules: masklens refuses ({', '.join(row['rules'])}), torch accepts: {row}")


# 2. Decisions run ---------------------------------------------------------------------
def rows_cols(q_len, k_len):
    i = torch.arange(q_len, device=DEV)[:, None]
    j = torch.arange(k_len, device=DEV)[None, :]
    return i, j


def masks():
    """(name, bool mask [B, 1, Q, K]) built from each structure's definition."""
    out = []
    L = 1024
    i, j = rows_cols(L, L)
    causal = j <= i
    out.append(("causal", causal.expand(2, 1, L, L)))
    qi, kj = rows_cols(256, L)
    out.append(("causal bottom-right Q<K", (kj <= qi + (L - 256)).expand(2, 1, 256, L)))
    out.append(("causal top-left Q<K", (kj <= qi).expand(2, 1, 256, L)))
    out.append(("sliding window 128", (causal & (i - j < 128)).expand(2, 1, L, L)))
    out.append(("chunked 256", (causal & (i // 256 == j // 256)).expand(2, 1, L, L)))
    out.append(("prefix_lm 300", (causal | (j < 300)).expand(2, 1, L, L)))
    blocks = torch.full((L,), -1, device=DEV)
    blocks[100:228] = 0
    blocks[600:700] = 1
    vlm = causal | ((blocks[:, None] >= 0) & (blocks[:, None] == blocks[None, :]))
    out.append(("VLM blocks", vlm.expand(2, 1, L, L)))
    docs = torch.stack([torch.bucketize(torch.arange(L, device=DEV), torch.tensor(cuts, device=DEV), right=True)
                        for cuts in ([100, 700], [512])])
    packed = causal[None] & (docs[:, :, None] == docs[:, None, :])
    out.append(("packed documents", packed[:, None]))
    valid = torch.tensor([L, 700], device=DEV)
    out.append(("right-padded causal", (causal[None] & (j[None] < valid[:, None, None]))[:, None]))
    start = torch.tensor([0, 300], device=DEV)
    out.append(("left-padded causal (empty rows)", (causal[None] & (j[None] >= start[:, None, None]))[:, None]))
    dk = torch.arange(L, device=DEV)
    decode = (dk[None, :] >= torch.tensor([0, 700, 5], device=DEV)[:, None])[:, None, None, :]
    out.append(("decode, left padding", decode))
    out.append(("decode, no padding", torch.ones(3, 1, 1, L, dtype=torch.bool, device=DEV)))
    g = torch.Generator(device=DEV).manual_seed(7)
    out.append(("arbitrary", torch.rand(2, 1, 512, 512, device=DEV, generator=g) < 0.5))
    out.append(("full", torch.ones(2, 1, 512, 512, dtype=torch.bool, device=DEV)))
    return out


KERNELS = {"torch.sdpa.flash": [SDPBackend.FLASH_ATTENTION], "torch.sdpa.efficient": [SDPBackend.EFFICIENT_ATTENTION],
           "torch.sdpa.cudnn": [SDPBackend.CUDNN_ATTENTION], "torch.sdpa.math": [SDPBackend.MATH],
           "torch.sdpa.causal_lower_right": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]}


def one_call(backend, args, q, k, v, mask):
    if backend not in KERNELS:
        raise RuntimeError(f"no runner for {backend}")
    how = args["attn_mask"]
    attn_mask = None
    if how == "keep":
        attn_mask = mask
    elif how == "replace":
        attn_mask = causal_lower_right(q.shape[-2], k.shape[-2])
    with sdpa_kernel(KERNELS[backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=bool(args.get("is_causal")),
                                              enable_gqa=bool(args.get("enable_gqa")))


def run_policy(policy, q, k, v, mask):
    if not policy["plan"]:
        return one_call(policy["backend"], policy["args"], q, k, v, mask)
    out = torch.zeros_like(q)
    for step in policy["plan"]:
        if step["backend"] == "zeros":
            continue
        b, (qs, qe), (ks, ke) = step["batch"], step["q_range"], step["k_range"]
        out[b:b + 1, :, qs:qe] = one_call(step["backend"], step["args"], q[b:b + 1, :, qs:qe],
                                          k[b:b + 1, :, ks:ke], v[b:b + 1, :, ks:ke], None)
    return out


def reference(q, k, v, mask):
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    return torch.where(mask.any(-1, keepdim=True), out, torch.zeros_like(out))


def check_runs(tmp):
    torch.manual_seed(0)
    heads, head_dim = 4, 128
    for name, mask in masks():
        B, _, Q, K = mask.shape
        path = os.path.join(tmp, "mask.npy")
        np.save(path, mask.cpu().numpy())
        for dtype in ("bf16", "fp16"):
            doc = masklens("inspect", path, "--json", *call_options(dtype, head_dim, heads))
            policy, structure = doc["policy"], doc["structure"]
            q = torch.randn(B, heads, Q, head_dim, device=DEV, dtype=DTYPES[dtype])
            k = torch.randn(B, heads, K, head_dim, device=DEV, dtype=DTYPES[dtype])
            v = torch.randn(B, heads, K, head_dim, device=DEV, dtype=DTYPES[dtype])
            want = reference(q, k, v, mask)
            try:
                got = run_policy(policy, q, k, v, mask).float()
                err = (got - want).abs().max().item()
            except RuntimeError as e:
                err = float("inf")
                failures.append(f"run {name} {dtype}: {policy['backend']} raised: {e}")
            row = {"mask": name, "dtype": dtype, "structure": structure["kind"], "backend": policy["backend"],
                   "args": policy["args"], "plan_calls": len(policy["plan"] or []), "max_abs_err": err}
            report["runs"].append(row)
            print(f"{name:34s} {dtype} {structure['kind']:14s} -> {policy['backend']:30s} "
                  f"{'plan of %d' % row['plan_calls'] if row['plan_calls'] else 'one call':11s} max|err| {err:.2e}")
            if not err < 2e-2:
                failures.append(f"run {name} {dtype}: max |err| {err} with {policy['backend']} {policy['args']}")


check_rules()
with tempfile.TemporaryDirectory() as tmp:
    check_runs(tmp)
agree = sum(r["torch"] == r["masklens"] for r in report["rules"])
print(f"rules: {agree}/{len(report['rules'])} agree with torch; {len(notes)} conservative")
for n in notes[:40]:
    print("note:", n)
if OUT:
    with open(OUT, "w") as f:
        json.dump(report, f, indent=1)
for f in failures:
    print("FAIL:", f)
print(f"{len(report['rules']) + len(report['runs']) - len(failures)} checks passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
