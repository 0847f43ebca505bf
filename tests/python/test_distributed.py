"""masklens.distributed on CPUs: gloo process groups of 2, 3 and 4 ranks (one spawn of 4
processes, subgroups for the smaller worlds), every structure kind, both shardings,
lengths that do not divide by the world size. Each rank scans only its rows; the agreed
verdict and decision are held to masklens.inspect() of the whole mask, on every rank.
torch's CP engine where it runs on CPUs: FlexAttention CP forward (flex has no backward
on the CPU; torch's SDPA ring dispatches CUDA kernels only: both checked to say so)."""
import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import masklens  # noqa: E402
import masklens.distributed as mld  # noqa: E402

WORLDS = (2, 3, 4)
LENGTHS = (24, 13, 5)  # 24 divides by 2W for every W here; 13 by none of the worlds; 5 leaves a rank none


# ---------------------------------------------------------------------------------
# Whole masks of every kind (bool [B, 1, Q, Q] or [Q, Q]; one additive)

def _causal(Q):
    return torch.ones(Q, Q, dtype=torch.bool).tril()


def _positions(Q):
    return torch.arange(Q)[:, None], torch.arange(Q)[None, :]


def masks(Q):
    q, k = _positions(Q)
    causal = _causal(Q)
    pads = torch.tensor([0, 3])  # left padding by batch: keys before it are masked
    padded = causal & (k >= pads[:, None, None, None])
    starts = [0, Q // 3, Q // 3 + 1, Q]  # packed documents, one of one row
    doc = torch.bucketize(torch.arange(Q), torch.tensor(starts[1:-1]), right=True)
    docs = causal & (doc[:, None] == doc[None, :])
    block = (q >= 2) & (q < 6) & (k >= 2) & (k < 6)  # an image's tokens see each other
    gen = torch.Generator().manual_seed(Q)
    arbitrary = torch.rand(2, 1, Q, Q, generator=gen) < 0.5
    additive = torch.zeros(Q, Q).masked_fill(~(causal & (q - k < 5)), float("-inf"))
    return {
        "full": torch.ones(Q, Q, dtype=torch.bool),
        "causal": causal,
        "sliding_window": causal & (q - k < 4),
        "chunked": causal & (q // 5 == k // 5),
        "prefix_lm": causal | (k < 6),
        "causal_blocks": causal | block,
        "documents": docs,
        "padding": padded,
        "arbitrary": arbitrary,
        "additive_window": additive,
        "empty_rows": causal & (q != 4),
    }


# ---------------------------------------------------------------------------------
# The ranks' side

def _agreement(group, rank, world):
    """Every kind, sharding and length: the agreed report equals the whole mask's."""
    for Q in LENGTHS:
        for name, whole in masks(Q).items():
            whole4 = whole if whole.dim() == 4 else whole[None, None]
            q = torch.randn(2, 4, Q, 16)
            expected = masklens.inspect(whole4, q, q, q).to_dict()
            for sharding in mld.SHARDINGS:
                local = mld.shard(whole4, -2, rank=rank, world_size=world, sharding=sharding)
                local_q = mld.shard(q, 2, rank=rank, world_size=world, sharding=sharding)
                got = mld.inspect(local, local_q, local_q, local_q, group=group, sharding=sharding).to_dict()
                assert got == expected, (name, Q, sharding, world, got["structure"], expected["structure"])
                # Without a call: the verdict alone, the 2-D mask as stored (a broadcast batch).
                verdict = mld.scan(mld.shard(whole, -2, rank=rank, world_size=world, sharding=sharding),
                                   group=group, sharding=sharding)
                assert verdict.structure.describe() == masklens.scan(whole).structure.describe(), (name, Q)
                assert np.array_equal(verdict.attending_rows(), masklens.scan(whole).attending_rows())


def _many_runs(group, rank, world):
    """A shard with more runs than travel in the first gather takes the second one."""
    Q = 600
    gen = torch.Generator().manual_seed(7)
    whole = torch.rand(Q, 40, generator=gen) < 0.3
    local = mld.shard(whole, -2, rank=rank, world_size=world, sharding="load_balanced")
    verdict = mld.scan(local, group=group, sharding="load_balanced")
    assert verdict.run_count >= Q - 2 and verdict.structure.kind == "arbitrary"
    assert np.array_equal(verdict.attending_rows(), masklens.scan(whole).attending_rows())


def _errors(group, rank, world):
    """One rank's NaN: every rank raises the same MaskError naming it (none left waiting);
    shards of different masks, and ranks that scan with different shardings or thresholds
    (their merged verdicts would differ by rank), are refused on every rank."""
    whole = torch.zeros(12, 12)
    local = mld.shard(whole, -2, rank=rank, world_size=world).clone()
    if rank == world - 1:
        local[0, 0] = float("nan")
    with pytest.raises(masklens.MaskError, match=f"rank {world - 1}: invalid_value"):
        mld.scan(local, group=group)
    keys = 12 if rank else 11
    with pytest.raises(masklens.MaskError, match="differ in keys"):
        mld.scan(torch.ones(3, keys, dtype=torch.bool), group=group)
    causal = torch.ones(12, 12, dtype=torch.bool).tril()
    sharding = "load_balanced" if rank == 0 else "contiguous"
    mine = mld.shard(causal, -2, rank=rank, world_size=world, sharding=sharding)
    with pytest.raises(masklens.MaskError, match="scanned their rows differently"):
        mld.scan(mine, group=group, sharding=sharding)
    with pytest.raises(masklens.MaskError, match="scanned their rows differently"):
        mld.scan(mld.shard(causal, -2, rank=rank, world_size=world), group=group,
                 masked_threshold=-1000.0 if rank else -1e4)
    # A shard that does not broadcast to its query fails in the collective too.
    rows = 5 if rank == 0 else 3
    with pytest.raises(masklens.MaskError, match="rank 0: invalid_shape"):
        mld.inspect(torch.ones(rows, 12, dtype=torch.bool), torch.randn(1, 2, 3, 8), group=group)


def _flex_cp(group, rank, world):
    """FlexAttention CP (forward) with masklens' BlockMask against SDPA on the whole
    sequence with the dense mask: every kind that keeps or drops keys, both shardings."""
    from torch.distributed.device_mesh import DeviceMesh
    mesh = DeviceMesh.from_group(group, "cpu")
    Q = 24
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, Q, 8, generator=gen) for _ in range(3))
    for sharding in mld.SHARDINGS:
        cp = mld.ContextParallel(mesh, sharding=sharding, block_size=8)
        for name, whole in masks(Q).items():
            whole4 = whole if whole.dim() == 4 else whole[None, None]
            attends = whole4 if whole4.dtype == torch.bool else whole4 > -1000
            reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attends)
            reference = torch.nan_to_num(reference, nan=0.0)  # rows with no key: masklens gives 0
            local = cp.shard(whole4, -2)
            lq, lk, lv = (cp.shard(t, 2) for t in (q, k, v))
            report = cp.inspect(local, lq, lk, lv)
            assert not cp.uses_ring(report.structure, lq.device)  # the ring is CUDA-only
            out = cp.attention(lq, lk, lv, report, local)
            torch.testing.assert_close(out, cp.shard(reference, 2), atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"{name} {sharding}: {m}")
            torch.testing.assert_close(cp.unshard(out, 2), reference, atol=1e-5, rtol=1e-5)
    # What does not run on CPUs, as docs/distributed.md says: torch's SDPA ring has no CPU
    # kernel to dispatch, and FlexAttention has no CPU backward.
    cp = mld.ContextParallel(mesh, sharding="contiguous")
    lq, lk, lv = (cp.shard(t, 2) for t in (q, k, v))
    with cp, pytest.raises(NotImplementedError, match="flash_attention_for_cpu"):
        cp._ring_causal(lq, lk, lv, None)
    report = cp.inspect(cp.shard(_causal(Q), -2), lq)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        cp.attention(lq.requires_grad_(), lk, lv, report, None)


def _unequal_shards_refused(group, rank, world):
    """torch's CP runs equal shards: a length that does not divide is refused on every rank
    before any collective (the verdict itself takes it: _agreement)."""
    from torch.distributed.device_mesh import DeviceMesh
    cp = mld.ContextParallel(DeviceMesh.from_group(group, "cpu"), sharding="load_balanced")
    whole = masks(13)["sliding_window"][None, None]
    q = cp.shard(torch.randn(1, 2, 13, 8), 2)
    report = cp.inspect(cp.shard(whole, -2), q)
    with pytest.raises(masklens.MaskError, match="equal length"):
        cp.attention(q, q, q, report, cp.shard(whole, -2))


def _transformers_cp(group, rank, world):
    """A tiny Llama with attn_implementation="masklens_cp" on this rank's tokens (left-padded
    and packed batches) gives the logits of the whole sequence under sdpa with the dense mask."""
    transformers = pytest.importorskip("transformers")
    from torch.distributed.device_mesh import DeviceMesh
    mld.register_transformers()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    Q = 24
    every = masks(Q)
    pads = torch.tensor([0, 3])
    padded = {"mask": every["padding"], "ids": torch.randint(0, 64, (2, Q)),
              "pos": (torch.arange(Q)[None] - pads[:, None]).clamp(min=0), "valid": torch.arange(Q)[None] >= pads[:, None]}
    starts = torch.tensor([0, Q // 3, Q // 3 + 1])
    doc = torch.bucketize(torch.arange(Q), starts[1:], right=True)
    packed = {"mask": every["documents"][None, None], "ids": torch.randint(0, 64, (1, Q)),
              "pos": (torch.arange(Q) - starts[doc])[None], "valid": torch.ones(1, Q, dtype=torch.bool)}
    for sharding in mld.SHARDINGS:
        cp = mld.ContextParallel(DeviceMesh.from_group(group, "cpu"), sharding=sharding, block_size=8)
        for batch in (padded, packed):
            model.set_attn_implementation("sdpa")
            with torch.no_grad():
                reference = model(batch["ids"], attention_mask=batch["mask"], position_ids=batch["pos"]).logits
            model.set_attn_implementation(mld.TRANSFORMERS_NAME)
            local_mask = cp.shard(batch["mask"], -2)
            report = cp.inspect(local_mask)
            with torch.no_grad(), cp.step(report, local_mask):
                logits = model(cp.shard(batch["ids"], 1), position_ids=cp.shard(batch["pos"], 1)).logits
            valid = cp.shard(batch["valid"], 1)
            torch.testing.assert_close(logits[valid], cp.shard(reference, 1)[valid], atol=1e-4, rtol=1e-4)


def _worker(rank, world, port, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        # Every rank creates every subgroup (new_group is collective), in one order.
        groups = {w: dist.new_group(list(range(w))) for w in WORLDS if w < world}
        groups[world] = dist.group.WORLD
        for w in WORLDS:
            if rank < w:
                _agreement(groups[w], rank, w)
                _errors(groups[w], rank, w)
        if rank < 3:
            _many_runs(groups[3], rank, 3)
        if rank < 2:
            _flex_cp(groups[2], rank, 2)
            _unequal_shards_refused(groups[2], rank, 2)
            _transformers_cp(groups[2], rank, 2)
        if rank < 3:
            _flex_cp(groups[3], rank, 3)
        open(os.path.join(result_dir, f"rank{rank}.ok"), "w").close()
        # Every rank done before any tears the group down: gloo aborts a process whose
        # peer closes the connection while its last send is still in flight.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_agree_and_flex_cp_runs(tmp_path):
    """One spawn of 4 gloo ranks runs every check above (the worlds of 2 and 3 as
    subgroups): a failing rank raises here with its traceback."""
    world = max(WORLDS)
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    assert sorted(os.listdir(tmp_path)) == [f"rank{r}.ok" for r in range(world)]


# ---------------------------------------------------------------------------------
# One process: the shardings and the merge

@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("q_len", (24, 13, 5))
def test_shardings_cover_the_sequence_once(world, q_len):
    for sharding in mld.SHARDINGS:
        order = mld.sequence_order(q_len, world, sharding)
        assert sorted(order.tolist()) == list(range(q_len))
    # contiguous is DTensor's Shard(dim): torch.chunk's sizes.
    sizes = [len(mld.positions(q_len, world, r)) for r in range(world)]
    assert sizes == [len(c) for c in torch.arange(q_len).chunk(world)] + [0] * (world - len(
        torch.arange(q_len).chunk(world)))
    # load_balanced is torch's head-tail balancer where it allows the length.
    if q_len % (2 * world) == 0:
        from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer
        torch_order = _HeadTailLoadBalancer(q_len, world, "cpu")._generate_indices()[0].tolist()
        assert mld.sequence_order(q_len, world, "load_balanced").tolist() == torch_order


def _fake_gather(whole, world, sharding):
    """What every rank's _scan_shard would contribute, gathered (no processes)."""
    headers, runs = [], []
    for r in range(world):
        header, rr, error = mld._scan_shard(mld.shard(whole, -2, rank=r, world_size=world, sharding=sharding), -1000.0)
        assert error is None
        headers.append(header)
        runs.append(rr)
    return np.stack(headers), runs


@pytest.mark.parametrize("sharding", mld.SHARDINGS)
def test_merged_runs_expand_to_the_whole_table(sharding):
    """The merge in one process: the runs of the shards, cut at chunk boundaries and put in
    global order, classify as the whole mask does. Chunks of one row (Q=5, 13) make a
    rank's two local rows one run across its boundary, which the merge must cut."""
    for Q, name in ((5, "causal"), (13, "sliding_window"), (13, "documents"), (24, "sliding_window"),
                    (31, "prefix_lm")):
        whole = masks(Q)[name]
        for world in WORLDS:
            table, merged = mld.merge_runs(*_fake_gather(whole, world, sharding), sharding)
            verdict = masklens._core.classify_runs(table, merged)
            assert verdict.structure.describe() == masklens.scan(whole).structure.describe()
            assert np.array_equal(verdict.attending_rows(), masklens.scan(whole).attending_rows())
            assert (np.diff(merged[:, 0]) > 0).all()


def test_load_balanced_lengths_torch_refuses_are_checked():
    """A load-balanced split must be the head-tail chunks of the rows the ranks hold
    together: another split is refused (by every rank alike: the same headers)."""
    whole = masks(24)["causal"]
    headers, runs = _fake_gather(whole, 2, "contiguous")
    headers[0, 1] -= 1  # rank 0 holds a row fewer than its chunks, rank 1 one more
    headers[1, 1] += 1
    with pytest.raises(masklens.MaskError, match="load_balanced sharding"):
        mld.merge_runs(headers, runs, "load_balanced")


def test_classify_runs_refuses_runs_that_do_not_tile():
    table, runs = masklens._core.scan_runs(np.tril(np.ones((6, 6), bool)))
    with pytest.raises(masklens.MaskError, match="tile the rows"):
        masklens._core.classify_runs(table, np.ascontiguousarray(runs[:, :] + np.array([1, 0, 0, 0, 0, 0, 0, 0])))


# ---------------------------------------------------------------------------------
# On a GPU: the device scanner's shards and torch's CP engine, forward and backward

def _gpu_worker(rank, world, port, backend, result_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (world,))
        Q = 256
        for name, whole in masks(Q).items():  # the device scanner's shards agree too
            whole = whole.to(device)
            for sharding in mld.SHARDINGS:
                local = mld.shard(whole, -2, rank=rank, world_size=world, sharding=sharding)
                got = mld.scan(local, sharding=sharding)
                assert got.structure.describe() == masklens.scan(whole).structure.describe(), (name, sharding)
        if backend == "gloo":
            # Two ranks on one GPU: torch's CP collectives over gloo with CUDA tensors die in
            # torch (SIGSEGV in the SDPA ring's and flex CP's all_gather, torch 2.11, measured
            # on an H100), so CP's attention runs only over NCCL, on two GPUs.
            open(os.path.join(result_dir, f"rank{rank}.ok"), "w").close()
            dist.barrier()
            return
        gen = torch.Generator(device=device).manual_seed(2)
        q, k, v = (torch.randn(2, 4, Q, 64, generator=gen, device=device) for _ in range(3))
        # Kinds whose every row attends a key: SDPA's reference gives NaN on a row with
        # none, and its backward spreads them (the CPU check covers padding's empty rows).
        for name in ("causal", "sliding_window", "chunked", "documents", "prefix_lm", "arbitrary"):
            whole = masks(Q)[name].to(device)
            whole = whole if whole.dim() == 4 else whole[None, None]
            ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
            ref = torch.nn.functional.scaled_dot_product_attention(*ref_in, attn_mask=whole)
            ref.square().sum().backward()
            for sharding in mld.SHARDINGS:
                cp = mld.ContextParallel(mesh, sharding=sharding)
                local = cp.shard(whole, -2)
                lq, lk, lv = (cp.shard(t, 2).detach().clone().requires_grad_() for t in (q, k, v))
                with cp:
                    report = cp.inspect(local, lq, lk, lv)
                    assert cp.uses_ring(report.structure, device) == (name == "causal")
                    out = cp.attention(lq, lk, lv, report, local, compiled=False)
                    out.square().sum().backward()
                tol = {"atol": 2e-3, "rtol": 2e-3}
                torch.testing.assert_close(out, cp.shard(ref, 2), **tol)
                for mine, theirs in zip((lq, lk, lv), ref_in):
                    torch.testing.assert_close(mine.grad, cp.shard(theirs.grad, 2), **tol)
        open(os.path.join(result_dir, f"rank{rank}.ok"), "w").close()
        # Every rank done before any tears the group down: gloo aborts a process whose
        # peer closes the connection while its last send is still in flight.
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_gpu_device_shards_and_cp_forward_backward(tmp_path):
    """Two ranks (NCCL on two GPUs; gloo sharing one GPU where there is one): CUDA masks
    scanned on the device agree with the whole mask's verdict, and ContextParallel.attention
    (the SDPA ring for causal, FlexAttention CP otherwise; on two GPUs only) gives SDPA's
    output and gradients on the whole sequence."""
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    mp.spawn(_gpu_worker, args=(2, _free_port(), backend, str(tmp_path)), nprocs=2, join=True)
    assert sorted(os.listdir(tmp_path)) == ["rank0.ok", "rank1.ok"]


def test_a_broadcast_shard_stands_for_every_batch():
    """One rank stores its rows once for every batch (stride 0), another stores each batch:
    the first's slice is replicated, and the verdict is the whole materialised mask's."""
    Q, B = 12, 3
    whole = masks(Q)["sliding_window"]
    headers, runs = [], []
    for r in range(2):
        rows = mld.shard(whole, -2, rank=r, world_size=2, sharding="load_balanced")[None, None]
        rows = rows.expand(B, 2, -1, -1) if r == 0 else rows.expand(B, 2, -1, -1).clone()
        header, rr, error = mld._scan_shard(rows, -1000.0)
        assert error is None and tuple(header[5:7]) == ((1, 1) if r == 0 else (B, 2))
        headers.append(header)
        runs.append(rr)
    table, merged = mld.merge_runs(np.stack(headers), runs, "load_balanced")
    assert table == [B, 2, Q, Q, B, 2]
    verdict = masklens._core.classify_runs(table, merged)
    materialised = masklens.scan(whole.expand(B, 2, Q, Q).clone())
    assert verdict.structure.describe() == materialised.structure.describe()
    assert np.array_equal(verdict.attending_rows(), materialised.attending_rows())
