"""Helpers shared by the test files: sample data files, the pipeline's launchers in fresh
processes (the CLI, torchrun, the deepspeed launcher), MLflow look-ups and result comparisons.

Test files import them as `from helpers import ...` (tests/ is on pytest's pythonpath);
fixtures stay in conftest.py.
"""
import atexit
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from pipeline import names

ROOT = Path(__file__).resolve().parents[1]
DEEPSPEED = [sys.executable, "-m", "deepspeed.launcher.runner"]
"""The deepspeed launcher by its module: its script is absent where packages went in with --target."""

# a fast job: tiny model, short sequences; overridden per test
FAST = ["model=preset:bangla-tiny", "train.max_length=48", "train.batch_size=32", "train.lr=1e-3",
        "tracking.system_metrics=false", "infer.bench=false"]


def settled_config(cfg, model_spec: str, task, device: str = "cpu"):
    """`cfg` settled as a one-process job on `device` settles it, for `model_spec` and `task`."""
    from pipeline.job.plan import settle_config
    from pipeline.runtime import compiler

    return settle_config(cfg, model_spec, task, device, compiler.resolve(cfg.train.compile, device, "single"))


def settled_train(*overrides: str, device: str = "cpu"):
    """A train section settled as a job on `device` settles it (the backends take only that)."""
    from pipeline.config import load_config
    from pipeline.tasks import get_task

    cfg = load_config(None, list(overrides))
    return settled_config(cfg, cfg.model or "preset:bangla-tiny", get_task(cfg.task), device).train


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


# what a launcher sets: a CLI process started by a test is a user's plain command, and must not
# inherit the variables of an in-process DeepSpeed group that a module fixture holds open
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_cli(*args, cwd=None, env=None, timeout=600):
    """`python -m pipeline ...` in a fresh process; returns CompletedProcess (text)."""
    full_env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}, **(env or {})}
    return subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], cwd=cwd or ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def torchrun(nproc, *args, env=None, timeout=600):
    """`torchrun --standalone` of the pipeline with nproc local workers; returns CompletedProcess (text)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "pipeline", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def deepspeed(*args, log=None, wait=True):
    """The pipeline under the real deepspeed launcher, two workers (on the CPU in the CPU suite), in
    its own session (so a kill reaches all of it). wait=True: (exit code, output); wait=False: the
    Popen (output to log)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()), "--module", "pipeline", *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w") if log else subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=900)
    return proc.returncode, out or ""


def free_port():
    """A local TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout=300, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@functools.cache
def _migrated_store() -> Path:
    """A store MLflow created and migrated, once per test process (removed at its exit)."""
    from mlflow.tracking import MlflowClient

    folder = tempfile.mkdtemp(prefix="mlflow-store-")
    atexit.register(shutil.rmtree, folder, True)
    template = Path(folder) / "template.db"
    MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()  # creates and migrates
    return template


def tracking_db(directory: Path, name: str = "m.db") -> Path:
    """A SQLite tracking store at directory/name that already holds MLflow's tables: a copy of a
    store MLflow created and migrated once in this test process. A brand-new store runs MLflow's
    schema migrations in the first process that opens it (~6 s of CPU, in most training tests);
    the copy is what a user's store is after its first run. Tests of a brand-new store, and of bad
    input (which must leave no store behind), use a plain path."""
    path = Path(directory) / name
    if not path.exists():  # a second call for the same store returns it as it is
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_store(), path)
    return path


def mlflow_runs(db: Path, experiment: str):
    """Every run of the experiment in the SQLite tracking store db ([] if there is no such experiment)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def bench_module(name: str):
    """benchmarks/NAME.py imported as a module (benchmarks/ is not a package: its scripts run from
    their folder), for the tests of what only the benchmarks use."""
    import importlib.util

    key = f"benchmarks_{name}"  # apart from installed packages of the same name (transformers pulls in `kernels`)
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[key]


def ddp_syncs_buffers_every_forward(ddp) -> bool:
    """Whether a DistributedDataParallel broadcasts buffers before each forward: on torch 2.11 its
    `broadcast_buffers` attribute (torch/nn/parallel/distributed.py, line 799), on 2.13 a property
    reading `forward_sync_buffers` (the same file, lines 1157-1163)."""
    return bool(ddp.broadcast_buffers)


def assert_same_result(a, b, tol=1e-6):
    """Two output_dirs hold the same best weights and the same train/, eval/ and test/ figures."""
    wa, wb = load_file(a / "best" / "model.safetensors"), load_file(b / "best" / "model.safetensors")
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= tol
    ma, mb = json.loads((a / "metrics.json").read_text()), json.loads((b / "metrics.json").read_text())
    for key in ma:
        if key.startswith((names.EVAL, names.TEST, names.TRAIN)):
            assert mb[key] == pytest.approx(ma[key], abs=tol), key


START_LINE = re.compile(r" INFO (train|distill): task .*; preparing data and model$")
"""The one line a job prints once it is settled, before its data and model load (start_block.py)."""


def error_lines(result) -> list[str]:
    """A refused job's stderr past its start line (printed before the data and model load, where some
    refusals are found): the error line, and nothing else."""
    lines = result.stderr.strip().splitlines()
    assert all(START_LINE.search(line) for line in lines[:-1]), lines
    return lines[-1:]
