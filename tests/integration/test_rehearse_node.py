"""`make rehearse-node` (launch/rehearse_node.py): the GPU check's node rehearsed on this CPU, from a fresh
virtualenv at the node's versions through the install with no index to the GPU check's quick run, with
everything under its folder. Minutes of installing: left out unless `-m install` selects it."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.install]


def test_the_node_installs_from_the_trimmed_wheelhouse_and_passes_the_quick_check(tmp_path):
    result = subprocess.run([sys.executable, "launch/rehearse_node.py", "--dir", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "rehearsal.json").read_text())
    assert summary["gpu_check_quick_pass"] and "tokenizers==0.23.2" in summary["installed_as_the_node"]
    wheels = {p.name.split("-")[0] for p in (tmp_path / "wheelhouse").glob("*.whl")}
    assert {"deepspeed", "mlflow", "tokenizers"} <= wheels and not {"torch", "transformers", "numpy"} & wheels
    checks = json.loads((tmp_path / "out" / "gpu-check.json").read_text())["checks"]
    assert all(c["pass"] for c in checks.values()) and (tmp_path / "out" / "mfu" / "bench_gpu.log").is_file()
    freeze = subprocess.run([str(tmp_path / "node" / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True,
                            text=True, check=True).stdout
    assert "tokenizers==0.23.3" in freeze and "transformers==5.17.0" in freeze  # replaced / held
