import pytest
import torch
from hypothesis import settings

from tests.support.models import tiny_graph

# 2 busy cores: no per-example deadline.
settings.register_profile("fxquant", deadline=None, max_examples=200, derandomize=True)
settings.load_profile("fxquant")


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Every test starts and ends with the same RNG seed, grad and anomaly modes."""
    torch.manual_seed(0)
    grad, anomaly = torch.is_grad_enabled(), torch.is_anomaly_enabled()
    yield
    assert torch.is_grad_enabled() == grad, "test left grad mode changed"
    assert torch.is_anomaly_enabled() == anomaly, "test left anomaly mode changed"


@pytest.fixture
def graph():
    return tiny_graph()
