"""The offline install of docs/launching.md, as on an air-gapped node: a fresh virtualenv that already has
a torch, the pipeline installed from a wheelhouse (`make wheelhouse`, this machine's Python and platform)
with no package index, the torch left as it was, and jobs run from a directory outside the checkout: a
train job, and a 2-process DeepSpeed ZeRO-2 job (on the CPU) that names no config (the one shipped in the
wheel). `make test-offline` builds the wheelhouse and runs this; `make test` leaves it out (minutes of
installing)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import FAST, ROOT, free_port

pytestmark = [pytest.mark.slow, pytest.mark.install]


def torch_files(venv: Path) -> dict[str, tuple[int, int]]:
    """Every file of the venv's torch package with its size and modification time."""
    site = next((venv / "lib").glob("python*/site-packages"))
    return {str(p.relative_to(site)): (p.stat().st_size, p.stat().st_mtime_ns)
            for folder in [site / "torch", *site.glob("torch-*.dist-info")] for p in folder.rglob("*") if p.is_file()}


def test_the_pipeline_installs_from_the_wheelhouse_with_no_index_and_keeps_the_nodes_torch(tmp_path):
    wheelhouse = Path(os.environ.get("WHEELHOUSE", ROOT / "wheelhouse"))
    if not any(wheelhouse.glob("bangla_amp_pipeline-*.whl")):
        pytest.fail(f"no wheelhouse at {wheelhouse}: run `make wheelhouse` (or `make test-offline`)")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of this checkout on the path
    venv = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # the node's torch: the same release as this environment's, installed before the pipeline as an image
    # brings it (with the index: this is the image, not the install under test)
    version = torch.__version__
    subprocess.run([py, "-m", "pip", "install", "-q", f"torch=={version}"], check=True, env=clean)
    before = torch_files(venv)
    out = subprocess.run(["make", "-s", "install-offline", f"TARGET_PY={py}", f"WHEELHOUSE={wheelhouse}"], cwd=ROOT,
                         capture_output=True, text=True, env={**clean, "PIP_INDEX_URL": "http://127.0.0.1:9/"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert torch_files(venv) == before  # not one file of torch replaced
    check = subprocess.run([py, "-c", "import torch, pipeline; print(torch.__version__, pipeline.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True, env=clean).stdout.split()
    assert check[0] == version and str(venv) in check[1]  # the installed copy, not this checkout
    cli = subprocess.run([py, "-m", "pipeline", "--help"], cwd=tmp_path, capture_output=True, text=True, env=clean)
    assert cli.returncode == 0 and "train" in cli.stdout, cli.stderr[-2000:]
    jobs_run_from_elsewhere(venv, tmp_path / "elsewhere", clean)


def jobs_run_from_elsewhere(venv: Path, here: Path, env: dict[str, str]) -> None:
    """From a directory that is not the checkout: a train job, then a 2-process DeepSpeed job on the CPU
    with no `deepspeed=` (the wheel's zero2.json), each to a finished output_dir."""
    here.mkdir()
    env = {**env, "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    job = [*FAST, "train.max_steps=4", f"tracking.uri=sqlite:///{here / 'mlflow.db'}"]
    train = subprocess.run([str(venv / "bin" / "python"), "-m", "pipeline", "train", *job, "output_dir=single"],
                           cwd=here, capture_output=True, text=True, env=env, timeout=900)
    assert train.returncode == 0, train.stderr[-3000:]
    assert (here / "single" / "metrics.json").is_file()
    ds = subprocess.run([str(venv / "bin" / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
                         "--module", "pipeline", "train", *job, "train.batch_size=8", "output_dir=zero2"],
                        cwd=here, capture_output=True, text=True, env=env, timeout=900)
    assert ds.returncode == 0, ds.stdout[-3000:] + ds.stderr[-3000:]
    resolved = json.loads((here / "zero2" / "deepspeed_config.json").read_text())
    assert resolved["zero_optimization"]["stage"] == 2 and resolved["train_batch_size"] == 16
    assert (here / "zero2" / "metrics.json").is_file()


def test_install_offline_refuses_an_environment_without_torch(tmp_path):
    """Without a torch in place, pip would have to find one: the target stops first and says why."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "bare")], check=True)
    out = subprocess.run(["make", "-s", "install-offline", f"TARGET_PY={tmp_path / 'bare' / 'bin' / 'python'}",
                          f"WHEELHOUSE={tmp_path}"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "has no torch" in out.stdout + out.stderr
