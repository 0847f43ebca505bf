"""ContextParallel: attention on torch's context-parallel engine under a verdict the
ranks agreed on. A plain causal verdict on CUDA runs as `is_causal` through torch's SDPA
ring (DTensors sharded on the sequence, dispatched by torch's CP handlers inside
`with cp:`); every other exact structure and any arbitrary mask runs as FlexAttention
on this rank's queries against the keys and values all-gathered by torch's
flex_cp_allgather, with masklens' BlockMask of this rank's rows."""
from __future__ import annotations

import contextlib
import zlib

import numpy as np
import torch
import torch.distributed as dist

from . import _core, _scan, _verdicts
from ._cp_block_mask import build_block_mask
from ._cp_collectives import agree_on_call, agree_on_values
from ._cp_runs import error_text
from ._cp_flex import flex_for
from ._cp_shards import check_sharding, sequence_order, shard
from ._cp_transformers import stepping
from ._cp_verdict import inspect, scan

_KEPT_BLOCK_MASKS = 8  # a training step's masks (one per mask kind), not every step's
# What every rank's attention() call must share (agreed before its collectives).
_CALL_SIGNATURE = ("Q", "verdict", "engine (1: SDPA ring)", "batch", "heads", "key heads", "head dim", "value dim",
                   "rows", "dtype", "device type", "gradients")
_RING_OUTSIDE_CP = ("masklens.distributed: the SDPA ring's backward is dispatched by torch's CP dispatcher: run the "
                    "forward and the backward inside `with cp:`")
_UNSHARD_DIMS = 8  # the dims unshard() compares between ranks (a tensor of more is refused)


def is_plain_causal(structure) -> bool:
    """Whether `is_causal` alone computes the structure: causal, as many keys as queries, no
    padding, documents, bias or rows masked by finite values (what torch's SDPA ring
    attention takes: is_causal and no mask)."""
    s = structure
    return (s.kind == "causal" and s.q_len == s.k_len and s.segments is None and s.kv_valid is None
            and s.q_valid is None and s.empty_rows == 0 and s.finite_masked_rows == 0 and not s.bias)


def _check_flex_structure(structure) -> None:
    """FlexAttention's mask_mod keeps or drops a key: a bias, or rows masked only by finite
    values (which attend uniformly in a dense softmax), are not a mask_mod."""
    if structure.bias or structure.finite_masked_rows:
        raise _core.MaskError("invalid_argument: a mask carrying an additive bias, or rows masked only by finite "
                              "values, is not a FlexAttention mask_mod: under CP masklens runs masks that keep or "
                              "drop keys (docs/distributed.md)")


def _gqa(query, key):
    return {"enable_gqa": True} if query.shape[1] != key.shape[1] else {}


def _agreed_arguments(group, sharding, block_size, check_calls):
    """ContextParallel's arguments, checked on this rank and then with every rank of the
    group (one all_gather_object): a bad or differing argument on any rank is an
    ArgumentError on every rank, where one rank raising alone would leave the others
    waiting in their next collective. The block size as (q, k)."""
    error, own, size = None, None, None
    try:
        check_sharding(sharding)
        try:
            size = _scan.tile_size(block_size)
        except _core.MaskError:
            size = (0, 0)
        if min(size) < 1:
            raise _core.MaskError(f"invalid_argument: block_size must be a tile size N or (q, k), integers >= 1, got "
                                  f"{block_size!r}")
        if not isinstance(check_calls, bool):
            raise _core.MaskError(f"invalid_argument: check_calls takes True or False, got {check_calls!r}")
    except Exception as e:  # noqa: BLE001 - every rank hears of it in the exchange below
        error, own = error_text(e), e
    agree_on_values(group, "ContextParallel", error,
                    {"sharding": sharding if isinstance(sharding, str) else repr(sharding), "block_size": size,
                     "check_calls": check_calls if isinstance(check_calls, bool) else repr(check_calls)}, own)
    return size


def _code(text: str) -> int:
    """A name (a dtype, a device type, a verdict's description) as an integer that travels in
    the call's signature: equal names, equal codes, on every rank."""
    return zlib.crc32(text.encode())


def _check_tensors(query, key, value) -> None:
    """q, k, v as attention takes them on one rank: [B, H, rows, D] tensors of one dtype on
    one device, the keys' and values' rows and batch the query's, the query's heads a
    multiple of the keys' (GQA)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _core.MaskError(f"invalid_shape: ContextParallel.attention takes {name} as a [B, H, rows, D] tensor, "
                                  f"got {shape}")
    if len({t.dtype for t in (query, key, value)}) > 1 or len({t.device for t in (query, key, value)}) > 1:
        raise _core.MaskError("invalid_argument: query, key and value have one dtype and one device, got dtype "
                              f"{[str(t.dtype) for t in (query, key, value)]}, device "
                              f"{[str(t.device) for t in (query, key, value)]}")
    b, h, rows, d = query.shape
    if (key.shape[0], key.shape[2], key.shape[3]) != (b, rows, d) or key.shape[:3] != value.shape[:3] \
            or h % key.shape[1]:
        raise _core.MaskError(f"invalid_shape: query {list(query.shape)}, key {list(key.shape)}, value "
                              f"{list(value.shape)}: the key and value hold the query's batch and rows, the key its "
                              "head dim, and the query's heads are a multiple of theirs")


def _check_local_mask(local_mask, rows: int, q_len: int) -> None:
    shape = getattr(local_mask, "shape", None)
    if shape is None or not 2 <= len(shape) <= 4 or tuple(shape[-2:]) != (rows, q_len):
        raise _core.MaskError(f"invalid_shape: local_mask holds this rank's {rows} rows of the mask's {q_len} keys "
                              f"([..., {rows}, {q_len}]), got {list(shape) if shape is not None else type(local_mask)}")


class ContextParallel:
    """masklens on torch's context parallelism over `mesh` (a 1-D DeviceMesh; its group is
    the CP group). sharding: "contiguous" (torch's Shard(seq_dim)) or "load_balanced"
    (torch's head-tail load balancer). `with cp:` turns torch's CP dispatcher on (and its
    load-balance option to match the sharding) for the forward and the backward: SDPA ring
    attention dispatches through it."""

    def __init__(self, mesh, sharding: str = "contiguous", block_size: int = 128, check_calls: bool = True):
        self.mesh = mesh
        self.group = mesh.get_group()
        self.sharding = sharding
        self.block_size = _agreed_arguments(self.group, sharding, block_size, check_calls)
        # Whether attention() and unshard() agree on their arguments with every rank before
        # their collectives (one all_gather of a few integers a call).
        self.check_calls = check_calls
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self._active = 0
        self._saved_balance = None
        # The last few BlockMasks: (report, local mask, device) -> BlockMask; the objects are
        # held with it, so an id is never another object's.
        self._block_masks = {}

    # -- torch's CP dispatcher ----------------------------------------------------------
    def __enter__(self):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
        if self._active == 0:
            self._saved_balance = cp_attention._cp_options.enable_load_balance
            cp_attention._cp_options.enable_load_balance = self.sharding == "load_balanced"
            cp_attention._enable_context_parallel_dispatcher()
        self._active += 1
        return self

    def __exit__(self, *exc):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
        self._active -= 1
        if self._active == 0:
            cp_attention._disable_context_parallel_dispatcher()
            cp_attention._cp_options.enable_load_balance = self._saved_balance
        return False

    # -- shards and the verdict ---------------------------------------------------------
    def shard(self, tensor, dim: int):
        """This rank's part of a whole-sequence tensor along `dim` (mask rows: -2; q, k, v: 2)."""
        return shard(tensor, dim, rank=self.rank, world_size=self.world_size, sharding=self.sharding)

    def unshard(self, tensor, dim: int):
        """The whole sequence from every rank's part along `dim` (an all_gather, put back in
        global order): for checking outputs."""
        self._agreed_part(tensor, dim)
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        whole = torch.cat(parts, dim)
        order = torch.as_tensor(np.argsort(sequence_order(whole.shape[dim], self.world_size, self.sharding)),
                                device=whole.device)
        return whole.index_select(dim, order)

    def _agreed_part(self, tensor, dim: int) -> None:
        """unshard()'s all_gather takes parts of one shape, dtype and device type on every
        rank: checked here and (check_calls) agreed with every rank first."""
        names = ("dims", "dim", *(f"size {i}" for i in range(_UNSHARD_DIMS)), "dtype", "device type")

        def check():
            if not isinstance(tensor, torch.Tensor) or not 1 <= tensor.dim() <= _UNSHARD_DIMS:
                raise _core.MaskError(f"invalid_argument: unshard takes a tensor of 1 to {_UNSHARD_DIMS} dims, got "
                                      f"{list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)}")
            if not isinstance(dim, int) or not -tensor.dim() <= dim < tensor.dim():
                raise _core.MaskError(f"invalid_argument: unshard's dim must index the tensor's {tensor.dim()} dims, "
                                      f"got {dim!r}")
            shape = list(tensor.shape) + [0] * (_UNSHARD_DIMS - tensor.dim())
            return dict(zip(names, (tensor.dim(), dim % tensor.dim(), *shape, _code(str(tensor.dtype)),
                                    _code(tensor.device.type))))
        self._checked_and_agreed("ContextParallel.unshard", check, names)

    def _checked_and_agreed(self, what: str, check, names) -> None:
        """check() on this rank (it raises, or gives the call's signature: a value for each
        of `names`), then, with check_calls, agree_on_call with every rank: an error is
        every rank's (its own type kept on its rank where it is no argument's). Without
        check_calls the error is this rank's alone."""
        error, own, signature = None, None, dict.fromkeys(names, 0)
        try:
            signature = check()
        except Exception as e:  # noqa: BLE001 - every rank hears of it in the exchange below
            if not self.check_calls:
                raise
            error, own = error_text(e), e
        if self.check_calls:
            agree_on_call(self.group, what, error, signature, own)

    def inspect(self, local_mask, query=None, key=None, value=None, **kwargs):
        return inspect(local_mask, query, key, value, group=self.group, sharding=self.sharding, **kwargs)

    def scan(self, local_mask, masked_threshold: float = -1000.0):
        return scan(local_mask, group=self.group, sharding=self.sharding, masked_threshold=masked_threshold)

    # -- attention ----------------------------------------------------------------------
    def uses_ring(self, structure, device) -> bool:
        """Whether attention() runs torch's SDPA ring (`is_causal`): a plain causal verdict on
        CUDA. CP's ring dispatches only the CUDA SDPA kernels (flash, efficient, cuDNN)."""
        return is_plain_causal(structure) and torch.device(device).type == "cuda"

    def attention(self, query, key, value, report, local_mask=None, *, scale=None, compiled=None):
        """This rank's attention output ([B, H, rows, D]) for its shards of q, k, v under the
        agreed `report` (a Report or Verdict from inspect()/scan()). A plain causal verdict on
        CUDA runs F.scaled_dot_product_attention(is_causal=True) on DTensors sharded on the
        sequence: torch's ring attention (inside `with cp:` when gradients flow, so that the
        backward is dispatched too). Anything else runs flex_attention on this rank's
        queries against the keys and values all-gathered by torch's flex_cp_allgather (its
        backward reduce-scatters the gradients), with masklens' BlockMask of this rank's rows
        (cp.block_mask). compiled: torch.compile'd flex (default on CUDA; eager on the CPU,
        where flex has no backward)."""
        ring, block_mask = self._agreed_call(query, key, value, report, local_mask)
        if ring:
            return self._ring_causal(query, key, value, scale)
        from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather
        from torch.distributed.distributed_c10d import _get_process_group_name
        whole_key, whole_value = flex_cp_allgather(key.contiguous(), value.contiguous(), 2,
                                                   _get_process_group_name(self.group))
        return flex_for(compiled, query.device)(query, whole_key, whole_value, block_mask=block_mask, scale=scale,
                                                **_gqa(query, key))

    def _agreed_call(self, query, key, value, report, local_mask):
        """(whether the SDPA ring runs the call, the BlockMask where flex does): the call's
        arguments checked on this rank, then (check_calls) agreed with every rank before any
        collective: one all_gather of the call's signature, which every rank must share
        (the verdict, the engine, shapes, dtype, device type, whether gradients flow: ranks
        that differ there would enter different collectives, or collectives of different
        sizes). An error on any rank, or a difference, is an ArgumentError on every rank; a
        rank's own error that is no argument's (out of memory) is raised there as it is."""
        decided = {"ring": False, "block_mask": None}

        def check():
            structure = getattr(report, "structure", None)
            if structure is None:
                raise _core.MaskError("invalid_argument: report is the ranks' agreed Report or Verdict (cp.inspect(), "
                                      f"cp.scan()), got {type(report).__name__}")
            _check_tensors(query, key, value)
            if structure.q_len != structure.k_len:
                raise _core.MaskError("invalid_argument: CP shards queries and keys alike: the mask must have as many "
                                      f"keys as queries, got Q={structure.q_len}, K={structure.k_len}")
            self._check_shards(structure.q_len, query)
            ring = decided["ring"] = self.uses_ring(structure, query.device)
            needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            if ring and needs_backward and not self._active:
                raise RuntimeError(_RING_OUTSIDE_CP)
            if not ring:
                _check_flex_structure(structure)
                if structure.kind == "arbitrary" and local_mask is None:
                    raise _core.MaskError("invalid_argument: an arbitrary mask's BlockMask reads the mask: pass "
                                          "local_mask")
                if local_mask is not None:
                    _check_local_mask(local_mask, query.shape[2], structure.q_len)
                decided["block_mask"] = self.block_mask(report, local_mask, query.device)
            b, h, rows, d = query.shape
            return dict(zip(_CALL_SIGNATURE, (
                structure.q_len, _code(structure.describe()), int(ring), b, h, key.shape[1], d, value.shape[3], rows,
                _code(str(query.dtype)), _code(query.device.type), int(needs_backward))))
        self._checked_and_agreed("ContextParallel.attention", check, _CALL_SIGNATURE)
        return decided["ring"], decided["block_mask"]

    def _check_shards(self, q_len: int, query) -> None:
        """torch's CP gathers and rotates equal shards (all_gather_tensor): Q must divide by
        W (contiguous) or by 2W (load_balanced: torch's head-tail chunks); the same test on
        every rank, so every rank raises alike before any collective."""
        parts = self.world_size * (2 if self.sharding == "load_balanced" else 1)
        if q_len % parts:
            raise _core.MaskError(f"invalid_shape: torch's context parallelism runs shards of equal length: Q={q_len} "
                                  f"does not divide into {parts} {self.sharding} parts (W={self.world_size}); the "
                                  "verdict (inspect, scan) takes any length")
        if query.shape[2] * self.world_size != q_len:
            raise _core.MaskError(f"invalid_shape: this rank's query holds {query.shape[2]} rows; its shard of "
                                  f"Q={q_len} over {self.world_size} ranks is {q_len // self.world_size}")

    def _ring_causal(self, query, key, value, scale):
        from torch.distributed.tensor import DTensor, Shard
        import torch.nn.functional as F
        needs_backward = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if needs_backward and not self._active:
            raise RuntimeError(_RING_OUTSIDE_CP)
        if key.shape[1] != query.shape[1]:
            # GQA: CP's ring calls the flash / efficient / cuDNN ops, which take as many key
            # heads as query heads: repeat them, as SDPA does without enable_gqa.
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        with self if not self._active else contextlib.nullcontext():
            q, k, v = (DTensor.from_local(t.contiguous(), self.mesh, [Shard(2)], run_check=False)
                       for t in (query, key, value))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            return out.to_local()

    # -- transformers -------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, report, local_mask=None):
        """A training or inference step of a transformers model whose attn_implementation is
        "masklens_cp" (register_transformers()): every attention layer runs attention() with
        this agreed report and this rank's mask rows (transformers builds no mask: from a
        shard of input_ids it would see only local positions). torch's CP dispatcher is on
        inside: run the forward and the backward in it."""
        with stepping(self, report, local_mask), self:
            yield self

    # -- BlockMask of this rank's rows ----------------------------------------------------
    def block_mask(self, report, local_mask=None, device=None):
        """FlexAttention's BlockMask of this rank's query rows against the whole sequence in the
        order the ranks' shards gather (flex CP's coordinates: local q, gathered kv). Its
        tiles are read from the local rows with their keys put in that order (one local read:
        on the device where masklens._cuda writes tiles, else on the host); its mask_mod is
        the agreed structure's rule at the global positions (an exact structure: nothing held
        but the position tables) or, for an arbitrary mask, a lookup into the local rows.
        Memoised per report and local mask."""
        structure = report.structure
        device = torch.device(device) if device is not None else (
            local_mask.device if local_mask is not None else torch.device("cpu"))
        # The mask's version too: a buffer refilled in place (same object) is another mask.
        version = None if local_mask is None else _verdicts.tensor_key(local_mask, None)
        key = (id(report), id(local_mask), version, str(device))
        if key not in self._block_masks:
            if len(self._block_masks) >= _KEPT_BLOCK_MASKS:
                self._block_masks.pop(next(iter(self._block_masks)))
            built = build_block_mask(structure, local_mask, device, rank=self.rank, world_size=self.world_size,
                                     sharding=self.sharding, block_size=self.block_size)
            self._block_masks[key] = (report, local_mask, built)
        return self._block_masks[key][2]
