"""Compiled FlexAttention for lengths that change.

A compile costs seconds (0.4 to 17.7 s each on an H200, issue 31), a step milliseconds.
So flex is compiled with dynamic lengths, once per shape bucket: the lengths up to
128 * 2^k share one compiled function of their own (its own code object, so its own
Dynamo cache and recompile limit), and within it the sequence dims are symbolic (a new
length reuses the kernel). What stays static and keys the bucket: the device, dtype,
batch, heads, key heads, head dims, the structure's rule (kind, window, chunk, prefix,
alignment, which tables the mask_mod reads) and the tile size. decide() is told what a
call's bucket would cost to compile (flex_compile_charge): 0 where it is warm, the
compile's estimate where it is cold, so a cold flex is chosen only where nothing
compile-free is cheaper than the compile (docs/policy.md). Forgoing a flex that would
win warm is counted: once the calls that ran without it have given up as much as the
compile costs, the bucket's compile is charged no more (renting until buying pays).

run_flex is the runner masklens._run looks up for "torch.flex_attention"; its BlockMask
comes from masklens._block_mask. flex_in_bucket runs other callers' flex (context
parallelism's) the same way, in buckets tagged with the caller: they neither share nor
warm the drop-in's, and decide() never charges for them; where a bucket would run
uncompiled it raises FlexRanEager, the caller choosing its fallback.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _block_mask, _core, _registry
from ._block_mask_storage import BLOCK_MASK_FIELDS
from ._mask_mods import mask_mod_for, rule_source


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
    return float(os.environ.get("MASKLENS_FLEX_COMPILE_MS", _core.FLEX_COLD_COMPILE_MS))


def length_bucket(n: int) -> int:
    """The smallest 128 * 2^k holding n: the lengths one compiled flex serves."""
    return 128 << max(0, (max(n, 1) - 1).bit_length() - 7)


def rule_signature(structure, reads_mask: bool):
    """What a mask_mod's source reads of the structure (mask_mod_for): what a compiled flex
    is specialised on besides the shapes. An exact structure's is its rule's source."""
    s = structure
    if reads_mask:
        tf = s.tile_fractions
        return ("mask", s.batch > 1, s.heads > 1, (tf.block_q, tf.block_k) if tf is not None else (128, 128))
    return (rule_source(s), (128, 128))


def device_key(device: torch.device):
    """Where a bucket's kernels run: the device, and on the CPU the thread count. Inductor's
    CPU flex kernel sizes its per-thread buffers for the threads of its compile and indexes
    them by the thread that runs, and neither Dynamo's guards nor Inductor's cache key hold
    that count (pytorch/pytorch#167463, fixed after torch 2.11 by #184444): a kernel
    compiled on one thread and run on two writes past its buffers. So a CPU bucket is
    specific to the thread count, and compiles with it pinned in Inductor's config
    (_pinned_cpu_threads), where the cache key sees it."""
    return (device.type, device.index if device.type != "cpu" else torch.get_num_threads())


def flex_bucket_key(structure, query, key, value, reads_mask=None):
    """The bucket a flex call on these tensors (or shapes) compiles in."""
    if reads_mask is None:  # as decide() builds FlexArgs: only an arbitrary mask is read
        reads_mask = structure.kind == "arbitrary"
    B, H, Q, D = query.shape
    return (*device_key(query.device), query.dtype, B, H, key.shape[1], D, value.shape[-1],
            rule_signature(structure, reads_mask), length_bucket(max(Q, key.shape[2])))


def tagged_bucket_key(tag: str, query, key, value, block_size, rule=None):
    """The bucket of a flex call made outside the drop-in (`tag` names the caller: "cp" for
    context parallelism): the tag first, so that no key of flex_bucket_key (the drop-in's,
    which decide()'s compile charge reads) is ever one of these; then what flex_bucket_key
    keeps static, with the tile size and `rule` (hashable: what the caller's mask_mod
    branches on, as rule_signature gives it; None where unknown, and then a new rule
    compiles again within the bucket, under its recompile limit)."""
    B, H, Q, D = query.shape
    return (tag, *device_key(query.device), query.dtype, B, H, key.shape[1], D, value.shape[-1],
            rule, tuple(block_size), length_bucket(max(Q, key.shape[2])))


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
    if env is not None and not (_registry.flex_tile_families() & set(env.available)):
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


def _run_in_bucket(bucket: FlexBucket, q, k, v, block_mask, scale, enable_gqa):
    """_compiled_in_bucket, or FlexRanEager where the bucket cannot run compiled: Dynamo
    ran it uncompiled now (the bucket is then broken) or on an earlier call."""
    if bucket.broken:
        raise FlexRanEager(f"masklens: the compiled FlexAttention of bucket {bucket.key} ran uncompiled before")
    try:
        return _compiled_in_bucket(bucket, q, k, v, block_mask, scale, enable_gqa)
    except FlexRanEager:
        bucket.broken = True
        raise


def flex_in_bucket(query, key, value, block_mask, *, tag: str, rule=None, scale=None, enable_gqa=False):
    """flex_attention on `block_mask`, compiled in the bucket of `tag` and these shapes
    (tagged_bucket_key): as the drop-in's calls, one compiled function a bucket with
    dynamic lengths (a new length in it compiles nothing), in one grad form; but in
    buckets of their own, so that the caller neither warms nor shares the drop-in's nor
    enters decide()'s compile charge. Never flex's unfused path: where Dynamo runs the
    bucket uncompiled (its recompile limit, a fallback to eager) it raises FlexRanEager,
    then and on every later call in the bucket; the caller picks its own fallback."""
    bucket = flex_bucket(tagged_bucket_key(tag, query, key, value, block_mask.BLOCK_SIZE, rule))
    return _run_in_bucket(bucket, query, key, value, block_mask, scale, enable_gqa)


def _call_in_form(training_form, fn, q, k, v, block_mask, scale, enable_gqa):
    with torch.enable_grad() if training_form else torch.no_grad(), _pinned_cpu_threads(q.device):
        return fn(q, k, v, block_mask, scale, enable_gqa)


class _pinned_cpu_threads:
    """On the CPU, Inductor's thread count fixed at this process's for a compile made in
    the block: the count then enters Inductor's cache key (its config), so no cached
    kernel sized for other threads is loaded (device_key says why). Elsewhere nothing. A
    plain set and restore: config.patch costs about 20 us a call."""

    __slots__ = ("config", "before")

    def __init__(self, device: torch.device):
        self.config = None
        if device.type == "cpu":
            from torch._inductor import config as inductor_config
            self.config = inductor_config.cpp

    def __enter__(self):
        if self.config is not None:
            self.before = self.config.threads
            self.config.threads = torch.get_num_threads()

    def __exit__(self, *exc):
        if self.config is not None:
            self.config.threads = self.before


def _dense_fallback(t, q, k, v):
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


def _flex_block_mask_for(t, a, q, k):
    B, Q, K = q.shape[0], q.shape[2], k.shape[2]
    key = ("flex", q.device, B, a.block_q, a.block_k, a.mask_mod_reads_mask)
    block_mask = t.derived.get(key)
    if block_mask is None:  # memoised with the verdict (the entry's derived values)
        from torch.nn.attention.flex_attention import create_block_mask
        block_mask = _block_mask.flex_block_mask(t.structure, t.mask, a, q.device)
        if block_mask is None:
            mask_mod = mask_mod_for(t.structure, q.device, t.mask if a.mask_mod_reads_mask else None)
            # A kept mask may differ per head: its block mask then spans the mask's heads.
            H = t.mask.shape[1] if a.mask_mod_reads_mask and t.mask.shape[1] > 1 else None
            block_mask = create_block_mask(mask_mod, B, H, Q, K, device=q.device, BLOCK_SIZE=(a.block_q, a.block_k))
        t.derived[key] = block_mask
    return block_mask


def _call_bucket(t, a, q, k, v) -> FlexBucket:
    """The call's bucket, memoised with the verdict per shape: a cached call reads no
    property of the structure (each read converts a list or a string)."""
    memo = ("flex bucket", device_key(q.device), q.dtype, q.shape, k.shape, v.shape[-1], a.mask_mod_reads_mask)
    bucket = t.derived.get(memo)
    if bucket is None or _flex_buckets.get(bucket.key) is not bucket:  # new, or the buckets were forgotten
        bucket = t.derived[memo] = flex_bucket(flex_bucket_key(t.structure, q, k, v, a.mask_mod_reads_mask))
    return bucket


def run_flex(call, t, q, k, v, compiled=True, args=None):
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
        return _run_in_bucket(bucket, q, k, v, block_mask, t.scale, gqa)
    except FlexRanEager:
        _flex_unusable(bucket, "Dynamo ran it uncompiled: its recompile limit, or a fallback to eager")
    except dynamo.exc.TorchDynamoException as e:
        if bucket.warm:
            raise
        _flex_unusable(bucket, f"its compile failed: {type(e).__name__}")
    return _dense_fallback(t, q, k, v)


def forgone_saving_ms(policy) -> float:
    """What each call of `policy` gives up by not running a flex that was passed over only
    for its cold compile: the chosen call's estimate less flex's without the compile (0
    where flex would not win warm either)."""
    if not policy.is_plan and _registry.computes_flex_tiles(policy.backend):
        return 0.0
    for r in policy.rejected:
        if _registry.computes_flex_tiles(r.backend) and r.kind == "slower" and r.compile_ms:
            return max(0.0, policy.cost_ms - (r.cost_ms - r.compile_ms))
    return 0.0


def renting(run, bucket: FlexBucket, saving_ms: float, prepared):
    """run, counting into the bucket what each call forgoes: once the calls have given up
    a compile's worth, decide() charges the bucket's compile no more, and `prepared` (the
    decision this run belongs to) is marked stale: the drop-in decides its mask and call
    again, so a mask tensor reused every step moves to flex too."""
    def renting(t, q, k, v, mask):
        bucket.forgone_ms += saving_ms
        if bucket.compile_charge() == 0.0:
            prepared.stale = True
        return run(t, q, k, v, mask)
    return renting
