"""masklens under context parallelism: the ranks of a sharded sequence agree on one
verdict, and attention runs on torch's own CP engine (docs/distributed.md).

    import masklens.distributed as mld
    cp = mld.ContextParallel(mesh, sharding="load_balanced")   # or "contiguous"
    local_mask = cp.shard(mask, dim=-2)          # this rank's query rows, as CP shards them
    q, k, v = (cp.shard(t, dim=2) for t in (q, k, v))
    with cp:                                     # torch's CP dispatcher, forward and backward
        report = cp.inspect(local_mask, q)       # one all_gather: every rank the same Report
        out = cp.attention(q, k, v, report, local_mask)

Spans are a monoid over row shards (row_span.hpp): each rank scans only its rows into
span runs (the device scanner on a CUDA mask where masklens._cuda is built, else the host
scanner), the ranks all_gather the runs (O(runs): one run for a causal shard, a few for a
window or padding, one per document) with their row counts, and every rank reassembles
the whole table's runs in global row order and classifies them (classify_runs.hpp:
deterministic, so every rank holds the same verdict, which equals masklens.inspect's on
the whole mask). A plain causal verdict runs as `is_causal` through torch's SDPA ring
(CUDA only); every other exact structure and any arbitrary mask runs as FlexAttention
with the keys and values all-gathered by torch's `flex_cp_allgather` and a BlockMask of
this rank's rows built by masklens (tiles from the local rows, the structure's rule as
mask_mod). Nothing here moves data but torch.distributed's collectives.

The package's modules under it, each of one job (bottom to top):
  _cp_shards       which rows a rank holds (torch's two shardings), and the cut of a tensor
  _cp_runs         this rank's rows scanned into span runs, with the header it sends
  _cp_collectives  the gather of the runs, and the exchanges that make every rank raise
                   together on a bad argument (none left waiting in a collective)
  _cp_merge        every rank's runs merged into the whole mask's, in global row order
  _cp_verdict      scan() and inspect(): the agreed verdict and decision
  _cp_block_mask   FlexAttention's BlockMask of a rank's rows (local work only)
  _cp_flex         the flex_attention CP calls, compiled on CUDA in buckets of their own
  _cp_transformers attn_implementation="masklens_cp"
  _cp_runner       ContextParallel: torch's CP dispatcher, the SDPA ring, FlexAttention CP,
                   each call's arguments agreed with every rank before its collectives
"""
from __future__ import annotations

from ._cp_collectives import EAGER_RUNS, ArgumentError, collective_device
from ._cp_collectives import gather_runs as _gather  # noqa: F401  (bench/distributed.py)
from ._cp_merge import merge_runs
from ._cp_runner import ContextParallel, is_plain_causal
from ._cp_runs import scan_shard as _scan_shard  # noqa: F401  (bench/distributed.py, tests)
from ._cp_shards import SHARDINGS, positions, row_ranges, sequence_order, shard
from ._cp_transformers import TRANSFORMERS_NAME, register_transformers
from ._cp_verdict import inspect, scan

__all__ = ["ArgumentError", "SHARDINGS", "EAGER_RUNS", "row_ranges", "positions", "sequence_order", "shard",
           "merge_runs", "scan", "inspect", "is_plain_causal", "ContextParallel", "TRANSFORMERS_NAME",
           "register_transformers"]


def _collective_device(group, mask=None):
    """Where the agreement's gathers run (bench/distributed.py times them there): chosen by
    the group alone, whatever device the mask is on."""
    return collective_device(group)
