"""`make gpu-check` (benchmarks/gpu_check.py) proves the GPU path on a CUDA machine within a budget:
the tests that train a model or start a process (the others are in tests/unit/test_gpu_check.py)."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT, tracking_db


@pytest.mark.slow
def test_the_gpu_check_quick_run_writes_one_json_with_every_check(tmp_path):
    work, out = tmp_path / "work", tmp_path / "gpu-check.json"
    tracking_db(work, "mlflow.db")
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick", "--out", str(out),
                             "--work", str(work)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    payload = json.loads(out.read_text())
    checks = payload["checks"]
    assert payload["quick"] and payload["pass"] and payload["complete"] and payload["not_run"] == {}
    assert list(checks) == ["ddp", "fallback", "grad_accum", "deepspeed", "pytest_gpu", "demo", "energy"]
    assert checks["pytest_gpu"]["counts"]["tests collected"] >= 10
    # the fallback ran as one process with grad_accum doubled, and was compared with its reference
    assert checks["fallback"]["one_process_grad_accum_2"] and checks["fallback"]["loss_rel_gap"] == 0
    assert checks["ddp"]["two_ranks"] and checks["ddp"]["cuda_graphs"]["loss_rel_gap"] == 0
    assert checks["grad_accum"]["fp16"]["compiled_params"]["resolved.grad_accum"] == "2"
    assert "skipped" in checks["energy"] and "skipped" in checks["deepspeed"]


@pytest.mark.slow
def test_a_side_by_side_check_runs_as_a_process_and_what_the_budget_leaves_out_is_listed(tmp_path):
    """The demo check in a child process (the GPU run's way for the correctness checks), the energy check
    past the budget by its estimate (demo ~180 s, then energy ~90 s alone): listed as not run, with why,
    and never started."""
    out = tmp_path / "gpu-check.json"
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick", "--only", "demo,energy",
                             "--parallel", "2", "--budget", "200", "--out", str(out), "--work", str(tmp_path / "w")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    payload = json.loads(out.read_text())
    assert list(payload["checks"]) == ["demo"] and payload["pass"] and not payload["complete"]
    assert payload["checks"]["demo"]["check_seconds"] > 0 and "sentiment-auto-s1" in payload["checks"]["demo"]["log"]
    assert list(payload["not_run"]) == ["energy"] and "200 s budget" in payload["not_run"]["energy"]
    assert not (tmp_path / "w" / "mlflow.db").exists()  # no job ran: the energy check never started


@pytest.mark.slow
def test_the_gpu_check_refuses_a_machine_without_a_gpu_unless_quick():
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--only", "demo"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--quick" in result.stderr
