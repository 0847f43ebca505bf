"""Running a Policy with torch: one typed call, or a plan of them, on [B, H, Q, D]
tensors. Every path is differentiable; rows that attend to nothing are zeroed by the
caller (masklens.torch) from the verdict, whatever the kernel wrote there.

Each backend masklens.torch runs has one runner, looked up by the backend's name in
RUNNERS (register_runner adds one): make(call) -> run(t, q, k, v, mask).
prepare() reads a Policy once into a Prepared runner: the drop-in keeps one per (mask,
call), so a cached call reads no property of the C++ objects (each read converts a
string or copies a struct) and runs only the torch calls themselves."""
from __future__ import annotations

import functools
import importlib
import inspect as _pyinspect

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from . import _core, _env, _flex, _plan, _scan


# The SDPA kernels each torch.sdpa backend selects: how _sdpa_runner runs it (part of the
# runners' table, RUNNERS below, so named by backend as it is).
SDPA_KERNELS = {
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
SDPA_KERNEL_FLAGS = {name: tuple(backend in kernels for backend, _, _ in _SWITCHES)
                     for name, kernels in SDPA_KERNELS.items()}


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
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def dtype_name(dtype) -> str:
    """A torch dtype as AttentionCall spells it ("bfloat16"); any other by torch's own name
    ("float64"), which AttentionCall refuses naming it. The one spelling of every
    AttentionCall made from torch tensors (the drop-in's here, masklens.inspect's)."""
    return DTYPES.get(dtype) or str(dtype).replace("torch.", "")


def attention_call(dtype, query_shape, kv_heads=None, k_len=None, head_dim_v=None, training=False, dropout_p=0.0,
                   mask_dtype=None):
    """The AttentionCall decide() reads, the one place one is made from tensors: the
    query's dtype and [B, H, Q, D] shape, the key's heads and length, the value's head dim,
    training, dropout, the mask's dtype, and torch's deterministic setting (None: the
    AttentionCall's default, where that tensor is not given)."""
    call = _core.AttentionCall()
    call.dtype = dtype_name(dtype)
    call.batch, call.heads, call.q_len, call.head_dim = query_shape
    if head_dim_v is not None:
        call.head_dim_v = head_dim_v
    if kv_heads is not None:
        call.kv_heads = kv_heads
    if k_len is not None:
        call.k_len = k_len
    call.training = training
    call.dropout = float(dropout_p)
    call.deterministic = torch.are_deterministic_algorithms_enabled()
    if mask_dtype is not None:
        call.mask_dtype = _scan.element_name(mask_dtype)
    return call


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
    flags = SDPA_KERNEL_FLAGS[call.backend]
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


def broadcast_sequences(sequences, structure, batch):
    """A structure of batch 1 describes every batch of a [1, ...] mask: repeat its
    sequences for each batch of the call."""
    if structure.batch == batch:
        return list(sequences)
    return [(b,) + tuple(s[1:]) for b in range(batch) for s in sequences]


@functools.lru_cache(maxsize=None)
def varlen_params():
    from torch.nn.attention.varlen import varlen_attn
    return varlen_attn, frozenset(_pyinspect.signature(varlen_attn).parameters)


def _varlen_layout(a, t: Tensors, q, k):
    key = ("varlen", q.device, q.shape[0])
    layout = t.derived.get(key)
    if layout is None:
        seqs = broadcast_sequences(a.sequences, t.structure, q.shape[0])
        qb, qi = _pack_index(seqs, 1, q.device, q.shape[0])
        kb, ki = _pack_index(seqs, 3, q.device, q.shape[0])
        cu_q = [0]
        cu_k = [0]
        for s in seqs:
            cu_q.append(cu_q[-1] + s[2] - s[1])
            cu_k.append(cu_k[-1] + s[4] - s[3])
        max_q = max((s[2] - s[1] for s in seqs), default=0)
        max_k = max((s[4] - s[3] for s in seqs), default=0)
        B = q.shape[0]
        layout = (qb, qi, kb, ki, torch.tensor(cu_q, dtype=torch.int32, device=q.device),
                  torch.tensor(cu_k, dtype=torch.int32, device=q.device), max_q, max_k,
                  _in_order(seqs, 1, B, q.shape[2]), _in_order(seqs, 3, B, k.shape[2]))
        t.derived[key] = layout
    return layout


def _in_order(sequences, side: int, batch: int, length: int):
    """How the packed rows (side 1: queries, 3: keys) sit in [B, L]: (lo, hi) where they
    are rows lo..hi-1 of the one batch in order (packing is a view), "every" where they are
    every row of every batch in order (a reshape), None otherwise (a gather)."""
    if batch == 1:
        lo = at = None
        for s in sequences:
            if s[0] != 0 or (at is not None and s[side] != at):
                return None
            lo, at = (s[side] if lo is None else lo), s[side + 1]
        return None if lo is None else (lo, at)
    at_b, at = 0, 0
    for s in sequences:
        b, lo, hi = s[0], s[side], s[side + 1]
        if b == at_b + 1 and at == length:
            at_b, at = b, 0
        if b != at_b or lo != at:
            return None
        at = hi
    return "every" if at_b == batch - 1 and at == length else None


def _every_row(order, length: int) -> bool:
    return order == "every" or order == (0, length)


def _packed(x, b, i, order):
    """x [B, L, H, D]'s rows (b, i) as [total, H, D]: a view of one batch's rows in order, a
    reshape of every row in order (varlen kernels take any row and head stride), a gather
    otherwise."""
    if x.stride(-1) != 1:  # a kernel's rows need a contiguous last dim: a contiguous gather
        return x[b, i].contiguous()
    if order == "every":
        return x.reshape(-1, *x.shape[2:])
    if order is not None:
        return x[0, order[0]:order[1]]
    return x[b, i]


def run_varlen(call, t: Tensors, q, k, v, attend=None, args=None, kernel=None):
    """Packs the sequences into [total, heads, dim], runs the varlen kernel, unpacks into a
    zero [B, H, Q, Dv] output. `kernel(qp, kp, vp, cu_q, cu_k, max_q, max_k, a, t)` is the
    backend's (its runner passes it); `attend` replaces it (tests run the packing on the
    CPU with it). GQA goes in as it is: K and V keep their fewer heads, which every
    varlen kernel here takes (flash's varlen forward and backward, behind torch's
    varlen_attn as behind flash-attn 2 and 3, need only heads % kv_heads == 0)."""
    a = args if args is not None else call.args  # a prepared call passes them: read once
    qb, qi, kb, ki, cu_q, cu_k, max_q, max_k, q_order, k_order = _varlen_layout(a, t, q, k)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, L, H, D]
    qp = _packed(qt, qb, qi, q_order)
    kp, vp = _packed(kt, kb, ki, k_order), _packed(vt, kb, ki, k_order)
    if attend is not None:
        outp = attend(qp, kp, vp, cu_q, cu_k, max_q, max_k, causal=a.causal, window=(a.window_left, a.window_right),
                      scale=t.scale)
    elif kernel is not None:
        outp = kernel(qp, kp, vp, cu_q, cu_k, max_q, max_k, a, t)
    else:
        raise RuntimeError(f"masklens: no varlen kernel given for {call.backend}")
    if _every_row(q_order, q.shape[2]):  # every row computed, in order: the output as it is
        return outp.reshape(q.shape[0], q.shape[2], q.shape[1], v.shape[-1]).transpose(1, 2)
    out = qt.new_zeros(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])
    out = out.index_put((qb, qi), outp)
    return out.transpose(1, 2)


def _torch_varlen_kernel(qp, kp, vp, cu_q, cu_k, max_q, max_k, a, t):
    """torch's varlen_attn on packed rows, with the window and scale where this torch's
    varlen_attn takes them (refused where it would run without them)."""
    varlen_attn, params = varlen_params()
    if t.scale is not None and "scale" not in params:
        raise RuntimeError("masklens: this torch's varlen_attn takes no scale; a scale was given")
    kwargs = {"scale": t.scale} if "scale" in params else {}
    window = (a.window_left, a.window_right)
    if "window_size" in params:
        kwargs["window_size"] = window
    elif a.window_left >= 0 or a.causal:
        raise RuntimeError("masklens: this torch's varlen_attn has no window_size argument")
    return varlen_attn(qp, kp, vp, cu_q, cu_k, max_q, max_k, **kwargs)


def _flash_attn_varlen_kernel(module: str, takes_dropout: bool):
    """flash-attn's flash_attn_varlen_func from `module` (flash_attn: version 2, with
    dropout; flash_attn_interface: version 3, without) on packed rows."""
    def kernel(qp, kp, vp, cu_q, cu_k, max_q, max_k, a, t):
        flash_attn_varlen_func = importlib.import_module(module).flash_attn_varlen_func
        kwargs = {"causal": a.causal, "softmax_scale": t.scale}
        if a.window_left >= 0 or a.window_right >= 0:
            kwargs["window_size"] = (a.window_left, a.window_right)
        if takes_dropout:
            kwargs["dropout_p"] = t.dropout_p
        outp = flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, max_q, max_k, **kwargs)
        return outp[0] if isinstance(outp, tuple) else outp
    return kernel


def run_flash_attn(call, t: Tensors, q, k, v, args=None):
    """flash-attn's fixed-length kernel: [B, L, H, D] in and out, GQA native."""
    a = args if args is not None else call.args
    from flash_attn import flash_attn_func
    kwargs = {"causal": a.causal, "softmax_scale": t.scale, "dropout_p": t.dropout_p}
    if a.window_left >= 0:
        kwargs["window_size"] = (a.window_left, 0)
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
    return out.transpose(1, 2)


def _varlen_runner(kernel):
    """make(call) for a varlen backend whose packed rows `kernel` runs."""
    def make(call):
        a = call.args
        return lambda t, q, k, v, mask: run_varlen(call, t, q, k, v, args=a, kernel=kernel)
    return make


def _flex_runner(call):
    a = call.args
    return lambda t, q, k, v, mask: _flex.run_flex(call, t, q, k, v, args=a)


def _flash_attn_runner(call):
    a = call.args
    return lambda t, q, k, v, mask: run_flash_attn(call, t, q, k, v, args=a)


# The runner of each backend masklens.torch runs, by the backend's name (the registry's,
# as Call.backend gives it): make(call) -> run(t, q, k, v, mask), the call's arguments
# read once. The one place the runtime names backends (with SDPA_KERNELS, the SDPA
# runner's own table): everything else reads the registry's rows (_registry). A backend
# decide() may choose that has no runner here is one the drop-in does not run
# (_env.RUNNABLE keeps its family out of the drop-in's environment); every backend of a
# family that comes with torch has one (tests/python/test_registry_facts.py).
RUNNERS = {name: _sdpa_runner for name in SDPA_KERNELS}
RUNNERS.update({"torch.varlen_attn": _varlen_runner(_torch_varlen_kernel),
                "flash_attn.varlen": _varlen_runner(_flash_attn_varlen_kernel("flash_attn", takes_dropout=True)),
                "flash_attn3.varlen": _varlen_runner(_flash_attn_varlen_kernel("flash_attn_interface",
                                                                               takes_dropout=False)),
                "torch.flex_attention": _flex_runner, "flash_attn": _flash_attn_runner})


_env.set_runnable(RUNNERS)


def register_runner(backend: str, make) -> None:
    """Runs `backend`'s calls with make(call) -> run(t, q, k, v, mask) (a backend added to
    the registry: docs/backends.md, "Adding a backend"). Its family becomes one the drop-in
    decides for once each of the family's backends has a runner."""
    RUNNERS[backend] = make
    _env.set_runnable(RUNNERS)


def prepare_call(call):
    """run(t, q, k, v, mask) for one typed call."""
    make = RUNNERS.get(call.backend)
    if make is None:
        raise RuntimeError(f"masklens: masklens.torch has no runner for {call.backend}")
    return make(call)


def run_call(call, t: Tensors, q, k, v, mask):
    return prepare_call(call)(t, q, k, v, mask)


class Prepared:
    """A Policy read once, as the drop-in keeps it per (mask, call): `run(t, q, k, v,
    mask)`, whether the call reads the dense mask (`needs_mask`: the drop-in builds the
    mask's 4-D view only then), whether rows that attend to nothing must be zeroed, and
    whether it is stale (`stale`: a flex it passed over for its cold compile has been paid
    for by the calls that ran without it; the drop-in then decides again)."""

    __slots__ = ("policy", "structure", "run", "needs_mask", "zero_rows", "stale")

    def __init__(self, policy, structure, flex_bucket=None):
        self.policy = policy
        self.structure = structure
        self.stale = False
        if policy.is_plan:
            self.run = _plan.runner(policy, structure, prepare_call, SDPA_KERNELS.get)
            self.needs_mask = False  # steps run unmasked calls
        else:
            call = policy.call
            self.run = prepare_call(call)
            a = call.args
            # A flex call keeps the mask at hand: where its compiled kernel cannot run,
            # torch's call with the dense mask runs it (run_flex).
            self.needs_mask = call.mask == "keep" or (a is not None and a.type == "flex")
        # Rows that attend nothing are zeroed after the call, a copy of its output, except
        # where the plan leaves them 0 itself (the copy would be one more output at the peak).
        self.zero_rows = structure.empty_rows > structure.finite_masked_rows and not (
            policy.is_plan and _plan.leaves_empty_rows_zero(policy, SDPA_KERNELS.get))
        saving = _flex.forgone_saving_ms(policy) if flex_bucket is not None else 0.0
        if saving > 0:
            self.run = _flex.renting(self.run, flex_bucket, saving, self)


def run_policy(policy, t: Tensors):
    """Runs a Policy, or the Prepared one the drop-in keeps."""
    p = policy if type(policy) is Prepared else Prepared(policy, t.structure)
    return p.run(t, t.q, t.k, t.v, t.mask)
