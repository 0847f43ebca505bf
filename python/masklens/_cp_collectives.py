"""Everything masklens.distributed says to the other ranks, and how every rank raises
together. The runs' gather (one all_gather of a fixed-size int64 tensor a rank, a second
only where some rank has more than EAGER_RUNS runs) and the exchanges that check
arguments: each rank checks its own first, then one collective tells every rank what the
others found, so that a bad argument on one rank is an error on every rank at once rather
than one rank raising alone and the others waiting in their next collective until the
group's timeout. Every decision to take a further collective is read from what was
gathered, which is the same on every rank: no rank takes a collective the others skip."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from . import _core
from ._cp_runs import FAILED, HEADER, OK, RUN_COLUMNS
from ._cp_shards import SHARDINGS

# Runs that travel in the first all_gather: a structured shard has a handful, so one
# collective settles it; more (an arbitrary mask) take a second, sized by the largest.
EAGER_RUNS = 256


class ArgumentError(_core.MaskError, ValueError):
    """An argument of a collective call that is impossible on some rank, or that the ranks
    must pass alike and do not: raised on every rank of the group together, naming each
    rank and its error. A MaskError, as masklens' other refusals, and a ValueError."""


def group_of(group, mesh=None):
    if mesh is not None:
        return mesh.get_group()
    return group if group is not None else dist.group.WORLD


def collective_device(group):
    """Where the gathered tensors live: the CPU where the group has gloo, else the current
    CUDA device (NCCL takes CUDA tensors only). Chosen from the group alone, never from a
    rank's tensors: ranks whose tensors sit on different devices still meet in one
    backend (in a group of both, a CPU tensor on one rank and a CUDA one on another would
    send them to different backends, each waiting for the other)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_array(array: np.ndarray, group, device) -> np.ndarray:
    """[world, *array.shape]: every rank's array (same shape on every rank)."""
    mine = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return torch.stack(out).cpu().numpy()


def _messages(error, group) -> list:
    """Every rank's error text (None where it has none): one all_gather_object, taken only
    where the gathered statuses say some rank failed (the same on every rank)."""
    messages = [None] * dist.get_world_size(group)
    dist.all_gather_object(messages, error, group=group)
    return messages


def _by_rank(messages) -> str:
    return "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)


# ---------------------------------------------------------------------------------
# Arguments: checked on each rank, then agreed

def _raise_failed(what: str, failed: str, own: BaseException | None):
    """Some rank failed: a rank whose own error is not an argument's (out of memory, a
    fault in masklens) raises that error, its type kept; every other rank raises
    ArgumentError naming each failing rank and its error."""
    if own is not None and not isinstance(own, (_core.MaskError, ValueError, TypeError)):
        raise own
    raise ArgumentError(f"{what}: {failed}")


def agree_on_values(group, what: str, error: str | None, values: dict, own: BaseException | None = None) -> None:
    """For arguments checked once (a constructor): one all_gather_object of this rank's
    error text (None: its arguments are good) and the values every rank must pass alike.
    Where any rank has an error, or the values differ, every rank raises (_raise_failed:
    `own` is this rank's exception)."""
    said = [None] * dist.get_world_size(group)
    dist.all_gather_object(said, (error, tuple(values.values())), group=group)
    failed = _by_rank([e for e, _ in said])
    if failed:
        _raise_failed(what, failed, own)
    if len({v for _, v in said}) > 1:
        raise ArgumentError(f"invalid_argument: {what}: the ranks differ in {' or '.join(values)}: "
                            f"{[v for _, v in said]} by rank; every rank of the group must pass the same")


def agree_on_call(group, what: str, error: str | None, signature: dict, own: BaseException | None = None) -> None:
    """For the arguments of every call (attention): one all_gather of an int64 row a rank,
    its status and `signature` (what every rank must pass alike: shapes, dtype, device,
    whether gradients flow, the verdict's rule; the same names in the same order on every
    rank, their values integers). Only where some rank failed is a second collective taken
    (the error texts). Where any rank failed, or a value differs, every rank raises
    ArgumentError, naming the ranks and values (a rank whose own exception `own` is not an
    argument's raises that: _raise_failed)."""
    row = np.zeros(1 + len(signature), dtype=np.int64)
    row[0] = FAILED if error is not None else OK
    if error is None:
        row[1:] = list(signature.values())
    rows = all_gather_array(row, group, collective_device(group))
    if (rows[:, 0] != OK).any():
        _raise_failed(what, _by_rank(_messages(error, group)), own)
    differ = [f"{name} {rows[:, 1 + i].tolist()}" for i, name in enumerate(signature)
              if len(set(rows[:, 1 + i].tolist())) > 1]
    if differ:
        raise ArgumentError(f"invalid_argument: {what}: the ranks differ in {'; '.join(differ)} by rank; every rank "
                            "of the group passes the same")


# ---------------------------------------------------------------------------------
# The runs' gather

def _check_asked_alike(headers) -> None:
    """A MaskError on every rank where the ranks scanned with different shardings or
    thresholds (every rank sees the same headers, so every rank raises)."""
    shardings = [SHARDINGS[int(c)] for c in headers[:, 8]]
    thresholds = headers[:, 9].astype(np.int64).view(np.float64).tolist()
    if len(set(shardings)) > 1 or len(set(headers[:, 9].tolist())) > 1:
        raise _core.MaskError(f"invalid_argument: the ranks scanned their rows differently: sharding {shardings}, "
                              f"masked_threshold {thresholds} by rank; every rank of the group must pass the same")


def gather_runs(header, runs, error, group, device):
    """Every rank's header and runs (a list of int64 [n_r, 8]), identical on every rank; a
    MaskError on every rank naming each rank whose scan failed."""
    first = np.zeros((EAGER_RUNS, RUN_COLUMNS), dtype=np.int64)
    first[:min(len(runs), EAGER_RUNS)] = runs[:EAGER_RUNS]
    gathered = all_gather_array(np.concatenate([header, first.ravel()]), group, device)
    headers = gathered[:, :HEADER]
    if (headers[:, 0] != OK).any():
        # Every rank saw the same headers, so every rank takes this path: one more gather,
        # of the messages, and the same error everywhere (no rank left waiting).
        raise _core.MaskError(f"{_by_rank(_messages(error, group))} (rows numbered within the rank's shard)")
    _check_asked_alike(headers)
    counts = headers[:, 7]
    gathered_runs = [gathered[r, HEADER:].reshape(EAGER_RUNS, RUN_COLUMNS)[:min(n, EAGER_RUNS)]
                     for r, n in enumerate(counts)]
    most = int(counts.max())
    if most > EAGER_RUNS:  # the same decision on every rank: all take the second gather
        rest = np.zeros((most - EAGER_RUNS, RUN_COLUMNS), dtype=np.int64)
        rest[:max(len(runs) - EAGER_RUNS, 0)] = runs[EAGER_RUNS:]
        more = all_gather_array(rest, group, device)
        gathered_runs = [np.concatenate([g, more[r, :max(int(n) - EAGER_RUNS, 0)]])
                         for r, (g, n) in enumerate(zip(gathered_runs, counts))]
    return headers, gathered_runs
