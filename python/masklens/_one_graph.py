"""One graph: a compiled model's masks proven and decided inside the graph, the decision
carried as data (masklens.torch.set_one_graph(True)).

The default compiled path (_compiled) decides outside the graph: one graph-break site per
forward, which Dynamo records once for each frame it had inlined, and which
torch.compile(fullgraph=True) refuses. Here the mask function's work is an opaque custom
op, masklens::graph_form: it scans the mask, decides the layers' call (as _compiled
does) and returns the decision as a code (a 0-d CPU tensor) beside what the FlexAttention
form needs: each row's first and last key, and the BlockMask's eight tensors, all of
shapes fixed by the mask's. The layers pick among sdpa with the mask, sdpa's is_causal
and flex_attention with torch.cond: every branch is in the graph, the code takes one at
run time, and no Python value changes with the mask (new padding, new documents: the
same graph, no break).

A branch costs compile time, so graphs hold the FlexAttention branch only once some
forward has decided FlexAttention: graph_forms, one setting for the process, is read
while tracing (Dynamo guards it); the op that decides FlexAttention for a graph without
the branch answers "dense" (torch's sdpa with the mask: what the model computes without
masklens) and adds the branch to graph_forms, and the next forward of every one-graph
model compiles once more, with it. torch's varlen_attn is
not a branch (its cumulative lengths change size with the sequences): a call decided
for it takes FlexAttention where that fits, else the dense mask.
"""
from __future__ import annotations

import collections
import os
import sys

import torch

from . import _block_mask, _compiled, _core, _plan, _registry, _run, _scan, _verdicts
from ._block_mask_storage import BLOCK_MASK_FIELDS, block_mask_shapes
from ._mask_mods import attends, bounds_mask_mod, span_bounds

# Whether torch.compile'd code decides in the graph (the drop-in and masklens.transformers'
# mask function read it while tracing: Dynamo guards it). MASKLENS_ONE_GRAPH=1: on at import.
enabled = os.environ.get("MASKLENS_ONE_GRAPH", "") == "1"


def set_one_graph(on: bool = True) -> None:
    """Whether torch.compile'd code proves masks and decides inside the graph (no graph
    break; fullgraph=True works) rather than outside it (transformers' mask function) or
    not at all (the drop-in, which runs torch's own call inside torch.compile). Set it
    before compiling; Dynamo guards it, so a compiled model compiles again after a switch
    (torch._dynamo.reset() where Dynamo had marked a frame to run eagerly)."""
    global enabled
    if type(on) is not bool:  # "false" is truthy: a switch is a bool or nothing
        raise TypeError(f"masklens.torch.set_one_graph takes True or False, got {type(on).__name__} {on!r}")
    enabled = on
    if on and "masklens._graph_definition" in sys.modules:
        # Model modules imported since masklens.transformers was: their factory names too.
        sys.modules["masklens._graph_definition"].rebind_imported()


DENSE, CAUSAL, FLEX = 0, 1, 2
BLOCK = 128  # the FlexAttention form's BlockMask block, q and k: a constant of the graph

# The forms compiled graphs hold (a bit per form), read while tracing: one setting for
# every graph of the process (a graph's own state is out of the op's reach).
DEFAULT_FORMS = (1 << DENSE) | (1 << CAUSAL)
graph_forms = DEFAULT_FORMS

# How often graph_form answered each form ("dense", "causal", "flex"): what the layers ran.
forms_taken = collections.Counter()


def _field_shapes(B, H, Q, K):
    """The shapes of the BlockMask's eight tensors over a mask of B x H slices at BLOCK;
    from sizes alone, as the fake op must give them."""
    return block_mask_shapes(B, H, -(-Q // BLOCK), -(-K // BLOCK))


def _flex_fits(policy) -> bool:
    """Whether the decided call could be FlexAttention (a backend computing BlockMask
    tiles): decided so, or passed over only as slower (not refused, defective or
    unavailable)."""
    return _registry.computes_flex_tiles(policy.call.backend) or any(
        _registry.computes_flex_tiles(r.backend) and r.kind == "slower" for r in policy.rejected)


def _host_bounds(allowed):
    """[B, H, Q, 2] int64: each row's first and last attended key (K and -1 for a row that
    attends nothing), read from a bool mask with torch ops."""
    K = allowed.shape[-1]
    u8 = allowed.view(torch.uint8)
    first = u8.argmax(-1)
    last = (K - 1) - u8.flip(-1).argmax(-1)
    some = allowed.any(-1)
    return torch.stack([torch.where(some, first, K), torch.where(some, last, -1)], -1)


def _read(mask, with_tiles: bool):
    """(verdict, bounds(), {name: tensor}) of the mask: a scan alone unless with_tiles; with
    them, the BlockMask's tensors at BLOCK and a function giving the rows' bounds: on a
    CUDA device with masklens._cuda both from one device read (the bounds are its spans),
    else from a host scan with tiles, the bounds read again from the mask (torch ops)."""
    threshold = _verdicts.DROPIN_MASKED_THRESHOLD
    if not with_tiles:
        return _scan.scan(mask, threshold), None, None
    if mask.device.type == "cuda" and _scan.has_device_tiles():
        spans = []
        verdict, arrays = _block_mask.device_scan_tiles(mask.detach(), (BLOCK, BLOCK), threshold,
                                                        classify_many_runs=False, spans_out=spans)
        db, dh = arrays["kv_num_blocks"].shape[:2]
        return verdict, lambda: span_bounds(spans[0](), db, dh), arrays
    verdict, tiles = _scan.scan_with_tiles(mask, (BLOCK, BLOCK), threshold)
    arrays, _ = _block_mask.tile_arrays(tiles, mask.device)
    return verdict, lambda: _host_bounds(attends(mask.detach(), threshold)), arrays


def _want_flex() -> None:
    global graph_forms
    graph_forms |= 1 << FLEX


# The op reads the mask to the host and decides there: never inside a CUDA graph capture
# (Inductor partitions a graph around an op so tagged, or does not capture it).
_HOST_WORK = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("masklens::graph_form", mutates_args=(), tags=_HOST_WORK)
def graph_form(mask: torch.Tensor, batch: int, heads: int, kv_heads: int, head_dim: int, head_dim_v: int,
               dtype: torch.dtype, training: bool, forms: int) -> list[torch.Tensor]:
    """[code, bounds, *BlockMask tensors]: the form of a compiled model's attention layers
    over `mask` ([B, H, Q, K], B or H of 1 for every batch or head), decided for the call
    (batch, heads, kv_heads, head_dim, head_dim_v, dtype, training) among the forms the
    graph holds (`forms`, a bit each); bounds [B, H, Q, 2] int64 and the eight int32
    tensors ([B, H, ...]) hold the FlexAttention form's BlockMask where the code is FLEX,
    and zeros otherwise."""
    B, H, Q, K = mask.shape
    flex_in_graph = bool(forms >> FLEX & 1)
    form, bounds, arrays = "dense", None, None
    try:
        verdict, bounds, arrays = _read(mask, flex_in_graph)
        if verdict is not None:
            structure = verdict.structure
            policy = _compiled.decide_for_layers(structure, mask, (heads, kv_heads, head_dim, head_dim_v), dtype,
                                                 training, batch=batch)
            form = layers_form(policy, structure, Q, K)
    except _core.MaskError:  # a mask masklens cannot read: torch's sdpa reads it as it is
        form = "dense"
    return answer(form, forms, (B, H, Q, K), mask.device, lambda: (bounds(), arrays))


def layers_form(policy, structure, q_len: int, k_len: int) -> str:
    """The branch of the layers' torch.cond that computes the decided call: "causal",
    "flex" where the call is FlexAttention's or varlen_attn's (or FlexAttention was passed
    over only as slower) and the bounds are exact (every row attends one interval: every
    exact structure), else "dense"."""
    form = _compiled.decided_form(policy, structure, q_len, k_len)
    if form in ("flex", "varlen"):
        form = "flex" if structure.kind != "arbitrary" and _flex_fits(policy) else "dense"
    return form


_CODES = {"dense": DENSE, "causal": CAUSAL, "flex": FLEX}


def answer(form, forms, shape, device, flex_tensors):
    """What the ops return for `form` over a mask of `shape` [B, H, Q, K] on `device`:
    [code, bounds [B, H, Q, 2] int64, the BlockMask's eight int32 tensors]. A "flex" for a
    graph without that branch (`forms`) asks for it and answers "dense". flex_tensors()
    gives (bounds, {name: tensor}), broadcastable to those shapes, only where "flex" is
    answered; otherwise the tensors are zeros (never read: the flex branch is not taken)."""
    B, H, Q, K = shape
    if form == "flex" and not forms >> FLEX & 1:
        _want_flex()
        form = "dense"
    shapes = _field_shapes(B, H, Q, K)
    if form == "flex":
        bounds, arrays = flex_tensors()
        # Copies, each of its own: the device read writes the eight tensors as views of one
        # allocation, and an op's outputs may share no storage.
        fields = [arrays[name] for name in BLOCK_MASK_FIELDS]
        out = [t.expand(s).clone(memory_format=torch.contiguous_format)
               for t, s in zip([bounds, *fields], [(B, H, Q, 2), *shapes])]
    else:  # zeros, not whatever memory held
        out = [torch.zeros((B, H, Q, 2), dtype=torch.int64, device=device)]
        out += [torch.zeros(s, dtype=torch.int32, device=device) for s in shapes]
    forms_taken[form] += 1
    return [torch.tensor(_CODES[form], dtype=torch.int64), *out]


# A graph whose layers do not read the op's answer (a call with dropout; Q != K before the
# FlexAttention branch is in the graph) must still run it: its answer is also a request
# for that branch. Without this, the graph's dead-code pass drops the op.
torch.fx.node.has_side_effect(torch.ops.masklens.graph_form.default)


@graph_form.register_fake
def _graph_form_fake(mask, batch, heads, kv_heads, head_dim, head_dim_v, dtype, training, forms):
    B, H, Q, K = mask.shape
    return [torch.empty((), dtype=torch.int64, device="cpu"), mask.new_empty((B, H, Q, 2), dtype=torch.int64),
            *(mask.new_empty(shape, dtype=torch.int32) for shape in _field_shapes(B, H, Q, K))]


@torch.library.custom_op("masklens::graph_operands", mutates_args=())
def graph_operands(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> list[torch.Tensor]:
    """q, k and v copied contiguous, as the torch.cond of the layers takes them. An op, not
    .contiguous(): Inductor (torch 2.11) compiles each branch for the strides its operands
    had when traced but may lay out a computed operand otherwise (seen on the CPU without
    grad: branch inputs failing their stride checks); an op's outputs have the layout its
    fake gives, which Inductor keeps."""
    return [t.clone(memory_format=torch.contiguous_format) for t in (query, key, value)]


@graph_operands.register_fake
def _graph_operands_fake(query, key, value):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in (query, key, value)]


def _graph_operands_backward(ctx, grads):
    return tuple(grads)


graph_operands.register_autograd(_graph_operands_backward)


class GraphMask:
    """What a compiled model's attention layers receive in one-graph mode: the op's decision
    (code), the FlexAttention form's tensors, and the dense mask or how to build it, made in
    the graph. A plain object: Dynamo traces its tensors and guards its Python values
    (expected, forms).

    The dense form's mask is `build_mask(*mask_operands)`: for graph_form's answer the
    operands are the mask itself (built before the op, which scans it); for a mask read from
    its definition (masklens._graph_definition) they are the definition's O(B·L) tensors and
    the build is transformers' own, so attend_graph builds the [B, 1, Q, K] mask inside the
    dense branch of its torch.cond, where it exists only while that branch runs. `mask`
    builds it where a call takes none of the forms (dropout, another scale), once."""

    def __init__(self, mask, code, bounds, arrays, expected, forms, *, shape=None, mask_operands=None,
                 build_mask=None):
        self._mask = mask
        self.code = code
        self.bounds = bounds
        self.arrays = arrays
        self.expected = expected  # (heads, kv_heads, head_dim, head_dim_v) the decision was for
        self.forms = forms
        self.shape = tuple(mask.shape) if shape is None else tuple(shape)
        self.mask_operands = (mask,) if mask_operands is None else tuple(mask_operands)
        self.build_mask = _as_is if build_mask is None else build_mask

    @property
    def mask(self):
        """The dense mask: built (in the graph, outside any branch) on first use where the
        GraphMask holds only its definition."""
        if self._mask is None:
            self._mask = self.build_mask(*self.mask_operands)
        return self._mask

    def __repr__(self):
        return f"<masklens GraphMask {self.shape}>"


def _as_is(mask):
    return mask


def graph_mask(mask, *, heads, kv_heads, head_dim, head_dim_v=None, dtype=torch.float32, training=None, batch=None):
    """In a traced graph: a GraphMask over `mask` (a dense [B or 1, H or 1, Q, K] mask), its
    form decided at run time by masklens::graph_form for the layers' call (`batch`: the
    mask's by default, `heads`, `kv_heads`, `head_dim`, `dtype`; training: grad mode by
    default). A mask masklens does not decide for (not 4-D, a dtype it does not decide, a
    device other than the CPU or CUDA) comes back as it is."""
    if (not isinstance(mask, torch.Tensor) or mask.dim() != 4 or dtype not in _run.DTYPES or mask.requires_grad
            or mask.device.type not in ("cpu", "cuda")):
        return mask
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    training = torch.is_grad_enabled() if training is None else training
    forms = graph_forms
    batch = mask.shape[0] if batch is None else batch
    code, bounds, *arrays = torch.ops.masklens.graph_form(mask, batch, heads, kv_heads, head_dim, head_dim_v, dtype,
                                                          training, forms)
    return GraphMask(mask, code, bounds, arrays, (heads, kv_heads, head_dim, head_dim_v), forms)


def constant_scale(scale, defaults):
    """`scale` as a constant that torch.cond's branches may close over, or NotImplemented.
    torch.cond takes no symbolic float, and Dynamo makes floats symbolic (a module's float
    attribute under torch.compile(dynamic=True); a float argument that changed between
    calls), with no way to tell from inside the trace. None stays None; a scale equal to
    one of `defaults` (Python floats: the comparison is guarded) is that constant; any
    other might be symbolic: NotImplemented, and the caller runs torch's own call."""
    if scale is None:
        return None
    for default in defaults:
        if scale == default:
            return default
    return NotImplemented


def attend_graph(gm, query, key, value, sdpa, dropout_p=0.0, scale=None):
    """A GraphMask's attention in the graph: torch.cond over the forms it holds, each branch
    giving [B, Q, H, Dv] contiguous (the layout transformers' layers return).
    sdpa(q, k, v, mask) is the caller's sdpa call without dropout (the dense form),
    sdpa(q, k, v, None) its is_causal one; `scale` and any float sdpa closes over must be
    constants (constant_scale). None where the call is not the one decided for
    (_compiled.fits_decided_call, another batch): the caller then runs sdpa with gm.mask."""
    B, H, Q, _ = query.shape
    Hk, K = key.shape[1], key.shape[2]
    if not _compiled.fits_decided_call(gm, gm.expected, query, key, value, dropout_p, H % Hk == 0):
        return None
    if gm.shape[0] not in (1, B):
        return None
    flex_kwargs = {"scale": scale, **({"enable_gqa": True} if H != Hk else {})}

    n = len(gm.mask_operands)  # the dense mask's operands, then bounds and the BlockMask's tensors

    def dense(q, k, v, *rest):
        # The mask built here where it is a definition's: it exists while this branch runs.
        return sdpa(q, k, v, gm.build_mask(*rest[:n]))

    def causal(q, k, v, *rest):
        return sdpa(q, k, v, None)

    def flex(q, k, v, *rest):
        from torch.nn.attention.flex_attention import flex_attention
        bounds, *arrays = rest[n:]
        block_mask = _block_mask.from_arrays(dict(zip(BLOCK_MASK_FIELDS, arrays)), (q.shape[2], k.shape[2]),
                                             (BLOCK, BLOCK), bounds_mask_mod(bounds))
        return flex_attention(q, k, v, block_mask=block_mask, **flex_kwargs).transpose(1, 2).contiguous()

    def contiguous_gradients(branch):
        # torch.cond's backward is a cond too, whose branches must give gradients of one
        # layout: each kernel's backward (and transformers' repeat_kv) lays out its own.
        def run(q, k, v, *rest):
            return branch(*(_plan.ContiguousGrad.apply(t) for t in (q, k, v)), *rest)
        return run
    dense, causal, flex = contiguous_gradients(dense), contiguous_gradients(causal), contiguous_gradients(flex)

    operands = (*torch.ops.masklens.graph_operands(query, key, value), *gm.mask_operands, gm.bounds, *gm.arrays)
    not_causal = dense
    if gm.forms >> FLEX & 1:
        def not_causal(*ops):
            return torch.cond(gm.code == FLEX, flex, dense, ops)
    if Q != K:  # top-left is_causal is the mask's rule only where Q = K (the op decides it only there)
        return not_causal(*operands)
    return torch.cond(gm.code == CAUSAL, causal, not_causal, operands)


_block_mask.block_mask_takes_q_side()  # worked out here, not while tracing a graph
