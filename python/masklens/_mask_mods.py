"""The mask semantics FlexAttention reads: which keys a mask lets attend (attends), and
the mask_mods of an exact structure's rule (from its fields), of a read's row bounds, or of
a kept mask (a lookup into it). BlockMasks (masklens._block_mask) carry one of these; the
drop-in's flex, CP and the one-graph form build theirs here too.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from . import _core, _scan


def attends(mask, masked_threshold: float = -1000.0):
    """The keys a mask lets attend, as a bool tensor (an additive mask's above the threshold)."""
    return mask if mask.dtype == torch.bool else (mask > masked_threshold if mask.is_floating_point() else mask != 0)


def mask_mod_for(structure, device, mask=None):
    """FlexAttention's mask_mod: the structure's rule (rule_source), or (for a kept mask) a
    lookup into the dense mask."""
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
    source, names = rule_source(structure)
    tables = _rule_tables(structure, names, device)
    return _rule_factory(source, names)(*(tables[n] for n in names))


def rule_source(structure):
    """The structure's rule as mask_mod source (masklens' one rule, mask_rule.hpp) and the
    names of the tables it reads: (source, names). The source is what a compiled flex is
    specialised on besides the shapes and the tables' values (the window and chunk are
    written in it; the offset, prefix, documents, blocks and padding are tensors)."""
    source, names = _core.mask_mod_source(structure)
    return source, tuple(names)


def _rule_factory(source: str, names: tuple):
    """A function of the tables returning the mask_mod, compiled once per source: every
    mask_mod of one rule shares one code object, with the tables as its closure (what
    Dynamo guards on and lifts as inputs), as a hand-written closure would."""
    key = (source, names)
    factory = _factories.get(key)
    if factory is None:
        body = "".join("    " + line + "\n" for line in source.splitlines())
        text = f"def make({', '.join(names)}):\n{body}    return mask_mod\n"
        scope = {}
        # A file name of its own per source: what names a code object to torch's caches
        # (file, line, name) then differs between two rules, as between two hand-written mask_mods.
        name = "<masklens mask rule " + hashlib.sha1(text.encode()).hexdigest()[:16] + ">"
        exec(compile(text, name, "exec"), scope)  # noqa: S102 (masklens' own source)
        factory = _factories.setdefault(key, scope["make"])
    return factory


# One factory per rule source: a handful of sources per model (its kinds and modifiers).
_factories: dict = {}


def _rule_tables(structure, names, device) -> dict:
    """The tensors a rule's source reads, by name. A table given once for every batch is one
    entry (the source reads it at batch 0)."""
    s = structure
    out = {}
    scalars = [(n, v) for n, v in (("offset", s.k_len - s.q_len), ("prefix", s.prefix)) if n in names]
    if scalars:  # 0-d tensors, one upload: a compiled flex serves every offset and prefix of its bucket
        values = _scan.to_device(np.asarray([v for _, v in scalars], dtype=np.int64), device)
        for i, (n, _) in enumerate(scalars):
            out[n] = values[i]
    if "block_id" in names:  # every key and every row's key position; -1 off the blocks
        table = np.full((max(_core.block_table_length(s), 1),), -1, dtype=np.int32)
        for n, (start, end) in enumerate(s.blocks):
            table[start:end] = n
        out["block_id"] = _scan.to_device(table, device)
    if "document_id" in names:
        out["document_id"] = document_table(s.segments, s.q_len, device)
    for prefix, ranges in (("kv", s.kv_valid), ("q", s.q_valid)):
        if prefix + "_start" in names:
            bounds = _scan.to_device(np.asarray(ranges, dtype=np.int64).reshape(-1, 2), device)
            out[prefix + "_start"], out[prefix + "_end"] = bounds[:, 0], bounds[:, 1]
    return out


def rule_reads_tables(structure) -> bool:
    """Whether mask_mod_for's rule of an exact structure reads device tables (built or
    uploaded when the mask_mod is made): documents, VLM blocks, padding."""
    return any(n not in ("offset", "prefix") for n in rule_source(structure)[1])


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
