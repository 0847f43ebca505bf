"""Malformed inputs through the masklens command: a generator of broken .npy files and
JSON structures (truncated and oversized headers, duplicate and unknown keys, bad descr,
huge, negative and empty shapes, non-ASCII, wrong magic and versions, data that does not
match the shape, NaN and +inf, wrong JSON types, integers from 2^63 to 2^64, ...) and
every file of tests/fuzz/corpus.

Each generated input must end in a clear error: exit 1 (an input file) or 2 (the command
line), nothing on stdout (never advice for malformed input), one line
`masklens: CODE: ...` on stderr that names the file and the problem; never a signal,
never a hang. Mutations of good inputs and the fuzz corpus may be valid: they must end
in a verdict (exit 0) or such an error.

Usage: bad_inputs.py MASKLENS"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

EXE = os.path.abspath(sys.argv[1])
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TIMEOUT = 30
failures = []
runs = 0


def run(args, stdin=None):
    global runs
    runs += 1
    try:
        return subprocess.run([EXE, *args], capture_output=True, timeout=TIMEOUT, stdin=stdin)
    except subprocess.TimeoutExpired:
        failures.append(f"{args}: still running after {TIMEOUT} s")
        return None


def clean_error(p, what, exit_code, names=()):
    """p failed as a bad input should: `exit_code`, nothing on stdout, one line naming each of `names`."""
    if p is None:
        return
    err = p.stderr.decode("utf-8", "replace")
    lines = err.strip().splitlines()
    if p.returncode < 0 or p.returncode >= 128:
        failures.append(f"{what}: killed by signal / crashed (exit {p.returncode}): {err[-400:]!r}")
        return
    if p.returncode == 0:
        failures.append(f"{what}: exit 0 with advice for a malformed input: {p.stdout[:200]!r}")
        return
    if p.returncode != exit_code:
        failures.append(f"{what}: exit {p.returncode}, want {exit_code} ({err.strip()!r})")
    if p.stdout:
        failures.append(f"{what}: printed {p.stdout[:200]!r} before failing")
    if len(lines) != 1 or not lines[0].startswith("masklens: "):
        failures.append(f"{what}: stderr is not one 'masklens: CODE: ...' line: {err!r}")
    for name in names:
        if name not in err:
            failures.append(f"{what}: stderr {err.strip()!r} does not name {name!r}")


def verdict_or_clean_error(p, what):
    """An input that may be valid: a verdict, or a clear error; never a signal or a hang."""
    if p is None:
        return
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode == 0:
        if not p.stdout.startswith((b"mask ", b"structure ")):
            failures.append(f"{what}: exit 0 without a verdict: {p.stdout[:200]!r}")
        return
    clean_error(p, what, p.returncode if p.returncode in (1, 2) else 1)


# --- .npy files ---------------------------------------------------------------------

def npy(header, data=b"", version=1, pad=True):
    """An .npy file of `header` (str or bytes) and `data`; padded to 64 bytes with a newline
    like numpy's own unless pad is False."""
    head = header.encode("latin-1") if isinstance(header, str) else header
    prefix_len = 10 if version == 1 else 12
    if pad:
        head += b" " * (-(prefix_len + len(head) + 1) % 64) + b"\n"
    if version == 1:
        prefix = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head))
    else:
        prefix = b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(head))
    return prefix + head + data


def header(descr="'|b1'", fortran="False", shape="(4, 4)", extra=""):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, %s}" % (descr, fortran, shape, extra)


GOOD_DATA = bytes(1 if k <= q else 0 for q in range(4) for k in range(4))  # a 4 x 4 causal bool mask
GOOD = npy(header(), GOOD_DATA)
F4 = lambda *values: struct.pack("<%df" % len(values), *values)
CAUSAL_F4 = F4(*[0.0 if k <= q else float("-inf") for q in range(4) for k in range(4)])


def bad_npy_cases():
    """(name, file bytes, extra inspect args, substring the error must hold)."""
    nan_f4 = bytearray(CAUSAL_F4)
    nan_f4[20:24] = F4(float("nan"))
    inf_f4 = bytearray(CAUSAL_F4)
    inf_f4[0:4] = F4(float("inf"))
    nan_f2 = struct.pack("<16e", *[0.0 if k <= q else float("-inf") for q in range(4) for k in range(4)])
    nan_f2 = nan_f2[:6] + struct.pack("<e", float("nan")) + nan_f2[8:]
    return [
        ("empty", b"", [], "empty file"),
        ("bad magic", b"NOTNUMPY" + b"\0" * 60, [], "bad magic"),
        ("magic only", b"\x93NUMPY", [], "truncated header"),
        ("magic of another format", b"\x89PNG\r\n\x1a\n" + b"\0" * 60, [], "bad magic"),
        ("version 0", npy(header(), GOOD_DATA, version=0), [], "format version 0"),
        ("version 4", npy(header(), GOOD_DATA, version=4), [], "format version 4"),
        ("version 7", npy(header(), GOOD_DATA, version=7), [], "format version 7"),
        ("v1 header length past the file", b"\x93NUMPY\x01\x00\xff\x00{'descr'", [], "truncated header"),
        ("v2 header length cut short", b"\x93NUMPY\x02\x00\x10", [], "truncated header"),
        ("v1 header length cut short", b"\x93NUMPY\x01\x00", [], "truncated header"),
        ("header over 1 MiB", npy(header() + " " * (1 << 20), GOOD_DATA, version=2), [], "longer than 1 MiB"),
        ("header length 2^32 - 1", b"\x93NUMPY\x02\x00\xff\xff\xff\xff{", [], "longer than 1 MiB"),
        ("header not a dict", npy("[1, 2, 3]", GOOD_DATA), [], "not a dict"),
        ("dict never closed", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (4, 4), ", GOOD_DATA), [],
         "not a dict numpy reads"),
        ("text after the dict", npy(header() + " junk", GOOD_DATA), [], "text after the header's dict"),
        ("string never closed", npy("{'descr': '|b1, 'fortran_order': False}", GOOD_DATA, pad=False), [],
         "header"),
        ("key without quotes", npy("{descr: '|b1', 'fortran_order': False, 'shape': (4, 4), }", GOOD_DATA), [],
         "not in quotes"),
        ("no colon", npy("{'descr' '|b1', 'fortran_order': False, 'shape': (4, 4), }", GOOD_DATA), [], "no ':'"),
        ("duplicate descr", npy(header(extra="'descr': '<f4', "), GOOD_DATA), [], "'descr' twice"),
        ("duplicate descr, first wins elsewhere", npy("{'descr': '<f4', " + header()[1:], GOOD_DATA), [],
         "'descr' twice"),
        ("duplicate shape", npy(header(extra="'shape': (2, 8), "), GOOD_DATA), [], "'shape' twice"),
        ("duplicate shape, same value", npy(header(extra="'shape': (4, 4), "), GOOD_DATA), [], "'shape' twice"),
        ("duplicate fortran_order", npy(header(extra="'fortran_order': True, "), GOOD_DATA), [],
         "'fortran_order' twice"),
        ("unknown key", npy(header(extra="'order': 'C', "), GOOD_DATA), [], "the key 'order'"),
        ("no descr", npy("{'fortran_order': False, 'shape': (4, 4), }", GOOD_DATA), [], "no 'descr'"),
        ("no fortran_order", npy("{'descr': '|b1', 'shape': (4, 4), }", GOOD_DATA), [], "no 'fortran_order'"),
        ("no shape", npy("{'descr': '|b1', 'fortran_order': False, }", GOOD_DATA), [], "no 'shape'"),
        ("descr <f8", npy(header("'<f8'"), b"\0" * 128), [], "not a mask type"),
        ("descr big-endian >f4", npy(header("'>f4'"), b"\0" * 64), [], "not a mask type"),
        ("descr object", npy(header("'|O'"), b"\0" * 128), [], "not a mask type"),
        ("descr unicode", npy(header("'<U1'"), b"\0" * 64), [], "not a mask type"),
        ("descr empty", npy(header("''"), GOOD_DATA), [], "not a mask type"),
        ("descr structured", npy(header("[('a', '<f4')]"), b"\0" * 64), [], "structured dtype"),
        ("descr not a string", npy(header("1"), GOOD_DATA), [], "not in quotes"),
        ("descr non-ASCII", npy(header("'|b\xe91'"), GOOD_DATA), [], "\\xe9"),
        ("non-ASCII outside strings", npy(header(extra="\xff"), GOOD_DATA), [], "\\xff"),
        ("non-ASCII key", npy(header(extra="'sh\xe4pe': (4, 4), "), GOOD_DATA), [], "\\xe4"),
        ("NUL in the header", npy(header(extra="\0"), GOOD_DATA), [], "\\x00"),
        ("u2 without --mask-dtype", npy(header("'<u2'"), b"\0" * 32), [], "needs --mask-dtype"),
        ("fortran_order Maybe", npy(header(fortran="Maybe"), GOOD_DATA), [], "neither True nor False"),
        ("fortran_order 1", npy(header(fortran="1"), GOOD_DATA), [], "neither True nor False"),
        ("fortran_order lowercase", npy(header(fortran="true"), GOOD_DATA), [], "neither True nor False"),
        ("shape an integer", npy(header(shape="(16)"), GOOD_DATA), [], "'shape' is not a tuple"),
        ("shape a list", npy(header(shape="[4, 4]"), GOOD_DATA), [], "'shape' is not a tuple"),
        ("shape without commas", npy(header(shape="(4 4)"), GOOD_DATA), [], "'shape' is not a tuple"),
        ("shape never closed", npy(header(shape="(4, 4"), GOOD_DATA), [], "'shape' is not a tuple: its '(' is never closed"),
        ("shape never closed, the header ends", npy("{'descr': '|b1', 'fortran_order': False, 'shape': (4, 4", GOOD_DATA),
         [], "its '(' is never closed"),
        ("shape float", npy(header(shape="(4.0, 4)"), GOOD_DATA), [], "'shape' holds something other than integers"),
        ("shape float 8.5", npy(header(shape="(8.5, 8)"), GOOD_DATA), [], "'shape' holds something other than integers"),
        ("shape float last", npy(header(shape="(4, 4.0)"), GOOD_DATA), [], "'shape' holds something other than integers"),
        ("shape hex", npy(header(shape="(0x4, 4)"), GOOD_DATA), [], "'shape' holds something other than integers"),
        ("shape string", npy(header(shape="('4', 4)"), GOOD_DATA), [], "other than integers"),
        ("shape negative", npy(header(shape="(-4, -4)"), GOOD_DATA), [], "must be >= 1, got -4"),
        ("shape zero", npy(header(shape="(0, 4)"), b""), [], "must be >= 1, got 0"),
        ("shape empty (a scalar)", npy(header(shape="()"), b"\1"), [], "2 to 4 dims ([Q, K], [H, Q, K] or [B, H, Q, K]) as SDPA takes it, the file has 0"),
        ("shape of five dims", npy(header(shape="(1, 1, 1, 4, 4)"), GOOD_DATA), [], "2 to 4 dims"),
        # One dim: torch refuses a 1-D attn_mask; [K] read as one query row would advise on it.
        ("shape of one dim", npy(header(shape="(16,)"), GOOD_DATA), [], "2 to 4 dims"),
        ("shape dim past 2^63", npy(header(shape="(99999999999999999999, 1)"), GOOD_DATA), [], "overflows 64 bits"),
        ("shape product past 2^63", npy(header(shape="(4294967296, 4294967296)"), GOOD_DATA), [], "overflows 64 bits"),
        ("shape needs more data", npy(header(shape="(8, 8)"), GOOD_DATA), [], "header lies about size"),
        ("shape needs less data", npy(header(shape="(2, 4)"), GOOD_DATA), [], "header lies about size"),
        ("data cut short", GOOD[:-3], [], "header lies about size"),
        ("data with a tail", GOOD + b"\0", [], "header lies about size"),
        ("NaN in an fp32 mask", npy(header("'<f4'"), bytes(nan_f4)), [], "NaN or +inf"),
        ("+inf in an fp32 mask", npy(header("'<f4'"), bytes(inf_f4)), [], "NaN or +inf"),
        ("NaN in an fp16 mask", npy(header("'<f2'"), nan_f2), [], "NaN or +inf"),
        ("NaN in a bf16 mask", npy(header("'<u2'"), b"\xc0\x7f" * 16), ["--mask-dtype", "bf16"], "NaN or +inf"),
    ]


def check_npy(tmp):
    for i, (name, blob, extra, message) in enumerate(bad_npy_cases()):
        path = os.path.join(tmp, f"bad{i}.npy")
        with open(path, "wb") as f:
            f.write(blob)
        clean_error(run(["inspect", path, *extra]), f".npy {name}", 1, names=(path, message))
        clean_error(run(["inspect", path, "--json", *extra]), f".npy {name} (--json)", 1, names=(path, message))

    # The good file cut at every byte: each prefix is an error naming the file.
    for cut in range(len(GOOD)):
        path = os.path.join(tmp, f"cut{cut}.npy")
        with open(path, "wb") as f:
            f.write(GOOD[:cut])
        clean_error(run(["inspect", path]), f".npy cut at byte {cut}", 1, names=(path,))
        os.remove(path)

    # Bytes of the header changed at random: valid or a clear error, never a crash.
    rng = random.Random(30)
    data_start = len(GOOD) - len(GOOD_DATA)
    for i in range(150):
        blob = bytearray(GOOD)
        for _ in range(rng.randint(1, 4)):
            blob[rng.randrange(data_start)] = rng.choice([0, 0x27, 0x28, 0x29, 0x2c, 0x3a, 0x7b, 0x7d, 0x80, 0xff,
                                                          ord("1"), ord("9"), ord("-"), rng.randrange(256)])
        path = os.path.join(tmp, "mutated.npy")
        with open(path, "wb") as f:
            f.write(bytes(blob))
        verdict_or_clean_error(run(["inspect", path]), f".npy mutation {i} {bytes(blob[:data_start])!r}")


# --- JSON structures ----------------------------------------------------------------

def bad_structures():
    """(name, JSON text as bytes, substring the error must hold) for --shape 2,1,16,16."""
    big = 2 ** 64 - 1
    cases = [
        ("empty text", "", "not valid JSON"),
        ("not JSON", "kind: causal", "not valid JSON"),
        ("truncated", '{"kind": "causal"', "not valid JSON"),
        ("NaN literal", '{"kind": "sliding_window", "window": NaN}', "not valid JSON"),
        ("Infinity literal", '{"kind": "sliding_window", "window": Infinity}', "not valid JSON"),
        ("trailing comma", '{"kind": "causal",}', "not valid JSON"),
        ("single quotes", "{'kind': 'causal'}", "not valid JSON"),
        ("an array", "[]", "must be a JSON object"),
        ("null", "null", "must be a JSON object"),
        ("a number", "3", "must be a JSON object"),
        ("no kind", "{}", "structure.kind must be a string"),
        ("kind a number", '{"kind": 1}', "structure.kind must be a string"),
        ("unknown kind", '{"kind": "diagonal"}', "not a known kind"),
        ("non-ASCII kind", '{"kind": "caus\u00e4l"}', "not a known kind"),
        ("misspelt kv_valid", '{"kind": "causal", "kv_vaild": [[0, 16], [0, 8]]}', "structure.kv_vaild"),
        ("misspelt key, non-ASCII", '{"kind": "causal", "kv_v\u00e4lid": [[0, 8]]}', "is not a structure field"),
        ("window on causal", '{"kind": "causal", "window": 4}', "structure.window applies to sliding_window"),
        ("chunk on sliding_window", '{"kind": "sliding_window", "window": 4, "chunk": 8}', "structure.chunk applies"),
        ("prefix on causal", '{"kind": "causal", "prefix": 4}', "structure.prefix applies"),
        ("blocks on chunked", '{"kind": "chunked", "chunk": 4, "blocks": [[0, 4]]}', "structure.blocks applies"),
        ("alignment on full", '{"kind": "full", "alignment": "bottom_right"}', "structure.alignment applies"),
        ("duplicate kind", '{"kind": "full", "kind": "causal"}', "'kind' twice"),
        ("duplicate window", '{"kind": "sliding_window", "window": 4, "window": 8}', "'window' twice"),
        ("duplicate in a document", '{"structure": {"kind": "causal"}, "structure": {"kind": "full"}}',
         "'structure' twice"),
        ("unknown document key", '{"schema": 2, "structure": {"kind": "causal"}, "shape2": []}', "'shape2'"),
        ("kv_valid empty", '{"kind": "causal", "kv_valid": []}', "structure.kv_valid must list one entry per batch (2)"),
        ("q_valid empty", '{"kind": "causal", "q_valid": []}', "structure.q_valid must list"),
        ("segments empty", '{"kind": "causal", "segments": []}', "structure.segments must list"),
        ("kv_valid three for two batches", '{"kind": "causal", "kv_valid": [[0, 8], [0, 8], [0, 8]]}', "got 3"),
        ("kv_valid not pairs", '{"kind": "causal", "kv_valid": [[0, 8, 9]]}', "must be [start, end]"),
        ("kv_valid a pair", '{"kind": "causal", "kv_valid": [0, 8]}', "must be [start, end]"),
        ("kv_valid past K", '{"kind": "causal", "kv_valid": [[0, 99]]}', "<= K (16)"),
        ("kv_valid an object", '{"kind": "causal", "kv_valid": {"0": [0, 8]}}', "must be an array"),
        ("window a string", '{"kind": "sliding_window", "window": "4"}', "structure.window must be an integer"),
        ("window a float", '{"kind": "sliding_window", "window": 4.5}', "structure.window must be an integer"),
        ("window 1e3", '{"kind": "sliding_window", "window": 1e3}', "structure.window must be an integer"),
        ("window true", '{"kind": "sliding_window", "window": true}', "structure.window must be an integer"),
        ("window zero", '{"kind": "sliding_window", "window": 0}', "structure.window must be in [1, 2^62]"),
        ("window 2^62 + 1", '{"kind": "sliding_window", "window": %d}' % (2 ** 62 + 1), "got %d" % (2 ** 62 + 1)),
        ("window 2^63", '{"kind": "sliding_window", "window": %d}' % 2 ** 63, "got %d" % 2 ** 63),
        ("window 2^64 - 1", '{"kind": "sliding_window", "window": %d}' % big, "got %d" % big),
        ("window 2^64", '{"kind": "sliding_window", "window": %d}' % 2 ** 64, "structure.window must be an integer"),
        ("window -2^63", '{"kind": "sliding_window", "window": %d}' % -2 ** 63, "got %d" % -2 ** 63),
        ("chunk 2^63 + 1", '{"kind": "chunked", "chunk": %d}' % (2 ** 63 + 1), "got %d" % (2 ** 63 + 1)),
        ("kv_valid end 2^64 - 1", '{"kind": "causal", "kv_valid": [[0, %d]]}' % big, "got %d" % big),
        ("segments offset 2^63", '{"kind": "causal", "segments": [[0, %d, 16]]}' % 2 ** 63, "got %d" % 2 ** 63),
        ("empty_rows 2^64 - 1", '{"kind": "causal", "empty_rows": %d}' % big, "got %d" % big),
        ("segments not rising", '{"kind": "causal", "segments": [[0, 9, 4, 16]]}', "rise strictly"),
        ("blocks overlapping", '{"kind": "causal_blocks", "blocks": [[0, 8], [4, 12]]}', "sorted, disjoint"),
        ("blocks empty", '{"kind": "causal_blocks", "blocks": []}', "at least one block"),
        ("empty_rows wrong", '{"kind": "causal", "empty_rows": 3}', "implies 0"),
        ("bias a string", '{"kind": "causal", "bias": "yes"}', "structure.bias"),
        ("tile_fractions on causal",
         '{"kind": "causal", "tile_fractions": {"block": [4, 4], "partial": 0.1, "full": 0.1}}', "only arbitrary"),
        ("tile_fractions NaN-like", '{"kind": "arbitrary", "tile_fractions": {"block": [4, 4], "partial": -1, "full": 3}}',
         "shares in [0, 1]"),
        ("nested 20 deep", '{"kind": "causal", "kv_valid": ' + "[" * 20 + "]" * 20 + "}", "nested deeper"),
    ]
    return [(name, text.encode(), message) for name, text, message in cases] + [
        ("invalid UTF-8", b'{"kind": "caus\xff"}', "not valid JSON"),
        ("NUL byte", b'{"kind": "causal"}\0', "not valid JSON"),
    ]


def check_structures(tmp):
    shape = ["--shape", "2,1,16,16"]
    for i, (name, text, message) in enumerate(bad_structures()):
        path = os.path.join(tmp, f"bad{i}.json")
        with open(path, "wb") as f:
            f.write(text)
        # From a file: an input, exit 1, the file named.
        clean_error(run(["policy", "--structure", "@" + path, *shape]), f"structure file {name}", 1, names=(path, message))
        # From stdin: the same error.
        with open(path, "rb") as f:
            clean_error(run(["policy", "--structure", "@-", *shape], stdin=f), f"structure on stdin {name}", 1,
                        names=(message,))
        # Inline: part of the command line, exit 2 naming --structure (a NUL cannot be an argument).
        if b"\0" not in text:
            clean_error(run(["policy", "--structure", text.decode("utf-8", "surrogateescape"), *shape, "--json"]),
                        f"inline structure {name}", 2, names=("--structure", message))


# --- tests/fuzz/corpus --------------------------------------------------------------

def check_corpus():
    corpus = os.path.join(SOURCE, "tests", "fuzz", "corpus")
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(corpus) for f in names)
    if not files:
        failures.append(f"no corpus files under {corpus}")
    for path in files:
        what = os.path.relpath(path, corpus)
        # Every file as a mask and as a structure: the .npy seeds are masks, the JSON seeds
        # structures; the rest are the other harnesses' raw bytes, which must be refused cleanly.
        verdict_or_clean_error(run(["inspect", path]), f"corpus {what} as a mask")
        verdict_or_clean_error(run(["inspect", path, "--mask-dtype", "bf16", "--tiles", "4"]),
                               f"corpus {what} as a bf16 mask with tiles")
        verdict_or_clean_error(run(["policy", "--structure", "@" + path, "--shape", "1,1,16,16"]),
                               f"corpus {what} as a structure")
        verdict_or_clean_error(run(["policy", "--structure", "@" + path, "--shape", "2,3,64,80"]),
                               f"corpus {what} as a structure of another shape")
    return len(files)


with tempfile.TemporaryDirectory() as tmp:
    check_npy(tmp)
    check_structures(tmp)
    corpus_files = check_corpus()

for f in failures:
    print("FAIL:", f)
print(f"{runs} runs ({corpus_files} corpus files): " + ("ok" if not failures else f"{len(failures)} failures"))
sys.exit(1 if failures else 0)
