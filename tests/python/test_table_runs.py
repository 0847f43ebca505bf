"""A definition's tables read as runs (masklens._table_runs) against the tables.

Every table's runs and the 1-D lists cross to the host together: they are the table's
runs, past the room too, positions tables (position - index) and empty tables included.
"""
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from masklens import _table_runs  # noqa: E402


def _in_cpp(tables, room):
    """read_runs, with each CPU table's view read by masklens._core (include/masklens/
    table_runs.hpp) as read_definition reads it."""
    return [r.runs() if isinstance(r, _table_runs.TableView) else r for r in _table_runs.read_runs(tables, room)]


# read_runs leaves CPU tables to the C++ read; _torch_read is what it does on a GPU
# without masklens._cuda: both are checked here.
READERS = {"c++": _in_cpp, "torch": _table_runs._torch_read}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("room", [1, 3, 1024])
def test_a_tables_runs_are_read_in_one_copy_or_exactly(room, reader):
    read_runs = READERS[reader]
    rng = random.Random(room)
    for _ in range(50):
        B, L = rng.randrange(1, 4), rng.randrange(1, 30)
        t = torch.tensor([[rng.randrange(3) for _ in range(L)] for _ in range(B)])
        pos = torch.tensor([[j - rng.randrange(2) * 3 for j in range(L)] for _ in range(B)])
        left = torch.tensor([rng.randrange(5) for _ in range(B)])
        runs, positions, flat = read_runs([(t, False), (pos, True), (left, False)], room=room)
        assert np.array_equal(flat, left.numpy())
        for got, table in ((runs, t.numpy()), (positions, pos.numpy() - np.arange(L))):
            for b in range(B):
                starts = np.flatnonzero(np.diff(table[b], prepend=table[b, 0] - 1) != 0)
                mine = got.b == b
                assert np.array_equal(got.start[mine], starts)
                assert np.array_equal(got.end[mine], np.append(starts[1:], L))
                assert np.array_equal(got.value[mine], table[b, starts])
        (empty,) = read_runs([(torch.zeros((B, 0), dtype=torch.long), False)], room=room)
        assert (empty.batch, empty.length, len(empty.b)) == (B, 0, 0)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("room", [1, 2, 1024])
def test_bool_int32_and_strided_tables_and_changes_across_batches(room, reader):
    """The table is read flat: a change between one batch's last value and the next batch's
    first is not a run, every batch's first value is; bool, int32, uint8 and float tables,
    and a table that is a strided view, give the same runs."""
    rng = random.Random(7 + room)
    for _ in range(60):
        B, L = rng.randrange(1, 5), rng.randrange(2, 20)
        values = [[rng.randrange(2) if rng.random() < 0.3 else 1 for _ in range(L)] for _ in range(B)]
        base = np.array(values)
        # uint8 and float tables are not the C++ read's: read_runs takes torch's way for them.
        for t in (torch.tensor(values, dtype=torch.bool), torch.tensor(values, dtype=torch.int32),
                  torch.tensor(values, dtype=torch.uint8), torch.tensor(values, dtype=torch.float32),
                  torch.tensor(values).t().contiguous().t()):
            (got,) = READERS[reader]([(t, False)], room=room)
            for b in range(B):
                starts = np.flatnonzero(np.diff(base[b], prepend=base[b, 0] - 1) != 0)
                mine = got.b == b
                assert np.array_equal(got.start[mine], starts), (t.dtype, b)
                assert np.array_equal(got.end[mine], np.append(starts[1:], L))
                assert np.array_equal(got.value[mine], base[b, starts])
            assert np.all(np.diff(got.b) >= 0)


@pytest.mark.gpu
@pytest.mark.parametrize("room", [1, 3, 1024])
def test_the_device_pass_reads_what_torch_reads(room):
    """masklens._cuda's table pass (include/masklens/cuda/table_runs.hpp) gives the runs the
    torch operations give, for bool, int32 and int64 tables, strided views, positions tables,
    1-D lists (int64 and int32, strided, empty, anywhere among the tables) written by the
    same kernel, empty tables, more lists and tables than one launch takes (the counters of
    each launch handed over and zeroed: the next read counts from 0 again) and tables past
    the room (read again exactly)."""
    from masklens import _scan
    if _scan.cuda_module() is None:
        pytest.skip(_scan.cuda_reason())
    rng = random.Random(room)
    for _ in range(40):
        B, L = rng.randrange(1, 4), rng.randrange(1, 40)
        ids = torch.tensor([[rng.randrange(3) if rng.random() < 0.2 else 1 for _ in range(L)] for _ in range(B)])
        pos = torch.tensor([[j - 5 * (j >= L // 2) for j in range(L)] for _ in range(B)])
        left = torch.tensor([rng.randrange(9) for _ in range(2 * B)]).cuda()
        tables = [(ids.bool().cuda(), False), (ids.int().cuda(), False), (ids.cuda().t().contiguous().t(), False),
                  (pos.cuda(), True), (left[::2], False), (left[:B].int(), False),
                  (left[:0], False), (ids.cuda()[:0], False)]
        rng.shuffle(tables)
        if rng.random() < 0.25:  # past one launch's kTableJobsPerLaunch (16) lists and tables
            tables = tables * 3
        finish = _table_runs._device_start(tables, room)
        assert finish is not None
        host = _table_runs._torch_read([(t.cpu(), p) for t, p in tables], room)
        _assert_same_runs(finish(), host)


def _assert_same_runs(device, host):
    assert len(device) == len(host)
    for d, h in zip(device, host):
        if isinstance(h, np.ndarray):  # a 1-D list
            assert isinstance(d, np.ndarray) and d.dtype == np.int64 and np.array_equal(d, h)
            continue
        for name in ("b", "start", "end", "value"):
            assert np.array_equal(getattr(d, name), getattr(h, name)), name
        assert (d.batch, d.length) == (h.batch, h.length)


@pytest.mark.gpu
def test_a_pending_device_read_sees_its_tables_as_the_stream_had_them():
    """table_runs_begin enqueues the pass and returns; the wait is finish()'s. Several reads
    pending at once each land in their own pinned slot, finished in any order, and each
    sees its tables as they were at its point of the stream, whatever the stream does to
    them after (a write enqueued before the finish); a dropped read is kept until its copy
    lands; finish() called again gives the same answer."""
    from masklens import _scan
    if _scan.cuda_module() is None:
        pytest.skip(_scan.cuda_reason())
    rng = random.Random(7)
    pending, expected = [], []
    for k in range(5):
        B, L = rng.randrange(1, 4), rng.randrange(2, 300)
        ids = torch.tensor([[rng.randrange(3) if rng.random() < 0.1 else k for _ in range(L)] for _ in range(B)])
        pos = torch.tensor([[j - 7 * (j >= L // 3) for j in range(L)] for _ in range(B)])
        tables = [(ids.cuda(), False), (pos.cuda(), True), (torch.arange(B).cuda(), False)]
        expected.append(_table_runs._torch_read([(t.cpu(), p) for t, p in tables], 1024))
        pending.append(_table_runs._device_start(tables, 1024))
        torch.cuda._sleep(1_000_000)  # the stream still busy when the tables change after the pass
        for t, _ in tables:
            t.add_(1)  # after the pass in the stream's order: not what the pass reads
    for k in (3, 0, 4, 1, 2):
        _assert_same_runs(pending[k](), expected[k])
    # A read dropped before its kernel ran keeps its tables (they may come from another
    # stream) until it has: the next read's start lets it go.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        other = torch.arange(64, device="cuda").view(2, 32)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda._sleep(50_000_000)
    before = list(_table_runs._dropped)
    dropped = _table_runs._device_start([(other, True)], 1024)
    del dropped, other
    kept = [d for d in _table_runs._dropped if all(d is not b for b in before)]
    assert len(kept) == 1 and not kept[0][0].ready
    torch.cuda.synchronize()
    again = _table_runs._device_start([(torch.ones((1, 4), dtype=torch.bool, device="cuda"), False)], 1024)
    assert all(d is not kept[0] for d in _table_runs._dropped)
    assert list(again()[0].start) == [0]
    cuda = _scan.cuda_module()
    from masklens import _core
    t = torch.zeros((1, 8), dtype=torch.bool, device="cuda")
    listed = torch.tensor([5, -6], device="cuda")
    read = cuda.table_runs_begin([_table_runs._view(listed.view(1, 2), False)], [_table_runs._view(t, False)], 1,
                                 _scan.stream_of(t.device), t.device.index or 0)
    assert not read.finished
    (runs,), words = read.finish()
    assert read.finished and list(runs.start) == [0] and runs.as_tuple()[:2] == (1, 8)
    assert list(words) == [5, -6]
    assert read.finish() is read.finish()  # again: the same answer (an interrupt on return loses nothing)
    # Refused before any slot is taken or CUDA call made, naming what is wrong.
    with pytest.raises(_core.MaskError, match="no table to read"):
        cuda.table_runs_begin([], [], 1, _scan.stream_of(t.device), 0)
    with pytest.raises(_core.MaskError, match="room must be in"):
        cuda.table_runs_begin([], [_table_runs._view(t, False)], 0, _scan.stream_of(t.device), 0)
    # Reads on two streams in turn take the same slots (each reused once its read is done,
    # whichever stream made it), each seeing its own stream's tables.
    side = torch.cuda.Stream()
    for k in range(6):
        with torch.cuda.stream(side if k % 2 else torch.cuda.current_stream()):
            ids = torch.full((2, 9), k, device="cuda")
            ids[1, 4:] = k + 1
            runs = _table_runs._device_start([(ids, False)], 1024)()[0]
            assert list(runs.start) == [0, 0, 4] and list(runs.value) == [k, k, k + 1]
    torch.cuda.synchronize()
    # A stream capturing a CUDA graph is refused before any CUDA call is captured (a replay
    # would write a slot later reads reuse): the read is made before the capture.
    graph, x = torch.cuda.CUDAGraph(), torch.zeros(4, device="cuda")
    with torch.cuda.graph(graph):
        x.add_(1)
        with pytest.raises(_core.MaskError, match="capturing a CUDA graph"):
            cuda.table_runs_begin([], [_table_runs._view(t, False)], 1, _scan.stream_of(t.device), t.device.index or 0)
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [1.0] * 4


@pytest.mark.parametrize("reader", READERS)
def test_a_table_of_no_batch_has_no_runs(reader):
    """An empty table has no runs, both ways (the C++ read refuses one: it is never asked)."""
    (runs,) = READERS[reader]([(torch.zeros((0, 5), dtype=torch.long), False)], 1024)
    assert (runs.batch, runs.length, len(runs.b)) == (0, 5, 0)


def test_the_cpp_read_refuses_a_table_it_cannot_read():
    """A view with a null pointer, an unknown element type or impossible strides is refused
    with its reason, before any element is read."""
    from masklens import _core
    t = torch.zeros((2, 5), dtype=torch.long)
    good = _table_runs.TableView(t, False).as_tuple()
    assert _core.table_runs(good)[:2] == (2, 5)
    for bad, words in (((0,) + good[1:], "null"), (good[:1] + ("float32",) + good[2:], "float32"),
                       (good[:4] + (-1,) + good[5:], "strides"), (good[:2] + (0,) + good[3:], "empty"),
                       ((good[0] + 1,) + good[1:], "aligned")):
        with pytest.raises(_core.MaskError, match=words):
            _core.table_runs(bad)


@pytest.mark.parametrize("seed", range(3))
def test_the_cpp_read_gives_the_runs_of_wide_values_and_broadcast_views(seed):
    """Values near the int64 range and positions that wrap, bool bytes, and a view whose
    batch stride is 0 (a broadcast) read as the tables they are, as torch's way reads them."""
    rng = random.Random(seed)
    big = 2 ** 62
    for _ in range(30):
        B, L = rng.randrange(1, 4), rng.randrange(1, 12)
        values = torch.tensor([[rng.choice([0, 1, big, -big, 2 ** 63 - 1, -(2 ** 63)]) for _ in range(L)]
                               for _ in range(B)])
        row = torch.tensor([rng.randrange(3) for _ in range(L)]).view(1, L).expand(B, L)
        for t, positions in ((values, False), (values, True), (values.bool(), False), (row, False), (row, True)):
            (mine,) = _in_cpp([(t, positions)], 1024)
            (theirs,) = _table_runs._torch_read([(t, positions)], 1024)
            for name in ("b", "start", "end", "value"):
                assert np.array_equal(getattr(mine, name), getattr(theirs, name)), (name, positions)


def test_read_definition_takes_the_device_passs_runs_as_they_are():
    """masklens._core.TableRuns (what the device pass's finish() hands back, one object a
    table) gives read_definition the verdict and pieces its tuple form gives; runs that do
    not tile their table are refused when made, naming the batch."""
    from masklens import _core, _definition
    mu = pytest.importorskip("transformers.masking_utils")
    rng = random.Random(3)
    for _ in range(30):
        B, L = rng.randrange(1, 4), rng.randrange(2, 50)
        ids = torch.tensor([sorted(rng.randrange(4) for _ in range(L)) for _ in range(B)])
        tree = _definition.parse(mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(ids)))
        (runs,) = _table_runs._torch_read([(ids, False)], 1024)
        encoded = _definition._encode(tree, {(id(ids), False): 0})
        made = _core.TableRuns(*runs.as_tuple())
        assert made.as_tuple()[:2] == (B, L) and all(np.array_equal(getattr(made, n), getattr(runs, n))
                                                     for n in ("b", "start", "end", "value"))
        as_object = _core.read_definition(encoded, [made], [], B, L, L, 0, 0)
        as_tuple = _core.read_definition(encoded, [runs.as_tuple()], [], B, L, L, 0, 0)
        assert as_object[0].structure.describe() == as_tuple[0].structure.describe()
        assert np.array_equal(as_object[1], as_tuple[1])
    one = np.zeros(1, dtype=np.int64)
    with pytest.raises(_core.MaskError, match="batch 0 end at 2, not at 4"):
        _core.TableRuns(1, 4, one, one, one + 2, one)

