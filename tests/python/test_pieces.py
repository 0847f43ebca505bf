"""Rows worked out per piece (masklens._pieces) against the same arithmetic row by row.

Random lines on random cuttings of a few batches of rows: every operation (sum, maximum,
minimum, a comparison, chunk starts, a table's run at a position) is rendered back to
rows and compared with numpy on every row; a table's runs read in one copy are its runs,
past the copy's room too, positions tables included.
"""
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from masklens import _pieces as P  # noqa: E402


def _grid(rng, batch, rows):
    grid = P.Grid(np.arange(batch), np.zeros(batch), np.full(batch, rows), rows + 1)
    cuts = [(b, rng.randrange(rows)) for b in range(batch) for _ in range(rng.randrange(4))]
    if cuts:
        grid.cut([c[0] for c in cuts], [c[1] for c in cuts])
    return grid


def _line(rng, grid):
    n = len(grid)
    return P.Line(grid, [rng.choice((0, 1)) for _ in range(n)], [rng.randrange(-20, 20) for _ in range(n)])


def _rows(line, batch, rows):
    """The line's value on every row [batch, rows]."""
    g = line.grid
    k, c = line.now()
    out = np.full((batch, rows), 1 << 40, dtype=np.int64)
    for i in range(len(g)):
        q = np.arange(g.lo[i], g.hi[i])
        out[g.b[i], q] = k[i] * q + c[i]
    assert (out != 1 << 40).all(), "the pieces cover every row once"
    return out


def test_lines_compare_and_combine_as_their_rows_do():
    rng = random.Random(7)
    for _ in range(400):
        batch, rows = rng.randrange(1, 4), rng.randrange(1, 40)
        grid = _grid(rng, batch, rows)
        f, g = _line(rng, grid), _line(rng, grid)
        fr, gr = _rows(f, batch, rows), _rows(g, batch, rows)
        assert np.array_equal(_rows(f + g, batch, rows), fr + gr)
        assert np.array_equal(_rows(f - g + 3, batch, rows), fr - gr + 3)
        assert np.array_equal(_rows(P.maximum(f, g), batch, rows), np.maximum(fr, gr))
        assert np.array_equal(_rows(P.minimum(f, g), batch, rows), np.minimum(fr, gr))
        P.cut_flips(f, g)
        whole = np.repeat(P.ge(f, g), grid.hi - grid.lo).reshape(batch, rows)
        assert np.array_equal(whole, fr >= gr), "a comparison holds over each piece after cut_flips"
        assert np.array_equal(_rows(f, batch, rows), fr), "a line made before cuts reads the same after"


def test_chunk_starts_and_table_runs_cut_where_the_rows_change():
    rng = random.Random(11)
    for _ in range(300):
        batch, rows = rng.randrange(1, 4), rng.randrange(1, 40)
        grid = _grid(rng, batch, rows)
        n = len(grid)
        x = P.Line(grid, [rng.choice((0, 1)) for _ in range(n)], [rng.randrange(0, 8) for _ in range(n)])
        period = rng.randrange(1, 7)
        origins = np.array([rng.randrange(0, 5) for _ in range(batch)])
        xr = _rows(x, batch, rows)
        P.cut_every(x, origins, period)
        chunk = np.repeat((x.first() - origins[grid.b]) // period, grid.hi - grid.lo).reshape(batch, rows)
        assert np.array_equal(chunk, (xr - origins[:, None]) // period)
        length = rows + 8
        table = torch.tensor([[rng.randrange(3) for _ in range(length)] for _ in range(batch)])
        (runs,) = P.read_runs([(table, False)], room=rng.randrange(1, 6))
        runs.cut_at_starts(x)
        r = runs.at(x)
        value = np.repeat(runs.value[r], grid.hi - grid.lo).reshape(batch, rows)
        assert np.array_equal(value, np.take_along_axis(table.numpy(), xr, 1))


@pytest.mark.parametrize("room", [1, 3, 1024])
def test_a_tables_runs_are_read_in_one_copy_or_exactly(room):
    rng = random.Random(room)
    for _ in range(50):
        B, L = rng.randrange(1, 4), rng.randrange(1, 30)
        t = torch.tensor([[rng.randrange(3) for _ in range(L)] for _ in range(B)])
        pos = torch.tensor([[j - rng.randrange(2) * 3 for j in range(L)] for _ in range(B)])
        left = torch.tensor([rng.randrange(5) for _ in range(B)])
        runs, positions, flat = P.read_runs([(t, False), (pos, True), (left, False)], room=room)
        assert np.array_equal(flat, left.numpy())
        for got, table in ((runs, t.numpy()), (positions, pos.numpy() - np.arange(L))):
            for b in range(B):
                starts = np.flatnonzero(np.diff(table[b], prepend=table[b, 0] - 1) != 0)
                mine = got.b == b
                assert np.array_equal(got.start[mine], starts)
                assert np.array_equal(got.end[mine], np.append(starts[1:], L))
                assert np.array_equal(got.value[mine], table[b, starts])
