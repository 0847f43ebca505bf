"""End-to-end tests of the masklens command: make a mask of every kind, inspect it
(text and JSON checked field by field), malformed .npy files, --png output."""
import ast
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

EXE = sys.argv[1]
failures = []


def run(*args, ok=True):
    p = subprocess.run([EXE, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        failures.append(f"{args}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def check(cond, what):
    if not cond:
        failures.append(what)


def snippets(text):
    """The Python printed under the call line (and each plan step), dedented."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.startswith("call "):
            current = []
        elif current is not None and line.startswith("          "):
            current.append(line[10:])
        elif current is not None:
            blocks.append("\n".join(current))
            current = None
    if current:
        blocks.append("\n".join(current))
    return blocks


def check_snippets(text, what):
    blocks = snippets(text)
    check(blocks and all(blocks), f"{what}: no code under the call line")
    for code in blocks:
        try:
            ast.parse(code)
        except SyntaxError as e:
            failures.append(f"{what}: printed code does not parse ({e}):\n{code}")


def write_npy(path, header, data=b"", version=1):
    header = header.encode()
    if version == 1:
        prefix = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header))
    else:
        prefix = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(header))
    with open(path, "wb") as f:
        f.write(prefix + header + data)


with tempfile.TemporaryDirectory() as tmp:
    cases = [
        (["causal", "--shape", "1,1,96,96"], {"kind": "causal", "alignment": "top_left"}),
        (["causal", "--shape", "1,1,16,80", "--alignment", "bottom_right"], {"kind": "causal", "alignment": "bottom_right"}),
        (["sliding_window", "--shape", "1,1,64,64", "--window", "9", "--mask-dtype", "bf16"], {"kind": "sliding_window", "window": 9}),
        (["chunked", "--shape", "1,1,64,64", "--chunk", "16", "--mask-dtype", "fp32"], {"kind": "chunked", "chunk": 16}),
        (["prefix_lm", "--shape", "1,1,64,64", "--prefix", "20"], {"kind": "prefix_lm", "prefix": 20}),
        (["causal_blocks", "--shape", "1,1,64,64", "--blocks", "[[5,9],[30,40]]"], {"kind": "causal_blocks", "blocks": [[5, 9], [30, 40]]}),
        (["causal", "--shape", "2,1,32,32", "--segments", "[[0,10,32],[0,32]]"], {"segments": [[0, 10, 32], [0, 32]]}),
        (["causal", "--shape", "2,2,32,32", "--kv-valid", "[[0,32],[4,32]]"], {"kv_valid": [[0, 32], [4, 32]], "empty_rows": 8}),
        (["full", "--shape", "3,1,1,50", "--kv-valid", "[[0,50],[10,50],[0,20]]"], {"kind": "full", "kv_valid": [[0, 50], [10, 50], [0, 20]]}),
    ]
    for i, (make_args, expect) in enumerate(cases):
        path = os.path.join(tmp, f"m{i}.npy")
        run("make", *make_args, "-o", path)
        extra = ["--mask-dtype", "bf16"] if "bf16" in make_args else []
        p = run("inspect", path, "--json", *extra)
        if p.returncode != 0:
            continue
        doc = json.loads(p.stdout)
        check(doc["schema"] == 2, f"{make_args}: schema")
        shape = [int(x) for x in make_args[make_args.index("--shape") + 1].split(",")]
        check(doc["shape"] == shape, f"{make_args}: shape {doc['shape']}")
        for key, value in expect.items():
            check(doc["structure"].get(key) == value, f"{make_args}: structure.{key} = {doc['structure'].get(key)}, want {value}")
        check(doc["policy"]["backend"].startswith("torch."), f"{make_args}: backend {doc['policy']['backend']}")
        check(all("source" in r for r in doc["policy"]["rejected"]), f"{make_args}: rejected without source")
        text = run("inspect", path, *extra).stdout
        check(text.splitlines()[0].startswith("mask "), f"{make_args}: text output starts with the mask line")
        check(any(l.startswith("structure " + expect.get("kind", "causal")) for l in text.splitlines()), f"{make_args}: structure line")
        check(any(l.startswith("call ") for l in text.splitlines()), f"{make_args}: call line")
        check_snippets(text, f"{make_args}")
        # Every family installed: their snippets parse too.
        check_snippets(run("inspect", path, *extra, "--available",
                           "torch,flash_attn,flash_attn3,flex,xformers,te,flashinfer,cudnn_frontend").stdout,
                       f"{make_args} (all families)")
        # policy from the inspect output reproduces the same policy.
        doc_path = os.path.join(tmp, f"m{i}.json")
        with open(doc_path, "w") as f:
            f.write(p.stdout)
        q = run("policy", "--structure", "@" + doc_path, "--shape", ",".join(map(str, shape)), "--json")
        if q.returncode == 0:
            again = json.loads(q.stdout)
            check(again["policy"]["backend"] == doc["policy"]["backend"], f"{make_args}: policy --structure differs")

    # The seed case without a mask: 69632^2 causal, d256, training.
    p = run("policy", "--structure", '{"kind": "causal"}', "--shape", "1,4,69632,69632", "--head-dim", "256", "--training", "--json")
    seed = json.loads(p.stdout)["policy"]
    check(seed["mask"] == "drop" and seed["args"] == {"is_causal": True}, f"seed args {seed}")
    check(seed["backend"] == "torch.sdpa.cudnn", f"seed backend {seed['backend']}")

    # The call's v head dim, determinism and the dense mask's dtype reach the rules.
    def rejection(doc, backend):
        return next(r for r in doc["policy"]["rejected"] if r["backend"] == backend)
    doc = json.loads(run("policy", "--structure", '{"kind": "causal"}', "--shape", "1,1,4096,4096", "--head-dim", "192",
                         "--head-dim-v", "128", "--deterministic", "--json").stdout)
    check(rejection(doc, "torch.sdpa.flash")["rules"] == ["flash.head_dim_v"], f"--head-dim-v: {doc['policy']}")
    check("cudnn.deterministic" in rejection(doc, "torch.sdpa.cudnn")["rules"], f"--deterministic: {doc['policy']}")
    doc = json.loads(run("policy", "--structure", '{"kind": "arbitrary"}', "--shape", "1,1,4096,4096",
                         "--mask-dtype", "fp32", "--json").stdout)
    # An fp32 mask with bf16 inputs: efficient raises on it and cuDNN misreads it, so the call casts it.
    check(doc["policy"]["backend"] in ("torch.sdpa.cudnn", "torch.sdpa.efficient"), f"fp32 mask: {doc['policy']['backend']}")
    check(doc["policy"]["mask"] == "keep" and doc["policy"]["mask_cast"] == "bfloat16", f"fp32 mask: {doc['policy']}")
    p = run("policy", "--structure", '{"kind": "causal"}', "--shape", "1,1,8,8", "--mask-dtype", "fp64", ok=False)
    check(p.returncode == 2 and "--mask-dtype must be" in p.stderr, "bad policy --mask-dtype")

    # Small masks get an ASCII preview.
    small = os.path.join(tmp, "small.npy")
    run("make", "causal", "--shape", "1,1,4,4", "-o", small)
    preview = [l for l in run("inspect", small).stdout.splitlines() if l.startswith("  ") and set(l.strip()) <= set("#.")]
    check(preview == ["  #...", "  ##..", "  ###.", "  ####"], f"ascii preview {preview}")

    # --png writes a valid PNG of the expected size (downsampled to <= 1024 px a side).
    big = os.path.join(tmp, "big.npy")
    run("make", "causal", "--shape", "1,1,2100,3000", "-o", big)
    png = os.path.join(tmp, "big.png")
    run("inspect", big, "--png", png)
    with open(png, "rb") as f:
        blob = f.read()
    check(blob[:8] == b"\x89PNG\r\n\x1a\n", "png magic")
    width, height = struct.unpack(">II", blob[16:24])
    check((width, height) == (1000, 700), f"png size {(width, height)}")
    check(zlib.crc32(blob[12:29]) == struct.unpack(">I", blob[29:33])[0], "png IHDR crc")

    # Malformed .npy files: clear errors, never a crash.
    bad = [
        ("empty", None, b"", "empty file"),
        ("magic", None, b"NOTNUMPY" + b"\0" * 40, "bad magic"),
        ("version", "{'descr': '|b1', 'fortran_order': False, 'shape': (2, 2), }", b"\1\1\1\1", "format version 7"),
        ("descr", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", b"\0" * 32, "not a mask type"),
        ("u2 without --mask-dtype", "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }", b"\0" * 8, "needs --mask-dtype"),
        ("truncated data", "{'descr': '|b1', 'fortran_order': False, 'shape': (100, 100), }", b"\1" * 50, "header lies about size"),
        ("huge shape", "{'descr': '|b1', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", b"", "overflows"),
        ("five dims", "{'descr': '|b1', 'fortran_order': False, 'shape': (1, 1, 1, 2, 2), }", b"\1" * 4, "1 to 4 dims"),
        ("zero dim", "{'descr': '|b1', 'fortran_order': False, 'shape': (0, 4), }", b"", ">= 1"),
        ("no shape", "{'descr': '|b1', 'fortran_order': False, }", b"", "no 'shape'"),
        ("fortran junk", "{'descr': '|b1', 'fortran_order': Maybe, 'shape': (2, 2), }", b"\1" * 4, "neither True nor False"),
        ("truncated header", None, b"\x93NUMPY\x01\x00\xff\x00{'descr'", "truncated header"),
    ]
    for name, header, data, message in bad:
        path = os.path.join(tmp, f"bad_{name.replace(' ', '_')}.npy")
        if header is None:
            with open(path, "wb") as f:
                f.write(data)
        else:
            write_npy(path, header, data, version=7 if name == "version" else 1)
        p = run("inspect", path, ok=False)
        check(p.returncode not in (0,) and p.returncode < 128, f"bad {name}: exit {p.returncode}")
        check(message in p.stderr, f"bad {name}: stderr {p.stderr.strip()!r} lacks {message!r}")

    # Fortran order and a v2 header read the same mask.
    data = bytes(1 if k <= q else 0 for k in range(5) for q in range(5))  # column-major causal 5x5
    path = os.path.join(tmp, "fortran.npy")
    write_npy(path, "{'descr': '|b1', 'fortran_order': True, 'shape': (5, 5), }" + " " * 7 + "\n", data, version=2)
    doc = json.loads(run("inspect", path, "--json").stdout)
    check(doc["structure"]["kind"] == "causal", f"fortran order: {doc['structure']}")

    # Bad call options.
    p = run("policy", "--structure", '{"kind": "causal"}', "--shape", "1,1,8", ok=False)
    check(p.returncode != 0 and "--shape" in p.stderr, "bad --shape")
    p = run("policy", "--structure", '{"kind": "causal"}', "--shape", "1,1,8,8", "--available", "torch,tpu", ok=False)
    check(p.returncode != 0 and "unknown family 'tpu'" in p.stderr, "bad --available")

for f in failures:
    print("FAIL:", f)
print(f"{'ok' if not failures else str(len(failures)) + ' failures'}")
sys.exit(1 if failures else 0)
