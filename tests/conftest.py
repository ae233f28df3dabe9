"""Fixtures, the xdist thread settings and the CPU suite's hidden GPUs; the shared helpers are in helpers.py."""
import os
import re

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers share two cores: one thread each (and for the jobs they launch), or OpenMP's
    # spinning threads fight over the cores and everything runs several times slower
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


SLOWEST_FIRST = ("test_faults.py", "test_deepspeed.py", "test_study.py", "test_tracking.py", "test_task_wikiqa.py",
                 "test_distill.py", "test_model_families.py", "test_fallback.py", "test_served_model.py",
                 "test_task_qa.py", "test_task_ner.py", "test_train.py", "test_compile.py", "test_features.py",
                 "test_ddp.py", "test_lock.py")
"""Test files, slowest first, by their time in a 2-worker run on a 2-core machine (237 s down to
27 s); the rest take seconds. `make test` hands whole files to the two workers in collection order,
so each worker takes the next-longest file when it frees up and the two end close together (greedy
list scheduling). xdist's own order, by test count, would leave the files with few but slow tests
(faults, DeepSpeed, study) for last, and one worker would sit idle while the other finished them."""


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order stays
    if not re.search(r"(?<!not )\binstall\b", config.getoption("markexpr") or ""):
        # minutes of installing, run by `make test-offline` after `make wheelhouse`
        left_out = [item for item in items if item.get_closest_marker("install")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("install")]


def pytest_configure(config):
    """The suite states CPU behaviour: gloo groups of two CPU ranks, RSS, fp16 refused on CPU. On a
    GPU machine its jobs would take the GPU paths instead (two ranks falling back to one visible GPU,
    CUDA memory metrics), so the GPUs are hidden, before anything initializes CUDA, unless the run
    selects the `gpu` tests (`pytest -m gpu`, `make test-gpu`): those, and only those, need them.
    DeepSpeed is told too: its launcher sets CUDA_VISIBLE_DEVICES=0..N-1 for its workers whatever
    its accelerator, which would make the GPUs visible to them again."""
    selects_gpu = re.search(r"(?<!not )\bgpu\b", config.getoption("markexpr") or "")
    if not selects_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["DS_ACCELERATOR"] = "cpu"


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One generated-sample/tokenizer cache for the whole session (subprocesses inherit it)."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["PIPELINE_CACHE"] = str(cache)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return cache
