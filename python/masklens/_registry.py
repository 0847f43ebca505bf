"""The backend registry (backends/registry.hpp) and the families (families.hpp kFamilies) as
the Python runtime asks about them. decide() judges backends by their rows; the runtime
reads the same rows here rather than knowing backends by name: which backend computes
whole tiles of a BlockMask (FlexAttention's work model), which families come with torch,
which Environment fields hold a family's version. Only the runners' table
(masklens._run.RUNNERS) names backends: it says how each one is run."""
from __future__ import annotations

from . import _core

# The host this package's torch side decides for (kFamilies' host): masklens.torch and
# masklens.inspect; masklens.jax decides for the "jax" host alone.
TORCH_HOST = "torch"

FAMILIES = {f["name"]: f for f in _core.families()}
BACKENDS = {b["name"]: b for b in _core.backends()}


def work_model(backend: str) -> str | None:
    """What the backend's cost rates multiply ("attended", "every_pair" or "flex_tiles");
    None for a name the registry has no row for (a plan's "zeros" step)."""
    row = BACKENDS.get(backend)
    return row["work"] if row is not None else None


def computes_flex_tiles(backend: str) -> bool:
    """Whether the backend computes whole tiles of a BlockMask (FlexAttention): the calls
    that compile first, take a BlockMask and fit the one-graph FlexAttention branch."""
    return work_model(backend) == "flex_tiles"


def flex_tile_families() -> frozenset:
    """The families whose backends compute BlockMask tiles."""
    return frozenset(b["family"] for b in BACKENDS.values() if b["work"] == "flex_tiles")


def family_of(backend: str) -> str | None:
    row = BACKENDS.get(backend)
    return row["family"] if row is not None else None


def host_of(backend: str) -> str | None:
    """The host that decides for the backend's family ("torch", "jax"); None for a name the
    registry has no row for."""
    family = family_of(backend)
    return FAMILIES[family]["host"] if family in FAMILIES else None


def comes_with_torch(family: str) -> bool:
    """Whether the family is of the torch host and has no library of its own to install
    (torch's own kernels, FlexAttention): the drop-in may choose its backends wherever
    torch runs, so each of them needs a runner."""
    f = FAMILIES.get(family)
    return f is not None and f["host"] == TORCH_HOST and f["python_module"] is None


def torch_backend(backend: str) -> bool:
    """Whether the backend's family comes with torch: a call a compiled graph can make
    through torch's own functions (no other library in the graph)."""
    family = family_of(backend)
    return family is not None and comes_with_torch(family)


def backends_of_families_with_torch() -> list[str]:
    """Every backend of a family that comes with torch, in registry order."""
    return [name for name, b in BACKENDS.items() if comes_with_torch(b["family"])]


def version_fields() -> tuple[str, ...]:
    """The Environment fields that hold a family's library version, in kFamilies order
    (every host's: masklens.inspect accepts each as a keyword)."""
    return tuple(f["version_field"] for f in FAMILIES.values() if f["version_field"])
