"""The offline install of docs/launching.md, as on an air-gapped node: a fresh virtualenv that already has
a torch, the pipeline installed from a wheelhouse (`make wheelhouse`, this machine's Python and platform)
with no package index, the torch left as it was, and the CLI working. `make test-offline` builds the
wheelhouse and runs this; `make test` leaves it out (minutes of installing)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT

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


def test_install_offline_refuses_an_environment_without_torch(tmp_path):
    """Without a torch in place, pip would have to find one: the target stops first and says why."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "bare")], check=True)
    out = subprocess.run(["make", "-s", "install-offline", f"TARGET_PY={tmp_path / 'bare' / 'bin' / 'python'}",
                          f"WHEELHOUSE={tmp_path}"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode != 0 and "has no torch" in out.stdout + out.stderr
