"""The masklens command built with the fake backend of tests/fake_backend/ (one family
row, one registry row, one header): its family is an --available name and its help
text, decide() picks it, and the text and JSON outputs name it and its arguments."""
import json
import subprocess
import sys

EXE = sys.argv[1]
CAUSAL = ["policy", "--structure", '{"kind": "causal"}', "--shape", "1,8,256,256"]
failures = []
checks = 0


def run(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60)


def check(what, ok):
    global checks
    checks += 1
    if not ok:
        failures.append(what)


p = run(*CAUSAL, "--available", "torch,fake_attn", "--json")
check(f"--available torch,fake_attn --json: exit {p.returncode}: {p.stderr}", p.returncode == 0)
if p.returncode == 0:
    policy = json.loads(p.stdout)["policy"]
    check(f"the JSON's backend is {policy['backend']!r}", policy["backend"] == "fake_attn")
    check(f"the JSON's args are {policy['args']!r}", policy["args"] == {"causal": True})
    check(f"the JSON's typed call is {policy['call']!r}", policy["call"]["type"] == "kernel")

p = run(*CAUSAL, "--available", "torch,fake_attn")
check(f"text output: {p.stdout!r}", p.returncode == 0 and p.stdout.splitlines()[1].startswith("call      fake_attn (mask drop)")
      and "out = fake_attn.attention(q, k, v, causal=True)" in p.stdout)

p = run(*CAUSAL, "--available", "torch,fake_attn", "--sm", "75", "--json")
refused = [r for r in json.loads(p.stdout)["policy"]["rejected"] if r["backend"] == "fake_attn"] if p.returncode == 0 else []
check(f"--sm 75: fake_attn's rejection is {refused!r}", [r.get("rules") for r in refused] == [["fake_attn.sm"]])

p = run(*CAUSAL, "--json")
unavailable = [r["kind"] for r in json.loads(p.stdout)["policy"]["rejected"] if r["backend"] == "fake_attn"]
check(f"without its family: fake_attn is {unavailable!r}", unavailable == ["unavailable"])

p = run(*CAUSAL, "--available", "torch,fake")
check(f"an unknown family names fake_attn among the known: {p.stderr!r}",
      p.returncode == 2 and "(torch, flash_attn, flash_attn3, flex, xformers, te, flashinfer, cudnn_frontend, jax, fake_attn)"
      in p.stderr)

p = run("policy", "--help")
check("policy --help lists fake_attn under --available", "jax, fake_attn" in p.stdout)

for f in failures:
    print("FAIL:", f)
print(f"{checks - len(failures)} checks passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
