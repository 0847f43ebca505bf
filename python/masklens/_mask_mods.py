"""The mask semantics FlexAttention reads: which keys a mask lets attend (attends), and
the mask_mods of an exact structure's rule (from its fields), of a read's row bounds, or of
a kept mask (a lookup into it). BlockMasks (masklens._block_mask) carry one of these; the
drop-in's flex, CP and the one-graph form build theirs here too.
"""
from __future__ import annotations

import numpy as np
import torch

from . import _scan


def attends(mask, masked_threshold: float = -1000.0):
    """The keys a mask lets attend, as a bool tensor (an additive mask's above the threshold)."""
    return mask if mask.dtype == torch.bool else (mask > masked_threshold if mask.is_floating_point() else mask != 0)


def mask_mod_for(structure, device, mask=None):
    """FlexAttention's mask_mod: the structure's rule from its fields, or (for a kept
    mask) a lookup into the dense mask."""
    if mask is not None:
        m = attends(mask)
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
    # `+ 0`), the graph a hand-written mask_mod of the same rule gives. The window, chunk
    # and prefix are a model's constants; the bottom-right offset K - Q changes with the
    # lengths (prefill over a cache), so it is a 0-d tensor: a compiled flex of dynamic
    # lengths then serves every offset in its bucket without compiling again.
    offset = _scan.to_device(np.asarray([d], dtype=np.int64), device).view(()) if d else None
    blocks = None
    if kind == "causal_blocks":
        table = np.full((max(K, Q + d, 1),), -1, dtype=np.int32)
        for n, (start, end) in enumerate(s.blocks):
            table[start:end] = n
        blocks = _scan.to_device(table, device)
    docs = None
    if s.segments is not None:
        docs = document_table(s.segments, Q, device)
    kv = _scan.to_device(np.asarray(s.kv_valid, dtype=np.int64), device) if s.kv_valid is not None else None
    qv = _scan.to_device(np.asarray(s.q_valid, dtype=np.int64), device) if s.q_valid is not None else None
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
        p = qi + offset if offset is not None else qi
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
    return bounds_mask_mod(span_bounds(spans, distinct_batch, distinct_heads))


def span_bounds(spans, distinct_batch: int, distinct_heads: int):
    """[distinct_batch, distinct_heads, Q, 2] int64: the first and last key of each row, a
    copy of the RowSpans a device read left ([distinct_batch * distinct_heads * Q, 4])."""
    Q = spans.shape[0] // (distinct_batch * distinct_heads)
    return spans[:, :2].contiguous().view(distinct_batch, distinct_heads, Q, 2)


def bounds_mask_mod(table):
    """FlexAttention's mask_mod of row bounds: table [B', H', Q, 2] (first, last key of
    each row, first past last for a row that attends nothing), B' or H' of 1 broadcast:
    key kv attends row q iff first <= kv <= last."""
    distinct_batch, distinct_heads = table.shape[0] > 1, table.shape[1] > 1

    def mask_mod(b, h, qi, ki):
        # Past Q (a ragged last tile) the row is clamped; flex masks those positions itself.
        # The table's own size bounds it: no guard on Q in a compiled flex.
        bb, hh, qc = b if distinct_batch else 0, h if distinct_heads else 0, qi.clamp(max=table.shape[2] - 1)
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
    n = len(segments) * Q
    # Batch b's ids are offset by the starts of the batches before it: the same within
    # the batch, which is all that a comparison inside one batch sees.
    starts = [b * Q + start for b, seg in enumerate(segments) for start in seg[1:-1]]
    if not starts:
        return torch.zeros((len(segments), Q), dtype=torch.int32, device=device)
    wide = n >= 2**31
    bounds = _scan.to_device(np.asarray(starts, dtype=np.int64 if wide else np.int32), device)
    positions = torch.arange(n, dtype=torch.int64 if wide else torch.int32, device=bounds.device)
    return torch.bucketize(positions, bounds, out_int32=True, right=True).view(len(segments), Q)
