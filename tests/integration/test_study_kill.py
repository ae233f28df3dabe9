"""A study runner killed with SIGKILL mid-study (an out-of-memory kill, a lost login session), then
run again with the same command.

The cells that were training outlive the runner and finish while the study's MLflow server (which
died with the runner) is gone: their records reach their journals only. The re-run replays each
into its run, under the study's parent run, once; its closing line and the report count the same
cells as finished, from the store; each cell's log keeps both attempts. A search killed before any
checkpoint keeps one run per trial once run again; a Ctrl-C stops a study's cells at a checkpoint.
"""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from helpers import FAST, LAUNCHER_ENV, ROOT, mlflow_runs, run_cli, tracking_db, wait_for
from integration.test_study_search import optuna_trials, search_study, study_cli, trial_runs
from pipeline import names
from pipeline.tracking import catch_up, read_journal
from pipeline.tracking.journal import end

STUDY = "killed"
CELLS = ["sentiment-fp32-s1", "sentiment-fp32-s2"]


def run_id_in(journal: Path) -> str | None:
    """The run id a cell's job wrote to its journal once its run was open in the store."""
    if not journal.is_file():
        return None
    return next((r["run_id"] for r in read_journal(journal) if r["type"] == "run" and r["run_id"]), None)


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # a study killed with two cells training, those cells finishing, the re-run
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the runner's children from /proc")
def test_a_study_killed_mid_run_is_mended_by_one_rerun(tmp_path):
    db = tracking_db(tmp_path)
    out = tmp_path / "outputs" / STUDY
    spec = {"name": STUDY, "output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
            "overrides": [*FAST, "train.max_steps=8", "train.log_every=1", f"tracking.uri=sqlite:///{db}"],
            "matrix": {"tasks": ["sentiment"], "precisions": ["fp32"], "seeds": [1, 2]}}
    path = tmp_path / f"{STUDY}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    with (tmp_path / "first.log").open("w") as first_log:
        runner = subprocess.Popen([sys.executable, "-m", "pipeline", "study", str(path), "--jobs", "2"], cwd=ROOT,
                                  env=env, stdout=first_log, stderr=subprocess.STDOUT)
    try:
        # both cells started at once, killed once one has its run open
        wait_for(lambda: any(run_id_in(out / c / "journal.jsonl") for c in CELLS) or runner.poll() is not None,
                 what="a cell training")
        assert runner.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        stages = {pid: Path(f"/proc/{pid}/cmdline").read_text() for pid in children(runner.pid)}
        runner.kill()
    finally:
        runner.kill()
        runner.wait()
    killed = [c for c in CELLS if any(f"tracking.run_name={c}\0" in cmd for cmd in stages.values())]
    assert len(killed) == 2, stages
    wait_for(lambda: not any(alive(p) for p in stages), what="the orphaned cells to end")
    in_store = {r.info.run_id: r.info.status for r in mlflow_runs(db, STUDY)}
    for cell in killed:  # they finished, with their records in their journals only
        assert (out / cell / "metrics.json").is_file()
        assert end("FINISHED") in read_journal(out / cell / "journal.jsonl")
        assert in_store.get(run_id_in(out / cell / "journal.jsonl"), "absent") in ("RUNNING", "absent")

    rerun = run_cli("study", path, "--jobs", "2")
    log = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, log[-3000:]
    for cell in killed:
        assert re.search(rf"{cell}: the store lacked .* of its journal; replayed into run", log)
    assert f"study {STUDY}: 2/2 cells finished" in log
    assert "Cells: 2 (2 finished)." in (tmp_path / "report" / "report.md").read_text()

    runs = mlflow_runs(db, STUDY)
    (parent,) = [r for r in runs if r.data.tags.get(names.PARENT_TAG) == "true"]
    cells = [r for r in runs if r.data.tags.get(names.PARENT_TAG) != "true"]
    assert sorted(r.data.tags["cell"] for r in cells) == CELLS  # one run per cell
    assert all(r.info.status == "FINISHED" for r in cells)
    assert all(r.data.tags[names.TAG_PARENT_RUN] == parent.info.run_id for r in cells)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics[names.STUDY_CELLS_FINISHED] == 2
    client = MlflowClient(f"sqlite:///{db}")
    for run in (r for r in cells if r.data.tags["cell"] in killed):
        journal = out / run.data.tags["cell"] / "journal.jsonl"
        assert run_id_in(journal) in (run.info.run_id, None)  # completed in place, or made once
        points = [r for r in read_journal(journal) if r["type"] == "metric" and r["key"] == names.TRAIN_LOSS]
        assert len(client.get_metric_history(run.info.run_id, names.TRAIN_LOSS)) == len(points)  # each point once
        final = json.loads((journal.parent / "metrics.json").read_text())
        assert run.data.metrics[names.TEST_MAIN] == pytest.approx(final[names.TEST_MAIN])
        # exactly once: a later run of the study finds nothing to replay
        assert catch_up(journal.parent, f"sqlite:///{db}", {names.TAG_PARENT_RUN: parent.info.run_id})
        assert len([r for r in read_journal(journal) if r["type"] == "synced"]) == 1

        text = (out / "_logs" / f"{run.data.tags['cell']}.log").read_text()
        first, second = re.split(r"^=== attempt 2, .* UTC ===$", text, flags=re.M)
        # the first attempt whole: the stage wrote its log itself, to its end after the runner died
        assert first.startswith("=== attempt 1, ") and "\n+ " in first and "samples/s over" in first
        assert "finished before" in second


@pytest.mark.slow  # one cell trained until Ctrl-C, which the runner passes on as a SIGTERM
def test_ctrl_c_of_a_study_stops_its_cells_at_a_checkpoint_in_one_line_and_leaves_no_run_running(tmp_path):
    """Ctrl-C as a terminal sends it: SIGINT to the runner's process group, which its cells are not in."""
    db = tracking_db(tmp_path)
    out = tmp_path / "outputs" / "stopped"
    spec = {"name": "stopped", "output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
            "overrides": [*FAST, "train.epochs=3", "train.save_every=0", "train.log_every=1",
                          f"tracking.uri=sqlite:///{db}"],
            "matrix": {"tasks": ["sentiment"], "precisions": ["fp32"], "seeds": [1, 2]}}
    path = tmp_path / "stopped.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    with (tmp_path / "log").open("w") as log:
        runner = subprocess.Popen([sys.executable, "-m", "pipeline", "study", str(path)], cwd=ROOT, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cell = out / "sentiment-fp32-s1"

    def training() -> bool:  # a training step logged: the stage acts on a SIGTERM from here on
        return cell.joinpath("journal.jsonl").is_file() and any(
            r["type"] == "metric" for r in read_journal(cell / "journal.jsonl"))
    try:
        wait_for(lambda: training() or runner.poll() is not None, what="the first cell training")
        os.killpg(runner.pid, signal.SIGINT)
        code = runner.wait(timeout=120)
    finally:
        runner.kill()
    text = (tmp_path / "log").read_text()
    assert code == 130, text[-3000:]
    assert text.strip().splitlines()[-1] == (
        "interrupted: study stopped: 0/2 cells finished, 1 stopped (1 at a checkpoint, resumed by the next run), "
        f"1 not started; to continue: python -m pipeline study {path}")
    assert "Traceback" not in text
    assert (cell / "checkpoints").is_dir() and not (cell / "metrics.json").exists()
    end = json.loads((out / "_logs" / "sentiment-fp32-s1.exit").read_text())  # what --report-only tells
    assert end["exit_code"] == 143 and "WARNING preempted: SIGTERM: checkpoint " in end["reason"]
    status = {r.data.tags.get("cell", "parent"): r.info.status for r in mlflow_runs(db, "stopped")}
    assert status == {"parent": "KILLED", "sentiment-fp32-s1": "KILLED"}


@pytest.mark.slow  # a real trial killed before its first checkpoint, then the search run again
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the runner's children from /proc")
def test_a_search_killed_before_any_checkpoint_keeps_one_run_per_trial(tmp_path):
    """SIGKILL of the runner and its trial (each in a session of its own) once the trial's run is open,
    nothing checkpointed; the same command again starts that trial over: the storage's trials and the
    trial runs in the default view agree, the killed attempt's run retired behind the new one."""
    path, db = search_study(tmp_path, "lost", 1, epochs=1, pruner="none")
    spec = yaml.safe_load(path.read_text())
    spec["overrides"].append("train.save_every=0")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    first = tmp_path / "outputs" / "lost" / "sentiment-t000" / "journal.jsonl"
    with (tmp_path / "first.log").open("w") as log:
        runner = subprocess.Popen([sys.executable, "-m", "pipeline", "study", str(path)], cwd=ROOT,
                                  env={k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV},
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: run_id_in(first) or runner.poll() is not None, what="the first trial's run")
        stages = children(runner.pid)
        for pid in [runner.pid, *stages]:
            os.killpg(pid, signal.SIGKILL)
    finally:
        runner.kill()
        runner.wait()
    killed = run_id_in(first)
    assert stages and killed and not (first.parent / "checkpoints").exists(), (tmp_path / "first.log").read_text()

    assert study_cli(path) == 0
    assert [t.state.name for t in optuna_trials(tmp_path, "lost")] == ["COMPLETE"]
    (again,) = trial_runs(db, "lost")  # one run per trial
    assert again.data.tags["search/trial"] == "0" and again.info.status == "FINISHED"
    old = MlflowClient(f"sqlite:///{db}").get_run(killed)
    assert again.data.tags[names.TAG_SUPERSEDES] == killed and old.info.lifecycle_stage == "deleted"
    assert old.data.tags[names.TAG_SUPERSEDED_BY] == again.info.run_id and old.info.status == "FAILED"
