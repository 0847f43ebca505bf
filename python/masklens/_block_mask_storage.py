"""The storage of torch BlockMask's eight int32 tensors: their order, shapes and one
allocation holding all eight (16-byte aligned), which masklens' writers (the device read,
a structure's ranges, a tile summary's states) fill in place. Allocation only: nothing
here reads a mask or calls masklens._cuda.
"""
from __future__ import annotations

import functools
import math

import torch


# torch BlockMask's eight tensors, in the order masklens._cuda.scan_runs takes them.
BLOCK_MASK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def block_mask_shapes(batch, heads, nq, nk):
    """The shapes of torch BlockMask's eight tensors (BLOCK_MASK_FIELDS order) over a grid
    of nq x nk tiles in batch x heads slices (sizes may be symbolic)."""
    kv, q = ((batch, heads, nq), (batch, heads, nq, nk)), ((batch, heads, nk), (batch, heads, nk, nq))
    return [*kv, *kv, *q, *q]


@functools.lru_cache(maxsize=64)
def _block_mask_layout(distinct_batch, distinct_heads, nq, nk, extra_bytes):
    """_block_mask_storage's layout of a grid, worked out once: (fields [(name, shape)],
    their sizes, the parts' int32 sizes (padded to 16 bytes; the extra part last), the
    parts' byte offsets)."""
    fields = tuple(zip(BLOCK_MASK_FIELDS, block_mask_shapes(distinct_batch, distinct_heads, nq, nk)))
    sizes = tuple(math.prod(shape) for _, shape in fields)
    padded = tuple(-(-n // 4) * 4 for n in sizes)
    extra = -(-extra_bytes // 16) * 4  # int32 elements
    parts = padded + ((extra,) if extra else ())
    offsets = tuple(4 * sum(parts[:k]) for k in range(len(parts)))
    return fields, sizes, parts, offsets


def _block_mask_storage(device, distinct_batch, distinct_heads, nq, nk, extra_bytes=0):
    """The storage of torch BlockMask's eight int32 tensors of a grid: one allocation (one
    block of the caching allocator instead of eight), each field 16-byte aligned in it.
    ([address], [bytes], views) in BLOCK_MASK_FIELDS order, the addresses by arithmetic;
    views() makes the {name: tensor} views. Torch ops cost microseconds each on the host
    (the views, 40-60 us on an H200 host): a caller that launches kernels into the
    storage makes them while the device works. extra_bytes > 0: a ninth address, of that
    many bytes after the fields (16-byte aligned; kept with the tensors, in no view)."""
    fields, sizes, parts, offsets = _block_mask_layout(distinct_batch, distinct_heads, nq, nk, extra_bytes)
    block = torch.empty(sum(parts), dtype=torch.int32, device=device)
    base = block.data_ptr()
    pointers = [base + at for at in offsets]

    def views():
        # One split (a single op), then a view per field (the extra part has none).
        return {name: (part if n == p else part[:n]).view(shape)
                for (name, shape), part, n, p in zip(fields, block.split(parts), sizes, parts)}
    return pointers, [4 * n for n in sizes], views


def _block_mask_tensors(device, distinct_batch, distinct_heads, nq, nk):
    """torch BlockMask's eight int32 tensors of a grid, empty, as views of one allocation
    (_block_mask_storage). ({name: tensor}, [address], [bytes]) in BLOCK_MASK_FIELDS order."""
    pointers, nbytes, views = _block_mask_storage(device, distinct_batch, distinct_heads, nq, nk)
    return views(), pointers, nbytes
