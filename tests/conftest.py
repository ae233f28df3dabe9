"""Fixtures, the xdist thread settings, the collector paused through collection and the CPU suite's hidden
GPUs; the shared helpers are in helpers.py."""
import atexit
import gc
import json
import os
import re
from pathlib import Path

import pytest

# Collection imports torch, transformers and the pipeline: some 800,000 objects that live as
# long as the process. With the collector on, each growth of the heap by a quarter walks them all
# again (seconds per process); so, as `python -m pipeline` does through set-up
# (pipeline/runtime/gc_pause.py), it is paused until collection ends, then what collection made is
# frozen, out of every later collection's walk. At exit everything is frozen again (as the CLI does:
# gc_pause.skip_final_collection): the interpreter's last collections walk nothing, and xdist's
# controller waits for each worker to exit.
gc.disable()
atexit.register(gc.freeze)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers share two cores: one thread each (and for the jobs they launch), or OpenMP's
    # spinning threads fight over the cores and everything runs several times slower
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds each test file took in a 2-worker run on a 2-core machine, written by `make test-durations`
(a full run with --record-durations). `make test` hands whole files to the two workers in
collection order, so the files go longest first: each worker takes the next-longest file when it
frees up and the two end close together (greedy list scheduling). xdist's own order, by test
count, would leave the files with few but slow tests (faults, DeepSpeed, study) for last, and one
worker would sit idle while the other finished them. A file the record does not know yet goes
first, as if it were the longest."""


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test file's seconds to {DURATIONS.name} (the order `make test` runs them in)")


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    unknown = max(seconds.values(), default=0.0) + 1.0
    # stable: a file's own order stays
    items.sort(key=lambda item: -seconds.get(_file_of(item.path), unknown))
    if not re.search(r"(?<!not )\binstall\b", config.getoption("markexpr") or ""):
        # minutes of installing, run by `make test-offline` after `make wheelhouse`
        left_out = [item for item in items if item.get_closest_marker("install")]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if not item.get_closest_marker("install")]


@pytest.hookimpl(hookwrapper=True)  # the old-style wrapper: pytest 7 (the floor) has no wrapper=True
def pytest_collection(session):
    """The collector back on once the tests are collected (at once in xdist's controller, which
    collects nothing), with what collection made frozen."""
    yield
    gc.freeze()
    gc.enable()


_recorded: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Every phase's seconds, per file (on the controller: xdist sends each worker's reports there)."""
    if report.when in ("setup", "call", "teardown"):
        name = _file_of(Path(report.fspath))
        _recorded[name] = _recorded.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    if session.config.getoption("--record-durations") and not os.environ.get("PYTEST_XDIST_WORKER") and _recorded:
        DURATIONS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(_recorded.items())}, indent=1) + "\n")


def _file_of(path: Path) -> str:
    """A test file's path relative to tests/, the record's key."""
    return Path(path).resolve().relative_to(DURATIONS.parent).as_posix()


def pytest_configure(config):
    """bf16 is allowed emulated (precision.EMULATED_BF16_ENV), so no bf16 path depends on the CPU.
    The suite states CPU behaviour: gloo groups of two CPU ranks, RSS, fp16 refused on CPU. On a
    GPU machine its jobs would take the GPU paths instead (two ranks falling back to one visible GPU,
    CUDA memory metrics), so the GPUs are hidden, before anything initializes CUDA, unless the run
    selects the `gpu` tests (`pytest -m gpu`, `make test-gpu`): those, and only those, need them.
    DeepSpeed is told too: its launcher sets CUDA_VISIBLE_DEVICES=0..N-1 for its workers whatever
    its accelerator, which would make the GPUs visible to them again."""
    selects_gpu = re.search(r"(?<!not )\bgpu\b", config.getoption("markexpr") or "")
    if not selects_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["DS_ACCELERATOR"] = "cpu"
    # Every bf16 path runs on every CPU: emulated where the CPU has no bf16 kernels (the users' refusal
    # stays; the tests that state it turn the override off). Subprocesses inherit it.
    from pipeline.runtime.precision import EMULATED_BF16_ENV

    os.environ[EMULATED_BF16_ENV] = "1"


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One generated-sample/tokenizer cache for the whole session (subprocesses inherit it)."""
    cache = tmp_path_factory.mktemp("cache")
    os.environ["PIPELINE_CACHE"] = str(cache)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return cache
