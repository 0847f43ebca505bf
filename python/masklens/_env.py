"""The Environment masklens decides for: the GPU, torch, cuDNN and the attention
libraries that are installed, read once per device."""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util

from . import _core
from ._core import Environment, MaskError


def set_field(target, where: str, name: str, value) -> None:
    """target.name = value for an AttentionCall or Environment field given by keyword; a
    value the binding cannot hold (an integer past 64 bits, a wrong type) is a MaskError
    naming the field, as validate() names one out of range, where nanobind would list
    the setter's signatures."""
    try:
        setattr(target, name, value)
    except TypeError:
        raise MaskError(f"invalid_argument: {where}.{name} cannot be {value!r} ({type(value).__name__}); "
                        f"validate() gives each field's range") from None

# The families (families.hpp kFamilies, one table for the CLI, the binding and this module):
# the installable ones as {name: (module that must import, distributions whose metadata
# carry the version, first installed wins)}, and each one's Environment version field.
_FAMILY_ROWS = _core.families()
_FAMILIES = {f["name"]: (f["python_module"], tuple(f["distributions"])) for f in _FAMILY_ROWS if f["python_module"]}
_VERSION_FIELDS = {f["name"]: f["version_field"] for f in _FAMILY_ROWS if f["version_field"]}
# The families every Environment holds (a default Environment's available: torch's own).
_DEFAULT_FAMILIES = frozenset(f["name"] for f in _FAMILY_ROWS if f["default_available"])

# The families whose calls masklens.torch runs itself (docs/python.md): every backend of
# the family has a runner; the others are reported by inspect() but never chosen by the
# drop-in. masklens._run sets it from its runners when it is imported (set_runnable),
# before anything asks for a runnable_only environment (masklens.torch imports it).
RUNNABLE = _DEFAULT_FAMILIES


def set_runnable(backends_run) -> None:
    """The runnable families from the names of the backends masklens.torch runs: a family
    is runnable where each of its backends is among them (decide() may choose any)."""
    global RUNNABLE
    run = set(backends_run)
    rows = _core.backends()
    RUNNABLE = frozenset(f for f in {b["family"] for b in rows}
                         if all(b["name"] in run for b in rows if b["family"] == f))
    _environment_for.cache_clear()

# An sm below every GPU kernel's minimum: on the CPU only torch's math kernel (and
# plans of it) remain, which is what runs there.
CPU_SM = 10


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=None)
def installed_families() -> dict[str, str]:
    """{family: version} for the optional libraries that can be imported (metadata only:
    importing TransformerEngine or FlashInfer takes seconds)."""
    found = {}
    for family, (module, dists) in _FAMILIES.items():
        if not _find(module):
            continue
        version = None
        for d in dists:
            try:
                version = importlib.metadata.version(d)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        found[family] = version or "0"
    return found


def _torch_version(torch) -> str:
    return torch.__version__.split("+")[0]


def cudnn_version_text(v) -> str | None:
    """cuDNN's version number as its text (91900 -> 9.19.0; before 9: 8907 -> 8.9.7);
    None for none (0 or None)."""
    if not v:
        return None
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def _cudnn_version(torch) -> str | None:
    try:
        v = torch.backends.cudnn.version()
    except Exception:  # a torch built without cuDNN
        return None
    return cudnn_version_text(v)


@functools.lru_cache(maxsize=None)
def _environment_for(device_type: str, index: int | None, runnable_only: bool) -> tuple:
    import torch

    fields = {"torch": _torch_version(torch), "cudnn": _cudnn_version(torch)}
    if device_type == "cuda":
        major, minor = torch.cuda.get_device_capability(index)
        fields["sm"] = major * 10 + minor
        available = set(_DEFAULT_FAMILIES)
        # FlexAttention comes with torch (no module of its own in its family row) but
        # compiles through Triton: found by torch's flex module and Triton, a probe of
        # that family alone.
        if _find("torch.nn.attention.flex_attention") and _find("triton"):
            available.add("flex")
        for family, version in installed_families().items():
            if runnable_only and family not in RUNNABLE:
                continue
            available.add(family)
            if family in _VERSION_FIELDS:  # a library with a version of its own
                fields[_VERSION_FIELDS[family]] = version
    else:
        fields["sm"] = CPU_SM
        available = set(_DEFAULT_FAMILIES)
    fields["available"] = available
    return tuple(sorted((k, frozenset(v) if isinstance(v, set) else v) for k, v in fields.items()))


def environment(device=None, runnable_only: bool = False, **overrides) -> Environment:
    """The Environment of `device` (a torch.device, a tensor's device, or None for the
    current CUDA device when there is one, else the CPU), with keyword overrides."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None:
        env = Environment()
    else:
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        device = torch.device(device)
        index = None
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
        env = Environment()
        for key, value in _environment_for(device.type if device.type == "cuda" else "cpu", index, runnable_only):
            setattr(env, key, set(value) if isinstance(value, frozenset) else value)
    for key, value in overrides.items():
        if key == "available" and isinstance(value, str):
            value = set(value.split(","))
        set_field(env, "environment", key, value)
    env.validate()
    return env


_strict = False


def set_strict(on: bool = True) -> None:
    """strict: raise where only a kernel with a known defect would run the mask, instead
    of falling back to torch's own dispatch (masklens.torch, masklens.transformers)."""
    global _strict
    _strict = bool(on)


def strict() -> bool:
    return _strict
