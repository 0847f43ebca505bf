"""A definition's tables read as runs (masklens._table_runs) against the tables.

Every table's runs and the 1-D lists cross to the host in one copy: they are the table's
runs, past the copy's room too, positions tables (position - index) and empty tables
included.
"""
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from masklens import _table_runs  # noqa: E402


# read_runs reads CPU tables by numpy in place; _torch_read is what it does on a GPU
# without masklens._cuda: both are checked here.
READERS = {"read_runs": _table_runs.read_runs, "torch": _table_runs._torch_read}


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
        # A float table is not numpy's to read in place: read_runs takes torch's way for it.
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
    1-D lists in the same copy and tables past the room (read again exactly)."""
    from masklens import _scan
    if _scan.cuda_module() is None:
        pytest.skip(_scan.cuda_reason())
    rng = random.Random(room)
    for _ in range(40):
        B, L = rng.randrange(1, 4), rng.randrange(1, 40)
        ids = torch.tensor([[rng.randrange(3) if rng.random() < 0.2 else 1 for _ in range(L)] for _ in range(B)])
        pos = torch.tensor([[j - 5 * (j >= L // 2) for j in range(L)] for _ in range(B)])
        tables = [(ids.bool().cuda(), False), (ids.int().cuda(), False), (ids.cuda().t().contiguous().t(), False),
                  (pos.cuda(), True), (torch.tensor([rng.randrange(9) for _ in range(B)]).cuda(), False)]
        device = _table_runs._device_read(tables, room)
        assert device is not None
        host = _table_runs._torch_read([(t.cpu(), p) for t, p in tables], room)
        assert np.array_equal(device[-1], host[-1])
        for d, h in zip(device[:-1], host[:-1]):
            for name in ("b", "start", "end", "value"):
                assert np.array_equal(getattr(d, name), getattr(h, name)), name
            assert (d.batch, d.length) == (h.batch, h.length)


@pytest.mark.parametrize("reader", READERS)
def test_a_table_of_no_batch_has_no_runs(reader):
    (runs,) = READERS[reader]([(torch.zeros((0, 5), dtype=torch.long), False)], 1024)
    assert (runs.batch, runs.length, len(runs.b)) == (0, 5, 0)
