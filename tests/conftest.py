import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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


def write_file(tmp_path, content, name):
    """A data file for reader tests: text as UTF-8, bytes as they are (to test bad encodings)."""
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def written_twice(task, tmp_path) -> dict:
    """The task's sample files, written twice into fresh folders: asserts both are byte-identical
    (the generators are deterministic) and returns the first set, split -> path."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = task.write_samples(tmp_path / "a"), task.write_samples(tmp_path / "b")
    assert set(a) == {"train", "dev", "test"}
    for split in a:
        assert a[split].read_bytes() == b[split].read_bytes()
    return a


def run_cli(*args, cwd=None, env=None, timeout=600):
    """`python -m pipeline ...` in a fresh process; returns CompletedProcess (text)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def torchrun(nproc, *args, env=None, timeout=600):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "pipeline", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def mlflow_runs(db: Path, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


# a fast job: tiny model, short sequences; overridden per test
FAST = ["model=preset:bangla-tiny", "train.max_length=48", "train.batch_size=32", "train.lr=1e-3",
        "tracking.system_metrics=false"]
