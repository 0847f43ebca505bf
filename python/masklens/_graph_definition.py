"""One graph with no dense mask: transformers' mask functions read while tracing.

With one graph on (masklens.torch.set_one_graph(True)) a compiled model's mask function is
traced into the graph. masklens._definition reads a composition of transformers' mask
primitives from its closures, but Dynamo (torch 2.11) cannot read `__closure__` of a
function made inside the traced region, and transformers makes its compositions there
(create_causal_mask & co. call and_masks, padding_mask_function, ... in the forward). What
Dynamo does trace is a plain object: its attributes (strings, ints, tensors) are read and
handed to an op without a graph break.

So, once installed (masklens.transformers.register()), transformers.masking_utils' primitive
factories (looked up through that module's globals by create_*_mask and sdpa_mask) return,
while Dynamo traces with one graph on, a Primitive: a callable object that calls the
factory's own closure (the mask is the same function: vmap, flex's mask_mod and every other
use of it keep working) and carries the primitive's name, parameters and children. Anywhere
else the factories return transformers' closures unchanged.

In the graph the mask function walks that tree (spec_of: a spec string, the O(B·L) tensors,
the ints) and hands it to the op masklens::graph_form_defined, which rebuilds the
composition from transformers' own factories on the host, reads it with
masklens._definition (no [B, 1, Q, K] tensor), decides the layers' call and returns what
graph_form returns: [code, bounds, *BlockMask tensors], of shapes from the sizes alone.
The layers' torch.cond builds the dense mask (transformers' sdpa_mask over the same
composition, rebuilt from the cond's operands) inside its dense branch only: no value of
the graph outside that branch is a [B, 1, Q, K] mask. What the walk does not recognise (a
model's own function, a closure made before install, a tensor offset) takes graph_form's
path: sdpa_mask traced, then scanned; what the op cannot read at run time (padding with
holes, a row of two ranges) answers dense, whose branch builds transformers' mask: never a
wrong result.
"""
from __future__ import annotations

import collections
import functools
import inspect
import sys
import time

import torch
from transformers import masking_utils as _masking_utils

from . import _block_mask, _compiled, _core, _definition, _one_graph, _run
from ._one_graph import BLOCK, GraphMask

# masking_utils' factories read in the graph: (node name, parameter names, each parameter's
# kind: "fns" the *mask_functions of a join, "fn" a wrapped mask function, "tensor", "int").
FACTORIES = {
    "and_masks": ("and", ("mask_functions",), ("fns",)),
    "or_masks": ("or", ("mask_functions",), ("fns",)),
    "sliding_window_overlay": ("sliding", ("sliding_window",), ("int",)),
    "sliding_window_bidirectional_overlay": ("sliding_bidirectional", ("sliding_window",), ("int",)),
    "chunked_overlay": ("chunked", ("chunk_size", "left_padding"), ("int", "tensor")),
    "padding_mask_function": ("padding", ("padding_mask",), ("tensor",)),
    "packed_sequence_mask_function": ("packed", ("packed_sequence_mask",), ("tensor",)),
    "blockwise_overlay": ("blocks", ("block_sequence_ids",), ("tensor",)),
    "remap_positions_for_packed_sequence": ("remap", ("mask_function", "position_ids"), ("fn", "tensor")),
    "add_offsets_to_mask_function": ("offsets", ("mask_function", "q_offset", "kv_offset"), ("fn", "int", "int")),
}
_NODE_FACTORY = {node: attr for attr, (node, _, _) in FACTORIES.items()}
# The two primitives that are plain module functions, recognised by identity.
_LEAVES = {"causal": "causal_mask_function", "bidirectional": "bidirectional_mask_function"}

# How the op's readings are reported: (how, what) as masklens.transformers.masks() lists them
# ("definition", the structure; "built", why), and the build's charge (a stand-in of the
# mask's shape and device -> milliseconds); masklens.transformers sets both.
on_read = None
mask_build_ms = None
# The op's last runs: (host milliseconds, bytes of its outputs) each, for benchmarks (the
# mask's cost per forward and mask kind in one graph).
timings = collections.deque(maxlen=64)


def _mu():
    return _masking_utils  # imported with the module: Dynamo traces no import statement


def original(attr):
    """transformers' own masking_utils.<attr> (the factory behind an installed wrapper)."""
    f = getattr(_mu(), attr)
    return getattr(f, "_masklens_original", f)


def _mask_mod_call(batch_idx, head_idx, q_idx, kv_idx):
    """The signature of a mask function (transformers' inner_mask's)."""


class Primitive:
    """A transformers mask primitive as a callable object: calls `fn` (the closure
    transformers' factory made), and names the node (`name`), its mask-function children,
    tensors and ints (in the factory's parameter order), which Dynamo reads while tracing.

    `__code__` and `__defaults__` are a mask function's signature, as torch's
    create_block_mask reads them to tell a mask_mod from a score_mod (flex_attention's mask
    interface is given these objects too): without them it asks inspect.signature, which
    Dynamo answers with a guard on the object's identity, so a frame starting at
    create_block_mask would compile again at every forward."""

    __code__ = _mask_mod_call.__code__
    __defaults__ = None

    def __init__(self, name, fn, children, tensors, ints):
        self.name = name
        self.fn = fn
        self.children = children
        self.tensors = tensors
        self.ints = ints

    def __call__(self, batch_idx, head_idx, q_idx, kv_idx):
        return self.fn(batch_idx, head_idx, q_idx, kv_idx)

    @property
    def _masklens_closure(self):  # what masklens._definition reads in its place
        return self.fn

    def __repr__(self):
        return f"<masklens Primitive {self.name}>"


def _reading() -> bool:
    """Whether the factories give Primitives: while Dynamo traces, with one graph on."""
    return torch.compiler.is_compiling() and _one_graph.enabled


def _wrapper(attr, factory):
    node, params, kinds = FACTORIES[attr]

    @functools.wraps(factory)
    def made(*args, **kwargs):
        fn = factory(*args, **kwargs)
        if not _reading():
            return fn
        if kinds == ("fns",):
            if kwargs:
                return fn
            return Primitive(node, fn, tuple(args), (), ())
        if len(args) + len(kwargs) != len(params) or any(p not in kwargs for p in params[len(args):]):
            return fn
        values = list(args) + [kwargs[p] for p in params[len(args):]]
        children = tuple(v for v, k in zip(values, kinds) if k == "fn")
        tensors = tuple(v for v, k in zip(values, kinds) if k == "tensor")
        ints = tuple(v for v, k in zip(values, kinds) if k == "int")
        return Primitive(node, fn, children, tensors, ints)
    made._masklens_original = factory
    return made


def install() -> list:
    """Wraps transformers.masking_utils' primitive factories (module globals, where
    create_*_mask and sdpa_mask look them up) so that, while Dynamo traces with one graph
    on, they return Primitives. A factory whose parameters are not the ones read here (another
    transformers) is left as it is: its masks take graph_form's path. Idempotent; the
    factories wrapped, by name."""
    mu = _mu()
    wrapped = []
    for attr, (_, params, kinds) in FACTORIES.items():
        factory = getattr(mu, attr, None)
        if factory is None:
            continue
        if hasattr(factory, "_masklens_original"):
            wrapped.append(attr)
            continue
        try:
            found = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            continue
        if kinds == ("fns",):
            ok = [p.kind for p in found.values()] == [inspect.Parameter.VAR_POSITIONAL]
        else:
            ok = tuple(found) == params
        if ok:
            setattr(mu, attr, _wrapper(attr, factory))
            wrapped.append(attr)
    rebind_imported()
    return wrapped


def rebind_imported() -> list:
    """Points the model modules that imported a factory by name (Gemma3's and Gemma4's
    `from ...masking_utils import sliding_window_overlay`) at its wrapper, as
    masking_utils' own name is: a name bound before install() still holds transformers'
    factory, whose closures Dynamo cannot read. Covers the transformers modules imported
    now; install() and masklens.torch.set_one_graph(True) run it. The (module, name) pairs
    rebound."""
    mu = _mu()
    wrappers = {id(w._masklens_original): w for w in (getattr(mu, attr, None) for attr in FACTORIES)
                if w is not None and hasattr(w, "_masklens_original")}
    rebound = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformers.models.") or module is None:
            continue
        for attr in FACTORIES:
            value = getattr(module, attr, None)
            if value is not None and id(value) in wrappers:
                setattr(module, attr, wrappers[id(value)])
                rebound.append((name, attr))
    return rebound


def _is_int(x) -> bool:
    return not isinstance(x, (bool, torch.Tensor)) and isinstance(x, (int, torch.SymInt))


def spec_of(fn, tensors, ints):
    """The spec of a mask function made of Primitives and the two leaf functions, e.g.
    "and(remap(causal()),packed())", its tensors and ints appended (each node's children's
    first, then its own); None where a node is not one (traced: no closure is read)."""
    mu = _mu()
    for name, attr in _LEAVES.items():
        if fn is getattr(mu, attr):
            return name + "()"
    if not isinstance(fn, Primitive):
        return None
    parts = []
    for child in fn.children:
        part = spec_of(child, tensors, ints)
        if part is None:
            return None
        parts.append(part)
    for t in fn.tensors:
        if not isinstance(t, torch.Tensor):
            return None
        tensors.append(t)
    for i in fn.ints:
        if not _is_int(i):
            return None
        ints.append(i)
    return fn.name + "(" + ",".join(parts) + ")"


def compose(spec: str, tensors, ints):
    """The mask function of a spec, made by transformers' own factories over `tensors` and
    `ints` (spec_of's order): the function sdpa_mask was given, rebuilt. Runs on the host in
    the op and traced in the dense branch (no closure is read, only made and called)."""
    t, i = list(tensors), list(ints)
    at = [0]

    def node():
        start = at[0]
        while spec[at[0]] != "(":
            at[0] += 1
        name = spec[start:at[0]]
        at[0] += 1
        children = []
        while spec[at[0]] != ")":
            children.append(node())
            if spec[at[0]] == ",":
                at[0] += 1
        at[0] += 1
        if name in _LEAVES:
            return original(_LEAVES[name])
        attr = _NODE_FACTORY[name]
        _, _, kinds = FACTORIES[attr]
        if kinds == ("fns",):
            return original(attr)(*children)
        args, c = [], iter(children)
        for kind in kinds:
            if kind == "fn":
                args.append(next(c))
            elif kind == "tensor":
                args.append(t.pop(0))
            else:
                args.append(i.pop(0))
        return original(attr)(*args)
    fn = node()
    if at[0] != len(spec) or t or i:
        raise ValueError(f"spec {spec!r} does not use its {len(t)} tensors and {len(i)} ints as given")
    return fn


def _note(how, what) -> None:
    if on_read is not None:
        on_read(how, what)


@torch.library.custom_op("masklens::graph_form_defined", mutates_args=(), tags=_one_graph._HOST_WORK)
def graph_form_defined(tensors: list[torch.Tensor], attention_mask: torch.Tensor | None, spec: str, ints: list[int],
                       batch: int, q_length: int, kv_length: int, q_offset: int, kv_offset: int, heads: int,
                       kv_heads: int, head_dim: int, head_dim_v: int, dtype: torch.dtype, training: bool, forms: int,
                       device: torch.device) -> list[torch.Tensor]:
    """graph_form's answer ([code, bounds [B, 1, Q, 2] int64, the BlockMask's eight int32
    tensors [B, 1, ...]]) for the mask sdpa_mask would build from these arguments (its own,
    with the composition as `spec` over `tensors` and `ints`, compose()), read from its
    definition on the host (masklens._definition): no dense mask is an input or made.
    Where the definition cannot be read (padding with holes, a row of two ranges, a
    primitive whose rule is off) the answer is dense: the layers' dense branch builds
    transformers' mask."""
    start = time.perf_counter()
    B, Q, K = batch, q_length, kv_length
    device = torch.device(device)
    form, definition = "dense", None
    try:
        fn = compose(spec, tensors, ints)
        definition = _definition.recognise(batch_size=B, q_length=Q, kv_length=K, q_offset=q_offset,
                                           kv_offset=kv_offset, mask_function=fn, attention_mask=attention_mask,
                                           device=device)
        structure = definition.verdict.structure
        _note("definition", structure.describe())
        stand_in = torch.zeros((), dtype=torch.bool, device=device).expand(B, 1, Q, K)
        build_ms = mask_build_ms(stand_in) if mask_build_ms is not None else 0.0
        policy = _compiled.decide_for_layers(structure, stand_in, (heads, kv_heads, head_dim, head_dim_v), dtype,
                                             training, batch=B, mask_build_ms=build_ms)
        form = _one_graph.layers_form(policy, structure, Q, K)
    except _definition.Unrecognised as e:
        _note("built", str(e))
        form = "dense"
    except _core.MaskError:  # no single call computes it: sdpa with transformers' mask
        form = "dense"
    # The FlexAttention form's BlockMask written from the structure (no mask read), [B' or 1, 1, ...].
    out = _one_graph.answer(form, forms, (B, 1, Q, K), device, lambda: (
        definition.bounds(), _block_mask.structure_arrays(definition.verdict.structure, (BLOCK, BLOCK), device)[0]))
    timings.append(((time.perf_counter() - start) * 1e3, sum(t.untyped_storage().nbytes() for t in out[1:])))
    return out


# Its answer may be read by no layer (dropout, Q != K before the flex branch) and is still
# a request for the flex branch: the graph's dead-code pass must keep it.
torch.fx.node.has_side_effect(torch.ops.masklens.graph_form_defined.default)


@graph_form_defined.register_fake
def _graph_form_defined_fake(tensors, attention_mask, spec, ints, batch, q_length, kv_length, q_offset, kv_offset,
                             heads, kv_heads, head_dim, head_dim_v, dtype, training, forms, device):
    B, Q, K = batch, q_length, kv_length
    return [torch.empty((), dtype=torch.int64, device="cpu"),
            torch.empty((B, 1, Q, 2), dtype=torch.int64, device=device),
            *(torch.empty(shape, dtype=torch.int32, device=device) for shape in _one_graph._field_shapes(B, 1, Q, K))]


# sdpa_mask's arguments read here; any other (a mask function's own) sends the mask to
# graph_form's path.
_READ_ARGUMENTS = {"batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function", "attention_mask",
                   "device"} | _definition._NEUTRAL_ARGUMENTS


def graph_mask_defined(kwargs, *, heads, kv_heads, head_dim, head_dim_v=None, dtype=torch.float32, training=None):
    """In a traced graph: a GraphMask for sdpa_mask's keyword arguments `kwargs` whose
    composition is made of Primitives (spec_of), its form decided at run time by
    masklens::graph_form_defined from the O(B·L) tensors, the dense mask made only inside
    the layers' dense branch (GraphMask.build_mask); None where the composition or an
    argument is not read here (the caller traces sdpa_mask and graph_form instead)."""
    if set(kwargs) - _READ_ARGUMENTS or dtype not in _run.DTYPES:
        return None
    B, Q, K = kwargs.get("batch_size"), kwargs.get("q_length"), kwargs.get("kv_length")
    qo, ko = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    if not all(_is_int(x) for x in (B, Q, K, qo, ko)):
        return None
    device = torch.device(kwargs.get("device", "cpu"))
    if device.type not in ("cpu", "cuda"):
        return None
    attention_mask = kwargs.get("attention_mask")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2
                                       or attention_mask.dtype != torch.bool):
        return None
    fn = kwargs.get("mask_function")
    tensors, ints = [], []
    spec = spec_of(original("causal_mask_function") if fn is None else fn, tensors, ints)
    if spec is None or any(t.dim() not in (1, 2) or t.requires_grad for t in tensors):
        return None
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    training = torch.is_grad_enabled() if training is None else training
    forms = _one_graph.graph_forms
    code, bounds, *arrays = torch.ops.masklens.graph_form_defined(
        tensors, attention_mask, spec, ints, B, Q, K, qo, ko, heads, kv_heads, head_dim, head_dim_v, dtype, training,
        forms, device)
    n = len(tensors)
    operands = (*tensors, attention_mask) if attention_mask is not None else tuple(tensors)

    def build(*ops):
        # transformers' own mask over the same composition, rebuilt from these operands
        # (in the dense branch, the cond's own inputs): exactly what sdpa_mask gives.
        mask_function = compose(spec, ops[:n], ints)
        return original("sdpa_mask")(batch_size=B, q_length=Q, kv_length=K, q_offset=qo, kv_offset=ko,
                                     mask_function=mask_function, attention_mask=ops[n] if len(ops) > n else None,
                                     allow_is_causal_skip=False, allow_is_bidirectional_skip=False, use_vmap=False,
                                     device=device)
    return GraphMask(None, code, bounds, arrays, (heads, kv_heads, head_dim, head_dim_v), forms, shape=(B, 1, Q, K),
                     mask_operands=operands, build_mask=build)
