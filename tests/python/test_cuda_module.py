"""masklens._cuda on any machine: it is present exactly where the build made it, loads
after torch, sizes its buffers as _core does, checks its arguments before any CUDA
call, and fails with a MaskError (never a crash) where no GPU can be used. The host
half of a device scan (the block's layout, DeviceRuns, runs past the first copy, the
classification of runs, a NaN row named) runs here with a stand-in for the kernels that
writes the runs a scan of the same mask reduces to; likewise the scan that writes torch
BlockMask's eight tensors (scan_runs planned with tiles), with a stand-in writing masklens'
host tiles."""
import ctypes
import importlib.util

import numpy as np
import pytest
import torch

import masklens
from masklens import _block_mask, _core, _scan
from helpers import rows_cols, tensors_held

try:
    from masklens import _build
    BUILT = _build.CUDA_MODULE
except ImportError:  # a package without the build record cannot have been built with it
    BUILT = False

needs_module = pytest.mark.skipif(not BUILT, reason="masklens was built without its CUDA module")
ROWSPAN = np.dtype([("first", "<i8"), ("last", "<i8"), ("count", "<i8"), ("flags", "<u4"), ("reserved", "<u4")])
SPANRUN = np.dtype([("row", "<i8"), ("length", "<i8"), ("first", "<i8"), ("last", "<i8"), ("d_first", "<i8"),
                    ("d_last", "<i8"), ("count", "<i8"), ("flags", "<u4"), ("reserved", "<u4")])
assert SPANRUN.itemsize == 64


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


def layout_of(m, scan_temp=1, reduce_temp=4000):
    return _core.DeviceRuns(*args_of(m), scan_temp, reduce_temp)


@pytest.mark.parametrize("name,m,slices", SHAPES, ids=[s[0] for s in SHAPES])
def test_device_block_layout(name, m, slices):
    """One block: count (64 bytes), room for min(rows, 4096) runs, one span per row of each
    distinct slice, then both temporary storages, each part 256-byte aligned, none
    overlapping; the head (count and first runs) is the block's first bytes."""
    rows = slices * m.shape[-2]
    r = layout_of(m, scan_temp=24, reduce_temp=777)
    lay = r.layout
    assert r.rows == rows and r.room == min(rows, 4096) and r.eager == min(rows, 256)
    assert lay["count"] == 0 and lay["first_invalid"] == 8 and lay["runs"] == 64  # both in the head
    for part in ("spans", "scan_temp", "reduce_temp"):
        assert lay[part] % 256 == 0
    assert lay["spans"] >= 64 + r.room * 64
    assert lay["scan_temp"] >= lay["spans"] + rows * 32
    assert lay["reduce_temp"] >= lay["scan_temp"] + 24
    assert r.block_bytes == lay["bytes"] == lay["reduce_temp"] + 777
    assert r.head_bytes == 64 + r.eager * 64 and r.head_address != 0


@needs_module
@pytest.mark.parametrize("name,m,slices", SHAPES, ids=[s[0] for s in SHAPES])
def test_the_plan_is_the_librarys_size_query(name, m, slices):
    """plan_runs() lays the block out as the library's runs_block_for (both temporaries
    at least a byte: a null temp pointer always means "size query"), with a tile scan's
    larger temporary and its grid where a tile size is given."""
    from masklens import _cuda
    runs = _cuda.plan_runs(*args_of(m))
    assert isinstance(runs, _core.DeviceRuns) and runs.tile_grid is None
    lay = runs.layout
    assert lay["reduce_temp"] > lay["scan_temp"] >= lay["spans"] + runs.rows * 32
    assert runs.rows == slices * m.shape[-2]
    tiled = _cuda.plan_runs(*args_of(m), 16, 8)
    B, H, Q, K = (1,) * (4 - m.dim()) + tuple(m.shape)
    assert tiled.tile_grid[2:] == [-(-Q // 16), -(-K // 8)]
    assert tiled.tile_grid[0] * tiled.tile_grid[1] == slices
    assert tiled.layout["spans"] == lay["spans"] and tiled.block_bytes > runs.block_bytes  # tile counts


@needs_module
def test_arguments_are_checked_before_any_cuda_call():
    from masklens import _cuda
    m = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    ptr, dtype, shape, strides, t = args_of(m)
    runs = _cuda.plan_runs(ptr, dtype, shape, strides, t)
    with pytest.raises(masklens.MaskError, match="^unsupported_dtype: .*int64"):
        _cuda.plan_runs(ptr, "int64", shape, strides, t)
    with pytest.raises(masklens.MaskError, match="^invalid_stride: "):
        _cuda.plan_runs(ptr, dtype, shape, strides[:3], t)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: mask data pointer is null"):
        _cuda.plan_runs(0, dtype, shape, strides, t)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: mask data pointer is null"):
        _core.DeviceRuns(0, dtype, shape, strides, t, 1, 1)
    block = 1 << 20
    with pytest.raises(masklens.MaskError, match="^invalid_argument: device block holds 32 bytes; this view's layout"):
        _cuda.scan_runs(runs, block, 32, 0, 0)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: device block is null"):
        _cuda.scan_runs(runs, 0, runs.block_bytes, 0, 0)
    with pytest.raises(masklens.MaskError, match="^misaligned_pointer: device block is not 256-byte aligned"):
        _cuda.scan_runs(runs, block + 8, runs.block_bytes, 0, 0)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: BlockMask arrays or tile states given to a scan "
                                                 "planned without tiles"):
        _cuda.scan_runs(runs, block, runs.block_bytes, 0, 0, d_states=1 << 16, states_bytes=4)
    # (a block laid out for another view is the library's to refuse: tests/test_gpu_runs_api.cpp)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: no scan enqueued with wait=False is pending"):
        _cuda.wait_runs(runs)


@needs_module
def test_runs_past_the_head_are_checked_before_any_cuda_call():
    from masklens import _cuda
    m = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    runs = _cuda.plan_runs(*args_of(m))
    head = np.zeros(runs.head_bytes, dtype=np.uint8)
    head[:8] = np.frombuffer(np.int64(3).tobytes(), dtype=np.uint8)  # 3 runs: all in the head
    ctypes.memmove(runs.head_address, head.ctypes.data, runs.head_bytes)
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: rest_buffer is for counts in \(16, 16\], got 3"):
        _cuda.copy_rest(runs, 1 << 20, runs.block_bytes, 0, 0, 0)
    head[:8] = np.frombuffer(np.int64(17).tobytes(), dtype=np.uint8)  # more runs than rows: a broken reduction
    ctypes.memmove(runs.head_address, head.ctypes.data, runs.head_bytes)
    with pytest.raises(masklens.MaskError, match="^device_error: the run reduction returned 17 runs for 16 rows"):
        _cuda.copy_rest(runs, 1 << 20, runs.block_bytes, 0, 0, 0)


@needs_module
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU can be used")
def test_without_a_gpu_the_scan_names_the_failing_cuda_call():
    from masklens import _cuda
    m = torch.ones(8, 8, dtype=torch.bool)
    runs = _cuda.plan_runs(*args_of(m))
    with pytest.raises(masklens.MaskError, match=r"^device_error: cuda\w+: cudaError"):
        _cuda.scan_runs(runs, 1 << 20, runs.block_bytes, 0, 0)
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


def encode_runs(spans, q_len):
    """span_runs.hpp's encoding, written again here: walking each slice from its first row,
    a row starts a new run at the slice's first row, when its class, flags or padding
    word differ from the row before, when it or the row before has holes, or when the run
    has two rows or more and the row is not the next term of their progression."""
    def cls(r):
        if r["count"] == 0:
            return "empty"
        return "interval" if r["count"] == r["last"] - r["first"] + 1 else "holed"

    out = []
    for i, r in enumerate(spans):
        prev = spans[i - 1] if i % q_len else None
        joins = (prev is not None and cls(r) != "holed" and cls(r) == cls(prev) and r["flags"] == prev["flags"]
                 and r["reserved"] == prev["reserved"])
        if joins and out[-1]["length"] >= 2:
            before = spans[i - 2]
            joins = (int(r["first"]) - int(prev["first"]) == int(prev["first"]) - int(before["first"])
                     and int(r["last"]) - int(prev["last"]) == int(prev["last"]) - int(before["last"]))
        if joins:
            run = out[-1]
            if run["length"] == 1:
                run["d_first"], run["d_last"] = int(r["first"]) - run["first"], int(r["last"]) - run["last"]
            run["length"] += 1
        else:
            out.append(dict(row=i, length=1, first=int(r["first"]), last=int(r["last"]), d_first=0, d_last=0,
                            count=int(r["count"]), flags=int(r["flags"]), reserved=int(r["reserved"])))
    table = np.zeros(len(out), dtype=SPANRUN)
    for i, run in enumerate(out):
        table[i] = tuple(run[f] for f in SPANRUN.names)
    return table


class FakeCuda:
    """Stands in for masklens._cuda: checks the block device_scan() hands it against the
    layout, and writes what the device would: the spans into the block (host memory here:
    a CPU mask's), the run count and the first runs into the head (one copy), the runs
    past them on copy_rest()."""

    def __init__(self, spans, q_len, flags_row=None):
        spans = spans.copy()
        if flags_row is not None:
            spans["flags"][flags_row] = 4  # kRowInvalid: the row held NaN / +inf
        self.spans, self.first_invalid = spans, -1 if flags_row is None else flags_row
        self.runs, self.calls = encode_runs(spans, q_len), []

    scan_temp = 24  # what the stand-in's size query answers

    def plan_runs(self, data, dtype, shape, strides, threshold, block_q=0, block_k=0):
        self.calls.append(dict(call="plan_runs", dtype=dtype, shape=shape, strides=strides, tiles=(block_q, block_k)))
        return _core.DeviceRuns(data, dtype, shape, strides, threshold, self.scan_temp, 1000, block_q, block_k)

    def scan_runs(self, runs, d_block, block_bytes, stream, device, arrays=(), array_bytes=(), d_states=0,
                  states_bytes=0, wait=True, classify_up_to=0):
        assert not arrays and not d_states, "a scan without tiles given tile outputs"
        return self.count_or_verdict(runs, self.scan_into(runs, d_block, block_bytes, stream), classify_up_to)

    @staticmethod
    def count_or_verdict(runs, count, classify_up_to):
        """As the binding answers: the runs' Verdict where they are at most classify_up_to
        and all came with the head (finish() done in the call), else the count."""
        return runs.finish() if count <= min(classify_up_to, runs.eager) else count

    def scan_into(self, runs, d_block, block_bytes, stream):
        """What the device writes: the spans into the block (host memory here: a CPU
        mask's), the run count, the first invalid row and the first runs into the head."""
        self.calls.append(dict(call="scan_runs", block_bytes=block_bytes, head_bytes=runs.head_bytes, stream=stream))
        assert block_bytes == runs.block_bytes
        ctypes.memmove(d_block + runs.layout["spans"], self.spans.ctypes.data, self.spans.nbytes)
        head = np.zeros(runs.head_bytes, dtype=np.uint8)
        head[:8] = np.frombuffer(np.int64(len(self.runs)).tobytes(), dtype=np.uint8)
        head[8:16] = np.frombuffer(np.int64(self.first_invalid).tobytes(), dtype=np.uint8)  # the run reduction's
        first = self.runs[:runs.eager]
        head[64:64 + first.nbytes] = np.frombuffer(first.tobytes(), dtype=np.uint8)
        ctypes.memmove(runs.head_address, head.ctypes.data, runs.head_bytes)
        return len(self.runs)

    def copy_rest(self, runs, d_block, block_bytes, d_more, stream, device):
        count = len(self.runs)
        address, nbytes = runs.rest_buffer(count)  # what the binding holds before its copy
        self.calls.append(dict(call="copy_rest", d_more=d_more, count=count, rest_bytes=nbytes))
        rest = self.runs[runs.eager:count]
        assert rest.nbytes == nbytes
        ctypes.memmove(address, rest.ctypes.data, nbytes)


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


def fake_scan(m, monkeypatch, flags_row=None, stream=12345):
    fake = FakeCuda(spans_of(m), m.shape[-2], flags_row)
    monkeypatch.setattr(_scan, "_cuda", fake)
    monkeypatch.setattr(_scan, "stream_of", lambda device: stream)
    return fake


@pytest.mark.parametrize("name", list(masks()))
def test_device_scan_host_half_matches_the_host_scan(name, monkeypatch):
    m = masks()[name]
    fake = fake_scan(m, monkeypatch)
    verdict = _scan.device_scan(m)
    t = masklens.last_timing()
    assert t["device"] == "cuda" and t["scan_ms"] >= 0
    assert t["classify_ms"] == 0.0  # classified in scan_runs' own call (its time is the call's)
    host = _scan.scan(m)
    assert verdict.structure.describe() == host.structure.describe()
    assert np.array_equal(verdict.attending_rows(), host.attending_rows())
    assert verdict.run_count == len(fake.runs) and host.run_count is None
    # Planned, then the runs came with the count and were classified in that call: two
    # crossings, one synchronisation.
    assert [c["call"] for c in fake.calls] == ["plan_runs", "scan_runs"]
    plan, call = fake.calls
    layout = _core.DeviceRuns(*args_of(m), 24, 1000)
    assert call["block_bytes"] == layout.block_bytes and call["head_bytes"] == layout.head_bytes
    # (the block's 256-byte alignment is torch's CUDA allocator's, 512; the library checks it)
    assert call["stream"] == 12345 and plan["dtype"] == "bool" and plan["tiles"] == (0, 0)
    assert plan["strides"] == list(m.stride())  # stride 0 passed as it is: broadcast slices scanned once


def test_device_scan_runs_are_few():
    """What the run path is for: a causal mask is one run per distinct slice, a sliding
    window two, packed documents one per document."""
    L = 40
    ms = masks()
    assert len(encode_runs(spans_of(ms["causal, stride-0 batch and heads"]), L)) == 1
    assert len(encode_runs(spans_of(ms["sliding window 5"]), L)) == 2
    assert len(encode_runs(spans_of(ms["packed documents"]), L)) == 3


@pytest.mark.parametrize("q", [300, 5000])
def test_device_scan_brings_runs_past_the_first_copy(q, monkeypatch):
    """More than 256 runs come back with a second copy; more than the block's room (4096)
    are reduced again into device room for them all. A mask whose every row has holes is
    one run per row: q runs, classified (arbitrary) with the rows that attend nothing."""
    i, j = rows_cols(q, 16)
    m = ((j % 2 == 0) & (i % 5 != 0))[None, None]
    fake = fake_scan(m, monkeypatch)
    assert len(fake.runs) == q
    verdict = _scan.device_scan(m)
    assert [c["call"] for c in fake.calls] == ["plan_runs", "scan_runs", "copy_rest"]
    rest = fake.calls[2]
    assert rest["count"] == q and rest["rest_bytes"] == (q - 256) * 64
    assert (rest["d_more"] != 0) == (q > 4096)
    assert verdict.run_count == q
    host = _scan.scan(m)
    assert verdict.structure.describe() == host.structure.describe() == f"arbitrary, {q // 5} empty rows"
    assert np.array_equal(verdict.attending_rows(), host.attending_rows())
    assert [r[0] for r in verdict.runs] == list(range(q))


def test_device_scan_names_an_invalid_row(monkeypatch):
    m = torch.ones(2, 3, 40, 40, dtype=torch.bool)
    # Slice 4 of 6 is (batch 1, head 1); row 17 of it.
    fake_scan(m, monkeypatch, flags_row=4 * 40 + 17, stream=0)
    with pytest.raises(masklens.MaskError, match=r"^invalid_value: mask row \[1, 1, 17\] holds NaN or \+inf"):
        _scan.device_scan(m)


def test_device_runs_are_classified_once_and_checked():
    m = torch.ones(4, 4, dtype=torch.bool)
    runs = encode_runs(spans_of(m[None, None]), 4)
    table = _core.DeviceRuns(*args_of(m), 1, 1)
    head = np.zeros(table.head_bytes, dtype=np.uint8)
    head[:8] = np.frombuffer(np.int64(len(runs)).tobytes(), dtype=np.uint8)
    head[64:64 + runs.nbytes] = np.frombuffer(runs.tobytes(), dtype=np.uint8)
    ctypes.memmove(table.head_address, head.ctypes.data, table.head_bytes)
    v = table.finish()
    assert v.structure.kind == "full" and v.run_count == 1
    with pytest.raises(masklens.MaskError, match="finish\\(\\) was called already"):
        table.finish()
    bad = _core.DeviceRuns(*args_of(m), 1, 1)
    head[:8] = np.frombuffer(np.int64(9).tobytes(), dtype=np.uint8)  # more runs than rows: a broken reduction
    ctypes.memmove(bad.head_address, head.ctypes.data, bad.head_bytes)
    with pytest.raises(masklens.MaskError, match="^device_error: the run reduction returned 9 runs for 4 rows"):
        bad.finish()


def test_last_timing_says_when_the_cache_answered():
    m = torch.ones(64, 64, dtype=torch.bool).tril()
    masklens.forget()
    masklens.scan(m)
    first = masklens.last_timing()
    assert first["scanned"] and first["device"] == "host"
    masklens.scan(m)
    assert not masklens.last_timing()["scanned"]


def test_runs_past_the_head_must_be_brought_before_finish():
    m = torch.ones(300, 8, dtype=torch.bool)
    table = _core.DeviceRuns(*args_of(m), 1, 1)
    head = np.zeros(table.head_bytes, dtype=np.uint8)
    head[:8] = np.frombuffer(np.int64(300).tobytes(), dtype=np.uint8)  # 300 runs: 44 past the head
    ctypes.memmove(table.head_address, head.ctypes.data, table.head_bytes)
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: rest_buffer is for counts in \(256, 300\]"):
        table.rest_buffer(256)
    with pytest.raises(masklens.MaskError, match="300 runs, of which 0 past the first copy were brought"):
        table.finish()
    table = _core.DeviceRuns(*args_of(m), 1, 1)
    address, nbytes = table.rest_buffer(300)
    assert address != 0 and nbytes == 44 * 64


# --- The scan that writes torch BlockMask's tensors on the device (planned with tiles) ----

TILE_FIELDS = list(_block_mask.BLOCK_MASK_FIELDS)
TILES_TEMP = 4096  # what FakeTileCuda's size query answers for the scan with tile counts


class FakeTileCuda(FakeCuda):
    """FakeCuda with the tile scan: checks the block and the eight arrays device_scan_tiles()
    hands it, and writes into them (host memory here: a CPU mask's tensors) what the device
    writes, from masklens' host tile summary of the same mask."""

    def __init__(self, m, size, flags_row=None):
        super().__init__(spans_of(m), m.shape[-2], flags_row)
        self.size = size
        _, tiles = _core.scan_with_tiles(m, size[0], size[1], -1000.0)
        self.host = tiles.block_mask()
        self.states = np.ascontiguousarray(tiles.states)
        self.pending = None  # the count of a scan enqueued with wait=False

    scan_temp = TILES_TEMP

    def scan_runs(self, runs, d_block, block_bytes, stream, device, arrays=(), array_bytes=(), d_states=0,
                  states_bytes=0, wait=True, classify_up_to=0):
        g = self.host.kv_indices.shape
        assert runs.tile_grid == [g[0], g[1], g[2], g[3]]
        self.calls.append(dict(call="scan_runs_tiles", stream=stream, arrays=list(arrays),
                               array_bytes=list(array_bytes), states=d_states != 0, wait=wait))
        assert self.pending is None, "a scan enqueued with wait=False was not waited for"
        self.runs_of_pending = runs
        for name, address, nbytes in zip(TILE_FIELDS, arrays, array_bytes):
            want = np.ascontiguousarray(getattr(self.host, name))
            assert nbytes == want.nbytes, name
            ctypes.memmove(address, want.ctypes.data, nbytes)
        if d_states:
            assert states_bytes == self.states.nbytes
            ctypes.memmove(d_states, self.states.ctypes.data, states_bytes)
        count = self.scan_into(runs, d_block, block_bytes, stream)
        if wait:
            return self.count_or_verdict(runs, count, classify_up_to)
        self.pending = count
        return None

    def wait_runs(self, runs, classify_up_to=0):
        assert self.pending is not None, "wait_runs() without a scan enqueued with wait=False"
        assert runs is self.runs_of_pending, "wait_runs() given another scan's runs"
        count, self.pending = self.pending, None
        self.calls.append(dict(call="wait_runs"))
        return self.count_or_verdict(runs, count, classify_up_to)


def fake_tile_scan(m, size, monkeypatch, flags_row=None):
    fake = FakeTileCuda(m, size, flags_row)
    monkeypatch.setattr(_scan, "_cuda", fake)
    monkeypatch.setattr(_scan, "stream_of", lambda device: 777)
    return fake


def tile_masks():
    L = 40
    ms = masks()
    g = torch.Generator().manual_seed(3)
    sparse = (torch.rand(2, 1, 3, 4, generator=g) < 0.5).repeat_interleave(16, 2).repeat_interleave(16, 3)
    ms["block-sparse ragged, stride-0 heads"] = sparse[:, :, :45, :61].expand(2, 3, 45, 61)
    ms["block-sparse, stride-0 batch"] = (torch.rand(1, 2, L, L, generator=g) < 0.4).expand(3, 2, L, L)
    return ms


@pytest.mark.parametrize("name", list(tile_masks()))
@pytest.mark.parametrize("size", [(16, 16), (32, 8)])
def test_device_tile_scan_host_half(name, size, monkeypatch):
    """device_scan_tiles() allocates the eight int32 tensors on the mask's device with the
    grid's shapes (broadcast dims once), hands their addresses and sizes in torch's field
    order, lays the block out with the tile scan's temporary storage, and returns what
    the device wrote with the verdict of the same read."""
    m = tile_masks()[name]
    fake = fake_tile_scan(m, size, monkeypatch)
    before = _scan.scan_count()
    verdict, arrays = _block_mask.device_scan_tiles(m, size)
    assert _scan.scan_count() == before + 1 and masklens.last_timing()["device"] == "cuda"
    assert verdict.structure.describe() == _scan.scan(m).structure.describe()
    assert [c["call"] for c in fake.calls] == ["plan_runs", "scan_runs_tiles", "scan_runs", "wait_runs"]
    plan, call, into = fake.calls[:3]
    assert plan["tiles"] == size and call["stream"] == 777
    assert call["wait"] is False  # enqueued, the views made, then waited for: wait_runs() above
    layout = _core.DeviceRuns(*args_of(m), TILES_TEMP, 1000, *size)
    assert into["block_bytes"] == layout.block_bytes and into["head_bytes"] == layout.head_bytes
    B, H, Q, K = m.shape
    db = 1 if m.stride(0) == 0 else B
    dh = 1 if m.stride(1) == 0 else H
    nq, nk = -(-Q // size[0]), -(-K // size[1])
    shapes = {"kv_num_blocks": (db, dh, nq), "kv_indices": (db, dh, nq, nk),
              "q_num_blocks": (db, dh, nk), "q_indices": (db, dh, nk, nq)}
    assert list(arrays) == TILE_FIELDS
    for name_, address, nbytes in zip(TILE_FIELDS, call["arrays"], call["array_bytes"]):
        t = arrays[name_]
        assert t.dtype == torch.int32 and t.is_contiguous() and t.device == m.device
        assert tuple(t.shape) == shapes[name_.replace("full_", "")], name_
        assert t.data_ptr() == address and address % 4 == 0 and nbytes == t.numel() * 4
        assert np.array_equal(t.numpy(), getattr(fake.host, name_)), name_


@pytest.mark.parametrize("name", ["block-sparse ragged, stride-0 heads", "block-sparse, stride-0 batch"])
def test_device_block_mask_equals_create_block_mask(name, monkeypatch):
    """The BlockMask _run assembles over the device tensors (the constructor with the q
    side, broadcast dims kept at 1) equals torch's create_block_mask over every batch and
    head, and its mask_mod is the mask."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    m = tile_masks()[name]
    size = (16, 16)
    fake_tile_scan(m, size, monkeypatch)
    mask_mod = _block_mask.mask_mod_for(None, "cpu", m)
    verdict, ours = _block_mask.device_block_mask(m, size, mask_mod)
    assert verdict.structure.kind == "arbitrary"
    B, H, Q, K = m.shape
    theirs = fa.create_block_mask(mask_mod, B, H, Q, K, device="cpu", BLOCK_SIZE=size)
    assert tuple(ours.BLOCK_SIZE) == size and tuple(ours.seq_lengths) == (Q, K)
    for field in TILE_FIELDS:
        a, b = getattr(ours, field), getattr(theirs, field)
        assert a.dtype == b.dtype == torch.int32
        assert torch.equal(a.expand(b.shape), b), field
    assert torch.equal(fa.create_mask(ours.mask_mod, B, H, Q, K, device="cpu"), m)


def write_host_arrays(host, arrays, array_bytes):
    """What a fake writer writes: masklens' host BlockMask tensors (a _core.BlockMaskTensors)
    into the eight arrays it was handed, each checked for its size and 16-byte alignment."""
    for name, address, nbytes in zip(TILE_FIELDS, arrays, array_bytes):
        want = np.ascontiguousarray(getattr(host, name))
        assert nbytes == want.nbytes and address % 16 == 0, name
        ctypes.memmove(address, want.ctypes.data, nbytes)


class FakeWriterCuda:
    """masklens._cuda's write_block_mask for host memory: checks what
    device_block_mask_tensors() hands it (the summary's states, the grid, the eight
    arrays in torch's field order and their sizes) and writes masklens' host tensors."""

    def __init__(self, tiles):
        self.tiles, self.host, self.calls = tiles, tiles.block_mask(), []

    def write_block_mask(self, states, states_bytes, grid, arrays, array_bytes, stream, device):
        t = self.tiles
        self.calls.append(dict(grid=list(grid), stream=stream, device=device))
        assert ctypes.string_at(states, states_bytes) == t.states.tobytes()
        write_host_arrays(self.host, arrays, array_bytes)


@pytest.mark.parametrize("name", list(tile_masks()))
@pytest.mark.parametrize("size", [(16, 16), (32, 8)])
def test_block_mask_tensors_written_on_the_device_from_host_tiles(name, size, monkeypatch):
    """device_block_mask_tensors(): a host tile summary's states cross once, the writer
    gets the grid [B, H, Q, K, block_q, block_k, B', H'] and eight 16-byte-aligned views
    of one allocation, and the tensors are the host writer's, with its shapes."""
    m = tile_masks()[name]
    _, tiles = _core.scan_with_tiles(m, size[0], size[1], -1000.0)
    fake = FakeWriterCuda(tiles)
    monkeypatch.setattr(_scan, "_cuda", fake)
    monkeypatch.setattr(_scan, "stream_of", lambda device: 777)
    assert _scan.has_device_writer()
    arrays = _block_mask.device_block_mask_tensors(tiles, "cpu")
    B, H, Q, K = m.shape
    db, dh = tiles.shape[:2]
    assert fake.calls == [dict(grid=[B, H, Q, K, size[0], size[1], db, dh], stream=777, device=0)]
    assert list(arrays) == TILE_FIELDS
    for field in TILE_FIELDS:
        want = getattr(fake.host, field)
        assert arrays[field].dtype == torch.int32 and arrays[field].is_contiguous()
        assert tuple(arrays[field].shape) == want.shape, field
        assert np.array_equal(arrays[field].numpy(), want), field
    # One allocation: every view shares one storage.
    assert len({arrays[f].untyped_storage().data_ptr() for f in TILE_FIELDS}) == 1


class FakeRangesCuda:
    """masklens._cuda's write_block_mask_from_ranges for host memory: checks what
    device_block_mask_from_structure() hands it (the structure's ranges, room for them
    past the eight arrays, the grid) and writes masklens' host tensors of the structure."""

    def __init__(self, structure, size):
        self.host = _core.tiles_from_structure(structure, *size).block_mask()
        self.grid, self.ranges = _core.structure_tile_ranges(structure, *size)
        self.calls = []

    def write_block_mask_from_ranges(self, h_ranges, ranges_bytes, d_ranges, grid, arrays, array_bytes, stream,
                                     device):
        self.calls.append(dict(grid=list(grid), stream=stream, device=device))
        assert ctypes.string_at(h_ranges, ranges_bytes) == self.ranges.tobytes()
        assert d_ranges % 16 == 0 and d_ranges >= arrays[-1] + array_bytes[-1]  # after every array, in no view
        ctypes.memmove(d_ranges, h_ranges, ranges_bytes)  # what the upload does
        self.d_ranges = d_ranges
        write_host_arrays(self.host, arrays, array_bytes)


@pytest.mark.parametrize("name", list(masks()))
@pytest.mark.parametrize("size", [(16, 16), (32, 8)])
def test_block_mask_tensors_of_a_structure_written_from_its_ranges(name, size, monkeypatch):
    """device_block_mask_from_structure(): the structure's tile ranges cross (to room after
    the eight arrays of one allocation, kept with them), the writer gets the structure's
    grid, and the tensors are the host writer's of tiles_from_structure, with its shapes."""
    m = masks()[name]
    s = masklens.scan(m).structure
    assert s.kind != "arbitrary"
    fake = FakeRangesCuda(s, size)
    monkeypatch.setattr(_scan, "_cuda", fake)
    monkeypatch.setattr(_scan, "stream_of", lambda device: 777)
    monkeypatch.setattr(_scan, "cuda_device", lambda device: torch.device("cpu"))  # host memory stands in
    assert _scan.has_structure_writer()
    arrays, lengths = _block_mask.device_block_mask_from_structure(s, size, "cpu")
    assert fake.calls == [dict(grid=fake.grid, stream=777, device=None)]
    assert lengths == (s.q_len, s.k_len) and list(arrays) == TILE_FIELDS
    for field in TILE_FIELDS:
        want = getattr(fake.host, field)
        assert arrays[field].dtype == torch.int32 and arrays[field].is_contiguous()
        assert tuple(arrays[field].shape) == want.shape and np.array_equal(arrays[field].numpy(), want), field
    storage = arrays["kv_num_blocks"].untyped_storage()
    assert len({arrays[f].untyped_storage().data_ptr() for f in TILE_FIELDS}) == 1
    # The ranges' room lies in that storage, after the arrays: it lives as long as they do.
    assert storage.data_ptr() < fake.d_ranges and fake.d_ranges + fake.ranges.nbytes <= storage.data_ptr() + storage.nbytes()
    assert ctypes.string_at(fake.d_ranges, fake.ranges.nbytes) == fake.ranges.tobytes()


@pytest.mark.parametrize("name", list(tile_masks()))
@pytest.mark.parametrize("size", [(16, 16), (32, 8)])
def test_device_tile_summary_is_the_host_summary(name, size, monkeypatch):
    """inspect(cuda_mask, tiles=) through device_tile_summary(): the states rebuilt from the
    device's kv side equal the host scan's, tile for tile, and an arbitrary verdict
    carries the same tile fractions (what decide() charges flex on)."""
    m = tile_masks()[name]
    fake = fake_tile_scan(m, size, monkeypatch)
    verdict, summary = _block_mask.device_tile_summary(m, size)
    scans = [c for c in fake.calls if c["call"] == "scan_runs_tiles"]
    assert len(scans) == 1 and scans[0]["states"]  # the writer stores the states in the same pass
    host_verdict, host = _core.scan_with_tiles(m, size[0], size[1], -1000.0)
    assert np.array_equal(summary.states, host.states)
    assert summary.shape == host.shape and summary.block_size == host.block_size
    assert (summary.batch, summary.heads, summary.q_len, summary.k_len) == (host.batch, host.heads, host.q_len,
                                                                          host.k_len)
    assert verdict.structure.describe() == host_verdict.structure.describe()
    want = host_verdict.structure.tile_fractions
    got = verdict.structure.tile_fractions
    assert (got is None) == (want is None)
    if want is not None:
        assert (got.partial, got.full, got.block_q, got.block_k) == (want.partial, want.full, want.block_q,
                                                                     want.block_k)


def test_tile_summary_from_states_checks_every_tile():
    states = np.zeros((1, 2, 2, 2), dtype=np.uint8)  # Q = 5, K = 8 at 4 x 4: q tile 1 ragged
    s = _core.tile_summary_from_states(states, 1, 2, 5, 8, 4, 4)
    assert s.counts == {"empty": 8, "partial": 0, "full": 0}
    states[0, 1, 0, 1] = 2
    assert _core.tile_summary_from_states(states, 1, 2, 5, 8, 4, 4).counts["full"] == 1
    states[0, 1, 1, 0] = 2
    with pytest.raises(masklens.MaskError, match=r"tile \[1, 1, 0\] .* holds 2, full, but the tile is ragged"):
        _core.tile_summary_from_states(states, 1, 2, 5, 8, 4, 4)
    states[0, 1, 1, 0] = 7
    with pytest.raises(masklens.MaskError, match=r"holds 7; a state is 0 \(empty\), 1 \(partial\) or 2"):
        _core.tile_summary_from_states(states, 1, 2, 5, 8, 4, 4)
    with pytest.raises(masklens.MaskError, match=r"states are \[1, 2, 2, 2\]; the grid has 3 x 2 tiles a slice"):
        _core.tile_summary_from_states(np.zeros((1, 2, 2, 2), dtype=np.uint8), 1, 2, 9, 8, 4, 4)
    with pytest.raises(masklens.MaskError, match="distinct_heads must be 1 or heads"):
        _core.tile_summary_from_states(np.zeros((1, 2, 2, 2), dtype=np.uint8), 1, 3, 5, 8, 4, 4)


def test_device_tile_scan_brings_runs_past_the_first_copy(monkeypatch):
    """Runs past the head come with copy_rest() told the tile scan's layout."""
    i, j = rows_cols(300, 16)
    m = ((j % 2 == 0) & (i % 5 != 0))[None, None]
    fake = fake_tile_scan(m, (32, 8), monkeypatch)
    verdict, arrays = _block_mask.device_scan_tiles(m, (32, 8))
    assert [c["call"] for c in fake.calls] == ["plan_runs", "scan_runs_tiles", "scan_runs", "wait_runs", "copy_rest"]
    assert verdict.run_count == 300 and verdict.structure.describe() == "arbitrary, 60 empty rows"
    assert arrays["kv_indices"].shape == (1, 1, 10, 2)


def test_a_block_mask_brings_no_runs_past_the_first_copy(monkeypatch):
    """A BlockMask needs no verdict: with classify_many_runs=False a mask of more than one
    run in 8 rows (300 runs in 300 rows here) is left unclassified (no copy_rest, no host
    work in O(runs)), and masklens.torch's device BlockMask reads the mask in its mask_mod,
    equal to create_block_mask's; its rows are still checked for NaN / +inf."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    import masklens.torch as mt
    i, j = rows_cols(300, 16)
    m = ((j % 2 == 0) & (i % 5 != 0))[None, None]
    fake = fake_tile_scan(m, (32, 8), monkeypatch)
    before = _scan.scan_count()
    verdict, arrays = _block_mask.device_scan_tiles(m, (32, 8), classify_many_runs=False)
    assert verdict is None and _scan.scan_count() == before + 1
    scan_calls = ["plan_runs", "scan_runs_tiles", "scan_runs", "wait_runs"]
    assert [c["call"] for c in fake.calls] == scan_calls
    fake.calls.clear()
    structure, ours = masklens._block_mask._device_block_mask(m, (32, 8), -1000.0)
    assert structure is None and [c["call"] for c in fake.calls] == scan_calls
    theirs = fa.create_block_mask(lambda b, h, q, kv: m[0, 0, q.clamp(max=299), kv.clamp(max=15)], 1, 1, 300, 16,
                                  device="cpu", BLOCK_SIZE=(32, 8))
    for field in TILE_FIELDS:
        assert torch.equal(getattr(ours, field), getattr(theirs, field)), field
    assert torch.equal(fa.create_mask(ours.mask_mod, 1, 1, 300, 16, device="cpu"), m)
    # Few runs: the verdict comes as before.
    few = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
    fake_tile_scan(few, (32, 8), monkeypatch)
    verdict, _ = _block_mask.device_scan_tiles(few, (32, 8), classify_many_runs=False)
    assert verdict.structure.kind == "causal"
    # Many runs of an exact structure (one a document, 300 documents of 4 rows): under one
    # run in 8 rows? No: 300 runs for 1200 rows is one in 4, left unclassified; 150
    # documents of 8 rows are one run in 8 rows: classified, the structure's rule as the
    # mask_mod over the scan's tensors. Either way the BlockMask is create_block_mask's.
    for n, exact in ((300, False), (150, True)):
        L = 1200
        docs = torch.arange(L) // (L // n)
        i, j = rows_cols(L, L)
        packed = ((j <= i) & (docs[:, None] == docs[None, :]))[None, None]
        fake_tile_scan(packed, (32, 8), monkeypatch)
        structure, bm = masklens._block_mask._device_block_mask(packed, (32, 8), -1000.0)
        assert (structure is not None) == exact, n
        held = tensors_held(bm.mask_mod)
        assert any(t is packed or t.data_ptr() == packed.data_ptr() for t in held) == (not exact), n
        assert torch.equal(fa.create_mask(bm.mask_mod, 1, 1, L, L, device="cpu"), packed)
        theirs = fa.create_block_mask(lambda b, h, q, kv: packed[0, 0, q.clamp(max=L - 1), kv.clamp(max=L - 1)],
                                      1, 1, L, L, device="cpu", BLOCK_SIZE=(32, 8))
        for field in TILE_FIELDS:
            assert torch.equal(getattr(bm, field), getattr(theirs, field)), (n, field)
    # No verdict, yet a NaN / +inf row is an error: the run reduction's first invalid row,
    # which came back in the head with the count (no second synchronisation).
    fake_tile_scan(m, (32, 8), monkeypatch, flags_row=123)
    with pytest.raises(masklens.MaskError, match=r"^invalid_value: mask row \[0, 0, 123\] holds NaN or \+inf"):
        _block_mask.device_scan_tiles(m, (32, 8), classify_many_runs=False)
    fake = fake_tile_scan(m, (32, 8), monkeypatch)
    fake.first_invalid = 300  # past the rows: the head is not believed
    with pytest.raises(masklens.MaskError, match=r"^device_error: the run reduction named row 300 .* 300 rows"):
        _block_mask.device_scan_tiles(m, (32, 8), classify_many_runs=False)


def test_device_block_mask_of_an_exact_structure_keeps_the_structures_slices(monkeypatch):
    """An exact structure's BlockMask takes the device read's tensors where they have the
    structure's own slices (one for a broadcast or 2-D mask, one per batch where the
    batches differ), and is tiled from the fields where the mask stores more: a
    materialised [2, 3, Q, K] causal mask would give 6 slices of one rule."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    import masklens.torch as mt
    i, j = rows_cols(64, 64)
    c = j <= i
    cases = {
        "2-D causal": (c[None, None], True),
        "stride-0 batch and heads": (c[None, None].expand(2, 3, 64, 64), True),
        "left padded, batches differ": (torch.stack([c & (j >= s) for s in (0, 9)])[:, None], True),
        "materialised [2, 3] causal": (c[None, None].expand(2, 3, 64, 64).contiguous(), False),
    }
    for name, (m, keeps) in cases.items():
        fake_tile_scan(m, (16, 16), monkeypatch)
        structure, bm = masklens._block_mask._device_block_mask(m, (16, 16), -1000.0)
        assert structure.kind != "arbitrary", name
        assert (bm is not None) == keeps, name
        if bm is not None:
            assert tuple(bm.kv_num_blocks.shape[:2]) == masklens._block_mask._structure_slices(structure), name
            assert torch.equal(fa.create_mask(bm.mask_mod, m.shape[0], 1, 64, 64, device="cpu"), m[:, :1]), name


@pytest.mark.parametrize("name", ["causal blocks", "packed documents", "left padding per batch",
                                  "query padding (q_valid)"])
def test_device_block_mask_of_a_structure_with_tables_takes_the_reads_row_bounds(name, monkeypatch):
    """A structure whose rule needs device tables (VLM blocks, documents, padding) takes the
    device read's row bounds as its mask_mod: a copy of [first, last] a row, not a view of
    the read's block, and the mask itself (create_mask), ragged tiles and per-batch slices
    included; a float mask read against its threshold gives the same."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    import masklens.torch as mt
    from test_tiles import as4, structured
    m = as4(structured()[name])
    B, _, Q, K = m.shape
    for mask in (m, torch.zeros(m.shape).masked_fill(~m, -1e4)):  # bool, and finite-masked additive
        fake_tile_scan(m, (16, 16), monkeypatch)
        structure, bm = masklens._block_mask._device_block_mask(mask, (16, 16), -1000.0)
        assert structure is not None and _block_mask.rule_reads_tables(structure), name
        held = tensors_held(bm.mask_mod)
        assert len(held) == 1 and held[0].shape[-1] == 2 and held[0].is_contiguous(), name
        assert torch.equal(fa.create_mask(bm.mask_mod, B, 1, Q, K, device="cpu"), m), name


def test_device_tile_scan_names_an_invalid_row(monkeypatch):
    m = torch.ones(2, 3, 40, 40, dtype=torch.bool)
    fake_tile_scan(m, (16, 16), monkeypatch, flags_row=4 * 40 + 17)
    with pytest.raises(masklens.MaskError, match=r"^invalid_value: mask row \[1, 1, 17\] holds NaN or \+inf"):
        _block_mask.device_scan_tiles(m, (16, 16))


def test_device_tiles_are_used_only_where_the_module_has_them(monkeypatch):
    class WithoutThePlan:  # a module without the device protocol: block_mask() and flex read on the host
        def write_block_mask(self, *args):
            raise AssertionError("not called")
    monkeypatch.setattr(_scan, "_cuda", WithoutThePlan())
    assert not _scan.has_device_tiles()
    monkeypatch.setattr(_scan, "_cuda", FakeTileCuda(torch.ones(1, 1, 4, 4, dtype=torch.bool), (4, 4)))
    assert _scan.has_device_tiles()


@needs_module
def test_block_mask_writer_arguments_are_checked_before_any_cuda_call():
    from masklens import _cuda
    grid = [2, 3, 40, 24, 16, 8, 1, 3]  # 3 x 3 tiles, stride-0 batch
    n = {"kv_num_blocks": 9, "kv_indices": 27, "q_num_blocks": 9, "q_indices": 27}
    nbytes = [4 * n[f.replace("full_", "")] for f in TILE_FIELDS]
    ptrs = [1 << 20] * 8

    def call(**kw):
        a = dict(states=1 << 24, states_bytes=27, grid=grid, arrays=ptrs, array_bytes=nbytes, stream=0, device=0)
        a.update(kw)
        return _cuda.write_block_mask(**a)
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: grid is \[batch, heads, q_len, k_len"):
        call(grid=grid[:6])
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: tile size k \(block_k\) must be in"):
        call(grid=grid[:5] + [0] + grid[6:])
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: tile grid distinct_heads must be 1 or heads"):
        call(grid=grid[:7] + [2])
    with pytest.raises(masklens.MaskError, match="^invalid_argument: states is null"):
        call(states=0)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: states hold 26 bytes; this grid has 27 tiles"):
        call(states_bytes=26)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: q_num_blocks is null"):
        call(arrays=ptrs[:4] + [0] + ptrs[5:])
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: kv_indices holds 4 bytes; this grid needs 27"):
        call(array_bytes=nbytes[:1] + [4] + nbytes[2:])


@needs_module
def test_tile_scan_arguments_are_checked_before_any_cuda_call():
    from masklens import _cuda
    m = torch.ones(2, 1, 40, 24, dtype=torch.bool).expand(2, 3, 40, 24)  # stride-0 heads
    args = args_of(m)
    runs = _cuda.plan_runs(*args, 16, 8)
    assert runs.tile_grid == [2, 1, 3, 3]
    lay, plain = runs.layout, _cuda.plan_runs(*args).layout
    assert lay["reduce_temp"] - lay["scan_temp"] >= 18 * 8  # a 64-bit count a tile
    assert lay["bytes"] - lay["reduce_temp"] == plain["bytes"] - plain["reduce_temp"]  # the same run reduction
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: tile size q \(block_q\) must be in"):
        _cuda.plan_runs(*args, 0, 8)
    n = {"kv_num_blocks": 6, "kv_indices": 18, "q_num_blocks": 6, "q_indices": 18}
    nbytes = [4 * n[f.replace("full_", "")] for f in TILE_FIELDS]
    ptrs = [1 << 20] * 8
    block = 1 << 24

    def call(runs=runs, **kw):
        a = dict(d_block=block, block_bytes=runs.block_bytes, arrays=ptrs, array_bytes=nbytes, stream=0, device=0)
        a.update(kw)
        return _cuda.scan_runs(runs, **a)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: device block holds 32 bytes; this view's layout"):
        call(block_bytes=32)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: pass the eight BlockMask arrays"):
        call(arrays=ptrs[:7])
    with pytest.raises(masklens.MaskError, match="^invalid_argument: full_kv_indices is null"):
        call(arrays=ptrs[:3] + [0] + ptrs[4:])
    with pytest.raises(masklens.MaskError, match=r"^misaligned_pointer: q_indices is not aligned to int32"):
        call(arrays=ptrs[:5] + [(1 << 20) + 2] + ptrs[6:])
    with pytest.raises(masklens.MaskError, match=r"^invalid_argument: kv_indices holds 4 bytes; this grid "
                                                 r"needs 18 int32 \(72 bytes\)"):
        call(array_bytes=nbytes[:1] + [4] + nbytes[2:])
    with pytest.raises(masklens.MaskError, match="^invalid_argument: states hold 17 bytes; this grid has 18 tiles"):
        call(d_states=1 << 20, states_bytes=17)


@needs_module
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU can be used")
def test_without_a_gpu_the_tile_scan_names_the_failing_cuda_call():
    from masklens import _cuda
    m = torch.ones(8, 8, dtype=torch.bool)
    runs = _cuda.plan_runs(*args_of(m), 4, 4)
    arrays = ([1 << 16] * 8, [8, 16, 8, 16, 8, 16, 8, 16])
    with pytest.raises(masklens.MaskError, match=r"^device_error: cuda\w+: cudaError"):
        _cuda.scan_runs(runs, 1 << 20, runs.block_bytes, 0, 0, *arrays)
    # Enqueued without waiting, it fails the same way and leaves nothing to wait for.
    with pytest.raises(masklens.MaskError, match=r"^device_error: cuda\w+: cudaError"):
        _cuda.scan_runs(runs, 1 << 20, runs.block_bytes, 0, 0, *arrays, wait=False)
    with pytest.raises(masklens.MaskError, match="^invalid_argument: no scan enqueued with wait=False is pending on "
                                                 "this thread"):
        _cuda.wait_runs(runs)
