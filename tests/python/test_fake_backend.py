"""A backend added in one row (docs/backends.md, "Adding a backend"), seen from Python: the
binding built with the fake backend of tests/fake_backend/ (its family row, registry row
and header; the build's _core_fake_backend module) and one runner registered with
masklens._run.register_runner. Each check runs in a process of its own, where that module
is loaded as masklens._core; the CLI side is tests/cli/test_fake_backend.py."""
import glob
import json
import os
import subprocess
import sys

import pytest

import masklens

FAKE_CORE = glob.glob(os.path.join(os.path.dirname(masklens.__file__), "_core_fake_backend*.so"))
pytestmark = pytest.mark.skipif(not FAKE_CORE, reason="the build's _core_fake_backend module (meson -Dtests) "
                                                      "is not beside this masklens")

PRELUDE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("masklens._core", {core!r})
core = importlib.util.module_from_spec(spec)
sys.modules["masklens._core"] = core
spec.loader.exec_module(core)
import torch
import masklens, masklens.torch
from masklens import _env, _run
i = torch.arange(64)
causal = (i[None, :] <= i[:, None])
q, k, v = (torch.randn(1, 2, 64, 32) for _ in range(3))
"""


def run(body: str, *paths) -> dict:
    """Runs PRELUDE + body in a fresh interpreter (the package beside this one's, and
    `paths` on its path) and returns the JSON the body prints last."""
    code = PRELUDE.format(core=FAKE_CORE[0]) + body
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, paths), os.path.dirname(os.path.dirname(
        masklens.__file__)), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_tables_hold_the_fake_row():
    got = run("""
print(json.dumps({"families": [f["name"] for f in core.families()],
                  "fake": [b for b in core.backends() if b["name"] == "fake_attn"],
                  "module": _env._FAMILIES.get("fake_attn"), "runnable": sorted(_env.RUNNABLE)}))
""")
    assert got["families"][-1] == "fake_attn"
    (row,) = got["fake"]
    assert row["family"] == "fake_attn" and row["rules"] == ["fake_attn.sm"] and row["native_rate"] == 0.5
    assert got["module"] == ["fake_attn", []]  # its Python module, no distributions
    assert "fake_attn" not in got["runnable"]  # no runner yet: the drop-in never decides it


def test_inspect_decides_it_and_the_json_names_it():
    got = run("""
report = masklens.inspect(causal, q, k, v, sm=90, available={"torch", "fake_attn"})
unavailable = masklens.inspect(causal, q, k, v, sm=90, available={"torch"})
old_gpu = masklens.inspect(causal, q, k, v, sm=75, available={"torch", "fake_attn"})
print(json.dumps({"policy": report.to_dict()["policy"], "text": str(report),
                  "without": unavailable.policy.backend,
                  "refused": [r.reason for r in old_gpu.rejected if r.backend == "fake_attn"]}))
""")
    policy = got["policy"]
    assert policy["backend"] == "fake_attn" and policy["mask"] == "drop"
    assert policy["args"] == {"causal": True}
    assert "call      fake_attn (mask drop)" in got["text"]
    assert got["without"] != "fake_attn"
    assert got["refused"] == ["fake_attn needs sm80 or newer, got sm75"]


def test_the_drop_in_runs_its_runner_once_registered():
    got = run("""
calls = []
def make(call):
    causal_arg = call.args.causal
    def run(t, q, k, v, mask):
        calls.append(causal_arg)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal_arg, scale=t.scale)
    return run
_run.register_runner("fake_attn", make)
real = _env.environment
_env.environment = lambda *a, **kw: real(*a, **{**kw, "sm": 90, "available": {"torch", "fake_attn"}})
out = masklens.torch.scaled_dot_product_attention(q, k, v, attn_mask=causal)
want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)
policy, _ = masklens.torch.inspect(q, k, v, causal)
print(json.dumps({"calls": calls, "runnable": sorted(_env.RUNNABLE), "backend": policy.backend,
                  "error": (out - want).abs().max().item()}))
""")
    assert "fake_attn" in got["runnable"]
    assert got["backend"] == "fake_attn" and got["calls"] == [True]
    assert got["error"] < 1e-5


def test_an_installed_family_without_a_version_is_found(tmp_path):
    """The fake family names a Python module and no version of its own: where that module
    imports, a GPU's environment has the family available (its version field none), and
    the drop-in's (runnable_only) has it once its backend has a runner."""
    (tmp_path / "fake_attn").mkdir()
    (tmp_path / "fake_attn" / "__init__.py").write_text("")
    got = run("""
torch.cuda.get_device_capability = lambda index=None: (9, 0)  # an sm90 GPU, as _env reads it
seen = {"all": sorted(_env.environment("cuda:0").available),
        "runnable": sorted(_env.environment("cuda:0", runnable_only=True).available)}
_run.register_runner("fake_attn", lambda call: None)
seen["runnable_with_runner"] = sorted(_env.environment("cuda:0", runnable_only=True).available)
print(json.dumps(seen))
""", tmp_path)
    assert "fake_attn" in got["all"]
    assert "fake_attn" not in got["runnable"]
    assert "fake_attn" in got["runnable_with_runner"]
