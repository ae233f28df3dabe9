"""Fallback mode: the tests that train a model or start a process (the others are in
tests/unit/test_fallback.py)."""
import os
import sys

import pytest
import yaml

from helpers import FAST, ROOT, mlflow_runs, run_cli, torchrun, tracking_db
from pipeline import names
from pipeline.runtime import world


@pytest.mark.slow  # a CLI process
def test_fallback_false_is_exit_2_before_any_run(tmp_path):
    db = tracking_db(tmp_path)
    result = run_cli("train", *FAST, "requested_world_size=2", "fallback=false", f"output_dir={tmp_path / 'out'}",
                     f"tracking.uri=sqlite:///{db}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: launch: requested_world_size=2 but 1 process(es) run and fallback=false: launch 2 processes on 2 "
        "devices")
    assert not (tmp_path / "out").exists() and mlflow_runs(db, "pipeline") == []


def tags_and_params(db, experiment):
    (run,) = mlflow_runs(db, experiment)
    assert run.info.status == "FINISHED"
    return run.data.tags, run.data.params


@pytest.mark.slow
def test_launch_script_asked_for_8_on_1_device_trains_1_process(tmp_path):
    import subprocess

    db = tracking_db(tmp_path)
    env = {**os.environ, "PYTHON": sys.executable, "NPROC": "8", world.DEVICES_ENV: "1"}
    result = subprocess.run(["bash", "launch/torchrun_single_node.sh", *FAST, "train.batch_size=4",
                             "train.max_steps=2", f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{db}",
                             "tracking.experiment=fb"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--nproc_per_node 1 " in result.stdout
    assert "fallback: requested_world_size=8 but 1 process(es) run; train.grad_accum 1 -> 8" in result.stderr
    tags, params = tags_and_params(db, "fb")
    assert (tags[names.TAG_FALLBACK], tags[names.TAG_REQUESTED_WORLD_SIZE], tags["world_size"]) == ("true", "8", "1")
    assert params["resolved.grad_accum"] == "8" and params["resolved.global_batch"] == "32"  # 4 x 8, as planned
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["train"]["grad_accum"] == 8


@pytest.mark.slow
def test_torchrun_beyond_the_devices_reforms_a_smaller_group(tmp_path):
    """4 torchrun processes, 2 devices: ranks 2 and 3 exit 0, ranks 0 and 1 form a new gloo group
    on the agent's store and train with grad_accum 2: one MLflow run saying what happened."""
    db = tracking_db(tmp_path)
    result = torchrun(4, "train", *FAST, "train.batch_size=4", "train.max_steps=2", f"output_dir={tmp_path / 'out'}",
                      f"tracking.uri=sqlite:///{db}", "tracking.experiment=fb", env={world.DEVICES_ENV: "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("fallback: local rank") == 2
    tags, params = tags_and_params(db, "fb")
    assert (tags["backend"], tags["world_size"], tags[names.TAG_REQUESTED_WORLD_SIZE]) == ("ddp", "2", "4")
    assert tags[names.TAG_FALLBACK] == "true" and params["resolved.global_batch"] == "16"


@pytest.mark.slow
def test_study_cell_asking_2_processes_runs_1_and_its_row_says_so(tmp_path):
    db = tracking_db(tmp_path)
    spec = {"name": "fb", "output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
            "overrides": [*FAST, "train.batch_size=4", "train.max_steps=2", f"tracking.uri=sqlite:///{db}"],
            "launcher": {"type": "torchrun", "nproc": 2}, "matrix": [{"tasks": ["sentiment"]}]}
    (tmp_path / "fb.yaml").write_text(yaml.safe_dump(spec))
    result = run_cli("study", tmp_path / "fb.yaml", env={world.DEVICES_ENV: "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "asks for torchrun:2, 1 device(s) per node visible: it runs torchrun:1" in result.stderr
    (run,) = [r for r in mlflow_runs(db, "fb") if r.data.tags.get(names.PARENT_TAG) != "true"]
    assert run.data.tags[names.TAG_FALLBACK] == "true" and run.data.params["resolved.global_batch"] == "8"
    cells = (tmp_path / "report" / "cells.csv").read_text()
    assert "torchrun:1 (fallback: asked torchrun:2)" in cells
