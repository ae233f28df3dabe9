"""Fixtures and the xdist thread settings; the shared helpers are in helpers.py."""
import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers share two cores: one thread each (and for the jobs they launch), or OpenMP's
    # spinning threads fight over the cores and everything runs several times slower
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One generated-sample/tokenizer cache for the whole session (subprocesses inherit it)."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["PIPELINE_CACHE"] = str(cache)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return cache
