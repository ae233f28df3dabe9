"""train.batch_size=auto: the tests that train a model or start a process (the others are in
tests/unit/test_batch_fit.py)."""
import json

import pytest
import yaml

from helpers import FAST, mlflow_runs, run_cli, torchrun, tracking_db
from pipeline import names
from pipeline.config import load_config

# ---------------------------------------------------------------- whole jobs

AUTO = [*FAST, "train.batch_size=auto", "train.max_steps=2", "train.log_every=1"]


@pytest.mark.slow
def test_a_found_batch_is_in_the_params_and_config_yaml_and_resume_sees_the_same_job(tmp_path):
    from pipeline.job.run import run

    db, out = tracking_db(tmp_path), tmp_path / "out"
    job = [*AUTO, "train.grad_accum=2", "train.memory_limit_mb=12", f"output_dir={out}",
           f"tracking.uri=sqlite:///{db}", "tracking.experiment=auto"]
    final = run(load_config(None, job))
    written = yaml.safe_load((out / "config.yaml").read_text())["train"]
    assert written["batch_size"] < 32 and written["batch_size"] * written["grad_accum"] == 32  # 16 x 2 kept
    (mlrun,) = mlflow_runs(db, "auto")
    assert mlrun.data.params["train.batch_size"] == str(written["batch_size"])
    assert mlrun.data.params["resolved.global_batch"] == "32"
    assert f"micro-batch {written['batch_size']} x grad_accum {written['grad_accum']}" in mlrun.data.tags[
        names.TAG_BATCH_FIT]
    assert json.loads((out / "job.json").read_text())["global_batch"] == "32 rows"
    # the same command again with resume=auto: the finished job, not another one
    assert run(load_config(None, [*job, "resume=auto"])) == final
    assert len(mlflow_runs(db, "auto")) == 1


@pytest.mark.slow
def test_when_one_row_does_not_fit_the_job_stops_in_one_line_and_leaves_nothing(tmp_path):
    db, out = tracking_db(tmp_path), tmp_path / "out"
    result = run_cli("train", *AUTO, "train.memory_limit_mb=1", f"output_dir={out}", f"tracking.uri=sqlite:///{db}",
                     "tracking.experiment=refused")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not fit for training: it needs" in errors[0]
    assert "the device has 1.0 MiB" in errors[0]
    assert not out.exists()  # no output_dir, no checkpoint
    assert mlflow_runs(db, "refused") == []  # no run left RUNNING: none was opened


@pytest.mark.slow
def test_a_fixed_batch_under_a_cpu_cap_fits_or_runs_out_of_memory_before_anything_is_written(tmp_path):
    """The memory ceiling's rungs on a CPU: train.memory_limit_mb with a fixed batch counts one step's
    tensors against the cap before the job starts; past it the job ends on one out-of-memory line
    (exit 1, as a capped GPU), leaving nothing; under it the job trains, its peak in the batch_fit tag."""
    from pipeline.job.run import run

    db = tracking_db(tmp_path)
    fixed = [*FAST, "train.max_steps=2", "train.log_every=1", "train.memory_limit_mb=12",
             f"tracking.uri=sqlite:///{db}"]
    out = tmp_path / "b32"
    result = run_cli("train", *fixed, "train.batch_size=32", f"output_dir={out}", "tracking.experiment=oom")
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: out of memory: train.batch_size=32 at "), errors
    assert "under train.memory_limit_mb=12" in errors[0] and "Traceback" not in result.stderr
    assert not out.exists() and mlflow_runs(db, "oom") == []
    run(load_config(None, [*fixed, "train.batch_size=2", f"output_dir={tmp_path / 'b2'}", "tracking.experiment=fits"]))
    (mlrun,) = mlflow_runs(db, "fits")
    assert mlrun.data.tags[names.TAG_BATCH_FIT].startswith("micro-batch 2 x grad_accum 1 (peak ")
    assert mlrun.data.tags[names.TAG_BATCH_FIT].endswith("of 12 MiB (emulated cap)")


@pytest.mark.slow
def test_two_gloo_ranks_agree_on_one_split_that_keeps_the_global_batch(tmp_path):
    db, out = tracking_db(tmp_path), tmp_path / "out"
    # 16 MiB less DDP's buckets (bangla-tiny's 3.6 MiB of gradients): about the in-process test's 12
    result = torchrun(2, "train", *AUTO, "train.grad_accum=2", "train.memory_limit_mb=16", f"output_dir={out}",
                      f"tracking.uri=sqlite:///{db}", "tracking.experiment=ddp-auto")
    assert result.returncode == 0, result.stderr[-3000:]
    written = yaml.safe_load((out / "config.yaml").read_text())["train"]
    assert written["batch_size"] < 32 and written["batch_size"] * written["grad_accum"] == 32
    (mlrun,) = mlflow_runs(db, "ddp-auto")
    assert mlrun.data.params["resolved.global_batch"] == "64"  # 16 x grad_accum 2 x 2 ranks, as asked
    assert mlrun.info.status == "FINISHED"


@pytest.mark.slow
def test_a_refusal_names_the_length_the_step_ran_at_padding_included(tmp_path, monkeypatch):
    """bangla-tiny's longest training row is 18 tokens; padded to train.pad_to_multiple_of=64 every
    step runs at 64, and that is the length a refusal names."""
    import torch

    from pipeline.errors import UserError
    from pipeline.job import batch_finder
    from pipeline.job.plan import settle
    from pipeline.job.stage import build_stage
    from pipeline.runtime.world import Runtime

    monkeypatch.setenv("PIPELINE_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, ["model=preset:bangla-tiny", "train.max_length=64", "train.pad_to_multiple_of=64",
                             "train.batch_size=4", "train.memory_limit_mb=1", f"output_dir={tmp_path / 'out'}"])
    stage = build_stage(settle(cfg, "train", Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))))
    with pytest.raises(torch.OutOfMemoryError, match="train.batch_size=4 at 64 tokens "):
        batch_finder.check_batch(stage)
    with pytest.raises(UserError, match="one row of 64 tokens does not fit"):
        batch_finder.fit_batch(stage)
