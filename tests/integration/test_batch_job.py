"""A cluster user's jobs, as a batch system runs them (stderr to a file, no terminal): a line per
train.log_every steps; two default jobs with other models keep both best models; a job pointed at
another finished job's output_dir is refused in one line and opens no run (the CLI exits 2 on it)."""
import logging

import pytest

from helpers import FAST, mlflow_runs, tracking_db
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.job.run import run
from pipeline.layout import OutputDir

pytestmark = pytest.mark.slow


def test_default_jobs_of_two_models_print_their_steps_keep_both_models_and_guard_their_dirs(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    with pytest.MonkeyPatch.context() as here:  # left before the test's report: pytest reads paths from cwd
        here.chdir(tmp_path)  # the default output_dir is relative: outputs/TASK-MODEL-PRECISION here
        three_jobs(tmp_path, caplog)


def three_jobs(tmp_path, caplog):
    """Two default jobs of other models, then the smaller model pointed at the first one's output_dir."""
    db = tracking_db(tmp_path)
    job = [*FAST, "task=sentiment", "train.log_every=2", f"tracking.uri=sqlite:///{db}"]  # FAST's model: tiny
    run(load_config(None, [*job, "train.max_steps=6"]))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split("  ")[0] for line in lines] == ["step 2/6 (33%)", "step 4/6 (67%)", "step 6/6 (100%)"]
    for shown in ("epoch ", "loss ", "lr ", " samples/s", " tokens/s", "peak ", "elapsed ", "ETA "):
        assert shown in lines[1], lines[1]

    run(load_config(None, [*job, "model=preset:bangla-small", "train.max_steps=2"]))
    outputs = tmp_path / "outputs"
    for name in ("sentiment-bangla-tiny-fp32", "sentiment-bangla-small-fp32"):
        assert OutputDir(outputs / name).trained_model() is not None, name
        assert "base model | preset:bangla-" in (outputs / name / "best" / "README.md").read_text()  # its card

    taken = outputs / "sentiment-bangla-tiny-fp32"
    before = (taken / "metrics.json").read_bytes()
    with pytest.raises(UserError) as refused:
        run(load_config(None, [*job, "model=preset:bangla-small", "train.max_steps=2", f"output_dir={taken}"]))
    assert str(refused.value) == (
        f"output_dir {taken} holds another job's finished outputs (train.max_steps: 6 -> 2; model: "
        "preset:bangla-tiny -> preset:bangla-small): another output_dir keeps both; overwrite=true removes them "
        "and starts this job there")
    assert (taken / "metrics.json").read_bytes() == before
    assert len(mlflow_runs(db, "pipeline")) == 2  # no run for the refused job
