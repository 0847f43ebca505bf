"""What one rank contributes to the agreement on a sharded mask: its rows scanned into
span runs (on the device where masklens._cuda is built and the shard is on CUDA, else on
the host) and a fixed-size header saying how it read them. A rank that fails (a bad
argument, NaN, a shape of no meaning) says so in its header instead of raising, so that
every rank still reaches the gather and hears of it there."""
from __future__ import annotations

import numpy as np
import torch

from . import _core, _scan
from ._cp_shards import SHARDINGS, check_sharding

# A rank's header in the gather: status (0 ok, 1 its scan failed), its rows, the mask's
# batch, heads and keys, its distinct batch and heads (0: no rows, no opinion), its runs;
# then what every rank must have asked alike: the sharding and the masked threshold (its
# float64 bits). Ranks that read their rows differently would merge into verdicts that
# differ by rank, and then run different collectives.
HEADER = 10
OK, FAILED = 0, 1
RUN_COLUMNS = 8  # (row, length, first, last, d_first, d_last, count, flags): Verdict.runs


def as_4d(mask):
    """The mask as [B, H, rows, K] (leading dims of 1 added), a torch tensor or numpy array."""
    if isinstance(mask, torch.Tensor):
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        return mask
    return mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))


def _distinct(view) -> tuple[int, int]:
    """Distinct batch and heads a scan of `view` (a torch tensor) stores: one where the
    dimension is 1 or of stride 0 (as SpanTable::for_view sizes it)."""
    b, h = view.shape[0], view.shape[1]
    return (1 if view.stride(0) == 0 or b == 1 else b), (1 if view.stride(1) == 0 or h == 1 else h)


def _local_runs(view, masked_threshold: float):
    """(int64 [runs, 8] of this rank's rows, numbered slice * rows + q; (distinct batch,
    distinct heads)): on the device where masklens._cuda is built and the mask is there,
    else on the host (scanned and encoded, not classified)."""
    if isinstance(view, torch.Tensor) and view.device.type == "cuda" and _scan.cuda_module() is not None:
        verdict = _scan.device_scan(view.detach(), masked_threshold)
        _scan.counted_scan()
        return np.asarray(verdict.runs, dtype=np.int64).reshape(-1, RUN_COLUMNS), _distinct(view)
    host = _scan.host_array(view) if isinstance(view, torch.Tensor) else view
    table, runs = _core.scan_runs(host, masked_threshold)
    _scan.counted_scan()
    return np.asarray(runs), (table[4], table[5])


class ShardError:
    """A shard that failed before its scan (inspect's checks of the call): its message
    travels in the gather like a scan's error."""

    def __init__(self, message: str):
        self.message = message


def error_text(e: BaseException) -> str:
    """What a rank tells the others of its error: a MaskError's own message (it starts with
    its code), anything else prefixed with its type."""
    return str(e) if isinstance(e, _core.MaskError) else f"{type(e).__name__}: {e}"


def scan_shard(local_mask, masked_threshold: float, sharding: str = "contiguous"):
    """(header int64 [HEADER], runs int64 [n, 8], error message or None) of this rank."""
    header = np.zeros(HEADER, dtype=np.int64)
    runs = np.zeros((0, RUN_COLUMNS), dtype=np.int64)
    try:
        # Every argument is checked here, inside the gather's try: a rank that raised before
        # the collective would leave the others waiting in it until the group's timeout.
        if isinstance(local_mask, ShardError):
            raise _core.MaskError(local_mask.message)
        check_sharding(sharding)
        masked_threshold = _scan.threshold_value(masked_threshold)
        header[8] = SHARDINGS.index(sharding)
        header[9] = np.array([masked_threshold], dtype=np.float64).view(np.int64)[0]
        mask = _scan.readable(local_mask)
        if len(mask.shape) < 2 or len(mask.shape) > 4:
            raise _core.MaskError(f"invalid_shape: a shard of a mask's rows has 2 to 4 dims ([..., rows, K]), got "
                                  f"{len(mask.shape)}")
        view = as_4d(mask)
        batch, heads, rows, keys = (int(n) for n in view.shape)
        db = dh = 0  # no rows: no say in how many slices are distinct
        if rows > 0:
            runs, (db, dh) = _local_runs(view, masked_threshold)
        header[:8] = (OK, rows, batch, heads, keys, db, dh, len(runs))
        return header, runs, None
    except Exception as e:  # noqa: BLE001 - whatever it is, every rank must hear of it in the gather
        header[0] = FAILED
        return header, runs, error_text(e)
