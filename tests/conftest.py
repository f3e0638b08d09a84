import relbench  # noqa: F401  (before torch: sets the OpenMP wait policy torch reads when it loads)
import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    """Every test uses a private token cache, fixed threads and a fixed seed."""
    monkeypatch.setenv("RELBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    torch.manual_seed(0)
