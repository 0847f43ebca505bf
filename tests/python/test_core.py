"""masklens._core through the package: scanning DLPack arrays, the typed structure and
policy, the JSON contract against the CLI, and errors as MaskError (a RuntimeError)."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import masklens
from helpers import rows_cols

L = 32


def causal(L=L):
    i, j = rows_cols(L, L)
    return j <= i


def test_scan_numpy_and_torch_agree():
    m = causal()
    a = masklens.scan(m).structure
    b = masklens.scan(m.numpy()).structure
    assert a.kind == b.kind == "causal" and a.alignment == "top_left"
    assert (a.batch, a.heads, a.q_len, a.k_len) == (1, 1, L, L)


def test_strides_broadcast_and_storage_offset_are_read():
    big = torch.zeros(3, L, L, dtype=torch.bool)
    big[1] = causal()
    view = big[1]  # storage offset L*L: data() must include it
    assert view.storage_offset() == L * L
    assert masklens.scan(view).structure.kind == "causal"
    # A transposed (non-contiguous) view: the upper triangle, i.e. keys >= query.
    up = causal().t()
    s = masklens.scan(up).structure
    assert s.kind == "arbitrary" or s.kind != "causal"
    # stride 0 over the batch: one distinct slice, batch kept.
    ex = causal().expand(4, 1, L, L)
    assert ex.stride(0) == 0
    s = masklens.scan(ex).structure
    assert (s.batch, s.kind) == (4, "causal")


def test_sliding_window_and_padding_fields():
    i, j = rows_cols(L, L)
    window = (j <= i) & (i - j < 8)
    start = torch.tensor([0, 5])
    m = window[None] & (j[None] >= start[:, None, None])
    s = masklens.scan(m[:, None]).structure
    assert s.kind == "sliding_window" and s.window == 8
    assert s.kv_valid == [(0, L), (5, L)]
    assert s.empty_rows == 5
    assert s.row(1, 10) == (5, 11)
    assert s.row(1, 2) is None


def test_float_masks_and_bias():
    m = torch.where(causal(), 0.0, float("-inf"))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert masklens.scan(m.to(dtype)).structure.kind == "causal"
    alibi = torch.where(causal(), -0.5, float("-inf"))
    assert masklens.scan(alibi).structure.bias


def test_requires_grad_mask_is_detached():
    m = torch.where(causal(), 0.0, float("-inf")).requires_grad_(True)
    assert masklens.scan(m).structure.kind == "causal"


def test_nan_names_the_element():
    m = torch.where(causal(), 0.0, float("-inf"))
    m[7, 3] = float("nan")
    with pytest.raises(masklens.MaskError, match=r"invalid_value: mask element \[0, 0, 7, 3\]"):
        masklens.scan(m)
    assert issubclass(masklens.MaskError, RuntimeError)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.int32])
def test_unsupported_dtypes(dtype):
    with pytest.raises(masklens.MaskError, match="unsupported_dtype"):
        masklens.scan(causal().to(dtype))


def test_bad_shapes():
    with pytest.raises(masklens.MaskError, match="invalid_shape"):
        masklens.scan(torch.ones(1, 1, 1, 2, 2, dtype=torch.bool))
    with pytest.raises(masklens.MaskError, match="invalid_shape"):
        masklens.scan(torch.ones(0, 4, dtype=torch.bool))


def test_typed_policy_for_the_seed_case():
    s = masklens.scan(causal()).structure
    call = masklens.AttentionCall()
    call.head_dim, call.heads, call.training = 256, 4, True
    env = masklens.Environment()
    p = masklens.decide(s, call, env)
    assert p.backend == "torch.sdpa.cudnn"
    assert p.call.mask == "drop" and p.call.args.type == "sdpa"
    assert p.call.args.kernel == "CUDNN_ATTENTION" and p.call.args.is_causal
    names = {r.backend for r in p.rejected}
    assert "torch.sdpa.efficient" in names and all(r.reason and r.source for r in p.rejected)


def test_varlen_typed_args():
    i, j = rows_cols(L, L)
    docs = (i < 10) == (j < 10)
    s = masklens.scan((j <= i) & docs).structure
    call = masklens.AttentionCall()
    call.training = True
    p = masklens.decide(s, call, masklens.Environment())
    backends = {p.backend} | {st.call.backend for st in p.plan}
    assert p.is_plan or p.call.args.type == "varlen", backends
    if p.call.args is not None and p.call.args.type == "varlen":
        assert p.call.args.cu_seqlens_q == [0, 10, L]


def test_environment_and_call_fields_validate():
    env = masklens.Environment()
    env.available = {"torch", "flex"}
    assert env.available == {"torch", "flex"}
    with pytest.raises(masklens.MaskError, match="unknown family"):
        env.available = {"torch", "nope"}
    env.flash_attn = "2.8.3"
    assert env.flash_attn == "2.8.3"
    env.flash_attn = None
    assert env.flash_attn is None
    with pytest.raises(masklens.MaskError, match="parse_error|does not start"):
        env.torch = "x.y"
    call = masklens.AttentionCall()
    call.heads, call.kv_heads = 6, 4
    with pytest.raises(masklens.MaskError, match="multiple"):
        call.validate()


def test_call_ranges_are_the_clis():
    # One validation for the CLI and Python (AttentionCall/Environment::validate): the
    # ranges the CLI refuses are refused here too, naming the field.
    with pytest.raises(masklens.MaskError, match="sm"):
        masklens.inspect(causal(), sm=1000)
    with pytest.raises(masklens.MaskError, match="sm"):
        masklens.inspect(causal(), sm=5)
    with pytest.raises(masklens.MaskError, match="head_dim"):
        masklens.inspect(causal(), head_dim=2**63 - 1)
    assert masklens.inspect(causal(), sm=129).policy is not None


def test_inspect_fills_the_call_from_tensors():
    q = torch.randn(2, 8, L, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, L, 64, dtype=torch.bfloat16)
    v = torch.randn(2, 2, L, 32, dtype=torch.bfloat16)
    r = masklens.inspect(causal(), q, k, v, sm=90)
    c = r.call
    assert (c.dtype, c.head_dim, c.head_dim_v, c.heads, c.kv_heads, c.batch, c.q_len, c.k_len, c.training) == \
        ("bf16", 64, 32, 8, 2, 2, L, L, True)
    assert c.mask_dtype == "bool"
    r2 = masklens.inspect(causal(), q, k, v, sm=90, training=False, head_dim=128)
    assert (r2.call.training, r2.call.head_dim) == (False, 128)
    major, minor = torch.__version__.split(".")[:2]
    assert r.environment.torch.startswith(f"{major}.{minor}") and r.environment.sm == 90
    with pytest.raises(TypeError, match="unknown keyword"):
        masklens.inspect(causal(), nonsense=1)
    # Without a query, key and value still say their heads, length and head dim.
    c3 = masklens.inspect(causal(), key=k, value=v, sm=90).call
    assert (c3.kv_heads, c3.k_len, c3.head_dim_v, c3.batch) == (2, L, 32, 1)


def test_the_python_docs_example_holds(capsys):
    """docs/python.md's "Inspect a mask" lines, on the mask they describe."""
    L, W = 4096, 1024
    i, j = rows_cols(L, L)
    document = torch.bucketize(torch.arange(L), torch.tensor([1000, 2500]), right=True)
    mask = ((j <= i) & (i - j < W) & (document[:, None] == document[None, :]))[None, None]
    q, k, v = (torch.randn(1, 8, L, 128, dtype=torch.bfloat16) for _ in range(3))
    report = masklens.inspect(mask, q, k, v, sm=90)
    assert (report.structure.kind, report.structure.window) == ("sliding_window", W)
    assert report.structure.segments == [[0, 1000, 2500, L]]
    assert report.policy.call.backend == "torch.varlen_attn"
    assert report.policy.call.args.cu_seqlens_q == [0, 1000, 2500, L]
    assert report.rejected and report.to_dict()["schema"] == masklens.JSON_SCHEMA
    masklens.explain(mask, q, k, v, sm=90)
    assert "call      torch.varlen_attn" in capsys.readouterr().out
    if not torch.cuda.is_available():  # the CPU's own environment: the math kernel, SdpaArgs
        args = masklens.inspect(mask, q, k, v).policy.call.args
        assert args.type == "sdpa" and not hasattr(args, "cu_seqlens_q")


def test_explain_prints_every_rejection_with_its_source(capsys):
    masklens.explain(causal(), sm=90, torch="2.11", cudnn="9.19", available={"torch"})
    out = capsys.readouterr().out
    assert "call      torch.sdpa.cudnn (mask drop)" in out
    assert out.count("rejected") == len(masklens._core.backends()) - 1  # every backend but the chosen one
    assert "[Environment::available]" in out and "bench/README.md" in out


def _cli():
    for p in (os.environ.get("MASKLENS_CLI"), shutil.which("masklens")):
        if p and os.path.exists(p):
            return p
    here = os.path.dirname(__file__)
    for build in ("build", "build-py", "buildpy", "build-cli"):
        p = os.path.join(here, "..", "..", build, "tools", "masklens")
        if os.path.exists(p):
            return p
    return None


def _masks():
    i, j = rows_cols(48, 48)
    c = j <= i
    start = torch.tensor([0, 6])
    docs = (i < 20) == (j < 20)
    qi, kj = rows_cols(16, 48)
    g = torch.Generator().manual_seed(3)
    return {
        "causal": c,
        "window": c & (i - j < 8),
        "left padded": (c[None] & (j[None] >= start[:, None, None]))[:, None],
        "packed": c & docs,
        "bottom right": kj <= qi + 32,
        "additive bias": torch.where(c, -(i - j).float() / 8, float("-inf")),
        "arbitrary": torch.rand(48, 48, generator=g) < 0.5,
        "uint8": c.to(torch.uint8),
    }


@pytest.mark.parametrize("name", list(_masks()))
@pytest.mark.parametrize("opts", [
    {"dtype": "bf16", "head_dim": 128, "heads": 16, "training": False},
    {"dtype": "fp16", "head_dim": 256, "heads": 4, "training": True, "kv_heads": 2},
])
def test_to_dict_equals_the_cli_json(tmp_path, name, opts):
    cli = _cli()
    if cli is None:
        pytest.skip("the masklens command is not built")
    mask = _masks()[name]
    path = tmp_path / "mask.npy"
    np.save(path, mask.numpy())
    args = [cli, "inspect", str(path), "--json", "--dtype", opts["dtype"], "--head-dim", str(opts["head_dim"]),
            "--heads", str(opts["heads"]), "--sm", "90", "--torch", "2.11", "--cudnn", "9.19",
            "--available", "torch,flex"]
    if opts["training"]:
        args.append("--training")
    if "kv_heads" in opts:
        args += ["--kv-heads", str(opts["kv_heads"])]
    want = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    got = masklens.inspect(mask, sm=90, torch="2.11", cudnn="9.19", available={"torch", "flex"}, **opts).to_dict()
    assert json.loads(json.dumps(got)) == want


@pytest.mark.parametrize("name", ["causal", "window", "left padded", "packed", "bottom right", "additive bias",
                                  "arbitrary"])
@pytest.mark.parametrize("tiles,flag", [(16, "16"), ((16, 8), "16x8"), (32, "32")])
def test_to_dict_with_tiles_equals_the_cli_json(tmp_path, name, tiles, flag):
    """inspect(tiles=...) is the CLI's inspect --tiles: the "tiles" document, and for an
    arbitrary mask its tile_fractions and the flex charge that follows from them."""
    cli = _cli()
    if cli is None:
        pytest.skip("the masklens command is not built")
    mask = _masks()[name]
    path = tmp_path / "mask.npy"
    np.save(path, mask.numpy())
    args = [cli, "inspect", str(path), "--json", "--tiles", flag, "--dtype", "bf16", "--head-dim", "128",
            "--heads", "8", "--sm", "90", "--torch", "2.11", "--cudnn", "9.19", "--available", "torch,flex"]
    want = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    report = masklens.inspect(mask, tiles=tiles, dtype="bfloat16", head_dim=128, heads=8, sm=90, torch="2.11",
                              cudnn="9.19", available={"torch", "flex"})
    got = report.to_dict()
    assert "tiles" in want and ("tile_fractions" in want["structure"]) == (name == "arbitrary")
    assert json.loads(json.dumps(got)) == want
