"""Masks built from their definitions, the reference attention, and the drop-in held to
torch's own outcome."""
import torch
import torch.nn.functional as F


def rows_cols(q_len, k_len):
    return torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]


def tensors_held(fn):
    """The tensors a function's closure holds (a mask_mod's document table, its mask...)."""
    return [c.cell_contents for c in fn.__closure__ or () if isinstance(c.cell_contents, torch.Tensor)]


def reference(q, k, v, mask, scale=None):
    """Dense-mask SDPA on the math kernel, in float64, rows that attend to nothing 0."""
    attends = mask if mask.dtype == torch.bool else (mask > -1000) if mask.is_floating_point() else mask != 0
    m = mask.double() if mask.is_floating_point() else attends
    if k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, scale=scale)
    while attends.dim() < 4:
        attends = attends.unsqueeze(0)
    return torch.where(attends.any(-1, keepdim=True), out, torch.zeros_like(out)).to(q.dtype)


def qkv(B, H, Q, K, D=16, Hk=None, dtype=torch.float32, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hk = Hk or H
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(dtype).requires_grad_(grad)
    return make(B, H, Q, D), make(B, Hk, K, D), make(B, Hk, K, D)


def grads(out, tensors, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=g, dtype=torch.float32).to(out.device, out.dtype)
    return torch.autograd.grad((out * w).sum(), tensors)


def assert_close(a, b, tol=1e-4):
    err = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"max |err| {err} > {tol}"


def leaves(*tensors):
    """Fresh leaves with the same values and requires_grad: one graph per run."""
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def outcome(fn, *args, **kwargs):
    """(exception type, None) where fn raises, else (None, result)."""
    try:
        return None, fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), None


def assert_same_outcome(args, kwargs, values=True):
    """The drop-in raises torch's exception type where torch raises, and gives torch's
    result where torch runs (values=False: its shape, dtype and device only, where
    torch's values are not defined)."""
    from masklens.torch import scaled_dot_product_attention as sdpa
    theirs = outcome(F.scaled_dot_product_attention, *leaves(*args), **kwargs)
    ours = outcome(sdpa, *leaves(*args), **kwargs)
    assert ours[0] == theirs[0], f"torch: {theirs[0]}, masklens: {ours[0]}"
    if theirs[0] is None and values:
        torch.testing.assert_close(ours[1], theirs[1], equal_nan=True)
    elif theirs[0] is None:
        assert (ours[1].shape, ours[1].dtype, ours[1].device) == (theirs[1].shape, theirs[1].dtype, theirs[1].device)
