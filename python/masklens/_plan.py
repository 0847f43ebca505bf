"""Running a plan: each step one call on q[b, :, q_range] and k/v[b, :, k_range], the
steps' outputs assembled into one output (rows no step computes stay 0), laid out
[B, Q, H, Dv] and returned as its [B, H, Q, Dv] view: the layout a fused kernel writes its
output in, so the model's `transpose(1, 2).contiguous()` before o_proj copies nothing.

Where autograd needs the steps and every step is an unmasked call of one of torch's fused
kernels with forward and backward ops (FUSED_OPS: cuDNN and flash on CUDA; on the CPU
torch's flash kernel, which its dispatch runs for such a call while flash is on), the
plan runs as one autograd function, PlanAttention: it keeps q, k, v, the assembled output
and each step's logsumexp, and its backward calls each step's backward op on slices of
them. A plan of torch calls keeps each step's own output for that step's backward beside
the assembled one: one attention output more than a single call at the peak (measured on
an H100: bench/README.md, zero_byte). Every other plan runs its steps as torch calls
(docs/python.md, "Plans", lists them)."""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

_aten = torch.ops.aten


class FusedOps:
    """A fused kernel's forward and backward ops, called as torch's scaled_dot_product_attention
    calls them for an unmasked call without dropout.
    forward(q, k, v, causal, scale) -> (out, saved tensors, saved ints);
    backward(grad, q, k, v, out, saved tensors, saved ints, causal, scale) -> (dq, dk, dv).
    `takes_gqa`: K and V with fewer heads go in as they are where the call says enable_gqa
    (torch's sdpa hands them to this kernel so); otherwise they are repeated to the query's
    heads and their gradients summed back. `head_dim_multiple`: the head dims the op takes
    as they are (others run as a torch call: torch pads them for flash)."""

    __slots__ = ("forward", "backward", "takes_gqa", "head_dim_multiple")

    def __init__(self, forward, backward, takes_gqa, head_dim_multiple=1):
        self.forward, self.backward = forward, backward
        self.takes_gqa, self.head_dim_multiple = takes_gqa, head_dim_multiple


def _cudnn_forward(q, k, v, causal, scale):
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = _aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale)
    return out, (lse, seed, offset, cum_q, cum_k), (max_q, max_k)


def _cudnn_backward(grad, q, k, v, out, saved, ints, causal, scale):
    lse, seed, offset, cum_q, cum_k = saved
    return _aten._scaled_dot_product_cudnn_attention_backward(grad, q, k, v, out, lse, seed, offset, None, cum_q,
                                                               cum_k, ints[0], ints[1], 0.0, causal, scale=scale)


def _flash_forward(q, k, v, causal, scale):
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, _ = _aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale)
    return out, (lse, cum_q, cum_k, rng_state, unused), (max_q, max_k)


def _flash_backward(grad, q, k, v, out, saved, ints, causal, scale):
    lse, cum_q, cum_k, rng_state, unused = saved
    return _aten._scaled_dot_product_flash_attention_backward(grad, q, k, v, out, lse, cum_q, cum_k, ints[0], ints[1],
                                                               0.0, causal, rng_state, unused, scale=scale)


def _cpu_flash_forward(q, k, v, causal, scale):
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, (lse,), ()


def _cpu_flash_backward(grad, q, k, v, out, saved, ints, causal, scale):
    return _aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, saved[0], 0.0, causal,
                                                                       scale=scale)


# Per (device type, the SDPA kernel a step's backend selects: kernels_of): the ops
# PlanAttention runs it with. On the CPU every call runs torch's own dispatch, which runs
# an unmasked call of equal head dims on its flash kernel: the ops here.
FUSED_OPS = {
    ("cuda", SDPBackend.CUDNN_ATTENTION): FusedOps(_cudnn_forward, _cudnn_backward, takes_gqa=True,
                                                   head_dim_multiple=8),
    ("cuda", SDPBackend.FLASH_ATTENTION): FusedOps(_flash_forward, _flash_backward, takes_gqa=True,
                                                   head_dim_multiple=8),
    ("cpu", SDPBackend.MATH): FusedOps(_cpu_flash_forward, _cpu_flash_backward, takes_gqa=False),
}


class _Slices:
    """A plan step's rows and keys: q[b, :, q_range] and k/v[b, :, k_range] (every batch
    where a structure of batch 1 stands for them)."""

    __slots__ = ("batch", "q_lo", "q_hi", "k_lo", "k_hi")

    def __init__(self, batch, q_range, k_range):
        self.batch = batch
        (self.q_lo, self.q_hi), (self.k_lo, self.k_hi) = q_range, k_range

    def rows(self, every_batch):
        return (slice(None) if every_batch else slice(self.batch, self.batch + 1), slice(None),
                slice(self.q_lo, self.q_hi))

    def slices(self, q, k, v, every_batch):
        """Contiguous copies of the step's q, k and v: the layout the fused kernels'
        backward passes are built and tested for."""
        b = slice(None) if every_batch else slice(self.batch, self.batch + 1)
        return (q[b, :, self.q_lo:self.q_hi].contiguous(), k[b, :, self.k_lo:self.k_hi].contiguous(),
                v[b, :, self.k_lo:self.k_hi].contiguous())


class _Step(_Slices):
    """One step of a fused plan: its rows, its call's ops and arguments."""

    __slots__ = ("ops", "causal", "gqa")

    def __init__(self, batch, q_range, k_range, ops, causal, gqa):
        super().__init__(batch, q_range, k_range)
        self.ops, self.causal, self.gqa = ops, causal, gqa

    def inputs(self, q, k, v, every_batch):
        """The step's slices, K and V repeated to the query's heads where the kernel is not
        given them grouped."""
        qs, ks, vs = self.slices(q, k, v, every_batch)
        groups = q.shape[1] // k.shape[1]
        if groups > 1 and not self.gqa:
            ks, vs = ks.repeat_interleave(groups, dim=1), vs.repeat_interleave(groups, dim=1)
        return qs, ks, vs


def _fused_ops(step, kernels_of, device_type, head_dim, head_dim_v):
    """The FusedOps a plan step runs on, or None: a kept or replaced mask, a kernel with no
    entry, a head dim its op does not take as it is, a causal step of unequal lengths
    (torch's sdpa rules on those; its own call runs them)."""
    call = step.call
    kernels = kernels_of(call.backend)
    if kernels is None or len(kernels) != 1 or call.mask in ("keep", "replace"):
        return None
    ops = FUSED_OPS.get((device_type, kernels[0]))
    if ops is None or head_dim != head_dim_v or head_dim % ops.head_dim_multiple:
        return None
    (q_lo, q_hi), (k_lo, k_hi) = step.q_range, step.k_range
    if call.args is not None and call.args.is_causal and q_hi - q_lo != k_hi - k_lo:
        return None
    return ops


def _causal_gqa(args, ops):
    """A step's is_causal, and whether its K and V go in grouped: where its call says
    enable_gqa and its kernel's op takes them so."""
    return (False, False) if args is None else (bool(args.is_causal), bool(args.enable_gqa) and ops.takes_gqa)


def _needs_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _may_fuse(t, q, k, v) -> bool:
    """Whether this call may run fused: autograd needs the steps, no dropout, autocast off
    or with q, k and v already in its dtype (it casts torch's sdpa, not these ops), and on
    the CPU torch's flash kernel switched on (its dispatch runs the math kernel otherwise;
    on CUDA masklens picks the kernel)."""
    device = q.device.type
    return (not t.dropout_p and _needs_grad(q, k, v)
            and (not torch.is_autocast_enabled(device)
                 or q.dtype == k.dtype == v.dtype == torch.get_autocast_dtype(device))
            and (q.is_cuda or torch.backends.cuda.flash_sdp_enabled()))


class PlanAttention(torch.autograd.Function):
    """A plan of fused steps as one autograd node (the module's docstring says why). Its
    output is [B, Q, H, Dv]; the runner returns its transposed view, made outside the
    function, so the output is an ordinary tensor autograd tracks (an in-place change to
    it is caught at backward, as for torch's own call)."""

    @staticmethod
    def forward(ctx, steps, every_batch, scale, q, k, v):
        out = q.new_zeros(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])
        heads_first = out.transpose(1, 2)
        saved, ints, counts = [], [], []
        for step in steps:
            piece, tensors, n = step.ops.forward(*step.inputs(q, k, v, every_batch), step.causal, scale)
            heads_first[step.rows(every_batch)] = piece
            saved.extend(tensors)
            counts.append(len(tensors))
            ints.append(n)
        ctx.save_for_backward(q, k, v, out, *saved)
        ctx.steps, ctx.every_batch, ctx.scale, ctx.ints, ctx.counts = steps, every_batch, scale, ints, counts
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        q, k, v, out, *saved = ctx.saved_tensors
        grad, out = grad.transpose(1, 2), out.transpose(1, 2)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        at = 0
        for step, n, count in zip(ctx.steps, ctx.ints, ctx.counts):
            tensors, at = saved[at:at + count], at + count
            rows = step.rows(ctx.every_batch)
            qs, ks, vs = step.inputs(q, k, v, ctx.every_batch)
            dqs, dks, dvs = step.ops.backward(grad[rows].contiguous(), qs, ks, vs, out[rows].contiguous(), tensors, n,
                                             step.causal, ctx.scale)
            if dks.shape[1] != k.shape[1]:  # K and V went in repeated: their gradients summed per group
                dks = dks.unflatten(1, (k.shape[1], -1)).sum(2)
                dvs = dvs.unflatten(1, (v.shape[1], -1)).sum(2)
            keys = (rows[0], slice(None), slice(step.k_lo, step.k_hi))
            dq[rows] = dqs
            dk[keys] += dks
            dv[keys] += dvs
        return None, None, None, dq, dk, dv


def _every_row_attends(step, kernels_of) -> bool:
    """Whether each row of an SDPA step attends a key: over at least one key, unmasked
    (is_causal top-left: row i attends keys 0..i; or every key) or causal_lower_right's
    replaced mask over at least as many keys as rows (row i attends keys 0..i + K - Q)."""
    call = step.call
    q_len, k_len = step.q_range[1] - step.q_range[0], step.k_range[1] - step.k_range[0]
    if kernels_of(call.backend) is None or k_len < 1 or call.mask == "keep":
        return False
    return call.mask != "replace" or k_len >= q_len


def leaves_empty_rows_zero(policy, kernels_of) -> bool:
    """Whether a plan's output is 0 on every row that attends nothing, with no zeroing after
    it: every step is a zeros step or an SDPA call each of whose rows attends a key. A plan
    is exact row by row, so the rows that attend nothing are then its zeros steps' rows or
    rows no step computes, which stay 0 (and get no gradient)."""
    return all(step.call.backend == "zeros" or _every_row_attends(step, kernels_of) for step in policy.plan)


def runner(policy, structure, prepare_call, kernels_of):
    """run(t, q, k, v, mask) for a plan: PlanAttention where autograd needs the steps and
    every step has fused ops, the steps as torch calls otherwise. A structure of batch 1
    stands for every batch. `prepare_call(call)` is a step's torch call (_run's runners);
    `kernels_of(backend)` the SDPA kernels a backend selects (_run.SDPA_KERNELS), or None."""
    plan = [step for step in policy.plan if step.call.backend != "zeros"]
    calls = [(_Slices(step.batch, step.q_range, step.k_range), prepare_call(step.call)) for step in plan]
    broadcast = structure.batch == 1
    fused_steps = {}  # per (FUSED_OPS, device type, head dims): the fused steps, or None

    def fused(q, v):
        key = (id(FUSED_OPS), q.device.type, q.shape[-1], v.shape[-1])
        if key not in fused_steps:
            ops = [_fused_ops(step, kernels_of, *key[1:]) for step in plan]
            fused_steps[key] = None if not plan or None in ops else [
                _Step(step.batch, step.q_range, step.k_range, op, *_causal_gqa(step.call.args, op))
                for step, op in zip(plan, ops)]
        return fused_steps[key]

    def run(t, q, k, v, mask):
        every_batch = broadcast and q.shape[0] > 1
        if _may_fuse(t, q, k, v):
            steps = fused(q, v)
            if steps is not None:
                return PlanAttention.apply(steps, every_batch, t.scale, q, k, v).transpose(1, 2)
        # [B, Q, H, Dv], each step's [b, H, rows, Dv] written transposed: the layout a fused
        # kernel writes, and a transpose (not a strided view) for autograd to go back through.
        out = q.new_zeros(q.shape[0], q.shape[2], q.shape[1], v.shape[-1])
        for where, call in calls:
            piece = call(t, *where.slices(q, k, v, every_batch), None)
            b, _, rows = where.rows(every_batch)
            out[b, rows] = (ContiguousGrad.apply(piece) if piece.requires_grad else piece).transpose(1, 2)
        out = out.transpose(1, 2)
        if not calls and _needs_grad(q, k, v):
            out = _NoKeyAttends.apply(out, q, k, v)
        return out
    return run


class ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands on a contiguous gradient. A plan step's output is a
    slice of the whole output, so its gradient arrives as a strided view; the fused
    kernels are run (and tested upstream) with dense gradients, and on an H200 a plan's
    cuDNN backward disagreed with the same calls assembled by torch.cat. One-graph layers
    (_one_graph) give each branch's inputs dense gradients: torch.cond's backward wants one
    layout from every branch."""

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
