import relbench  # noqa: F401  (before torch: sets the OpenMP wait policy torch reads when it loads)

# isort: split
import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """Every test uses a private token cache, fixed threads and a fixed seed."""
    monkeypatch.setenv("RELBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    torch.manual_seed(0)


@pytest.fixture
def merges(monkeypatch):
    """The log-sum-exp merges the split paths make: the shape of the near output of each `_merge` call."""
    calls = []
    from relbench.attention import fused as fused_module

    original = fused_module._merge
    monkeypatch.setattr(fused_module, "_merge", lambda *a, **kw: calls.append(tuple(a[0].shape)) or original(*a, **kw))
    return calls
