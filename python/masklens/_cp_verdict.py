"""The agreed verdict of a sharded mask: scan() and inspect() as collectives. Each rank
scans its own rows into span runs, one all_gather brings every rank's runs (a second where
some rank has more than EAGER_RUNS), every rank merges them in global row order and
classifies the same runs (classify_runs.hpp: deterministic), so every rank holds the
verdict masklens.scan() gives the whole mask; inspect() decides the whole call on it."""
from __future__ import annotations

import torch

import masklens
from . import _core, _inspect, _scan
from ._cp_collectives import collective_device, gather_runs, group_of
from ._cp_merge import merge_runs
from ._cp_runs import ShardError, error_text, scan_shard


def scan(local_mask, *, group=None, sharding: str = "contiguous", masked_threshold: float = -1000.0):
    """The Verdict of the whole mask from this rank's rows of it (`local_mask`: [..., rows,
    K], the query rows this rank holds under `sharding`, every key): each rank scans its
    rows into span runs, one all_gather brings every rank's runs (a second where some rank
    has more than EAGER_RUNS), and each rank classifies the same merged runs. Equal to
    masklens.scan() of the whole mask; the same on every rank. A collective: every rank of
    `group` calls it, with its own rows. A rank whose scan fails (NaN, a bad dtype) makes
    every rank raise the same MaskError, naming it."""
    group = group_of(group)
    header, runs, error = scan_shard(local_mask, masked_threshold, sharding)
    headers, gathered = gather_runs(header, runs, error, group, collective_device(group))
    table, merged = merge_runs(headers, gathered, sharding)
    return _core.classify_runs(table, merged)


def inspect(local_mask, query=None, key=None, value=None, *, group=None, sharding: str = "contiguous",
            masked_threshold: float = -1000.0, max_plan_calls: int = 64, strict: bool = False, **fields):
    """masklens.inspect() of the whole mask from this rank's rows of it: the agreed verdict
    (scan() above: one collective) and the decision for the whole call. query, key, value
    are this rank's shards ([B, H, rows, D]); the call's lengths are the whole sequence's
    (Q the ranks' rows together, K the mask's keys). Report.to_dict() equals
    masklens.inspect(whole_mask, whole_q, whole_k, whole_v).to_dict()."""
    try:
        call_fields, env_fields = _inspect.split_fields(dict(fields))
        mask = view = _scan.readable(local_mask, check_dims=query is None)
        if query is not None:
            # Broadcast as SDPA reads it, against the local query and the mask's own keys
            # (the key shard is not the keys the rows attend to).
            view = _inspect.broadcast_to_call(mask, query, None)
        # The call's and the environment's fields checked now, with the local lengths (the
        # whole call is made after the gather, from the same fields).
        masklens.make_call(view, query, key, value, **call_fields)
        masklens.environment(_cuda_device(query, mask), **env_fields)
    except Exception as e:  # noqa: BLE001 - raised in the collective, on every rank (see scan_shard)
        mask, view = None, ShardError(error_text(e))
    verdict = scan(view, group=group, sharding=sharding, masked_threshold=masked_threshold)
    s = verdict.structure
    if query is not None:
        call_fields = {"q_len": s.q_len, "k_len": s.k_len, **call_fields}
    call = masklens.make_call(view, query, key, value, **call_fields)
    env = masklens.environment(_cuda_device(query, mask), **env_fields)
    try:
        policy, error = masklens.decide(s, call, env, max_plan_calls), None
    except _core.MaskError as e:
        if strict:
            raise
        policy, error = None, str(e)
    return masklens.Report(verdict, policy, call, env, error)


def _cuda_device(query, mask):
    """The CUDA device of the query or the mask (the environment decided for), or None."""
    return next((t.device for t in (query, mask) if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
