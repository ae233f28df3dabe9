"""`make gpu-check` (benchmarks/gpu_check.py) proves the GPU path on a CUDA machine within a budget:
the tests that train a model or start a process (the others are in tests/unit/test_gpu_check.py)."""
import json
import re
import subprocess
import sys

import psutil
import pytest

from helpers import ROOT, tracking_db


@pytest.mark.slow
def test_the_gpu_check_quick_run_writes_everything_under_its_out_folder(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    tracking_db(work, "mlflow.db")
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick", "--out", str(out),
                             "--work", str(work)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    payload = json.loads((out / "gpu-check.json").read_text())
    checks = payload["checks"]
    assert payload["quick"] and payload["pass"] and payload["complete"] and payload["not_run"] == {}
    assert list(checks) == ["mfu", "ddp", "demo", "pytest_gpu", "fallback", "deepspeed"]
    assert checks["pytest_gpu"]["counts"]["deselected"] == 1 and (out / "pytest_gpu" / "pytest.log").is_file()
    # the cells (quick: tiny, eager only, no energy counter on a CPU) with their JSON and profile tables
    assert [c["precision"] for c in checks["mfu"]["cells"]][:1] == ["fp32"] and "skipped" in checks["mfu"]["energy"]
    assert any((out / "mfu" / "cells").glob("*-tables.md")) and (out / "mfu" / "bench_gpu.log").is_file()
    # the fallback ran as one process with grad_accum doubled, and was compared with its reference
    assert checks["fallback"]["one_process_grad_accum_2"] and checks["fallback"]["loss_rel_gap"] == 0
    assert checks["ddp"]["two_ranks"] and checks["ddp"]["cuda_graphs"]["loss_rel_gap"] == 0
    assert "skipped" in checks["deepspeed"] and (out / "demo" / "demo.log").is_file()


@pytest.mark.slow
def test_a_side_by_side_check_runs_as_a_process_and_what_the_budget_leaves_out_is_listed(tmp_path):
    """Two lanes: the demo (~200 s by its estimates) on one, pytest_gpu (~210 s) on the other, then
    deepspeed (~120 s) from ~200 s: with 300 s it is listed as not run, with why, and never started;
    each check that ran has its log in the out folder."""
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick", "--only",
                             "demo,pytest_gpu,deepspeed", "--parallel", "2", "--budget", "300", "--out", str(out),
                             "--work", str(tmp_path / "w")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    payload = json.loads((out / "gpu-check.json").read_text())
    assert list(payload["checks"]) == ["demo", "pytest_gpu"] and payload["pass"] and not payload["complete"]
    assert payload["checks"]["demo"]["check_seconds"] > 0 and "sentiment-auto-s1" in payload["checks"]["demo"]["log"]
    assert (out / "demo.log").is_file() and (out / "demo" / "demo.log").is_file()
    assert list(payload["not_run"]) == ["deepspeed"] and "from ~200 s" in payload["not_run"]["deepspeed"]
    assert not (out / "deepspeed.log").exists()  # never started


@pytest.mark.slow
def test_a_command_past_its_time_is_stopped_with_every_process_under_it(tmp_path, monkeypatch):
    """A launcher whose worker starts its own session (as torchrun's do) and ignores SIGTERM: at the
    timeout the launcher, the worker and the worker's child are all gone."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import process_tree

    monkeypatch.setattr(process_tree, "GRACE_S", 0.5)  # then SIGKILL, which the worker cannot ignore
    pids = tmp_path / "pids"
    worker = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(60)")
    launcher = ("import subprocess, sys; "
                f"subprocess.Popen([sys.executable, '-c', {worker!r}], start_new_session=True).wait()")
    ok, log = process_tree.run([sys.executable, "-c", launcher], tmp_path / "log", timeout=3, cwd=tmp_path)
    assert not ok and "stopped after 3 s" in log
    for pid in map(int, pids.read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


@pytest.mark.slow
def test_the_gpu_check_refuses_a_machine_without_a_gpu_unless_quick():
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--only", "demo"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--quick" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gpu-check", "test-gpu", "demo", "bench-gpu"])
def test_a_gpu_target_on_a_nodes_python_installs_nothing(target):
    """`make TARGET PY=python3` (a node without an index): the commands make would run check that the
    pipeline is installed there, then run; no virtualenv, no pip."""
    # run as `make test` runs it too: a make inside make prints "Entering directory" unless told not to
    plan = subprocess.run(["make", "--no-print-directory", "-n", target, "PY=/node/bin/python3"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert plan.splitlines()[0] == "/node/bin/python3 launch/node_ready.py"
    assert not re.search(r"-m pip\s", plan) and "venv" not in plan and ".installed" not in plan
    assert all(line.startswith(("/node/bin/python3 ", " ")) for line in plan.splitlines()), plan
