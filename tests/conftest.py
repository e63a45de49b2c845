import os
import sys
from pathlib import Path

import pytest

DISTS = Path(__file__).parent / "dists"
# nothing here may reach the hub (the trainers' tests build their models in code): set before they import it
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def test_dists(monkeypatch):
    """Put the test-only distribution (real ``*.dist-info`` with entry points) on ``sys.path``."""
    monkeypatch.syspath_prepend(str(DISTS))
    yield DISTS
    for name in [module for module in sys.modules if module.startswith("mmrope_test_")]:
        del sys.modules[name]


@pytest.fixture
def make_manager(test_dists):
    """A fresh plugin manager reading the real entry points, with the environment given."""
    from mmrope_core import PluginManager

    def make(**env):
        return PluginManager(env={**os.environ, **env})

    return make


@pytest.fixture
def toy_manager(make_manager):
    """Only the well-behaved test plugin (and whatever else the environment installs)."""
    return make_manager(MMROPE_DISABLE_PLUGINS="broken_import,raises,blocked,conflict_a,conflict_b,unknown_hook,nonconforming")
