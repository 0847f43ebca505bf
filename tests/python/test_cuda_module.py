"""masklens._cuda on any machine: it is present exactly where the build made it, loads
after torch, sizes its buffers as _core does, checks its arguments before any CUDA
call, and fails with a MaskError (never a crash) where no GPU can be used. The Python
half of a device scan (buffer layout, DeviceScan, classification) runs here with a
stand-in for the kernel that writes the spans a scan of the same mask produces."""
import ctypes
import importlib.util

import numpy as np
import pytest
import torch

import masklens
from masklens import _cache, _core
from helpers import rows_cols

try:
    from masklens import _build
    BUILT = _build.CUDA_MODULE
except ImportError:  # a package without the build record cannot have been built with it
    BUILT = False

needs_module = pytest.mark.skipif(not BUILT, reason="masklens was built without its CUDA module")
ROWSPAN = np.dtype([("first", "<i8"), ("last", "<i8"), ("count", "<i8"), ("flags", "<u4"), ("reserved", "<u4")])


def test_module_is_present_exactly_where_it_was_built():
    assert (importlib.util.find_spec("masklens._cuda") is not None) == BUILT
    assert masklens.has_cuda_scan() == BUILT
    reason = masklens.cuda_scan_unavailable()
    if BUILT:
        assert reason is None
        from masklens import _cuda
        assert _cuda.built_with_cuda()
    else:
        assert "without" in reason


def args_of(m, threshold=-1000.0):
    dtype = masklens.element_name(m.dtype)
    return m.data_ptr(), dtype, list(m.shape), list(m.stride()), threshold


SHAPES = [  # (description, tensor): the span table holds one slice per distinct (batch, head)
    ("2-D", torch.ones(37, 53, dtype=torch.bool), 1),
    ("3-D heads", torch.ones(3, 37, 53, dtype=torch.bool), 3),
    ("batch and heads", torch.ones(2, 3, 37, 53, dtype=torch.bool), 6),
    ("stride-0 heads", torch.ones(2, 1, 37, 53, dtype=torch.bool).expand(2, 5, 37, 53), 2),
    ("stride-0 batch", torch.ones(1, 3, 37, 53, dtype=torch.float16).expand(4, 3, 37, 53), 3),
    ("stride-0 batch and heads", torch.ones(37, 53, dtype=torch.bfloat16).expand(4, 5, 37, 53), 1),
    ("stride-0 query", torch.ones(2, 1, 1, 53, dtype=torch.int8).expand(2, 1, 37, 53), 2),
]


@needs_module
@pytest.mark.parametrize("name,m,slices", SHAPES, ids=[s[0] for s in SHAPES])
def test_both_modules_size_the_same_table(name, m, slices):
    from masklens import _cuda
    temp_bytes, span_bytes = _cuda.query(*args_of(m))
    assert temp_bytes >= 1  # a null temp pointer always means "size query"
    assert span_bytes == slices * m.shape[-2] * 32
    assert _core.DeviceScan(*args_of(m)).nbytes == span_bytes


@needs_module
def test_arguments_are_checked_before_any_cuda_call():
    from masklens import _cuda
    m = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    ptr, dtype, shape, strides, t = args_of(m)
    table = _core.DeviceScan(ptr, dtype, shape, strides, t)
    with pytest.raises(masklens.MaskError, match="^unsupported_dtype: .*int64"):
        _cuda.query(ptr, "int64", shape, strides, t)
    with pytest.raises(masklens.MaskError, match="^invalid_stride: "):
        _cuda.query(ptr, dtype, shape, strides[:3], t)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: mask data pointer is null"):
        _core.DeviceScan(0, dtype, shape, strides, t)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: span buffers hold 32 bytes; this view needs 512"):
        _cuda.scan(ptr, dtype, shape, strides, t, 4096, 1, 8192, table.address, 32, 0, 0)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: host span buffer is null"):
        _cuda.scan(ptr, dtype, shape, strides, t, 4096, 1, 8192, 0, table.nbytes, 0, 0)


@needs_module
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU can be used")
def test_without_a_gpu_the_scan_names_the_failing_cuda_call():
    from masklens import _cuda
    m = torch.ones(8, 8, dtype=torch.bool)
    table = _core.DeviceScan(*args_of(m))
    with pytest.raises(masklens.MaskError, match=r"^device_error: cuda\w+: cudaError"):
        _cuda.scan(*args_of(m), 4096, 1, 8192, table.address, table.nbytes, 0, 0)
    with pytest.raises(masklens.MaskError, match=r"^device_error: cudaGetDeviceCount"):
        _cuda.device_count()


def spans_of(m):
    """The RowSpans a scan of bool mask m ([B, H, Q, K], maybe stride 0) produces, laid out
    as the span table: one slice per distinct (batch, head), size-1 dims read as stride 0."""
    B, H, Q, K = m.shape
    db = B if B > 1 and m.stride(0) != 0 else 1
    dh = H if H > 1 and m.stride(1) != 0 else 1
    out = np.zeros(db * dh * Q, dtype=ROWSPAN)
    keys = torch.arange(K)
    i = 0
    for b in range(db):
        for h in range(dh):
            for q in range(Q):
                row = m[b, h, q]
                n = int(row.sum())
                out[i] = (int(keys[row].min()) if n else 2**63 - 1, int(keys[row].max()) if n else -1, n, 0, 0)
                i += 1
    return out


class FakeCuda:
    """Stands in for masklens._cuda: checks the buffers device_scan() hands it and writes
    the spans the kernel would, as the real scan's device-to-host copy does."""

    def __init__(self, spans, flags_row=None):
        self.spans, self.flags_row, self.calls = spans, flags_row, []

    def query(self, data, dtype, shape, strides, threshold):
        return 24, self.spans.nbytes

    def scan(self, data, dtype, shape, strides, threshold, d_temp, temp_bytes, d_spans, h_spans, span_bytes, stream,
             device):
        self.calls.append(dict(d_temp=d_temp, temp_bytes=temp_bytes, d_spans=d_spans, span_bytes=span_bytes,
                               stream=stream, dtype=dtype, shape=shape, strides=strides))
        spans = self.spans.copy()
        if self.flags_row is not None:
            spans["flags"][self.flags_row] = 4  # kRowInvalid: the row held NaN / +inf
        ctypes.memmove(h_spans, spans.ctypes.data, span_bytes)


def masks():
    L = 40
    i, j = rows_cols(L, L)
    c = j <= i
    start = torch.tensor([0, 7])
    docs = torch.bucketize(torch.arange(L), torch.tensor([9, 25]), right=True)
    return {
        "causal, stride-0 batch and heads": c.expand(2, 3, L, L),
        "left padded causal": (c[None] & (j[None] >= start[:, None, None]))[:, None],
        "packed documents": (c & (docs[:, None] == docs[None, :]))[None, None],
        "sliding window 5": (c & (i - j < 5))[None, None].expand(1, 4, L, L),
    }


@pytest.mark.parametrize("name", list(masks()))
def test_device_scan_python_half_matches_the_host_scan(name, monkeypatch):
    m = masks()[name]
    fake = FakeCuda(spans_of(m))
    monkeypatch.setattr(_cache, "_cuda", fake)
    monkeypatch.setattr(_cache, "_stream_of", lambda device: 12345)
    verdict = _cache.device_scan(m)
    t = masklens.last_timing()
    assert t["device"] == "cuda" and t["scan_ms"] >= 0 and t["classify_ms"] >= 0
    host = _cache.scan(m)
    assert verdict.structure.describe() == host.structure.describe()
    assert np.array_equal(verdict.attending_rows(), host.attending_rows())
    call = fake.calls[0]
    # One block: the spans first, the temporary storage right after them.
    assert call["span_bytes"] == fake.spans.nbytes and call["temp_bytes"] == 24
    assert call["d_temp"] == call["d_spans"] + call["span_bytes"]
    assert call["stream"] == 12345 and call["dtype"] == "bool"
    assert call["strides"] == list(m.stride())  # stride 0 passed as it is: broadcast slices scanned once


def test_device_scan_names_an_invalid_row(monkeypatch):
    m = torch.ones(2, 3, 40, 40, dtype=torch.bool)
    # Slice 4 of 6 is (batch 1, head 1); row 17 of it.
    monkeypatch.setattr(_cache, "_cuda", FakeCuda(spans_of(m), flags_row=4 * 40 + 17))
    monkeypatch.setattr(_cache, "_stream_of", lambda device: 0)
    with pytest.raises(masklens.MaskError, match=r"^invalid_value: mask row \[1, 1, 17\] holds NaN or \+inf"):
        _cache.device_scan(m)


def test_device_scan_table_is_classified_once():
    m = torch.ones(4, 4, dtype=torch.bool)
    table = _core.DeviceScan(*args_of(m))
    spans = spans_of(m[None, None])
    ctypes.memmove(table.address, spans.ctypes.data, table.nbytes)
    assert table.finish().structure.kind == "full"
    with pytest.raises(masklens.MaskError, match="finish\\(\\) was called already"):
        table.finish()


def test_last_timing_says_when_the_cache_answered():
    m = torch.ones(64, 64, dtype=torch.bool).tril()
    masklens.forget()
    masklens.scan(m)
    first = masklens.last_timing()
    assert first["scanned"] and first["device"] == "host"
    masklens.scan(m)
    assert not masklens.last_timing()["scanned"]
