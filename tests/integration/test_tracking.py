"""Tracking against a real `mlflow server` over HTTP: one run per 2-process job, nothing lost
when the server dies (journal + sync), no secrets in params, tags or artifacts."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from helpers import FAST, ROOT, free_port, run_cli, torchrun, tracking_db, wait_for
from pipeline import names
from pipeline.tracking import sync
from pipeline.tracking.ui import server_env

pytestmark = pytest.mark.slow  # every test starts an mlflow server or a pipeline process


class Server:
    def __init__(self, db, port=None):
        self.db, self.port = db, port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--default-artifact-root", str(self.db.parent / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"], env=server_env(),  # as `pipeline ui` runs it
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2)
                return self
            except OSError:
                time.sleep(0.5)
        raise AssertionError("mlflow server did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the tests that only talk to it (each in its own experiment); the test that
    kills a server starts its own."""
    s = Server(tracking_db(tmp_path_factory.mktemp("server"), "server.db")).start()
    yield s
    s.stop()


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def only_run(uri, experiment):
    c = client(uri)
    runs = c.search_runs([c.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


def test_two_process_job_against_an_http_server_logs_one_run_and_no_secrets(tmp_path, server):
    """A 2-process job tracking to a server over HTTP, with credentials in its tracking URI, tokens
    in its environment and a secret-looking tag: one run with the job's figures and artifacts, and
    no secret in its params, tags, output files or either rank's console output."""
    out = tmp_path / "out"
    secret_uri = server.uri.replace("http://", "http://alice:hunter2pw@")
    env = {"HF_TOKEN": "hf_supersecret1", "WANDB_API_KEY": "key_supersecret2", "MLFLOW_TRACKING_PASSWORD": "pw3"}
    result = torchrun(2, "train", *FAST, "train.epochs=1", f"output_dir={out}", f"tracking.uri={secret_uri}",
                      "tracking.experiment=http", "tracking.tags.api_token=tok_supersecret4", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(server.uri, "http")
    final = json.loads((out / "metrics.json").read_text())
    assert run.info.status == "FINISHED"
    assert run.data.tags["world_size"] == "2" and run.data.tags["energy_available"] == "false"
    for key in (names.TEST_MAIN, names.SAMPLES_PER_S, names.TRAIN_TIME, names.TFLOPS, names.SKIPPED_STEPS):
        assert run.data.metrics[key] == pytest.approx(final[key]), key
    artifacts = {a.path for a in client(server.uri).list_artifacts(run.info.run_id)}
    assert {"config.yaml", "metrics.json", "report.txt"} <= artifacts
    exposed = json.dumps({"params": run.data.params, "tags": run.data.tags})
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".yaml", ".json", ".jsonl", ".txt"):
            exposed += path.read_text(encoding="utf-8")
    exposed += result.stderr + result.stdout
    for secret in ("hunter2pw", "hf_supersecret1", "key_supersecret2", "tok_supersecret4"):
        assert secret not in exposed, secret
    assert run.data.tags["api_token"] == "***"


def test_server_dies_mid_run_training_finishes_and_sync_uploads_everything(tmp_path):
    server = Server(tracking_db(tmp_path, "server.db")).start()
    out = tmp_path / "out"
    job = subprocess.Popen([sys.executable, "-m", "pipeline", "train", *FAST, "train.epochs=2", "train.log_every=5",
                            f"output_dir={out}", f"tracking.uri={server.uri}", "tracking.experiment=dies"],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    journal = out / "journal.jsonl"
    deadline = time.time() + 300
    first_eval = f'"key": "{names.EVAL_MAIN}"'
    while time.time() < deadline and first_eval not in (journal.read_text() if journal.exists() else ""):
        time.sleep(0.2)
    server.stop()  # after the first epoch's figures reached it
    output, _ = job.communicate(timeout=600)
    assert job.returncode == 0, output[-3000:]
    assert "MLflow unavailable" in output and "pipeline sync" in output

    restarted = Server(server.db, port=server.port).start()
    try:
        partial = only_run(restarted.uri, "dies")
        assert partial.info.status == "RUNNING" and names.TEST_MAIN not in partial.data.metrics
        result = run_cli("sync", out, "--uri", restarted.uri)
        assert result.returncode == 0, result.stderr
        run = only_run(restarted.uri, "dies")  # completed in place, not a second run
        assert run.info.run_id == partial.info.run_id and run.info.status == "FINISHED"
        final = json.loads((out / "metrics.json").read_text())
        for key, value in final.items():
            if not key.startswith(names.EVAL):  # eval/* in metrics.json is the best epoch's, MLflow has the last
                assert run.data.metrics[key] == pytest.approx(value), key
        journaled = [json.loads(l) for l in journal.read_text().splitlines() if '"metric"' in l]
        history = client(restarted.uri).get_metric_history(run.info.run_id, names.TRAIN_LOSS)
        assert len(history) == sum(1 for r in journaled if r["key"] == names.TRAIN_LOSS)  # no duplicates
        assert sync(out, restarted.uri) == run.info.run_id  # idempotent (in this process: the CLI ran above)
        assert len(client(restarted.uri).get_metric_history(run.info.run_id, names.TRAIN_LOSS)) == len(history)
    finally:
        restarted.stop()


def test_unreachable_server_at_start_then_sync_creates_the_run(tmp_path, server):
    out = tmp_path / "out"
    dead = f"http://127.0.0.1:{free_port()}"
    result = run_cli("train", *FAST, "train.max_steps=10", f"output_dir={out}", f"tracking.uri={dead}",
                     "tracking.experiment=late")
    assert result.returncode == 0, result.stderr[-2000:]
    assert run_cli("sync", out, "--uri", server.uri).returncode == 0  # to a server that is up
    run = only_run(server.uri, "late")
    final = json.loads((out / "metrics.json").read_text())
    assert run.info.status == "FINISHED"
    assert run.data.metrics[names.TEST_MAIN] == pytest.approx(final[names.TEST_MAIN])
    assert run.data.params["train.lr"] == "0.001" and run.data.tags["task"] == "sentiment"


def test_malformed_tracking_uri_is_a_user_error(tmp_path):
    result = run_cli("train", "tracking.uri=mlflow-server:5000", f"output_dir={tmp_path / 'out'}")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: config: tracking.uri=mlflow-server:5000: not a tracking URI")


RACE = """
import sys, time
from pathlib import Path
from pipeline.tracking import Tracker
out, uri, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
tracker = Tracker(out, active=True)
(out / "ready").touch()
while not go.exists():  # every job reaches the store at the same moment
    time.sleep(0.01)
tracker.start(uri, "together", "job", {}, {"job": out.name})
print(tracker.run_id)
"""


def test_jobs_starting_together_on_a_fresh_sqlite_store_all_track(tmp_path):
    uri, go = f"sqlite:///{tmp_path}/fresh.db", tmp_path / "go"
    outs = [tmp_path / f"job{i}" for i in range(2)]
    jobs = [subprocess.Popen([sys.executable, "-c", RACE, str(out), uri, str(go)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for out in outs]
    wait_for(lambda: all((out / "ready").exists() for out in outs) or any(j.poll() is not None for j in jobs),
             what="both jobs imported")
    go.touch()
    outputs = [job.communicate(timeout=300)[0] for job in jobs]
    for output in outputs:
        assert "MLflow unavailable" not in output, output[-2000:]
    c = client(uri)
    runs = c.search_runs([c.get_experiment_by_name("together").experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(o.strip().splitlines()[-1] for o in outputs)


def test_a_journal_that_cannot_be_written_still_ends_the_run(tmp_path, monkeypatch):
    """The disk is full when the job fails: the journal's writes go to /dev/full (a real ENOSPC)."""
    from pathlib import Path

    from pipeline.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/m.db"
    tracker = Tracker(tmp_path / "out", active=True)
    tracker.start(uri, "full", "job", {}, {})
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: real_open(
        Path("/dev/full") if self == tracker.journal_path else self, *a, **k))
    tracker.end("FAILED")
    assert client(uri).get_run(tracker.run_id).info.status == "FAILED"


# a journal as jobs write it: the file format every version must replay
JOURNAL_LINES = [
    '{"type": "start", "uri": "http://***@127.0.0.1:9", "experiment": "replay", "run_name": "job", '
    '"tags": {"task": "sentiment", "world_size": "1"}, "params": {"train.lr": "0.001", "seed": "7"}, '
    '"resume_run_id": null, "supersedes": null}',
    '{"type": "run", "run_id": null}',
    '{"type": "datasets", "datasets": [{"split": "train", "name": "train.tsv", "source_type": "local", '
    '"source": "{\\"uri\\": \\"/data/train.tsv\\"}", "digest": "0123456789abcdef", "rows": 12}]}',
    '{"type": "tags", "tags": {"data_cache": "miss"}}',
    '{"type": "metric", "key": "train/loss", "value": 1.5, "step": 5, "ts": 1700000000000}',
    '{"type": "metric", "key": "train/loss", "value": 0.75, "step": 10, "ts": 1700000001000}',
    '{"type": "metric", "key": "test/ü", "value": 0.5, "step": 10, "ts": 1700000002000}',
    '{"type": "artifact", "path": "/nowhere/report.txt", "artifact_path": null}',
    '{"type": "end", "status": "FINISHED"}',
]


def test_journal_records_read_back_as_written(tmp_path):
    from pipeline.tracking.journal import read_journal, to_json

    path = tmp_path / "journal.jsonl"
    path.write_text("\n".join(JOURNAL_LINES) + "\n", encoding="utf-8")
    assert [to_json(r) for r in read_journal(path)] == JOURNAL_LINES
    # a start record of a version before `supersedes` reads as superseding nothing
    path.write_text(JOURNAL_LINES[0].replace(', "supersedes": null', "") + "\n", encoding="utf-8")
    assert [to_json(r) for r in read_journal(path)] == JOURNAL_LINES[:1]


def test_a_journal_replays_into_a_new_run(tmp_path):
    out, db = tmp_path / "out", tracking_db(tmp_path)
    out.mkdir()
    (out / "journal.jsonl").write_text("\n".join(JOURNAL_LINES) + "\n", encoding="utf-8")
    run_id = sync(out, f"sqlite:///{db}")
    c = client(f"sqlite:///{db}")
    run = c.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "job"
    assert run.data.params == {"train.lr": "0.001", "seed": "7"}
    assert {k: run.data.tags[k] for k in ("task", "world_size", "data_cache")} == \
        {"task": "sentiment", "world_size": "1", "data_cache": "miss"}
    assert [(m.step, m.value, m.timestamp) for m in c.get_metric_history(run_id, "train/loss")] == \
        [(5, 1.5, 1700000000000), (10, 0.75, 1700000001000)]
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.digest == "0123456789abcdef" and dataset.tags[0].value == "train"
    assert json.loads((out / "journal.jsonl").read_text().splitlines()[-1]) == \
        {"type": "synced", "run_id": run_id, "uri": f"sqlite:///{db}"}


def test_a_live_run_and_its_journal_replayed_elsewhere_are_the_same_run(tmp_path):
    """The Tracker applies each record it journals the way sync replays them: the run it logs
    live and the run sync makes of its journal on another store hold the same record."""
    from pipeline.tracking import Tracker

    live, replayed = f"sqlite:///{tracking_db(tmp_path, 'live.db')}", f"sqlite:///{tracking_db(tmp_path, 're.db')}"
    out = tmp_path / "out"
    tracker = Tracker(out, active=True)
    tracker.start(live, "same", "job", {"task": "sentiment", "api_token": "tok"},
                  {f"p{i:03d}": i for i in range(150)})  # more params than one MLflow batch takes
    tracker.log_datasets([{"split": "dev", "name": "dev.tsv", "source_type": "local", "source": '{"uri": "/d/dev.tsv"}',
                          "digest": "fedcba9876543210", "rows": 3}])
    tracker.set_tags({"data_cache": "hit"})
    tracker.log_metrics({"train/loss": 2.0, "lr": 1e-3}, step=1)
    tracker.log_metrics({"train/loss": 1.0}, step=2)
    (out / "report.txt").write_text("figures\n")
    tracker.log_artifact(out / "report.txt")
    tracker.end("FINISHED")

    def record(uri, run_id):
        c = client(uri)
        run = c.get_run(run_id)
        return {"status": run.info.status, "name": run.info.run_name, "params": run.data.params,
                "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
                "metrics": {k: [(m.step, m.timestamp, m.value) for m in c.get_metric_history(run_id, k)]
                            for k in run.data.metrics},
                "inputs": [(d.dataset.name, d.dataset.digest, d.tags[0].value) for d in run.inputs.dataset_inputs],
                "artifacts": [a.path for a in c.list_artifacts(run_id)]}

    expected = record(live, tracker.run_id)
    assert len(expected["params"]) == 150 and expected["tags"]["api_token"] == "***"
    assert record(replayed, sync(out, replayed)) == expected
