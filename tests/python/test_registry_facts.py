"""The Python runtime reads backend facts from the registry's rows (_core.backends(),
_core.families()), not from backend names: every backend the drop-in may choose on any
machine has a runner, each family's version keyword is accepted, and the compiled forms
and FlexAttention's compile charge follow the rows' work model."""
import pytest
import torch

import masklens
from masklens import _compiled, _core, _env, _flex, _one_graph, _registry, _run


def families_that_come_with_torch(families) -> set:
    """The families of the torch host with no library of their own, from the binding's rows."""
    return {f["name"] for f in families if f["host"] == "torch" and f["python_module"] is None}


def backends_without_runner(backends, families, runners) -> list:
    """The backends of families that come with torch that `runners` cannot run: decide()
    may choose them wherever torch runs, so each would raise in a user's forward."""
    always = families_that_come_with_torch(families)
    return [b["name"] for b in backends if b["family"] in always and b["name"] not in runners]


def test_every_backend_of_a_family_that_comes_with_torch_has_a_runner():
    families, backends = _core.families(), _core.backends()
    always = families_that_come_with_torch(families)
    assert "torch" in always  # the default Environment's family
    assert {f["name"] for f in families if f["default_available"]} <= always
    assert any(b["family"] in always for b in backends)
    assert backends_without_runner(backends, families, _run.RUNNERS) == []
    assert always <= _env.RUNNABLE


def test_a_new_row_of_such_a_family_without_a_runner_is_caught():
    families = _core.families()
    (torch_family,) = [f["name"] for f in families if f["default_available"]]
    new_row = {"name": "torch.sdpa.new_kernel", "family": torch_family, "work": "attended"}
    assert backends_without_runner([*_core.backends(), new_row], families, _run.RUNNERS) == ["torch.sdpa.new_kernel"]
    assert _registry.comes_with_torch(torch_family)


def test_the_registry_module_agrees_with_the_binding():
    names = [b["name"] for b in _core.backends()
             if b["family"] in families_that_come_with_torch(_core.families())]
    assert _registry.backends_of_families_with_torch() == names
    assert _registry.version_fields() == tuple(f["version_field"] for f in _core.families() if f["version_field"])
    flex_rows = [b for b in _core.backends() if b["work"] == "flex_tiles"]
    assert flex_rows and all(_registry.computes_flex_tiles(b["name"]) for b in flex_rows)
    assert not any(_registry.computes_flex_tiles(b["name"]) for b in _core.backends() if b["work"] != "flex_tiles")
    assert not _registry.computes_flex_tiles("zeros")  # a plan step, no row


def test_families_of_another_host_never_enter_the_drop_in_environment():
    others = {f["name"] for f in _core.families() if f["host"] != "torch"}
    assert others  # masklens.jax's family
    assert not others & set(_env.environment("cpu", runnable_only=True).available)
    assert not others & set(_env.installed_families())


@pytest.mark.parametrize("field", [f["version_field"] for f in _core.families() if f["version_field"]])
def test_every_family_version_is_an_inspect_keyword(field):
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    report = masklens.inspect(causal, **{field: "1.2.3"})
    assert getattr(report.environment, field) == "1.2.3"


def test_an_unknown_environment_keyword_is_refused():
    with pytest.raises(TypeError, match="unknown keyword"):
        masklens.inspect(torch.ones(4, 4, dtype=torch.bool), not_a_library="1.0")


def decided(mask, **env):
    """inspect() of a [1, 2, L, L] bfloat16 call over `mask` on an sm90 GPU's tables."""
    L = mask.shape[-1]
    q = torch.randn(1, 2, L, 64, dtype=torch.bfloat16)
    return masklens.inspect(mask, q, q, q, sm=90, flash_attn="2.8.3", **env)


def form_of(report):
    L = report.structure.q_len
    return _compiled.decided_form(report.policy, report.structure, L, L)


def test_compiled_forms_follow_the_rows():
    """A compiled layer's form comes from the decided backend's row and arguments: sdpa's
    is_causal, a flex-tile backend's BlockMask, torch's own varlen kernel; another
    library's varlen kernel keeps the dense mask (the forms call torch's functions)."""
    i = torch.arange(1024)
    causal = i[None, :] <= i[:, None]
    docs = (i[:, None] // 128 == i[None, :] // 128) & causal
    prefix = causal | (i[None, :] < 300)

    plain = decided(causal, available={"torch"})
    assert plain.policy.call.args.type == "sdpa" and form_of(plain) == "causal"

    flex = decided(prefix, available={"torch", "flex"})
    assert _registry.work_model(flex.policy.backend) == "flex_tiles" and form_of(flex) == "flex"

    packed = decided(docs, available={"torch", "flex"})
    assert _registry.torch_backend(packed.policy.backend) and packed.policy.call.args.type == "varlen"
    assert form_of(packed) == "varlen"

    other_library = decided(docs, available={"flash_attn"})
    assert not _registry.torch_backend(other_library.policy.backend)
    assert other_library.policy.call.args.type == "varlen" and form_of(other_library) == "dense"


def test_flex_is_recognised_by_its_work_model():
    """FlexAttention's compile charge, the forgone saving and the one-graph branch ask
    the row's work model: an environment without a flex-tile family charges nothing."""
    i = torch.arange(64)
    causal = i[None, :] <= i[:, None]
    q = torch.randn(1, 2, 64, 32)
    no_flex = set(f["name"] for f in _core.families() if f["default_available"])
    env = _env.environment("cpu", available=no_flex)
    assert _flex.flex_compile_charge(None, q, q, q, env) == (0.0, None)
    report = decided(causal, available=no_flex | _registry.flex_tile_families())
    flex_rejections = [r for r in report.rejected if _registry.computes_flex_tiles(r.backend)]
    chose_flex = _registry.computes_flex_tiles(report.policy.backend)
    assert chose_flex or flex_rejections
    assert _one_graph._flex_fits(report.policy) == (chose_flex or any(r.kind == "slower" for r in flex_rejections))
