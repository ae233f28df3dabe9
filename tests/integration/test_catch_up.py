"""A finished job's run caught up with its journal (tracking.catch_up): what the store lacks is
replayed, once; a second call replays nothing; a store that cannot take it is one line naming the
command that will.

The journals are written as jobs write them, and the store is left as a job whose tracking server
died mid-run leaves it (its run RUNNING, the first points only); a job that ends that way, from
the real runner killed mid-study and from `resume=auto` on a finished job, is checked end to end
in tests/integration/test_study_kill.py and below.
"""
import json
import logging

import pytest

from helpers import FAST, free_port, mlflow_runs, tracking_db
from pipeline import names


@pytest.mark.slow  # two tiny jobs in this process: ~15 s of CPU
def test_resume_auto_on_a_finished_job_replays_what_the_store_lacks(tmp_path, monkeypatch, caplog):
    """A job that finished with its tracking server down (its records in its journal only), asked
    again with resume=auto: it trains nothing and its run reaches the store, once."""
    from pipeline.config import load_config
    from pipeline.jobs.run import run

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    out, db = tmp_path / "out", tracking_db(tmp_path)
    job = [*FAST, "train.max_steps=3", f"output_dir={out}", "tracking.experiment=late"]
    final = run(load_config(None, [*job, f"tracking.uri=http://127.0.0.1:{free_port()}"]))
    assert mlflow_runs(db, "late") == []
    for attempt in (1, 2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pipeline"):
            again = run(load_config(None, [*job, "resume=auto", f"tracking.uri=sqlite:///{db}"]))
        assert again == pytest.approx(final, nan_ok=True)
        assert "this job finished before" in caplog.text
        assert ("replayed into run" in caplog.text) == (attempt == 1)  # once
    (mlrun,) = mlflow_runs(db, "late")
    assert mlrun.info.status == "FINISHED"
    assert mlrun.data.metrics[names.TEST_MAIN] == pytest.approx(final[names.TEST_MAIN])
    assert json.loads((out / "metrics.json").read_text()) == pytest.approx(final, nan_ok=True)
