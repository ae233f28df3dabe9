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
import math

import pytest

from helpers import FAST, free_port, mlflow_runs, tracking_db
from pipeline import names
from pipeline.tracking import catch_up, journal
from pipeline.tracking.journal import append, read_journal

pytestmark = pytest.mark.slow  # every test creates and migrates or copies an MLflow store

START = journal.start("http://127.0.0.1:9", "caught", "job", {"task": "sentiment", "cell": "a"},
              {"train.lr": "0.001", "seed": "7"})
POINTS = [journal.metric("train/loss", 1.5, 5, 1700000000000), journal.metric("train/loss", 0.75, 10, 1700000001000),
          journal.metric("test/macro_f1", 0.5, 10, 1700000002000),
          journal.metric("test/energy_j", math.nan, 10, 1700000002000)]  # NaN equals nothing, itself included


def client_for(db):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def history(client, run_id, key):
    return [(m.step, m.timestamp) for m in client.get_metric_history(run_id, key)]


def synced(out):
    return [r for r in read_journal(out / "journal.jsonl") if r["type"] == "synced"]


def test_a_run_the_server_left_running_is_completed_once_under_the_parent(tmp_path):
    """The job reached the store, then its server died: its run holds the first point and is
    RUNNING; the journal holds the rest and the end. catch_up completes that run (no second run,
    no point twice, the parent tag set), then finds nothing to do."""
    from mlflow.entities import Metric as MlflowMetric

    from pipeline.tracking.store import open_experiment

    db, out = tracking_db(tmp_path), tmp_path / "out"
    out.mkdir()
    uri = f"sqlite:///{db}"
    client, experiment_id = open_experiment(uri, "caught")
    run_id = client.create_run(experiment_id, run_name="job", tags=START["tags"]).info.run_id
    client.log_batch(run_id, metrics=[MlflowMetric("train/loss", 1.5, 1700000000000, 5)])
    append(out / "journal.jsonl", START, journal.run(run_id), *POINTS, journal.tags({"data_cache": "hit"}),
           journal.end("FINISHED"))

    assert catch_up(out, uri, {names.TAG_PARENT_RUN: "parent-1"}) == run_id
    assert len(synced(out)) == 1  # replayed
    (run,) = mlflow_runs(db, "caught")
    assert run.info.status == "FINISHED" and run.data.tags[names.TAG_PARENT_RUN] == "parent-1"
    assert run.data.tags["data_cache"] == "hit" and run.data.params == {"train.lr": "0.001", "seed": "7"}
    assert history(client, run_id, "train/loss") == [(5, 1700000000000), (10, 1700000001000)]
    assert math.isnan(run.data.metrics["test/energy_j"])

    assert catch_up(out, uri, {names.TAG_PARENT_RUN: "parent-1"}) == run_id
    assert len(synced(out)) == 1  # replayed once
    assert history(client, run_id, "train/loss") == [(5, 1700000000000), (10, 1700000001000)]
    assert len(client.get_metric_history(run_id, "test/energy_j")) == 1


def test_a_job_that_never_reached_the_store_gets_one_run(tmp_path):
    """Its server was down from the start (no run id in the journal): the first call creates the
    run, the second finds that run (by the journal's sync record) and replays nothing."""
    db, out = tracking_db(tmp_path), tmp_path / "out"
    out.mkdir()
    uri = f"sqlite:///{db}"
    append(out / "journal.jsonl", START, journal.run(None), *POINTS, journal.end("FINISHED"))
    first = catch_up(out, uri)
    assert first and [r["run_id"] for r in synced(out)] == [first]  # replayed
    assert catch_up(out, uri) == first
    assert len(synced(out)) == 1  # replayed once
    (run,) = mlflow_runs(db, "caught")
    assert run.info.run_id == first and run.info.status == "FINISHED"
    assert run.data.metrics["test/macro_f1"] == 0.5
    assert catch_up(tmp_path / "no-journal", uri) is None  # nothing to replay


def test_a_store_that_cannot_take_it_names_the_command_that_will(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    out, dead = tmp_path / "out", f"http://127.0.0.1:{free_port()}"
    out.mkdir()
    append(out / "journal.jsonl", START, journal.run(None), *POINTS, journal.end("FINISHED"))
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        assert catch_up(out, dead) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"python -m pipeline sync {out} --uri {dead}" in line and str(out) in line
    assert synced(out) == []  # nothing was replayed


@pytest.mark.slow  # two tiny jobs in this process: ~15 s of CPU
def test_resume_auto_on_a_finished_job_replays_what_the_store_lacks(tmp_path, monkeypatch, caplog):
    """A job that finished with its tracking server down (its records in its journal only), asked
    again with resume=auto: it trains nothing and its run reaches the store, once."""
    from pipeline.config import load_config
    from pipeline.job.run import run

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
