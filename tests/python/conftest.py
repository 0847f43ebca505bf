"""pytest setup for the Python package: tests run against the installed package, or
against a build tree when MASKLENS_PYTHONPATH names it (the Meson test does)."""
import os
import sys

path = os.environ.get("MASKLENS_PYTHONPATH")
if path:
    sys.path.insert(0, path)

import pytest  # noqa: E402

torch = pytest.importorskip("torch")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    # Inductor's CPU kernels are sized for the thread count of their compile, which torch
    # 2.11's cache key does not hold (pytorch/pytorch#167463): a kernel cached by a run on
    # one thread (OMP_NUM_THREADS=1) is loaded by a run on two and writes past its
    # buffers. Pinned, the count is in the key of every compile the tests make (masklens'
    # own buckets pin it themselves: masklens._flex.device_key).
    from torch._inductor import config as inductor_config
    inductor_config.cpp.threads = torch.get_num_threads()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gpu_environment(monkeypatch):
    """The compiled path decides as on an H100 with the given families (on CPU tensors):
    the FlexAttention and varlen forms are then traced on the CPU."""
    import masklens
    import masklens.torch as mt
    real = masklens.environment

    def use(available):
        monkeypatch.setattr(mt._env, "environment",
                            lambda device=None, runnable_only=False, **kw: real("cpu", sm=90, available=available))
    return use


@pytest.fixture
def one_graph_mode(monkeypatch):
    """One graph on, graph_forms and forms_taken fresh (restored after), Dynamo reset."""
    import collections

    import torch
    import masklens._one_graph as one_graph
    monkeypatch.setattr(one_graph, "enabled", True)
    monkeypatch.setattr(one_graph, "graph_forms", one_graph.DEFAULT_FORMS)
    monkeypatch.setattr(one_graph, "forms_taken", collections.Counter())
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
