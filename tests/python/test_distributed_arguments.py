"""masklens.distributed's arguments on two gloo ranks on the CPU: an impossible argument,
or one that differs between the ranks, on one rank only is an error on both ranks at once,
naming the rank and the argument (a ValueError), where that rank raising alone would leave
the other waiting in its next collective until the group's timeout. The group's timeout
here is short, and each call is timed well within it: a rank left waiting fails the test
in seconds instead of hanging it. After every refusal a good call still runs on both
ranks, so no refusal left the ranks in different collectives."""
import datetime
import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import masklens  # noqa: E402
import masklens.distributed as mld  # noqa: E402

WORLD = 2
TIMEOUT_S = 20   # the process group's: a collective left waiting raises after it
PROMPT_S = 8     # what a refusal may take (a spawn on a shared 2-core machine is slow)
Q = 24


def _refused_on_every_rank(call, message):
    """call() raises an ArgumentError (a ValueError and a MaskError) matching `message` on
    this rank, well before the group's timeout."""
    start = time.monotonic()
    with pytest.raises(ValueError, match=message) as raised:
        call()
    assert isinstance(raised.value, masklens.MaskError)
    assert time.monotonic() - start < PROMPT_S, f"{message}: took {time.monotonic() - start:.1f} s"


def _constructor(mesh, rank):
    bad = rank == WORLD - 1
    named = f"rank {WORLD - 1}: "
    cases = [
        (lambda: mld.ContextParallel(mesh, block_size=0 if bad else 8),
         named + r"invalid_argument: block_size .* got 0"),
        (lambda: mld.ContextParallel(mesh, block_size="x" if bad else 8),
         named + r"invalid_argument: block_size .* got 'x'"),
        (lambda: mld.ContextParallel(mesh, block_size=(8, -1) if bad else 8),
         named + r"invalid_argument: block_size .* got \(8, -1\)"),
        (lambda: mld.ContextParallel(mesh, sharding="ring" if bad else "contiguous"),
         named + "invalid_argument: sharding"),
        (lambda: mld.ContextParallel(mesh, check_calls="yes" if bad else True),
         named + "invalid_argument: check_calls"),
        (lambda: mld.ContextParallel(mesh, block_size=16 if bad else 8), "the ranks differ in .*block_size"),
        (lambda: mld.ContextParallel(mesh, check_calls=not bad), "the ranks differ in .*check_calls"),
    ]
    for call, message in cases:
        _refused_on_every_rank(call, message)
    # every rank impossible alike: each rank named
    _refused_on_every_rank(lambda: mld.ContextParallel(mesh, block_size=0),
                           "rank 0: .*block_size.*; rank 1: .*block_size")


def _attention(mesh, rank):
    bad = rank == WORLD - 1
    named = f"rank {WORLD - 1}: "
    cp = mld.ContextParallel(mesh, block_size=8)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, Q, 8, generator=gen) for _ in range(3))
    window = torch.ones(Q, Q, dtype=torch.bool).tril().triu(-4)[None, None]
    arbitrary = torch.rand(1, 1, Q, Q, generator=gen) < 0.5
    lq, lk, lv = (cp.shard(t, 2) for t in (q, k, v))
    local = cp.shard(window, -2)
    report = cp.inspect(local, lq, lk, lv)
    local_arbitrary = cp.shard(arbitrary, -2)
    report_arbitrary = cp.inspect(local_arbitrary, lq, lk, lv)
    wide = lambda t: t.double() if bad else t  # noqa: E731
    cases = [
        # impossible on the bad rank alone
        (lambda: cp.attention(*(t[:, :, :3] if bad else t for t in (lq, lk, lv)), report, local),
         named + "invalid_shape: this rank's query holds 3 rows"),
        (lambda: cp.attention(lq, lk[0] if bad else lk, lv, report, local), named + "invalid_shape: .*key"),
        (lambda: cp.attention(lq, lk, lv.double() if bad else lv, report, local), named + "invalid_argument: .*dtype"),
        (lambda: cp.attention(lq, lk, lv, report_arbitrary, None if bad else local_arbitrary),
         named + "invalid_argument: an arbitrary mask's BlockMask reads the mask"),
        (lambda: cp.attention(lq, lk, lv, report, local[:, :, :5] if bad else local),
         named + "invalid_shape: local_mask holds this rank's 12 rows"),
        (lambda: cp.attention(lq, lk, lv, None if bad else report, local), named + "invalid_argument: report is"),
        # possible on each rank, but the ranks differ: their collectives would not match
        (lambda: cp.attention(wide(lq), wide(lk), wide(lv), report, local), "the ranks differ in dtype"),
        (lambda: cp.attention(lq, lk[:, :1] if bad else lk, lv[:, :1] if bad else lv, report, local),
         "the ranks differ in key heads"),
        (lambda: cp.attention(lq, lk, lv, report_arbitrary if bad else report, local_arbitrary if bad else local),
         "the ranks differ in verdict"),
    ]
    for call, message in cases:
        _refused_on_every_rank(call, message)
    # an error that is no argument's (out of memory building the BlockMask) keeps its type
    # on its rank; the other rank raises ArgumentError naming it, at once
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("no room for the BlockMask")
    if bad:
        cp.block_mask = out_of_memory
    start = time.monotonic()
    with pytest.raises(torch.OutOfMemoryError if bad else mld.ArgumentError,
                       match=("" if bad else named + "OutOfMemoryError: ") + "no room for the BlockMask"):
        cp.attention(lq, lk, lv, report, local)
    assert time.monotonic() - start < PROMPT_S
    cp.__dict__.pop("block_mask", None)
    # the ranks still meet: a good call gives SDPA's output on the whole sequence
    out = cp.attention(lq, lk, lv, report, local)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=window)
    torch.testing.assert_close(out, cp.shard(reference, 2), atol=1e-5, rtol=1e-5)
    # unshard gathers equal parts: one rank's part of another length is refused on both
    _refused_on_every_rank(lambda: cp.unshard(out[:, :, :5] if bad else out, 2), "the ranks differ in size 2")
    torch.testing.assert_close(cp.unshard(out, 2), reference, atol=1e-5, rtol=1e-5)
    # check_calls=False, agreed by every rank: no exchange, the same output; an error is
    # then this rank's own (here every rank's alike, so none is left waiting)
    unchecked = mld.ContextParallel(mesh, block_size=8, check_calls=False)
    torch.testing.assert_close(unchecked.attention(lq, lk, lv, report, local), out)
    with pytest.raises(masklens.MaskError, match="^invalid_shape: this rank's query holds 3 rows") as raised:
        unchecked.attention(*(t[:, :, :3] for t in (lq, lk, lv)), report, local)
    assert not isinstance(raised.value, mld.ArgumentError)


def _worker(rank, port, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        from torch.distributed.device_mesh import DeviceMesh
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        _constructor(mesh, rank)
        _attention(mesh, rank)
        open(os.path.join(result_dir, f"rank{rank}.ok"), "w").close()
        # Every rank done before any tears the group down: gloo aborts a process whose
        # peer closes the connection while its last send is still in flight.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_bad_argument_on_one_rank_raises_on_every_rank_at_once(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=WORLD, join=True)
    assert sorted(os.listdir(tmp_path)) == [f"rank{r}.ok" for r in range(WORLD)]
