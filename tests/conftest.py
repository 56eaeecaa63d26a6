import os

import pytest
import torch

# Every test gets its own cache dir unless the caller points B12X_CACHE_DIR somewhere on purpose
# (the GPU tests read prebuilt artifacts from it).


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("B12X_CACHE_DIR", str(d))
    return d
