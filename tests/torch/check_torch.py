"""masklens against real PyTorch on a GPU (exit 77, skipped, without torch or a GPU).

1. Capability rules: for a grid of calls, without and with a dense bool mask, torch's
   own checks (torch.backends.cuda.can_use_{flash,efficient,cudnn}_attention) against
   what masklens accepts of torch.sdpa.{flash,efficient,cudnn}. masklens accepting a call
   torch refuses is a failure (the chosen call would not run); masklens refusing a call
   torch accepts is reported (a conservative rule).
2. Decisions run: masks built in torch from their definitions (causal, windows, chunks,
   prefix, VLM blocks, packed documents, padding, decode, arbitrary) are inspected by
   the masklens command, and the call it chooses (one call, a plan of slices, torch's
   varlen_attn, compiled flex_attention) is run with torch and compared with the math
   kernel on the dense mask in fp32 (rows with no key: 0).
3. Mask dtypes: every (mask dtype x query dtype) pair, with and without bias values:
   the chosen call (its mask cast included) must not raise and must match the reference.
4. Tiles: `inspect --tiles` on every mask of 2, at 128 x 128 and at ragged 96 x 80 tiles,
   against torch's create_block_mask on the GPU, tensor for tensor; and flex_attention
   run on a BlockMask built from masklens' tensors (BlockMask.from_kv_blocks, the mask_mod
   reading the mask) against the reference.

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
    import inspect as pyinspect
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
TORCH_TYPES = {"bool": torch.bool, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def passed_mask(call, mask):
    """The mask as the call passes it: mask_cast applied."""
    return mask.to(TORCH_TYPES[call["mask_cast"]]) if call.get("mask_cast") else mask


def run_varlen(call, q, k, v):
    from torch.nn.attention.varlen import varlen_attn
    seqs = call["call"]["sequences"]
    qp = torch.cat([q[b, :, s:e].transpose(0, 1) for b, s, e, _, _ in seqs])
    kp = torch.cat([k[b, :, s:e].transpose(0, 1) for b, _, _, s, e in seqs])
    vp = torch.cat([v[b, :, s:e].transpose(0, 1) for b, _, _, s, e in seqs])
    a = call["args"]
    cu_q = torch.tensor(a["cu_seq_q"], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor(a["cu_seq_k"], dtype=torch.int32, device=DEV)
    params = pyinspect.signature(varlen_attn).parameters
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = tuple(a["window_size"])
    elif call["call"]["window_left"] >= 0:
        raise RuntimeError("this torch's varlen_attn has no window_size")
    if "is_causal" in params:  # older signature: causal as a flag
        kwargs["is_causal"] = call["call"]["causal"]
    outp = varlen_attn(qp, kp, vp, cu_q, cu_k, a["max_q"], a["max_k"], **kwargs)
    out = torch.zeros_like(q)
    pieces = outp.split([e - s for _, s, e, _, _ in seqs])
    for (b, s, e, _, _), piece in zip(seqs, pieces):
        out[b, :, s:e] = piece.transpose(0, 1)
    return out


FLEX = {}


def run_flex(call, structure, q, k, v, mask):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    B, H, Q, K = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if call["call"]["mask_mod_reads_mask"]:
        m = mask if mask.dtype == torch.bool else mask == 0
        def mask_mod(b, h, qi, ki):
            return m[b, 0, qi, ki]
    else:  # the structure's rule from its fields
        d = K - Q if structure.get("alignment") == "bottom_right" else 0
        kind = structure["kind"]
        blocks = torch.full((K,), -1, device=DEV, dtype=torch.int32)
        for n, (s, e) in enumerate(structure.get("blocks") or []):
            blocks[s:e] = n
        docs = None
        if structure.get("segments"):  # one entry a batch, or one for every batch
            docs = torch.stack([torch.bucketize(torch.arange(Q, device=DEV), torch.tensor(seg[1:-1], device=DEV), right=True)
                                for seg in structure["segments"]]).expand(B, Q)

        def ranges(name):
            r = structure.get(name)
            return torch.tensor(r, device=DEV).expand(B, 2) if r else None
        kv, qv = ranges("kv_valid"), ranges("q_valid")  # qv: rows outside attend nothing
        W, C, P = structure.get("window", 0), structure.get("chunk", 1), structure.get("prefix", 0)
        def mask_mod(b, h, qi, ki):
            p = qi + d
            if kind == "full":
                ok = ki >= 0
            elif kind == "causal":
                ok = ki <= p
            elif kind == "sliding_window":
                ok = (ki <= p) & (p - ki < W)
            elif kind == "chunked":
                ok = (ki <= p) & (ki // C == p // C)
            elif kind == "prefix_lm":
                ok = (ki <= p) | (ki < P)
            else:
                ok = (ki <= p) | ((blocks[ki] >= 0) & (blocks[ki] == blocks[p]))
            if docs is not None:
                ok = ok & (docs[b, qi] == docs[b, ki])
            if kv is not None:
                ok = ok & (ki >= kv[b, 0]) & (ki < kv[b, 1])
            if qv is not None:
                ok = ok & (qi >= qv[b, 0]) & (qi < qv[b, 1])
            return ok
    bq, bk = call["call"]["block"]
    block_mask = create_block_mask(mask_mod, B, None, Q, K, device=DEV, BLOCK_SIZE=(bq, bk))
    fn = FLEX.setdefault("fn", torch.compile(flex_attention, dynamic=False))
    return fn(q, k, v, block_mask=block_mask)


def one_call(call, q, k, v, mask, structure=None):
    backend = call["backend"]
    if backend == "torch.varlen_attn":
        return run_varlen(call, q, k, v)
    if backend == "torch.flex_attention":
        return run_flex(call, structure, q, k, v, mask)
    if backend not in KERNELS:
        raise RuntimeError(f"no runner for {backend}")
    attn_mask = None
    if call["mask"] == "keep":
        attn_mask = passed_mask(call, mask)
    elif call["mask"] == "replace":
        obj = call["mask_object"]["args"]
        attn_mask = causal_lower_right(obj["seq_len_q"], obj["seq_len_kv"])
    sdpa = call["call"]
    with sdpa_kernel(KERNELS[backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=sdpa["is_causal"],
                                              enable_gqa=sdpa["enable_gqa"])


def run_policy(policy, structure, q, k, v, mask):
    if not policy["plan"]:
        return one_call(policy, q, k, v, mask, structure)
    out = torch.zeros_like(q)
    for step in policy["plan"]:
        if step["backend"] == "zeros":
            continue
        b, (qs, qe), (ks, ke) = step["batch"], step["q_range"], step["k_range"]
        out[b:b + 1, :, qs:qe] = one_call(step, q[b:b + 1, :, qs:qe], k[b:b + 1, :, ks:ke], v[b:b + 1, :, ks:ke], None)
    return out


def reference(q, k, v, mask):
    """fp32 math on the mask as given; rows that attend to nothing are 0."""
    attends = mask if mask.dtype == torch.bool else (mask > -1000) if mask.is_floating_point() else mask != 0
    m = mask.float() if mask.is_floating_point() else attends
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m)
    return torch.where(attends.any(-1, keepdim=True), out, torch.zeros_like(out))


def run_and_compare(name, dtype, path, mask, extra, tolerance, available="torch"):
    heads, head_dim = 4, 128
    B, _, Q, K = mask.shape
    doc = masklens("inspect", path, "--json", *extra, *call_options(dtype, head_dim, heads), "--available", available)
    policy, structure = doc["policy"], doc["structure"]
    q = torch.randn(B, heads, Q, head_dim, device=DEV, dtype=DTYPES[dtype])
    k = torch.randn(B, heads, K, head_dim, device=DEV, dtype=DTYPES[dtype])
    v = torch.randn(B, heads, K, head_dim, device=DEV, dtype=DTYPES[dtype])
    want = reference(q, k, v, mask)
    try:
        got = run_policy(policy, structure, q, k, v, mask).float()
        err = (got - want).abs().max().item()
    except Exception as e:  # any raise is a failure: the policy named a call that does not run
        err = float("inf")
        failures.append(f"run {name} {dtype}: {policy['backend']} raised: {type(e).__name__}: {e}")
    row = {"mask": name, "dtype": dtype, "available": available, "structure": structure["kind"],
           "backend": policy["backend"], "mask_use": policy["mask"], "mask_cast": policy["mask_cast"],
           "plan_calls": len(policy["plan"] or []), "max_abs_err": err}
    report["runs"].append(row)
    print(f"{name:34s} {dtype:4s} {structure['kind']:14s} -> {policy['backend']:30s} "
          f"{'plan of %d' % row['plan_calls'] if row['plan_calls'] else 'mask ' + policy['mask']:11s} "
          f"cast {policy['mask_cast'] or '-':8s} max|err| {err:.2e}")
    if not err < tolerance:
        failures.append(f"run {name} {dtype}: max |err| {err} with {policy['backend']} {policy['args']}")


def check_runs(tmp):
    torch.manual_seed(0)
    for name, mask in masks():
        path = os.path.join(tmp, "mask.npy")
        np.save(path, mask.cpu().numpy())
        for dtype in ("bf16", "fp16"):
            run_and_compare(name, dtype, path, mask, [], 2e-2)
        if name in ("sliding window 128", "VLM blocks", "packed documents", "arbitrary"):
            run_and_compare(name, "bf16", path, mask, [], 2e-2, available="torch,flex")


def check_mask_dtypes(tmp):
    """Every (mask dtype, query dtype) pair, with and without bias values (ALiBi-like)."""
    torch.manual_seed(1)
    L = 512
    i, j = rows_cols(L, L)
    causal = (j <= i)[None, None].expand(2, 1, L, L)
    alibi = torch.where(causal, -(i - j).float() / 64, torch.tensor(float("-inf"), device=DEV))
    masks = {"bool": causal, "uint8": causal.to(torch.uint8), "int8": causal.to(torch.int8)}
    for name, t in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        masks[name] = torch.where(causal, 0.0, float("-inf")).to(t)
        masks[name + " bias"] = alibi.to(t)
    g = torch.Generator(device=DEV).manual_seed(3)
    arbitrary = torch.rand(2, 1, L, L, device=DEV, generator=g) < 0.6
    arbitrary[..., 0] = True  # no empty rows
    masks["fp32 arbitrary bias"] = torch.where(arbitrary, -(i - j).abs().float() / 64, float("-inf"))
    # Kept integer and half masks (arbitrary: never dropped): cast to bool / the query's dtype.
    masks["uint8 arbitrary"] = arbitrary.to(torch.uint8)
    masks["int8 arbitrary"] = arbitrary.to(torch.int8)
    masks["bf16 arbitrary"] = torch.where(arbitrary, 0.0, float("-inf")).to(torch.bfloat16)
    for name, m in masks.items():
        path = os.path.join(tmp, "mask.npy")
        extra = []
        if m.dtype == torch.bfloat16:  # numpy has no bf16: stored as its bits, read with --mask-dtype
            np.save(path, m.view(torch.uint16).cpu().numpy())
            extra = ["--mask-dtype", "bf16"]
        else:
            np.save(path, m.cpu().numpy())
        for dtype in ("bf16", "fp16", "fp32"):
            # The reference reads the mask as given; bias values cast to a half type round.
            run_and_compare(f"mask {name}", dtype, path, m, extra, 3e-2)


TILE_FIELDS = ["kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
               "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"]


def check_tiles(tmp):
    """masklens' tile summary against create_block_mask, and flex run on it."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
    fn = FLEX.setdefault("fn", torch.compile(flex_attention, dynamic=False))
    for name, mask in masks():
        path = os.path.join(tmp, "tiles.npy")
        np.save(path, mask.cpu().numpy())
        B, H, Q, K = mask.shape
        tensors = {}
        for tiles in ((128, 128), (96, 80)):
            got = masklens("inspect", path, "--json", "--tiles", f"{tiles[0]}x{tiles[1]}")["tiles"]
            tensors[tiles] = got
            bm = create_block_mask(lambda b, h, qi, ki: mask[b, h, qi, ki], B, H, Q, K, device=DEV, BLOCK_SIZE=tiles)
            differ = [f for f in TILE_FIELDS if getattr(bm, f).tolist() != got[f]]
            report["runs"].append({"mask": name, "tiles": list(tiles), "create_block_mask_differs": differ})
            print(f"tiles {name:34s} {tiles[0]}x{tiles[1]}: {'differ: ' + str(differ) if differ else 'as create_block_mask'}")
            if differ:
                failures.append(f"tiles {name} {tiles}: {differ} differ from create_block_mask")
        if name not in ("sliding window 128", "VLM blocks", "packed documents", "arbitrary", "causal bottom-right Q<K"):
            continue
        # flex on masklens' own tensors: the BlockMask torch would build, without building it.
        got = tensors[(128, 128)]
        t = {f: torch.tensor(got[f], dtype=torch.int32, device=DEV) for f in TILE_FIELDS}
        block_mask = BlockMask.from_kv_blocks(t["kv_num_blocks"], t["kv_indices"], t["full_kv_num_blocks"],
                                              t["full_kv_indices"], BLOCK_SIZE=tuple(got["block"]),
                                              mask_mod=lambda b, h, qi, ki: mask[b, 0, qi, ki],
                                              seq_lengths=tuple(got["seq_lengths"]))
        q, k, v = (torch.randn(B, 4, n, 128, device=DEV, dtype=torch.bfloat16) for n in (Q, K, K))
        try:
            err = (fn(q, k, v, block_mask=block_mask).float() - reference(q, k, v, mask)).abs().max().item()
        except Exception as e:
            err = float("inf")
            failures.append(f"tiles {name}: flex on masklens' BlockMask raised {type(e).__name__}: {e}")
        report["runs"].append({"mask": name, "flex_on_tiles_max_abs_err": err})
        print(f"tiles {name:34s} flex on masklens' BlockMask: max|err| {err:.2e}")
        if not err < 2e-2:
            failures.append(f"tiles {name}: flex on masklens' BlockMask max |err| {err}")


check_rules()
with tempfile.TemporaryDirectory() as tmp:
    check_runs(tmp)
    check_mask_dtypes(tmp)
    check_tiles(tmp)
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
