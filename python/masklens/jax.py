"""masklens.jax: the JAX host. A dense boolean mask handed to jax.nn.dot_product_attention
proven and replaced by JAX's own arguments (is_causal, local_window_size,
key_value_seq_lengths) where they compute it exactly, on cuDNN's fused kernel where it
can run (docs/jax.md).

    import masklens.jax as mj
    out = mj.dot_product_attention(q, k, v, mask=mask)   # jax's signature, [B, T, N, H]
    report = mj.inspect(mask, q, k, v)                    # structure, policy, rejections
    prepared = mj.prepare(mask, q, k)                     # outside jit: a pytree
    out = jax.jit(mj.attention)(q, k, v, prepared)        # inside: no retrace as padding changes

Nothing here holds global state but the verdict cache (one verdict per jax array while it
lives) and the environment read once per device.
"""
from __future__ import annotations

import functools
import logging
import threading

import numpy as np

import jax
import jax.numpy as jnp

from . import _core, _jax_scan, _registry
from ._core import AttentionCall, Environment, MaskError, decide
from ._env import cudnn_version_text
from ._report import Report, explain_text

__all__ = ["Prepared", "attention", "dot_product_attention", "environment", "explain", "forget", "inspect",
           "prepare"]

logger = logging.getLogger("masklens")

# An sm below every GPU kernel's minimum: what a CPU (or TPU) is decided as (XLA only).
CPU_SM = 10
_IMPLEMENTATIONS = (None, "xla", "cudnn")


# --- the environment --------------------------------------------------------------

def _version_of(module_name: str) -> str | None:
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    return getattr(module, "__version__", None)


def _older(a: str | None, b: str | None) -> str | None:
    """The older of two versions (the one that says what both can do)."""
    if a is None or b is None:
        return a or b
    def key(v):
        parts = []
        for piece in v.split(".")[:3]:
            digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
            parts.append(int(digits) if digits else 0)
        return tuple(parts)
    return a if key(a) <= key(b) else b


def _cudnn_version() -> str | None:
    """The cuDNN jax's CUDA plugin loads (jax._src.lib.cuda_versions), as 9.19.0."""
    try:
        from jax._src.lib import cuda_versions
    except ImportError:
        return None
    if cuda_versions is None:
        return None
    try:
        v = int(cuda_versions.cudnn_get_version())
    except Exception:
        return None
    return cudnn_version_text(v)


@functools.lru_cache(maxsize=None)
def _environment_for(platform: str, capability: str | None, cudnn: bool) -> tuple:
    fields = {"jax": _older(_version_of("jax"), _version_of("jaxlib")), "available": frozenset({"jax"})}
    if platform in ("gpu", "cuda") and capability:
        major, minor = (int(x) for x in capability.split(".")[:2])
        fields["sm"] = major * 10 + minor
        fields["cudnn"] = _cudnn_version() if cudnn else None
    else:
        fields["sm"] = CPU_SM
        fields["cudnn"] = None
    return tuple(sorted(fields.items()))


def environment(device=None, *, use_cudnn: bool = True, **overrides) -> Environment:
    """The Environment masklens.jax decides for: the `jax` family alone (jax's version, the
    older of jax's and jaxlib's), the device's compute capability (a CPU or TPU is sm 10:
    XLA only) and the cuDNN jax loads (none with use_cudnn=False: implementation="xla" asked).
    `device`: a jax device or array (default: jax's first device). Keyword overrides as
    masklens.inspect takes them (sm=90, cudnn="9.19", jax="0.11")."""
    if device is not None and not hasattr(device, "platform"):
        device = _jax_scan.device_of(device)
    if device is None:
        device = jax.devices()[0]
    platform = str(getattr(device, "platform", "cpu")).lower()
    capability = getattr(device, "compute_capability", None)
    env = Environment()
    for key, value in _environment_for(platform, capability, use_cudnn):
        setattr(env, key, set(value) if isinstance(value, frozenset) else value)
    for key, value in overrides.items():
        if key == "available" and isinstance(value, str):
            value = set(value.split(","))
        setattr(env, key, value)
    env.validate()
    return env


# --- the call ---------------------------------------------------------------------

def _dims(query, key):
    """(B, T, N, H) of the query and (S, K) of the key, [B, T, N, H] or [T, N, H] arrays."""
    q, k = tuple(query.shape), tuple(key.shape)
    if len(q) == 3:
        q = (1,) + q
    if len(k) == 3:
        k = (1,) + k
    if len(q) != 4 or len(k) != 4:
        raise MaskError(f"invalid_shape: query and key are [B, T, N, H] or [T, N, H] arrays, got {list(query.shape)} "
                        f"and {list(key.shape)}")
    return q, k


_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}


def make_call(mask, query=None, key=None, value=None, training: bool | None = None, **fields) -> AttentionCall:
    """The AttentionCall of arrays in jax's layout [B, T, N, H]; keyword fields override."""
    call = AttentionCall()
    call.mask_dtype = _jax_scan._scan.element_name(np.dtype(mask.dtype)) if mask is not None else None
    if query is not None and key is not None:
        (b, t, n, h), (_, s, kh, _) = _dims(query, key)
        call.dtype = _DTYPES.get(np.dtype(query.dtype).name, "float32")
        call.head_dim, call.batch, call.heads, call.kv_heads, call.q_len, call.k_len = h, b, n, kh, t, s
        if value is not None:
            call.head_dim_v = int(value.shape[-1])
        if training is None:  # under jax.grad (outside jit) the arrays are tracers
            training = any(_jax_scan.is_tracer(x) for x in (query, key, value) if x is not None)
    call.training = bool(training)
    for name, v in fields.items():
        setattr(call, name, v)
    call.validate()
    return call


def _target(mask, query, key):
    if query is None or key is None:
        shape = (1,) * (4 - len(mask.shape)) + tuple(mask.shape)
        if len(shape) != 4:
            raise MaskError(f"invalid_shape: a jax mask has at most 4 dims [B, N, T, S], got {list(mask.shape)}")
        return shape
    (b, t, n, _), (_, s, _, _) = _dims(query, key)
    return (b, n, t, s)


def _broadcast_target(mask, query, key):
    target = _target(mask, query, key)
    shape = _jax_scan.mask_shape_for(mask.shape, target)
    if shape is None:
        raise MaskError(f"invalid_shape: mask of shape {list(mask.shape)} does not broadcast to the call's "
                        f"[B, N, T, S] = {list(target)} as jax.nn.dot_product_attention broadcasts it")
    # Batch and heads stay as stored: a structure of batch 1 describes every batch.
    return (shape[0], shape[1], target[2], target[3])


_CALL_FIELDS = ("dtype", "head_dim", "head_dim_v", "batch", "heads", "kv_heads", "q_len", "k_len", "training",
                "dropout", "deterministic", "mask_dtype")


def inspect(mask, query=None, key=None, value=None, *, masked_threshold: float = -1000.0, strict: bool = False,
            implementation: str | None = None, **fields) -> Report:
    """Scans `mask` (a NumPy or jax array, 1-4 dims, broadcast as jax.nn.dot_product_attention
    broadcasts it to [B, N, T, S]) and decides jax.nn.dot_product_attention's call for
    query/key/value in jax's layout [B, T, N, H]. A CUDA jax array is scanned on its device
    (masklens._cuda, through DLPack); the verdict equals masklens.inspect's on the same
    values. Call fields (dtype, head_dim, training, ...) and environment fields (sm,
    cudnn, jax, available) by keyword; implementation="xla" decides without cuDNN."""
    if implementation not in _IMPLEMENTATIONS:
        raise MaskError(f"invalid_argument: implementation is None, 'xla' or 'cudnn', got {implementation!r}")
    call_fields = {k: fields.pop(k) for k in list(fields) if k in _CALL_FIELDS}
    env_fields = dict(fields)
    if _jax_scan.is_tracer(mask):
        raise MaskError("invalid_argument: the mask is a tracer (inside jit): inspect it outside jit")
    if not (isinstance(mask, np.ndarray) or _jax_scan.is_jax_array(mask)):
        raise MaskError(f"invalid_argument: a mask is a NumPy or jax array, got {type(mask).__name__}")
    target = _broadcast_target(mask, query, key)
    verdict = _jax_scan.scan(mask, target, masked_threshold)
    call = make_call(mask, query, key, value, **call_fields)
    device = _jax_scan.device_of(query if query is not None else mask)
    env = environment(device, use_cudnn=implementation != "xla", **env_fields)
    try:
        policy = decide(verdict.structure, call, env, 64)
        error = None
    except MaskError as e:
        if strict:
            raise
        policy, error = None, str(e)
    return Report(verdict, policy, call, env, error)


def explain(mask, query=None, key=None, value=None, file=None, **fields) -> Report:
    """Prints the decision for `mask` with every rejection and its source; returns the Report."""
    report = inspect(mask, query, key, value, **fields)
    print(explain_text(report), file=file)
    return report


def forget() -> None:
    """Drops every cached verdict and decision."""
    _jax_scan.forget()
    with _decisions_lock:
        _decisions.clear()


# --- the decision -----------------------------------------------------------------

class _Decision:
    """What runs: jax's own call (`own`), or jax's call with the mask dropped for `static`
    keyword arguments and `lengths` (key_value_seq_lengths, int32 [B], or None)."""
    __slots__ = ("own", "static", "lengths", "backend", "describe")

    def __init__(self, own, static=(), lengths=None, backend=None, describe=""):
        self.own, self.static, self.lengths, self.backend, self.describe = own, static, lengths, backend, describe


def _native(policy, implementation, q_len, k_len, batch):
    """The policy's call as a _Decision where it drops the mask for a jax backend that the
    requested implementation allows; else None (jax's own call)."""
    if policy is None or policy.plan or policy.call.mask != "drop":
        return None
    backend = policy.call.backend
    if _registry.host_of(backend) != "jax":
        return None
    args, _ = policy.call.rendered(batch, q_len, k_len)
    if implementation == "cudnn" and args.get("implementation") != "cudnn":
        return None  # cuDNN asked for: only a call that runs on it
    static, lengths = [], None
    for name, value in args.items():
        if name == "key_value_seq_lengths":
            lengths = np.asarray(value, dtype=np.int32)
        elif name == "local_window_size":
            static.append((name, (int(value[0]), int(value[1]))))
        else:
            static.append((name, value))
    return _Decision(False, tuple(sorted(static)), lengths, backend)


def _with_lengths(structure):
    """The structure with every batch's keys written as valid, [0, S): the same mask, said
    with lengths, so a prepared call keeps its form (and jit its trace) whether or not a
    batch pads. None where the structure takes no lengths."""
    if structure.kind not in ("full", "causal", "sliding_window") or structure.kv_valid is not None \
            or structure.q_valid is not None or structure.segments is not None:
        return None
    if structure.kind != "full" and structure.alignment != "top_left" and structure.q_len != structure.k_len:
        return None
    s = _core.MaskStructure()
    for field in ("batch", "heads", "q_len", "k_len", "kind", "alignment", "window", "empty_rows",
                  "finite_masked_rows", "bias"):
        if field == "window" and structure.kind != "sliding_window":
            continue
        setattr(s, field, getattr(structure, field))
    s.kv_valid = [(0, structure.k_len)]
    return s


_decisions: dict = {}
_decisions_lock = threading.Lock()
_MAX_DECISIONS = 4096


def _decide(mask, query, key, value, implementation, masked_threshold, stable_lengths=False):
    """(_Decision, Report) for the call, the decision cached per (structure, call)."""
    target = _broadcast_target(mask, query, key)
    verdict = _jax_scan.scan(mask, target, masked_threshold)
    call = make_call(mask, query, key, value)
    env = environment(_jax_scan.device_of(query), use_cudnn=implementation != "xla")
    (batch, q_len, _, _), (_, k_len, _, _) = _dims(query, key)
    structure = verdict.structure
    cache_key = (structure.describe(), repr(structure.kv_valid), target, batch, call.dtype, call.head_dim,
                 call.head_dim_v, call.heads, call.kv_heads, call.training, call.mask_dtype, env.sm, env.cudnn,
                 implementation, stable_lengths)
    with _decisions_lock:
        hit = _decisions.get(cache_key)
    if hit is not None:
        return hit
    try:
        policy = decide(structure, call, env, 64)
    except MaskError:
        policy = None
    decision = _native(policy, implementation, q_len, k_len, batch)
    if stable_lengths and decision is not None and decision.lengths is None:
        spelled = _with_lengths(structure)
        if spelled is not None:
            try:
                again = _native(decide(spelled, call, env, 64), implementation, q_len, k_len, batch)
            except MaskError:
                again = None
            if again is not None and again.lengths is not None:
                decision = again
    if decision is None:
        decision = _Decision(True, backend=None)
    decision.describe = structure.describe()
    if decision.lengths is not None and len(decision.lengths) != batch:  # a mask broadcast over the batch
        decision.lengths = np.broadcast_to(decision.lengths, (batch,)).copy()
    with _decisions_lock:
        if len(_decisions) >= _MAX_DECISIONS:
            _decisions.clear()
        _decisions[cache_key] = decision
    logger.info("masklens.jax: %s -> %s", structure.describe(),
                "jax's own call" if decision.own else f"{decision.backend} {dict(decision.static)}")
    return decision


def _lengths_on(lengths, like):
    """key_value_seq_lengths as an int32 jax array on `like`'s device."""
    device = _jax_scan.device_of(like)
    out = jnp.asarray(lengths, dtype=jnp.int32)
    return jax.device_put(out, device) if device is not None else out


# --- the drop-in ------------------------------------------------------------------

_fallback_warned = False


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, **kwargs):
    """jax.nn.dot_product_attention with its signature and layout ([B, T, N, H]). A boolean
    mask given alone (no bias, is_causal, sequence lengths or window) is proven outside jit
    and dropped for jax's own arguments where they compute it exactly (implementation
    "cudnn" where cuDNN can run it, else "xla"; implementation="xla" given keeps XLA,
    "cudnn" keeps cuDNN). Everything else — a tracer mask inside jit, a mask that must be
    kept, any other argument — is jax's own call, unchanged (errors included)."""
    own = functools.partial(jax.nn.dot_product_attention, query, key, value, bias, mask, scale=scale,
                            is_causal=is_causal, query_seq_lengths=query_seq_lengths,
                            key_value_seq_lengths=key_value_seq_lengths, local_window_size=local_window_size,
                            implementation=implementation, **kwargs)
    if (mask is None or bias is not None or is_causal or query_seq_lengths is not None
            or key_value_seq_lengths is not None or local_window_size is not None or kwargs
            or implementation not in _IMPLEMENTATIONS or _jax_scan.is_tracer(mask)
            or not (isinstance(mask, np.ndarray) or _jax_scan.is_jax_array(mask))
            or np.dtype(mask.dtype) != np.dtype(bool) or not _checks_pass(query, key, value, mask, implementation)):
        return own()
    decision = _decide(mask, query, key, value, implementation, -1000.0)
    if decision.own:
        return own()
    return _run(query, key, value, scale, decision, implementation, own)


def _run(query, key, value, scale, decision, implementation, own):
    global _fallback_warned
    kwargs = dict(decision.static)
    if decision.lengths is not None:
        kwargs["key_value_seq_lengths"] = _lengths_on(decision.lengths, query)
    try:
        return jax.nn.dot_product_attention(query, key, value, scale=scale, **kwargs)
    except Exception as e:  # cuDNN chosen for implementation=None and refused here: XLA then
        if implementation is not None or kwargs.get("implementation") != "cudnn":
            raise
        if not _fallback_warned:
            _fallback_warned = True
            logger.warning("masklens.jax: cuDNN refused the call (%s); XLA's implementation runs it", e)
        return own()


@functools.lru_cache(maxsize=1024)
def _checks_pass_for(signature) -> bool:
    q, k, v, m, implementation = signature
    try:
        jax.eval_shape(functools.partial(jax.nn.dot_product_attention, implementation=implementation),
                       jax.ShapeDtypeStruct(*q), jax.ShapeDtypeStruct(*k), jax.ShapeDtypeStruct(*v),
                       None, jax.ShapeDtypeStruct(*m))
    except Exception:
        return False
    return True


def _checks_pass(query, key, value, mask, implementation) -> bool:
    """Whether jax's own call with the dense mask passes jax's checks for these shapes and
    dtypes (asked once per signature, by tracing it abstractly): where it does not, the
    drop-in runs jax's call, which raises as jax raises."""
    try:
        sig = tuple((tuple(x.shape), np.dtype(x.dtype)) for x in (query, key, value, mask)) + (implementation,)
    except (AttributeError, TypeError):
        return False
    return _checks_pass_for(sig)


# --- prepare / attention: the decision as a pytree, for jitted steps ---------------

@jax.tree_util.register_pytree_node_class
class Prepared:
    """A decided jax.nn.dot_product_attention call as a pytree: the arrays it takes (the
    kept `mask`, or `key_value_seq_lengths`) as leaves, the static arguments (is_causal,
    local_window_size, implementation) as its structure. New padding is new leaf values:
    a jitted step that takes a Prepared traces once per form, not per padding."""

    def __init__(self, mask=None, key_value_seq_lengths=None, static=(), backend=None):
        self.mask = mask
        self.key_value_seq_lengths = key_value_seq_lengths
        self.static = tuple(static)
        self.backend = backend  # a backend of the jax family, or None (the mask kept: jax's own call)

    @property
    def keeps_mask(self) -> bool:
        return self.backend is None

    def kwargs(self) -> dict:
        """jax.nn.dot_product_attention's keyword arguments for this call."""
        out = dict(self.static)
        if self.mask is not None:
            out["mask"] = self.mask
        if self.key_value_seq_lengths is not None:
            out["key_value_seq_lengths"] = self.key_value_seq_lengths
        return out

    def tree_flatten(self):
        return (self.mask, self.key_value_seq_lengths), (self.static, self.backend)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], children[1], aux[0], aux[1])

    def __repr__(self) -> str:
        what = "mask kept" if self.keeps_mask else self.backend
        return f"Prepared({what}, {dict(self.static)}, lengths={self.key_value_seq_lengths is not None})"


def prepare(mask, query, key, value=None, *, implementation=None, masked_threshold: float = -1000.0,
            lengths: bool = True) -> Prepared:
    """Proves `mask` (a concrete NumPy or jax bool array, outside jit) for a call on arrays
    shaped like query/key/value ([B, T, N, H]; jax.ShapeDtypeStruct works) and returns the
    decided call as a Prepared pytree for masklens.jax.attention inside a jitted step.
    lengths=True (default) writes key_value_seq_lengths even where no batch pads (every
    batch's S), where the decided form takes lengths: a step traced for one padding serves
    every other. A mask the decision keeps is carried as it is (jax's own call)."""
    if implementation not in _IMPLEMENTATIONS:
        raise MaskError(f"invalid_argument: implementation is None, 'xla' or 'cudnn', got {implementation!r}")
    if _jax_scan.is_tracer(mask):
        raise MaskError("invalid_argument: prepare() needs a concrete mask: call it outside jit and pass the "
                        "Prepared into the jitted step")
    if not (isinstance(mask, np.ndarray) or _jax_scan.is_jax_array(mask)):
        raise MaskError(f"invalid_argument: a mask is a NumPy or jax array, got {type(mask).__name__}")
    if value is None:
        value = key
    keep = Prepared(jnp.asarray(mask), None, (("implementation", implementation),), None)
    if np.dtype(mask.dtype) != np.dtype(bool):
        return keep  # jax takes a bool mask only: its own call raises, as it does without masklens
    decision = _decide(mask, query, key, value, implementation, masked_threshold, stable_lengths=lengths)
    if decision.own:
        return keep
    lengths_array = None if decision.lengths is None else _lengths_on(decision.lengths, mask)
    return Prepared(None, lengths_array, decision.static, decision.backend)


def attention(query, key, value, prepared: Prepared, *, bias=None, scale=None):
    """jax.nn.dot_product_attention(query, key, value) with a Prepared call: jit-safe (the
    Prepared's arrays are leaves). `bias` and `scale` as jax takes them."""
    return jax.nn.dot_product_attention(query, key, value, bias, scale=scale, **prepared.kwargs())
