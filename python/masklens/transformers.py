"""attn_implementation="masklens" for transformers models.

    import masklens.transformers      # registers (or call masklens.transformers.register())
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="masklens")

Registers two functions under "masklens": the attention function (sdpa's contract,
running masklens.torch.scaled_dot_product_attention) and the mask function
(transformers' own sdpa_mask). Both are needed: for an implementation name it has no
mask function for, transformers builds no mask at all, and padded batches go wrong.

sdpa_mask hands every layer of a forward the same mask tensor, so a model pays one scan
per forward (per mask kind: sliding and full layers have one each). One-token decode
takes transformers' sdpa path unchanged (nothing to prove in one row).

torch.compile(model): transformers calls the mask function once per forward (per mask
kind), and there masklens proves and decides outside the graph (a
torch.compiler.disable'd call: one graph break per mask kind and forward) and hands the
layers what compiles well: None for plain causal (sdpa's is_causal), a CompiledMask for
FlexAttention or varlen_attn, or the dense mask as sdpa would (masklens.torch.
prepare_compiled). Inside the layers nothing breaks the graph. With one graph on
(masklens.torch.set_one_graph(True)) the mask is proven and the call decided by an op
of the graph instead, the layers choosing their form with torch.cond (masklens.
_one_graph): no graph break, fullgraph=True works. A composition of transformers'
primitives is read there from its definition (masklens._graph_definition: registering
wraps masking_utils' factories so that, while Dynamo traces with one graph on, they give
objects it can read): the op reads the O(B·L) metadata, and the dense mask is built only
inside the layers' dense branch.
A one-token decode step's mask is sdpa_mask's, traced in either mode.

CUDA graph capture: a call whose mask the drop-in ran before the capture (the same
tensor, unchanged: a 4-D mask the caller passes) is replayed; any other runs as torch's.

Importing this module or calling register() does not initialise CUDA (nor load
masklens' kernels): registration happens at import, often before the program has chosen
its device. CUDA loads a kernel at its first launch, so the first forward's scan of a
CUDA mask would also pay for loading masklens'; the mask function, the first time it
sees a CUDA device, loads them there on a background thread (masklens.load_kernels),
while transformers builds the mask (preload_kernels = False turns it off). A framework
that wants them loaded before any forward calls masklens.load_kernels() itself:

    import masklens, masklens.transformers
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="masklens").to("cuda")
    masklens.load_kernels()           # True; False without masklens._cuda or a CUDA device
"""
from __future__ import annotations

import collections
import logging
import threading

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers import masking_utils
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import _compiled, _core, _definition, _graph_definition, _one_graph, _run, _scan, _verdicts
from . import torch as _dropin
from ._definition import DefinedMask
from ._one_graph import GraphMask, attend_graph, constant_scale, graph_mask
from .torch import CompiledMask, attend_compiled, prepare_compiled, scaled_dot_product_attention

NAME = "masklens"
logger = logging.getLogger("masklens")

# Whether the mask function loads masklens' CUDA kernels (on a background thread) the first
# time it sees a CUDA device.
preload_kernels = True
# Whether the mask function reads a recognised composition of transformers' mask functions
# back (masklens._definition) instead of building the [B, 1, Q, K] mask and scanning it.
from_definition = True
# Where a mask is read from its definition, when the layers may build it for a call that
# keeps it: "when_faster" charges the call the build (its bytes at _BUILD_BYTES_PER_MS) and
# builds it only where that call still wins; "never" builds it only where no call that
# drops it computes the mask (an arbitrary structure, a bias).
build_masks = "when_faster"
# When a definition's tables are read where they are on a device: "cuda" enqueues the
# read in the mask function and waits for it where the first attention layer needs the
# verdict (waiting in the mask function would drain the stream, and the GPU would idle
# while the host works out the rows and launches the next kernels); "always" defers CPU
# reads too (their C++ read moves to the first layer); "never" reads in the mask function.
defer_reads = "cuda"
# Bytes of bool mask a build writes per millisecond (a few broadcast passes over it).
_BUILD_BYTES_PER_MS = {"cuda": 5e8, "cpu": 5e6}
_masks = collections.deque(maxlen=16)  # the last mask function calls: (how, what) each (masks())
_definitions = 0       # masks read from their definition in this process (definition_count())
_devices_seen = set()  # the mask functions' `device` arguments seen (as given: no conversion per call)
_loaders = {}          # CUDA device index -> the thread that loads masklens' kernels there


def _load_in_background(device) -> None:
    """Starts masklens.load_kernels(device) on a thread of its own, once per CUDA device:
    CUDA loads modules under its own lock, so a scan that starts meanwhile waits at most
    for the rest of the load, never loads twice."""
    device = torch.device(device)
    if device.type != "cuda" or not _scan.has_cuda_scan():
        return
    index = torch.cuda.current_device() if device.index is None else device.index
    if index in _loaders:
        return

    def load():
        try:
            _scan.load_kernels(index)
        except Exception as e:  # the first scan loads them itself, and names any failure
            logger.debug("masklens: loading the kernels on cuda:%d failed: %s", index, e)
    thread = threading.Thread(target=load, name=f"masklens-load-kernels-{index}", daemon=True)
    _loaders[index] = thread
    thread.start()


def _begin_forward(device) -> None:
    _verdicts.begin_forward()
    if preload_kernels and device is not None and device not in _devices_seen:
        _devices_seen.add(device)
        _load_in_background(device)


def masklens_mask(*args, **kwargs):
    """transformers' mask function. A composition of transformers' mask primitives it
    recognises (masklens._definition) is read back from its definition, with no
    [B, 1, Q, K] tensor: the layers get a DefinedMask holding its verdict (or None for
    plain causal, as sdpa_mask gives it). Where the tables' read is deferred (defer_reads:
    on a GPU by default) the DefinedMask's verdict is waited for at the first layer, which
    then takes it as None, or builds the mask, if the read says so. Anything else is transformers' sdpa_mask, proven
    by a scan in the layers. Each call starts a new forward for the verdict cache
    (inference-mode masks are remembered within one forward). Inside torch.compile the
    mask is proven and decided outside the graph (_mask_outside_graph), or in it with one
    graph on (masklens.torch.set_one_graph; _mask_in_graph); a one-token decode step's mask
    is sdpa_mask's, traced (nothing to prove in one row: no break, no scan)."""
    if isinstance(kwargs.get("attention_mask"), DefinedMask):
        # A mask this function made, handed back (generate's masks made ahead of the
        # forward): as it is, as transformers passes a ready 4-D mask through.
        return kwargs["attention_mask"]
    if torch.compiler.is_compiling():
        if kwargs.get("q_length") == 1:
            return sdpa_mask(*args, **kwargs)
        if _one_graph.enabled:
            return _mask_in_graph(*args, **kwargs)
        return _mask_outside_graph(*args, **kwargs)
    _begin_forward(kwargs.get("device"))
    defined = _defined_mask(args, kwargs, defer=True)
    return defined if defined is not _BUILD else sdpa_mask(*args, **kwargs)


_BUILD = object()  # _defined_mask's answer where the mask is built as before


def _note(how, what) -> None:
    _masks.append((how, what))


class _Outcome:
    """What a mask function call that read a definition gave the layers, worked out once
    the read is waited for (at once, or at the first layer where the read was deferred):
    ("definition", the structure), ("none", why) where sdpa_mask too gives none, or
    ("built", why) where only the tables' values said the definition is not read back."""

    __slots__ = ("definition", "kwargs", "answer")

    def __init__(self, definition, kwargs):
        self.definition, self.kwargs, self.answer = definition, kwargs, None

    def __call__(self) -> tuple:
        if self.answer is None:
            failure = self.definition.failure()
            if failure is not None:
                logger.debug("masklens: building the mask: %s", failure)
                answer = ("built", str(failure))
            elif _skips_to_none(self.definition.verdict.structure, self.kwargs):
                answer = ("none", "sdpa_mask's own skip: sdpa's is_causal, or no mask")
            else:
                answer = ("definition", self.definition.verdict.structure.describe())
            self.answer = answer
            self.definition, self.kwargs = None, None  # the answer is all a note keeps
            if answer[0] != "built":
                global _definitions
                _definitions += 1
        return self.answer


def _notes() -> list:
    """The notes as (how, what), each pending read waited for."""
    return [note() if isinstance(note, _Outcome) else note for note in _masks]


def definition_count() -> int:
    """Masks read from their definition in this process (no tensor built, no scan): beside
    masklens.scan_count(), the proofs made. A read still pending (defer_reads) among the
    last 16 calls' is waited for first; one older than that counts once a layer reads it."""
    _notes()
    return _definitions


def masks() -> list:
    """The last mask function calls (up to 16), oldest first: ("definition", the
    structure's description) for a mask read from its definition, ("none", why) where
    sdpa_mask too gives none (the layers run sdpa's is_causal), ("built", why) for one
    built by sdpa_mask and scanned (the node of the composition that is not recognised,
    or why the definition was not read). A read still pending (defer_reads) is waited for
    first."""
    return _notes()


def _defers(device) -> bool:
    if defer_reads not in ("cuda", "always", "never"):
        raise ValueError(f"masklens.transformers.defer_reads is {defer_reads!r}; it takes 'cuda', 'always' or "
                         "'never'")
    return defer_reads == "always" or defer_reads == "cuda" and _scan.is_cuda(device)


def _defined_mask(args, kwargs, defer=False):
    """The mask the layers get from the definition: a DefinedMask, or None where sdpa_mask
    too gives None (plain causal or full: the layers then run sdpa's is_causal, as with
    "sdpa"); or _BUILD, the reason noted, where the mask is built by sdpa_mask. defer: the
    tables' read may be left pending (defer_reads says where); the DefinedMask then
    stands for None, or for a mask to build, if its read says so at the first layer."""
    if args or not from_definition:
        _note("built", "positional arguments" if args else "masklens.transformers.from_definition is False")
        return _BUILD
    if kwargs.get("q_length") == 1:  # one row: sdpa_mask's [B, 1, 1, K] is small, and the layers take it as it is
        _note("built", "one query row")
        return _BUILD
    device = kwargs.get("device", "cpu")
    if type(device) is not torch.device:
        device = torch.device(device)
    if _scan.is_cuda(device) and torch.cuda.is_current_stream_capturing():
        _note("built", "CUDA graph capture (reading the definition synchronises)")
        return _BUILD
    try:
        definition = _definition.recognise_arguments(kwargs, device, defer and _defers(device))
    except _definition.Unrecognised as e:
        _note("built", str(e))
        logger.debug("masklens: building the mask: %s", e)
        return _BUILD  # sdpa_mask: its own skip first, as with "sdpa"
    outcome = _Outcome(definition, kwargs)
    _masks.append(outcome)
    if not definition.pending and outcome()[0] == "none":
        return None

    def build():
        return sdpa_mask(**{**kwargs, "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False})
    return DefinedMask(definition, device, build, outcome)


def _skips_to_none(s, kwargs) -> bool:
    """Whether sdpa_mask gives None for the mask of structure `s`: its own skip (plain
    causal that sdpa's is_causal computes, or full attention without padding), and the
    layers run what "sdpa" runs. A definition with padding, documents or empty rows is
    never skipped (transformers skips only where its padding mask is all True and turns the
    skip off for packed documents), so only a plain one asks transformers' tests, which
    read the padding mask (a synchronisation)."""
    plain = s.segments is None and s.kv_valid is None and s.q_valid is None and s.empty_rows == 0
    return plain and (kwargs.get("allow_is_causal_skip", True) and s.kind == "causal" and s.q_len == s.k_len
                      or kwargs.get("allow_is_bidirectional_skip", False) and s.kind == "full"
                      or _sdpa_skips(kwargs))


def _mask_build_ms(dm) -> float:
    if build_masks == "never":
        return float("inf")
    if build_masks != "when_faster":
        raise ValueError(f"masklens.transformers.build_masks is {build_masks!r}; it takes 'when_faster' or 'never'")
    B, _, Q, K = dm.shape
    return B * Q * K / _BUILD_BYTES_PER_MS["cuda" if _scan.is_cuda(dm.device) else "cpu"]


def _sdpa_skips(kwargs) -> bool:
    """Whether sdpa_mask gives None for these arguments (its first step: plain causal that
    sdpa's is_causal computes, or full attention without padding), decided by transformers'
    own tests, so that the layers run what "sdpa" runs; False where they cannot be asked."""
    mu = masking_utils  # its private skip tests, asked as sdpa_mask asks them
    try:
        padding = mu.prepare_padding_mask(kwargs.get("attention_mask"), kwargs["kv_length"],
                                          kwargs.get("kv_offset", 0))
        if kwargs.get("allow_is_causal_skip", True) and mu._ignore_causal_mask_sdpa(
                padding, kwargs["q_length"], kwargs["kv_length"], kwargs.get("q_offset", 0),
                kwargs.get("kv_offset", 0), kwargs.get("local_size")):
            return True
        return bool(kwargs.get("allow_is_bidirectional_skip", False) and mu._ignore_bidirectional_mask_sdpa(
            padding, kwargs["kv_length"], kwargs.get("local_size")))
    except (AttributeError, KeyError, TypeError):  # another transformers: the definition decides
        return False


def _attend_defined(dm, query, key, value, dropout_p, scale, enable_gqa):
    """The drop-in's call on a DefinedMask's verdict: decided once per call (the policies
    live on the mask's entry, shared by the layers of the forward) and run with no dense
    mask unless the decided call keeps one. None where the drop-in would run torch's own
    call (a dtype, shape or scale it does not take): the caller builds the mask then."""
    # The checks the drop-in makes of a mask and call, made on a zero-byte stand-in of the
    # mask's shape; the decision is the drop-in's, the mask's build charged.
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    stand_in = dm.stand_in(query.device)
    if (_dropin._torch_runs_it(query, key, value, stand_in, dropout_p, False, scale, enable_gqa) is not None
            or _dropin._refusal(query, key, value, stand_in, enable_gqa) is not None):
        return None
    prepared = _dropin._decide(dm.entry, query, key, value, stand_in, dropout_p, training, enable_gqa,
                               mask_build_ms=_mask_build_ms(dm))
    if prepared is None:
        return None
    mask = None
    if prepared.needs_mask:
        keeps = prepared.policy.call.mask == "keep"
        # A call that keeps the mask reads it; flex reads it only where it cannot run.
        mask = dm.materialise(f"the decided call ({prepared.policy.backend}) keeps it") if keeps else dm
    t = _run.Tensors(query, key, value, mask, scale, dropout_p, prepared.structure, dm.entry.derived)
    out = _run.run_policy(prepared, t)
    if prepared.zero_rows:
        out = torch.where(_dropin._attending_rows(dm.entry, out.device), out, out.new_zeros(()))
    return out


def _attention_shape(config):
    """(heads, kv_heads, head_dim) of a model's attention layers, from its config, or None."""
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int) or head_dim < 1:
        return None
    return heads, kv_heads, head_dim


def _call_dtype(dtype, device):
    """The dtype the attention layers compute in: autocast's where it is on."""
    device_type = torch.device(device).type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


def _layers_mask(prepare, *args, **kwargs):
    """sdpa_mask's mask and what `prepare` (prepare_compiled or graph_mask) makes of it for
    the layers' call: their shape from the config transformers passes, their dtype the
    embeddings' (autocast's where it is on)."""
    mask = sdpa_mask(*args, **kwargs)
    shape = _attention_shape(kwargs.get("config"))
    if mask is None or shape is None or not isinstance(mask, torch.Tensor):
        return mask
    heads, kv_heads, head_dim = shape
    dtype = _call_dtype(kwargs.get("dtype", torch.float32), mask.device)
    return prepare(mask, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)


def _mask_outside_graph(*args, **kwargs):
    """The mask proven outside the graph of a compiled model (the one graph break of a
    forward per mask kind) and the call decided: what the layers receive is what
    masklens.torch.prepare_compiled makes of it (None for plain causal, a CompiledMask, or
    the dense mask). A recognised definition is proven without building the mask; it is
    built only where the layers' form is the dense mask."""
    _begin_forward(kwargs.get("device"))
    defined = _defined_mask(args, kwargs)
    if defined is _BUILD:
        return _layers_mask(prepare_compiled, *args, **kwargs)
    shape = _attention_shape(kwargs.get("config"))
    if defined is None:
        return None
    if shape is None:
        return defined.materialise("the config names no attention shape")
    heads, kv_heads, head_dim = shape
    dtype = _call_dtype(kwargs.get("dtype", torch.float32), defined.device)
    if dtype not in _run.DTYPES:
        return defined.materialise(f"the layers compute in {dtype}")
    expected = (heads, kv_heads, head_dim, head_dim)
    structure = defined.structure
    try:
        policy = _compiled.decide_for_layers(structure, defined, expected, dtype, torch.is_grad_enabled(),
                                             mask_build_ms=_mask_build_ms(defined))
    except _core.MaskError as e:  # no single call computes it: sdpa with the mask, as prepare_compiled gives
        return defined.materialise(f"no single call computes it: {e}")
    form = _compiled.compiled_form(policy, structure, defined, expected)
    if form is defined:
        return defined.materialise(f"the layers' form is the dense mask ({policy.backend})")
    if isinstance(form, CompiledMask):
        form.mask = defined  # for a call the form does not fit: built there (DefinedMask.materialise)
    return form


_mask_outside_graph = _verdicts.outside_graph(
    _mask_outside_graph, "masklens.transformers proves the mask outside the graph (one graph break per forward, which "
                         "fullgraph=True refuses): call masklens.torch.set_one_graph(True) before compiling")


def _mask_in_graph(*args, **kwargs):
    """One graph, no graph break. A composition of transformers' primitives made while
    tracing (masklens._graph_definition: the factories give objects Dynamo reads) is handed
    to an op as its O(B·L) tensors and a spec, read from its definition at run time, and the
    dense mask is built only inside the layers' dense branch; anything else is sdpa_mask
    traced into the graph, its form decided at run time by an op that scans it
    (masklens._one_graph.graph_mask)."""
    if not args and from_definition and not _sdpa_skips(kwargs):
        shape = _attention_shape(kwargs.get("config"))
        if shape is not None:
            heads, kv_heads, head_dim = shape
            dtype = _call_dtype(kwargs.get("dtype", torch.float32), kwargs.get("device", "cpu"))
            gm = _graph_definition.graph_mask_defined(kwargs, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                                      dtype=dtype)
            if gm is not None:
                return gm
    return _layers_mask(graph_mask, *args, **kwargs)


def _graph_read(how, what) -> None:
    """The in-graph op's reading of a definition, noted as the eager path notes its own."""
    global _definitions
    if how == "definition":
        _definitions += 1
    _note(how, what)


def _skip_scan(query, attention_mask) -> bool:
    return (attention_mask is None or query.shape[2] == 1 or torch.compiler.is_compiling()
            or not isinstance(attention_mask, torch.Tensor))


def _gqa(module, query, key, value):
    """(key, value, enable_gqa): GQA through module.num_key_value_groups, expanded as sdpa
    does where the heads do not divide as GQA expects."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1 and key.shape[1] * groups != query.shape[1]:
        return repeat_kv(key, groups), repeat_kv(value, groups), False
    return key, value, groups > 1


def _default_scales(module, head_dim):
    """The scales transformers' attention layers take by default: 1/sqrt(head_dim), and
    1/sqrt(query_pre_attn_scalar) where the config has one (Gemma). One graph takes its
    forms for these (constant_scale); a layer of another scale runs sdpa with the mask."""
    pre = getattr(getattr(module, "config", None), "query_pre_attn_scalar", None)
    return (head_dim ** -0.5,) + ((pre ** -0.5,) if pre else ())


@torch.compiler.disable
def _outcome_outside_graph(mask) -> tuple:
    """DefinedMask.outcome() for a layer compiled on its own (its mask function ran eagerly):
    the wait made outside the layer's graph (one break there), not traced."""
    return mask.outcome()


def masklens_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                               **kwargs):
    """sdpa_attention_forward's contract: query/key/value [B, H, L, D], GQA through
    module.num_key_value_groups, returns (out [B, L, H, Dv], None)."""
    if kwargs.get("s_aux") is not None:
        # Attention sinks (GPT-OSS): a logit per head that sdpa's call has no place for;
        # transformers refuses "sdpa" for such models, so a result without them is wrong.
        raise ValueError("`masklens` attention does not support attention sinks (`s_aux`, as `sdpa`). Try `eager` "
                         "or `flex_attention`")
    # A compiled model's forms fit a call that is sdpa's: no position bias, no softcap.
    sdpa_call = kwargs.get("position_bias") is None and kwargs.get("softcap") is None
    if isinstance(attention_mask, GraphMask):
        # One graph: every form the graph holds, taken at run time by the op's decision.
        scale = constant_scale(scaling, _default_scales(module, attention_mask.expected[2]))
        if sdpa_call and scale is not NotImplemented:
            def sdpa(q, k, v, mask):  # called only without dropout
                return sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=scale,
                                              is_causal=mask is None or is_causal, **kwargs)[0]
            out = attend_graph(attention_mask, query, key, value, sdpa, dropout_p=dropout, scale=scale)
            if out is not None:
                return out, None
        attention_mask = attention_mask.mask
    if isinstance(attention_mask, DefinedMask):
        # The definition's read, waited for here where it was deferred (the stream goes on):
        # None where sdpa_mask too gives none, the dense mask where only the tables' values
        # say it is not read back.
        how, what = attention_mask.outcome() if not torch.compiler.is_compiling() else _outcome_outside_graph(
            attention_mask)
        if how == "none" and not attention_mask.touched:
            attention_mask = None
        elif how == "built":
            attention_mask = attention_mask.materialise(f"its definition is not read back: {what}")
    if isinstance(attention_mask, DefinedMask):
        # Read from its definition: the drop-in's call on its verdict, no dense mask; a
        # mask the model's code used (and may have written) is its dense tensor, scanned.
        if kwargs.get("softcap") is not None:
            raise ValueError("`masklens` attention does not support `softcap` (as `sdpa`). Try `eager` or "
                             "`flex_attention`")
        out = None
        if sdpa_call and not attention_mask.touched and not torch.compiler.is_compiling():
            k, v, enable_gqa = _gqa(module, query, key, value)
            out = _attend_defined(attention_mask, query, k, v, dropout, scaling, enable_gqa)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None
        attention_mask = attention_mask.materialise("the attention call is not one masklens takes")
    if isinstance(attention_mask, CompiledMask):
        # A compiled model's mask, decided outside the graph: traced as it is, or the dense
        # mask where this call is not the one decided for.
        out = None
        if sdpa_call:
            k, v, enable_gqa = _gqa(module, query, key, value)
            out = attend_compiled(attention_mask, query, k, v, dropout_p=dropout, scale=scaling, enable_gqa=enable_gqa)
        if out is not None:
            return out.transpose(1, 2).contiguous(), None
        attention_mask = attention_mask.mask
    if _skip_scan(query, attention_mask) or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if kwargs.get("softcap") is not None:
        raise ValueError("`masklens` attention does not support `softcap` (as `sdpa`). Try `eager` or "
                         "`flex_attention`")
    key, value, enable_gqa = _gqa(module, query, key, value)
    # sdpa's is_causal rule: only without a mask; with one the mask decides (and masklens
    # drops it again where it is plain causal).
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                       enable_gqa=enable_gqa)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Registers "masklens" with AttentionInterface and AttentionMaskInterface. Touches no
    CUDA device: the kernels load at the first forward on one (preload_kernels)."""
    AttentionInterface.register(NAME, masklens_attention_forward)
    AttentionMaskInterface.register(NAME, masklens_mask)
    # One graph reads transformers' compositions while tracing: its factories give objects
    # Dynamo can read there (closures everywhere else: nothing changes outside compile).
    _graph_definition.install()
    _graph_definition.on_read = _graph_read
    _graph_definition.mask_build_ms = _mask_build_ms


register()
