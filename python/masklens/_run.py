"""Running a Policy with torch: one typed call, or a plan of them, on [B, H, Q, D]
tensors. Every path is differentiable; rows that attend to nothing are zeroed by the
caller (masklens.torch) from the verdict, whatever the kernel wrote there.

prepare() reads a Policy once into a Prepared runner: the drop-in keeps one per (mask,
call), so a cached call reads no property of the C++ objects (each read converts a
string or copies a struct) and runs only the torch calls themselves."""
from __future__ import annotations

import functools
import inspect as _pyinspect

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

_KERNELS = {
    "torch.sdpa.flash": [SDPBackend.FLASH_ATTENTION],
    "torch.sdpa.efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "torch.sdpa.cudnn": [SDPBackend.CUDNN_ATTENTION],
    "torch.sdpa.math": [SDPBackend.MATH],
    # CausalBias dispatches to flash or efficient itself.
    "torch.sdpa.causal_lower_right": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
}
# sdpa_kernel(backends) on a CUDA tensor, through torch.backends.cuda's public switches:
# the four kernels' flags set for the call and restored after it (left alone where they
# already say so). sdpa_kernel does the same by name (getattr on formatted names inside
# a generator context): ~20 µs a call where this takes ~1.5 µs (bench/dropin_overhead.py).
# It also turns off the "overrideable" backend, which serves only out-of-tree
# (PrivateUse1) devices, never a CUDA tensor.
_cuda_backends = torch.backends.cuda
_SWITCHES = ((SDPBackend.FLASH_ATTENTION, _cuda_backends.flash_sdp_enabled, _cuda_backends.enable_flash_sdp),
             (SDPBackend.EFFICIENT_ATTENTION, _cuda_backends.mem_efficient_sdp_enabled,
              _cuda_backends.enable_mem_efficient_sdp),
             (SDPBackend.MATH, _cuda_backends.math_sdp_enabled, _cuda_backends.enable_math_sdp),
             (SDPBackend.CUDNN_ATTENTION, _cuda_backends.cudnn_sdp_enabled, _cuda_backends.enable_cudnn_sdp))
# Per SDPA backend name: the switches' states (in _SWITCHES order) that select it.
_KERNEL_FLAGS = {name: tuple(backend in kernels for backend, _, _ in _SWITCHES) for name, kernels in _KERNELS.items()}


def _sdpa_on_kernels(flags, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """F.scaled_dot_product_attention with only the kernels `flags` names enabled."""
    before = tuple(enabled() for _, enabled, _ in _SWITCHES)
    if before == flags:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)
    for (_, _, enable), on in zip(_SWITCHES, flags):
        enable(on)
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)
    finally:
        for (_, _, enable), on in zip(_SWITCHES, before):
            enable(on)


_TYPES = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "float32": torch.float32}


class Tensors:
    """The call's tensors and the arguments every runner shares."""

    __slots__ = ("q", "k", "v", "mask", "scale", "dropout_p", "structure", "derived")

    def __init__(self, q, k, v, mask, scale, dropout_p, structure, derived):
        self.q, self.k, self.v, self.mask = q, k, v, mask
        self.scale, self.dropout_p = scale, dropout_p
        self.structure = structure
        self.derived = derived  # per-mask memo (block masks, index tensors): the cache entry's


def _expand_kv(q, k, v):
    """K and V repeated to the query's heads: only for an SDPA kernel that takes no
    enable_gqa (the varlen, flex and flash-attn runners take fewer key heads as they are)."""
    groups = q.shape[1] // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def kept_mask(call, mask, query_dtype):
    """The dense mask as the call passes it: cast, then in its form."""
    return _kept_mask(call.mask_cast, call.mask_form, mask, query_dtype)


def _kept_mask(mask_cast, mask_form, mask, query_dtype):
    if mask_cast:
        mask = mask.to(_TYPES[mask_cast])
    if mask_form == "additive":
        attends = mask if mask.dtype == torch.bool else (mask != 0) if not mask.is_floating_point() else None
        if attends is not None:
            mask = torch.zeros((), dtype=query_dtype, device=mask.device).masked_fill(~attends, float("-inf"))
        else:
            mask = mask.to(query_dtype)
    elif mask_form == "inverted":
        mask = ~(mask if mask.dtype == torch.bool else mask != 0)
    elif mask_form == "flattened":
        raise NotImplementedError("masklens.torch does not run FlashInfer's flattened custom masks")
    return mask


def _sdpa_runner(call):
    """run(t, q, k, v, mask) for an SDPA call, its arguments read once."""
    a = call.args
    use = call.mask
    mask_cast, mask_form = call.mask_cast, call.mask_form
    enable_gqa = bool(a.enable_gqa) if a is not None else False
    is_causal = bool(a.is_causal) if a is not None else False
    flags = _KERNEL_FLAGS[call.backend]
    if use == "replace":
        from torch.nn.attention.bias import causal_lower_right

    def run(t, q, k, v, mask):
        attn_mask = None
        if use == "keep":
            attn_mask = _kept_mask(mask_cast, mask_form, mask, q.dtype)
        elif use == "replace":
            attn_mask = causal_lower_right(q.shape[2], k.shape[2])
        if not enable_gqa and q.shape[1] != k.shape[1]:
            k, v = _expand_kv(q, k, v)
        if not q.is_cuda:
            # On the CPU only the math kernel is decided (masklens.torch's CPU environment);
            # torch's CPU kernels are exact for every mask, so its own dispatch runs it.
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=t.dropout_p,
                                                  is_causal=is_causal, scale=t.scale, enable_gqa=enable_gqa)
        return _sdpa_on_kernels(flags, q, k, v, attn_mask, t.dropout_p, is_causal, t.scale, enable_gqa)
    return run


def run_sdpa(call, t: Tensors, q, k, v, mask):
    return _sdpa_runner(call)(t, q, k, v, mask)


def _pack_index(sequences, side, device, batch):
    """(batch index, row index) of every packed row, in packing order: side 1 = q, 3 = k."""
    bs, rows = [], []
    for seq in sequences:
        b, start, end = seq[0], seq[side], seq[side + 1]
        n = end - start
        rows.append(torch.arange(start, end, device=device))
        bs.append(torch.full((n,), b, device=device, dtype=torch.long))
    if not rows:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty
    return torch.cat(bs), torch.cat(rows)


def _broadcast_sequences(sequences, structure, batch):
    """A structure of batch 1 describes every batch of a [1, ...] mask: repeat its
    sequences for each batch of the call."""
    if structure.batch == batch:
        return list(sequences)
    return [(b,) + tuple(s[1:]) for b in range(batch) for s in sequences]


@functools.lru_cache(maxsize=None)
def _varlen_params():
    from torch.nn.attention.varlen import varlen_attn
    return varlen_attn, frozenset(_pyinspect.signature(varlen_attn).parameters)


def _varlen_layout(a, t: Tensors, q):
    key = ("varlen", q.device, q.shape[0])
    layout = t.derived.get(key)
    if layout is None:
        seqs = _broadcast_sequences(a.sequences, t.structure, q.shape[0])
        qb, qi = _pack_index(seqs, 1, q.device, q.shape[0])
        kb, ki = _pack_index(seqs, 3, q.device, q.shape[0])
        cu_q = [0]
        cu_k = [0]
        for s in seqs:
            cu_q.append(cu_q[-1] + s[2] - s[1])
            cu_k.append(cu_k[-1] + s[4] - s[3])
        max_q = max((s[2] - s[1] for s in seqs), default=0)
        max_k = max((s[4] - s[3] for s in seqs), default=0)
        layout = (qb, qi, kb, ki, torch.tensor(cu_q, dtype=torch.int32, device=q.device),
                  torch.tensor(cu_k, dtype=torch.int32, device=q.device), max_q, max_k)
        t.derived[key] = layout
    return layout


def run_varlen(call, t: Tensors, q, k, v, attend=None, args=None):
    """Packs the sequences into [total, heads, dim], runs the varlen kernel, unpacks into a
    zero [B, H, Q, Dv] output. `attend` replaces the kernel (tests run the packing on the
    CPU with it). GQA goes in as it is: K and V keep their fewer heads, which every
    varlen kernel here takes (flash's varlen forward and backward, behind torch's
    varlen_attn as behind flash-attn 2 and 3, need only heads % kv_heads == 0)."""
    a = args if args is not None else call.args  # a prepared call passes them: read once
    qb, qi, kb, ki, cu_q, cu_k, max_q, max_k = _varlen_layout(a, t, q)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, L, H, D]
    qp, kp, vp = qt[qb, qi], kt[kb, ki], vt[kb, ki]
    if attend is not None:
        outp = attend(qp, kp, vp, cu_q, cu_k, max_q, max_k, causal=a.causal, window=(a.window_left, a.window_right),
                      scale=t.scale)
    elif call.backend == "torch.varlen_attn":
        varlen_attn, params = _varlen_params()
        if t.scale is not None and "scale" not in params:
            raise RuntimeError("masklens: this torch's varlen_attn takes no scale; a scale was given")
        kwargs = {"scale": t.scale} if "scale" in params else {}
        window = (a.window_left, a.window_right)
        if "window_size" in params:
            kwargs["window_size"] = window
        elif a.window_left >= 0 or a.causal:
            raise RuntimeError("masklens: this torch's varlen_attn has no window_size argument")
        outp = varlen_attn(qp, kp, vp, cu_q, cu_k, max_q, max_k, **kwargs)
    elif call.backend in ("flash_attn.varlen", "flash_attn3.varlen"):
        if call.backend == "flash_attn.varlen":
            from flash_attn import flash_attn_varlen_func
        else:
            from flash_attn_interface import flash_attn_varlen_func
        kwargs = {"causal": a.causal, "softmax_scale": t.scale}
        if a.window_left >= 0 or a.window_right >= 0:
            kwargs["window_size"] = (a.window_left, a.window_right)
        if call.backend == "flash_attn.varlen":
            kwargs["dropout_p"] = t.dropout_p
        outp = flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, max_q, max_k, **kwargs)
        if isinstance(outp, tuple):
            outp = outp[0]
    else:
        raise RuntimeError(f"masklens: no varlen runner for {call.backend}")
    out = qt.new_zeros(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])
    out = out.index_put((qb, qi), outp)
    return out.transpose(1, 2)


def run_flash_attn(call, t: Tensors, q, k, v, args=None):
    """flash-attn's fixed-length kernel: [B, L, H, D] in and out, GQA native."""
    a = args if args is not None else call.args
    from flash_attn import flash_attn_func
    kwargs = {"causal": a.causal, "softmax_scale": t.scale, "dropout_p": t.dropout_p}
    if a.window_left >= 0:
        kwargs["window_size"] = (a.window_left, 0)
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
    return out.transpose(1, 2)


def mask_mod_for(structure, device, mask=None):
    """FlexAttention's mask_mod: the structure's rule from its fields, or (for a kept
    mask) a lookup into the dense mask."""
    if mask is not None:
        m = mask if mask.dtype == torch.bool else (mask > -1000) if mask.is_floating_point() else mask != 0
        mb, mh = m.shape[:2]

        def lookup(b, h, qi, ki):
            # create_block_mask evaluates whole tiles: indices past the last row or key
            # reach here when a length is not a multiple of the block; clamp them (flex
            # masks those positions itself). The bounds are the mask's own sizes, not
            # Python ints: a compiled flex traces them as the lengths, without a guard.
            return m[b if mb > 1 else 0, h if mh > 1 else 0, qi.clamp(max=m.shape[2] - 1), ki.clamp(max=m.shape[3] - 1)]
        return lookup
    s = structure
    Q, K = s.q_len, s.k_len
    d = K - Q if s.alignment == "bottom_right" else 0
    kind = s.kind
    W, C, P = s.window, max(s.chunk, 1), s.prefix
    # The closure holds Python ints, and a tensor only for a rule or modifier that reads
    # one: torch.compile traces exactly the terms the structure has (no dead clamp, no
    # `+ 0`), the graph a hand-written mask_mod of the same rule gives.
    from ._cache import to_device  # host tables cross once, from pinned memory
    blocks = None
    if kind == "causal_blocks":
        table = np.full((max(K, Q + d, 1),), -1, dtype=np.int32)
        for n, (start, end) in enumerate(s.blocks):
            table[start:end] = n
        blocks = to_device(table, device)
    docs = None
    if s.segments is not None:
        docs = document_table(s.segments, Q, device)
    kv = to_device(np.asarray(s.kv_valid, dtype=np.int64), device) if s.kv_valid is not None else None
    qv = to_device(np.asarray(s.q_valid, dtype=np.int64), device) if s.q_valid is not None else None
    # Modifiers hold one entry per batch, or one for every batch (a broadcast mask).
    docs_batch = docs is not None and docs.shape[0] > 1
    kv_batch = kv is not None and kv.shape[0] > 1
    qv_batch = qv is not None and qv.shape[0] > 1

    def mask_mod(b, h, qi, ki):
        # create_block_mask evaluates whole tiles: indices past Q or K reach here when a
        # length is not a multiple of the block. Lookups use clamped indices (flex masks
        # those positions itself); comparisons use the real ones. The branches test
        # Python values: a trace keeps only the structure's own terms. Clamps read the
        # tables' sizes, not Q or K: a compiled flex of dynamic lengths is not guarded on them.
        p = qi + d if d else qi
        if kind == "full":
            ok = ki >= 0
        elif kind == "causal":
            ok = ki <= p
        elif kind == "sliding_window":
            ok = (ki <= p) & (p - ki < W)
        elif kind == "chunked":
            ok = (ki <= p) & (p >= 0) & (ki // C == p // C)
        elif kind == "prefix_lm":
            ok = (ki <= p) | (ki < P)
        else:  # causal_blocks: p's block, when p lies in one
            last = blocks.shape[0] - 1  # the table spans every key (positions past K hold -1)
            kc = ki.clamp(max=last)
            ok = (ki <= p) | ((blocks[kc] >= 0) & (blocks[kc] == blocks[p.clamp(min=0, max=last)]) & (p >= 0))
        if docs is not None:
            db = b if docs_batch else 0
            last = docs.shape[1] - 1  # documents are of square masks: Q = K
            ok = ok & (docs[db, qi.clamp(max=last)] == docs[db, ki.clamp(max=last)])
        if kv is not None:
            kb = b if kv_batch else 0
            ok = ok & (ki >= kv[kb, 0]) & (ki < kv[kb, 1])
        if qv is not None:  # rows outside q_valid attend nothing: their tiles are empty
            qb = b if qv_batch else 0
            ok = ok & (qi >= qv[qb, 0]) & (qi < qv[qb, 1])
        return ok
    return mask_mod


def rule_reads_tables(structure) -> bool:
    """Whether mask_mod_for's rule of an exact structure reads device tables (built or
    uploaded when the mask_mod is made): documents, VLM blocks, padding."""
    s = structure
    return (s.kind == "causal_blocks" or s.segments is not None or s.kv_valid is not None
            or s.q_valid is not None)


def span_mask_mod(spans, distinct_batch: int, distinct_heads: int):
    """FlexAttention's mask_mod of a mask whose every row attends one interval of keys (every
    exact structure's rows do: row_span.hpp), from the RowSpans a device read left
    ([distinct_batch * distinct_heads * Q, 4] int64: first, last, count, flags): key kv
    attends row q iff first[q] <= kv <= last[q] (an empty row's first is past every key).
    One copy of the bounds on the device, no upload: where a structure's rule needs tables
    (a document id per position...), this is the same mask with nothing else to build.
    The copy (16 bytes a row) lets the read's block go: a view would keep its runs, spans
    and tile counts alive with the BlockMask (~4.9 MB at 69632^2). A broadcast batch or
    head (distinct 1) reads slice 0."""
    Q = spans.shape[0] // (distinct_batch * distinct_heads)
    table = spans[:, :2].contiguous().view(distinct_batch, distinct_heads, Q, 2)

    def mask_mod(b, h, qi, ki):
        # Past Q (a ragged last tile) the row is clamped; flex masks those positions itself.
        # The table's own size bounds it: no guard on Q in a compiled flex.
        bb, hh, qc = b if distinct_batch > 1 else 0, h if distinct_heads > 1 else 0, qi.clamp(max=table.shape[2] - 1)
        return (ki >= table[bb, hh, qc, 0]) & (ki <= table[bb, hh, qc, 1])
    return mask_mod


def document_table(segments, Q: int, device) -> torch.Tensor:
    """[len(segments), Q] int32: the document of each position of each batch, from the
    documents' starts alone (segments[b] = [0, e1, ..., Q]). The ids only need to be equal
    within a document and distinct across two of one batch, so one search over every
    batch's interior starts as flat positions (b * Q + start) numbers them all at once:
    the positions, one upload of a few dozen integers and one bucketize, three launches
    and no synchronisation (marks, index_fill_ and cumsum took four; a Q-long table built
    on the host cost 0.7-1.1 ms a BlockMask at 65536 on an H200 host). A tensor, not
    Python ints: new document boundaries then reuse the compiled flex_attention (Dynamo
    guards ints as constants and would compile again for each packing)."""
    from ._cache import to_device  # the starts cross once, from pinned memory
    n = len(segments) * Q
    # Batch b's ids are offset by the starts of the batches before it: the same within
    # the batch, which is all that a comparison inside one batch sees.
    starts = [b * Q + start for b, seg in enumerate(segments) for start in seg[1:-1]]
    if not starts:
        return torch.zeros((len(segments), Q), dtype=torch.int32, device=device)
    wide = n >= 2**31
    bounds = to_device(np.asarray(starts, dtype=np.int64 if wide else np.int32), device)
    positions = torch.arange(n, dtype=torch.int64 if wide else torch.int32, device=bounds.device)
    return torch.bucketize(positions, bounds, out_int32=True, right=True).view(len(segments), Q)


_BLOCK_MASK_TAKES_Q_SIDE = None


def block_mask_from_arrays(arrays, seq_lengths, block_size, mask_mod):
    """A torch BlockMask over its eight int32 tensors ({name: tensor}, [B', H', ...] with B'
    and H' the distinct batch and heads, 1 broadcasting): through BlockMask's constructor
    where it takes the q side (torch 2.11 does), else BlockMask.from_kv_blocks deriving it.
    A broadcast dimension stays 1: flex_attention reads a dimension of 1 for every batch or
    head, while an expanded (stride-0) tensor would meet its contiguous offset arithmetic."""
    global _BLOCK_MASK_TAKES_Q_SIDE
    from torch.nn.attention.flex_attention import BlockMask
    if _BLOCK_MASK_TAKES_Q_SIDE is None:
        _BLOCK_MASK_TAKES_Q_SIDE = "q_num_blocks" in _pyinspect.signature(BlockMask.__init__).parameters
    if _BLOCK_MASK_TAKES_Q_SIDE:
        return BlockMask(seq_lengths=tuple(seq_lengths), BLOCK_SIZE=tuple(block_size), mask_mod=mask_mod, **arrays)
    return BlockMask.from_kv_blocks(arrays["kv_num_blocks"], arrays["kv_indices"], arrays["full_kv_num_blocks"],
                                    arrays["full_kv_indices"], BLOCK_SIZE=tuple(block_size), mask_mod=mask_mod,
                                    seq_lengths=tuple(seq_lengths))


def block_mask_from_tiles(tiles, mask_mod, device):
    """A torch BlockMask over masklens' tile summary (a _core.TileSummary): its eight int32
    tensors (the kv side, and the q side torch would derive for the backward). On a CUDA
    device with masklens._cuda, written there from the summary's states (one byte a tile
    crosses); otherwise written on the host and shared from numpy (moved to `device`)."""
    from . import _cache
    if torch.device(device).type == "cuda" and _cache.has_device_writer():
        arrays = _cache.device_block_mask_tensors(tiles, device)
        return block_mask_from_arrays(arrays, (tiles.q_len, tiles.k_len), tiles.block_size, mask_mod)
    t = tiles.block_mask()
    arrays = {name: _cache.to_device(getattr(t, name), device) for name in t.fields}
    return block_mask_from_arrays(arrays, t.seq_lengths, t.block_size, mask_mod)


def block_mask_from_structure(structure, size, mask_mod, device):
    """torch's BlockMask of an exact structure at `size` (q, k), from its fields (no mask is
    read): on a CUDA device with masklens._cuda, written there from the structure's tile
    ranges (a few bytes a q tile cross; no host writer, no tile states); otherwise from
    its tile summary (tiles_from_structure) as block_mask_from_tiles writes it."""
    from . import _cache, _core
    if torch.device(device).type == "cuda" and _cache.has_structure_writer():
        arrays, seq_lengths = _cache.device_block_mask_from_structure(structure, size, device)
        return block_mask_from_arrays(arrays, seq_lengths, size, mask_mod)
    return block_mask_from_tiles(_core.tiles_from_structure(structure, *size), mask_mod, device)


def device_block_mask(mask, size, mask_mod, masked_threshold=-1000.0, classify_many_runs=True):
    """The BlockMask of a CUDA mask ([B, H, Q, K]) from masklens._cuda's device tile summary:
    one read on the device, the eight tensors written there (masklens._cache.
    device_scan_tiles). (Verdict, BlockMask); the Verdict is None where classify_many_runs
    is False and the mask's runs are many (masklens._cache._MANY_RUNS)."""
    from . import _cache
    verdict, arrays = _cache.device_scan_tiles(mask.detach(), size, masked_threshold,
                                               classify_many_runs=classify_many_runs)
    return verdict, block_mask_from_arrays(arrays, mask.shape[-2:], size, mask_mod)


def flex_block_mask(t: Tensors, a, device):
    """The BlockMask of the call from masklens' tiles, or None where they are not at hand:
    an exact structure's tiles from its fields (no read of the mask), a kept CPU mask's
    from one host read, a kept CUDA mask's from one device read where masklens._cuda
    summarises tiles (else None: create_block_mask then evaluates the mask_mod on the
    device)."""
    from . import _cache, _core
    if not a.mask_mod_reads_mask:
        return block_mask_from_structure(t.structure, (a.block_q, a.block_k), mask_mod_for(t.structure, device), device)
    if t.mask.device.type == "cpu":
        _, tiles = _core.scan_with_tiles(t.mask.detach(), a.block_q, a.block_k)
        return block_mask_from_tiles(tiles, mask_mod_for(t.structure, device, t.mask), device)
    if t.mask.device.type == "cuda" and t.mask.device == device and _cache.has_device_tiles():
        _, block_mask = device_block_mask(t.mask, (a.block_q, a.block_k), mask_mod_for(t.structure, device, t.mask),
                                          classify_many_runs=False)  # the verdict is known: only the tiles are new
        return block_mask
    return None


# --- Compiled FlexAttention: lengths that change ----------------------------------------
# A compile costs seconds (0.4 to 17.7 s each on an H200, issue 31), a step milliseconds.
# So flex is compiled with dynamic lengths, once per shape bucket: the lengths up to
# 128 * 2^k share one compiled function of their own (its own code object, so its own
# Dynamo cache and recompile limit), and within it the sequence dims are symbolic (a new
# length reuses the kernel). What stays static and keys the bucket: the device, dtype,
# batch, heads, key heads, head dims, the structure's rule (kind, window, chunk, prefix,
# alignment, which tables the mask_mod reads) and the tile size. decide() is told what a
# call's bucket would cost to compile (flex_compile_charge): 0 where it is warm, the
# compile's estimate where it is cold, so a cold flex is chosen only where nothing
# compile-free is cheaper than the compile (docs/policy.md). Forgoing a flex that would
# win warm is counted: once the calls that ran without it have given up as much as the
# compile costs, the bucket's compile is charged no more (renting until buying pays).

# What a cold compile is charged, ms: _core.FLEX_COLD_COMPILE_MS (measured, cost.hpp) or
# MASKLENS_FLEX_COMPILE_MS; set_flex_compile_ms() overrides it (0: never a cost).
_flex_compile_ms = None

# Tests: a function run in place of every compiled bucket (eager flex on the CPU).
_compiled_flex = None


class FlexRanEager(RuntimeError):
    """A compiled flex bucket ran as Python: Dynamo did not compile it (its recompile limit
    was hit, or it fell back to eager). Flex's unfused path would materialise the whole
    score matrix, so the bucket's function raises this before reaching it."""


def set_flex_compile_ms(ms):
    """The cost decide() charges a FlexAttention call whose bucket is cold (None: the
    measured default, _core.FLEX_COLD_COMPILE_MS, or MASKLENS_FLEX_COMPILE_MS)."""
    global _flex_compile_ms
    if ms is not None and not float(ms) >= 0:
        raise ValueError(f"masklens: a compile cost is >= 0 ms, got {ms}")
    _flex_compile_ms = None if ms is None else float(ms)


def flex_compile_ms() -> float:
    if _flex_compile_ms is not None:
        return _flex_compile_ms
    import os
    from . import _core
    return float(os.environ.get("MASKLENS_FLEX_COMPILE_MS", _core.FLEX_COLD_COMPILE_MS))


def length_bucket(n: int) -> int:
    """The smallest 128 * 2^k holding n: the lengths one compiled flex serves."""
    return 128 << max(0, (max(n, 1) - 1).bit_length() - 7)


def _rule_signature(structure, reads_mask: bool):
    """What a mask_mod's Python branches read of the structure (mask_mod_for): what a
    compiled flex is specialised on besides the shapes."""
    s = structure
    if reads_mask:
        tf = s.tile_fractions
        return ("mask", s.batch > 1, s.heads > 1, (tf.block_q, tf.block_k) if tf is not None else (128, 128))
    d = s.k_len - s.q_len if s.alignment == "bottom_right" else 0

    def modifier(table):
        return None if table is None else len(table) > 1
    return (s.kind, d, s.window, s.chunk, s.prefix, modifier(s.segments), modifier(s.kv_valid),
            modifier(s.q_valid), (128, 128))


def flex_bucket_key(structure, query, key, value, reads_mask=None):
    """The bucket a flex call on these tensors (or shapes) compiles in."""
    if reads_mask is None:  # as decide() builds FlexArgs: the native form takes no q_valid
        reads_mask = structure.kind == "arbitrary" or structure.q_valid is not None
    B, H, Q, D = query.shape
    device = query.device
    return (device.type, device.index, query.dtype, B, H, key.shape[1], D, value.shape[-1],
            _rule_signature(structure, reads_mask), length_bucket(max(Q, key.shape[2])))


class FlexBucket:
    """One bucket's compiled flex: warm once a call ran compiled; broken once Dynamo ran
    it as Python (it is then never chosen again); forgone_ms, what calls that ran without
    it while it was cold would have saved."""

    __slots__ = ("key", "fn", "warm", "broken", "forgone_ms")

    def __init__(self, key):
        self.key = key
        self.fn = None
        self.warm = self.broken = False
        self.forgone_ms = 0.0

    def compile_charge(self) -> float:
        """What decide() charges a flex call in this bucket before it runs, ms."""
        if self.broken:
            return float("inf")
        if self.warm:
            return 0.0
        return max(0.0, flex_compile_ms() - self.forgone_ms)


_flex_buckets: dict = {}


def flex_bucket(key) -> FlexBucket:
    bucket = _flex_buckets.get(key)
    if bucket is None:
        bucket = _flex_buckets[key] = FlexBucket(key)
    return bucket


def flex_compile_charge(structure, query, key, value, env=None):
    """(ms, bucket): what decide() should charge a flex call on these tensors for its
    compile, and the bucket (None where flex is not available to the decision)."""
    if env is not None and "flex" not in env.available:
        return 0.0, None
    bucket = flex_bucket(flex_bucket_key(structure, query, key, value))
    return bucket.compile_charge(), bucket


def flex_compiles() -> dict:
    """{bucket key: graphs Dynamo holds for that bucket's function}: tests and benchmarks
    check that a bucket compiled once."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    return {key: len(_debug_get_cache_entry_list(b.fn._torchdynamo_orig_callable.__code__))
            for key, b in _flex_buckets.items() if b.fn is not None and hasattr(b.fn, "_torchdynamo_orig_callable")}


def forget_flex_buckets():
    """Drops every bucket's state (tests; torch._dynamo.reset() drops the graphs)."""
    _flex_buckets.clear()


_flex_attention = None


def _flex_in_graph(q, k, v, block_mask, scale, enable_gqa):
    # Dynamo traces this body; run as Python it would reach flex's unfused path.
    if not torch.compiler.is_compiling():
        raise FlexRanEager("masklens: a compiled FlexAttention ran uncompiled")
    return _flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _bucket_function(bucket: FlexBucket):
    """torch.compile of a copy of _flex_in_graph with a code object of its own: Dynamo keys
    its cache and recompile limit on the code object, so each bucket has its own."""
    import types
    global _flex_attention
    if _flex_attention is None:
        from torch.nn.attention.flex_attention import flex_attention
        _flex_attention = flex_attention
    name = f"masklens_flex_{len(_flex_buckets)}_{bucket.key[-1]}"
    code = _flex_in_graph.__code__.replace(co_name=name)
    fn = types.FunctionType(code, _flex_in_graph.__globals__, name)
    return torch.compile(fn, dynamic=True)


def _mark_static_dims(q, k, v, block_mask):
    """Before a bucket's compile: batch, heads and head dims static (only the lengths and
    tile counts are symbolic), so no small dim shares a symbol with a tile count."""
    from ._cache import BLOCK_MASK_FIELDS
    mark = torch._dynamo.mark_static
    for t in (q, k, v):
        for dim in (0, 1, 3):
            mark(t, dim)
    for name in BLOCK_MASK_FIELDS:
        t = getattr(block_mask, name, None)
        if t is not None:
            mark(t, 0)
            mark(t, 1)


def _compiled_in_bucket(bucket: FlexBucket, q, k, v, block_mask, scale, enable_gqa):
    """The bucket's compiled flex, in the one grad form its graph was made for. On CUDA
    always the training form (grad mode on, q, k and v requiring grad; AOTAutograd
    compiles a backward only when one runs), so train and eval steps share one graph; the
    output is detached where the caller wanted none. On the CPU, where flex has no
    backward, always without grad."""
    cold = not bucket.warm
    if bucket.fn is None:
        bucket.fn = _bucket_function(bucket)
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    # Inference mode cannot record a backward: it runs the form without grad (a graph of
    # its own in the bucket, compiled once).
    training_form = q.is_cuda and not torch.is_inference_mode_enabled()
    if training_form:
        q, k, v = (x if x.requires_grad and wants_grad else x.detach().requires_grad_() for x in (q, k, v))
    else:  # flex refuses CPU inputs that require grad, whatever the grad mode
        q, k, v = q.detach(), k.detach(), v.detach()
    if cold:
        _mark_static_dims(q, k, v, block_mask)
        from torch.fx.experimental import _config as shape_config
        # Lengths of equal value would share a symbol (duck sizing): a later call where
        # they differ (Q != K, a table's length) would compile again.
        with shape_config.patch(use_duck_shape=False):
            out = _call_in_form(training_form, bucket.fn, q, k, v, block_mask, scale, enable_gqa)
    else:
        out = _call_in_form(training_form, bucket.fn, q, k, v, block_mask, scale, enable_gqa)
    bucket.warm = True
    return out if wants_grad or not training_form else out.detach()


def _call_in_form(training_form, fn, q, k, v, block_mask, scale, enable_gqa):
    with torch.enable_grad() if training_form else torch.no_grad():
        return fn(q, k, v, block_mask, scale, enable_gqa)


def _dense_fallback(t: Tensors, q, k, v):
    """Torch's own call with the dense mask: exact wherever flex was (the drop-in keeps
    the mask at hand for a flex call, Prepared.needs_mask)."""
    if t.mask is None:
        raise RuntimeError("masklens: FlexAttention cannot run here and the dense mask is not at hand")
    m = t.mask
    if m.dtype != torch.bool and not m.is_floating_point():
        m = m != 0
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=t.dropout_p, scale=t.scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


_warned_eager = set()


def _flex_unusable(bucket: FlexBucket, why):
    bucket.broken = True
    if bucket.key not in _warned_eager:
        _warned_eager.add(bucket.key)
        import logging
        logging.getLogger("masklens").warning(
            "masklens: compiled FlexAttention cannot run for %s (%s); torch's call with the dense mask runs it, "
            "and flex is not chosen for it again", bucket.key, why)


def _flex_block_mask_for(t: Tensors, a, q, k):
    B, Q, K = q.shape[0], q.shape[2], k.shape[2]
    key = ("flex", q.device, B, a.block_q, a.block_k, a.mask_mod_reads_mask)
    block_mask = t.derived.get(key)
    if block_mask is None:  # memoised with the verdict (the entry's derived values)
        from torch.nn.attention.flex_attention import create_block_mask
        block_mask = flex_block_mask(t, a, q.device)
        if block_mask is None:
            mask_mod = mask_mod_for(t.structure, q.device, t.mask if a.mask_mod_reads_mask else None)
            # A kept mask may differ per head: its block mask then spans the mask's heads.
            H = t.mask.shape[1] if a.mask_mod_reads_mask and t.mask.shape[1] > 1 else None
            block_mask = create_block_mask(mask_mod, B, H, Q, K, device=q.device, BLOCK_SIZE=(a.block_q, a.block_k))
        t.derived[key] = block_mask
    return block_mask


def _call_bucket(t: Tensors, a, q, k, v) -> FlexBucket:
    """The call's bucket, memoised with the verdict per shape: a cached call reads no
    property of the structure (each read converts a list or a string)."""
    memo = ("flex bucket", q.device, q.dtype, q.shape, k.shape, v.shape[-1], a.mask_mod_reads_mask)
    bucket = t.derived.get(memo)
    if bucket is None or _flex_buckets.get(bucket.key) is not bucket:  # new, or the buckets were forgotten
        bucket = t.derived[memo] = flex_bucket(flex_bucket_key(t.structure, q, k, v, a.mask_mod_reads_mask))
    return bucket


def run_flex(call, t: Tensors, q, k, v, compiled=True, args=None):
    """FlexAttention on masklens' BlockMask: compiled in the call's bucket (above), never
    flex's unfused path (compiled=False runs that path: tests, small shapes). Where the
    bucket cannot run compiled (Dynamo ran it as Python, the compile failed), or on the
    CPU with a backward wanted (flex has none there), torch's call with the dense mask
    runs it instead."""
    a = args if args is not None else call.args
    gqa = q.shape[1] != k.shape[1]
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if compiled and _compiled_flex is None and not q.is_cuda and wants_grad:
        return _dense_fallback(t, q, k, v)
    block_mask = _flex_block_mask_for(t, a, q, k)
    if not compiled or _compiled_flex is not None:
        if compiled:
            fn = _compiled_flex
        else:
            from torch.nn.attention.flex_attention import flex_attention as fn
        kwargs = {"enable_gqa": True} if gqa else {}
        return fn(q, k, v, block_mask=block_mask, scale=t.scale, **kwargs)
    import torch._dynamo as dynamo  # its exceptions, and mark_static for a compile
    bucket = _call_bucket(t, a, q, k, v)
    if bucket.broken:
        return _dense_fallback(t, q, k, v)
    try:
        return _compiled_in_bucket(bucket, q, k, v, block_mask, t.scale, gqa)
    except FlexRanEager:
        _flex_unusable(bucket, "Dynamo ran it uncompiled: its recompile limit, or a fallback to eager")
    except dynamo.exc.TorchDynamoException as e:
        if bucket.warm:
            raise
        _flex_unusable(bucket, f"its compile failed: {type(e).__name__}")
    return _dense_fallback(t, q, k, v)


def prepare_call(call):
    """run(t, q, k, v, mask) for one typed call."""
    b = call.backend
    if b in _KERNELS:
        return _sdpa_runner(call)
    a = call.args
    if b in ("torch.varlen_attn", "flash_attn.varlen", "flash_attn3.varlen"):
        return lambda t, q, k, v, mask: run_varlen(call, t, q, k, v, args=a)
    if b == "torch.flex_attention":
        return lambda t, q, k, v, mask: run_flex(call, t, q, k, v, args=a)
    if b == "flash_attn":
        return lambda t, q, k, v, mask: run_flash_attn(call, t, q, k, v, args=a)
    raise RuntimeError(f"masklens: masklens.torch has no runner for {b}")


def run_call(call, t: Tensors, q, k, v, mask):
    return prepare_call(call)(t, q, k, v, mask)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient. A plan step's output is a
    slice of the whole output, so its gradient arrives as a strided view; the fused
    kernels are run (and tested upstream) with dense gradients, and on an H200 a plan's
    cuDNN backward disagreed with the same calls assembled by torch.cat."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


class _NoKeyAttends(torch.autograd.Function):
    """The output of a call where no row attends any key (a plan of zeros steps only):
    zeros, connected to q, k and v with zero gradients, as torch's dense call gives them
    (its output requires grad wherever an input does; a plain zero tensor would not)."""

    @staticmethod
    def forward(ctx, out, q, k, v):
        ctx.inputs = [(t.shape, t.dtype, t.device) for t in (q, k, v)]
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        zeros = [torch.zeros(shape, dtype=dtype, device=device) if needed else None
                 for (shape, dtype, device), needed in zip(ctx.inputs, ctx.needs_input_grad[1:])]
        return (None, *zeros)


def _plan_runner(policy, structure):
    """run(t, q, k, v, mask) for a plan: each step on q[b, :, q_range] and k/v[b, :,
    k_range], written into a zero output; zeros steps leave their rows 0. A structure
    of batch 1 stands for every batch. Each step reads contiguous copies of its slices
    and gets a contiguous gradient back, the layouts the fused kernels' backward passes
    are built for."""
    steps = [(step.batch, *step.q_range, *step.k_range, prepare_call(step.call))
             for step in policy.plan if step.call.backend != "zeros"]
    broadcast = structure.batch == 1

    def run(t, q, k, v, mask):
        out = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])
        all_batches = broadcast and q.shape[0] > 1
        for b, qs, qe, ks, ke, step in steps:
            bs = slice(None) if all_batches else slice(b, b + 1)
            piece = step(t, q[bs, :, qs:qe].contiguous(), k[bs, :, ks:ke].contiguous(), v[bs, :, ks:ke].contiguous(),
                         None)
            out[bs, :, qs:qe] = _ContiguousGrad.apply(piece) if piece.requires_grad else piece
        if not steps and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            out = _NoKeyAttends.apply(out, q, k, v)
        return out
    return run


def run_plan(policy, t: Tensors):
    return _plan_runner(policy, t.structure)(t, t.q, t.k, t.v, None)


class Prepared:
    """A Policy read once, as the drop-in keeps it per (mask, call): `run(t, q, k, v,
    mask)`, whether the call reads the dense mask (`needs_mask`: the drop-in builds the
    mask's 4-D view only then) and whether rows that attend to nothing must be zeroed."""

    __slots__ = ("policy", "structure", "run", "needs_mask", "zero_rows")

    def __init__(self, policy, structure, flex_bucket=None):
        self.policy = policy
        self.structure = structure
        if policy.is_plan:
            self.run = _plan_runner(policy, structure)
            self.needs_mask = False  # steps run unmasked calls
        else:
            call = policy.call
            self.run = prepare_call(call)
            a = call.args
            # A flex call keeps the mask at hand: where its compiled kernel cannot run,
            # torch's call with the dense mask runs it (run_flex).
            self.needs_mask = call.mask == "keep" or (a is not None and a.type == "flex")
        self.zero_rows = structure.empty_rows > structure.finite_masked_rows
        saving = forgone_saving_ms(policy) if flex_bucket is not None else 0.0
        if saving > 0:
            self.run = _renting(self.run, flex_bucket, saving)


def forgone_saving_ms(policy) -> float:
    """What each call of `policy` gives up by not running a flex that was passed over only
    for its cold compile: the chosen call's estimate less flex's without the compile (0
    where flex would not win warm either)."""
    if policy.backend == "torch.flex_attention" and not policy.is_plan:
        return 0.0
    for r in policy.rejected:
        if r.backend == "torch.flex_attention" and r.kind == "slower" and r.compile_ms:
            return max(0.0, policy.cost_ms - (r.cost_ms - r.compile_ms))
    return 0.0


def _renting(run, bucket: FlexBucket, saving_ms: float):
    """run, counting into the bucket what each call forgoes: once the calls have given up
    a compile's worth, decide() charges the bucket's compile no more."""
    def renting(t, q, k, v, mask):
        bucket.forgone_ms += saving_ms
        return run(t, q, k, v, mask)
    return renting


def run_policy(policy, t: Tensors):
    """Runs a Policy, or the Prepared one the drop-in keeps."""
    p = policy if type(policy) is Prepared else Prepared(policy, t.structure)
    return p.run(t, t.q, t.k, t.v, t.mask)
