import os

import pytest
import torch

# Ray reads these when it starts a node: listen on 127.0.0.1 only, no token file, no usage report.
# Set before any test imports verl (which imports ray).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

torch.set_num_threads(1)  # two cores, shared with Ray's workers


def pytest_configure(config):
    # ray warns on import (verl imports ray.experimental's state API)
    config.addinivalue_line("filterwarnings", "ignore:Ray state API is no longer experimental:DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:ray.data.context")  # Ray Data's own settings
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:audioread.rawread")  # librosa's audio reader


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """``checkpoint(name)``: a directory holding family ``name``'s saved processor and config."""
    from cases import save

    saved = {}

    def directory(name):
        if name not in saved:
            saved[name] = save(name, tmp_path_factory.mktemp(name.replace(".", "_")))
        return saved[name]

    return directory
