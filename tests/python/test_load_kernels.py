"""masklens.load_kernels(): masklens' CUDA kernels loaded at start-up instead of at the
first scan. On any machine: it is public and documented (masklens, masklens.torch), it
returns False and does nothing without masklens._cuda or a CUDA device or for a device
that is not CUDA, it passes the device index it resolves to masklens._cuda.load_kernels
(a stand-in records it), the real module names the failing CUDA call where no GPU can be
used, and masklens.transformers neither calls it nor initialises CUDA. On a GPU: True,
again True, and scans after it give the host's verdicts and tiles."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import masklens
from masklens import _scan
from helpers import rows_cols

try:
    from masklens import _build
    BUILT = _build.CUDA_MODULE
except ImportError:
    BUILT = False

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "python.md")


class FakeCuda:
    """Stands in for masklens._cuda: records the device index of each load_kernels call."""

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def load_kernels(self, device):
        self.calls.append(device)
        if self.fail:
            raise masklens.MaskError(self.fail)


def test_is_public_and_documented():
    from masklens import torch as masklens_torch
    assert "load_kernels" in masklens.__all__
    assert masklens_torch.load_kernels is masklens.load_kernels  # re-exported beside the drop-in
    doc = masklens.load_kernels.__doc__
    for words in ("start-up", "True", "False", "masklens._cuda", "CUDA device"):
        assert words in doc, words
    assert "load_kernels()" in masklens_torch.__doc__
    if os.path.exists(DOCS):  # a source checkout: docs/python.md says how to call it
        with open(DOCS, encoding="utf-8") as f:
            assert "masklens.load_kernels(" in f.read()


def test_real_answer_is_whether_a_cuda_device_scans_here():
    """No stand-in: False where there is no masklens._cuda or no CUDA device (this
    machine, without a GPU), True on a GPU with the module; never an error."""
    assert masklens.load_kernels() is (masklens.has_cuda_scan() and torch.cuda.is_available())


def test_false_without_the_cuda_module(monkeypatch):
    monkeypatch.setattr(_scan, "cuda_module", lambda: None)

    def no_probe():
        raise AssertionError("asked torch for CUDA without masklens._cuda")
    monkeypatch.setattr(torch.cuda, "is_available", no_probe)
    assert masklens.load_kernels() is False
    assert masklens.load_kernels("cuda:0") is False


def test_false_without_a_cuda_device(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(_scan, "cuda_module", lambda: fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in (None, 0, "cuda", "cuda:1", torch.device("cuda", 0)):
        assert masklens.load_kernels(device) is False
    assert fake.calls == []


def test_loads_on_the_device_it_resolves(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(_scan, "cuda_module", lambda: fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    reserved = []  # the pinned staging of each device it loads on
    monkeypatch.setattr(_scan, "reserve_staging", lambda device: reserved.append(str(device)))
    assert masklens.load_kernels() is True              # torch's current device
    assert masklens.load_kernels("cuda") is True        # no index: the current one too
    assert masklens.load_kernels("cuda:1") is True
    assert masklens.load_kernels(2) is True             # an index, as torch.device(2)
    assert masklens.load_kernels(torch.device("cuda", 0)) is True
    assert fake.calls == [3, 3, 1, 2, 0]
    assert reserved == ["cuda:3", "cuda:3", "cuda:1", "cuda:2", "cuda:0"]
    assert masklens.load_kernels("cpu") is False         # not a CUDA device: nothing to load
    assert masklens.load_kernels(torch.device("meta")) is False
    assert fake.calls == [3, 3, 1, 2, 0] and len(reserved) == 5


def test_a_failure_on_a_cuda_device_is_raised(monkeypatch):
    fake = FakeCuda(fail="device_error: cudaSetDevice: cudaErrorInvalidDevice: invalid device ordinal")
    monkeypatch.setattr(_scan, "cuda_module", lambda: fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(masklens.MaskError, match="^device_error: cudaSetDevice"):
        masklens.load_kernels(7)
    assert fake.calls == [7]


@pytest.mark.skipif(not BUILT, reason="masklens was built without its CUDA module")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU can be used")
def test_without_a_gpu_the_module_names_the_failing_cuda_call():
    from masklens import _cuda
    with pytest.raises(masklens.MaskError, match=r"^device_error: cuda\w+.*: cudaError"):
        _cuda.load_kernels(0)


def run_python(code):
    """`code` in a fresh interpreter that imports the masklens under test."""
    env = dict(os.environ)
    path = os.environ.get("MASKLENS_PYTHONPATH")
    if path:
        env["PYTHONPATH"] = path + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_transformers_registration_neither_loads_kernels_nor_initialises_cuda():
    pytest.importorskip("transformers")
    out = run_python(
        "import torch, masklens\n"
        "def boom(*a, **k):\n"
        "    raise AssertionError('masklens.transformers called load_kernels')\n"
        "masklens.load_kernels = boom\n"
        "import masklens.transformers\n"
        "masklens.transformers.register()\n"
        "print(torch.cuda.is_initialized())\n")
    assert out == "False"


@pytest.mark.gpu
@pytest.mark.skipif(not BUILT, reason="masklens was built without its CUDA module")
def test_on_a_gpu_it_loads_and_scans_after_it_are_right():
    assert masklens.load_kernels() is True
    assert masklens.load_kernels() is True  # again: found loaded
    assert masklens.load_kernels(torch.cuda.current_device()) is True
    L = 300
    i, j = rows_cols(L, L)
    masks = {
        "causal bool": (j <= i)[None, None],
        "sliding window bf16": torch.where((j <= i) & (i - j < 40), 0.0, -torch.inf).to(torch.bfloat16)[None, None],
        "padded float32": torch.where(j >= 17, 0.0, torch.finfo(torch.float32).min)[None, None],
    }
    for name, base in masks.items():
        # Broadcast on the device as on the host (.cuda() of an expanded tensor would copy
        # every batch and head: another mask's verdict, one entry per batch).
        m, on_device = base.expand(2, 3, L, L), base.cuda().expand(2, 3, L, L)
        host = _scan.scan(m)
        device = masklens.scan(on_device)
        assert masklens.last_timing()["device"] == "cuda", name
        assert device.structure.describe() == host.structure.describe(), name
        assert np.array_equal(device.attending_rows(), host.attending_rows()), name
        on_gpu = masklens.inspect(on_device, tiles=64).tiles
        on_cpu = masklens.inspect(m, tiles=64).tiles
        assert np.array_equal(on_gpu.states, on_cpu.states), name
