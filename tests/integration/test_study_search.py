"""A search study run for real on the built-in sentiment set (a few hundred rows of it, the tiny
preset model): trials side by side, pruned from their dev figures, each a nested MLflow run with
its fate; the runner killed mid-trial and run again; trials submitted as Slurm jobs (faked)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from helpers import LAUNCHER_ENV, ROOT, mlflow_runs, run_cli, tracking_db, wait_for
from integration.test_study_concurrency import fake_slurm, jobs  # noqa: F401 (a fixture)
from pipeline import names

EPOCHS = 3


def small_sentiment(folder: Path, rows: dict[str, int]) -> list[str]:
    """The first rows of the built-in sentiment set's splits, as data.* overrides."""
    from pipeline.tasks import get_task

    folder.mkdir(parents=True)
    files = get_task("sentiment", {}).write_samples(folder)
    out = []
    for split, path in files.items():
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[: rows[split] + 1]), encoding="utf-8")
        out.append(f"data.{split}={path}")
    return out


def search_study(tmp_path, name, trials, seeds=(1,), **search):
    db = tracking_db(tmp_path)
    data = small_sentiment(tmp_path / "data", {"train": 320, "dev": 96, "test": 64})
    spec = {"name": name, "output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
            "overrides": ["model=preset:bangla-tiny", "model_config.initializer_range=0.05", "train.max_length=32",
                          f"train.epochs={EPOCHS}", "tracking.system_metrics=false", "infer.bench=false", *data,
                          f"tracking.uri=sqlite:///{db}"],
            "matrix": {"tasks": ["sentiment"], "seeds": list(seeds)},
            "search": {"space": {"train.lr": {"log_uniform": [1e-5, 3e-3]},
                                 "train.batch_size": {"categorical": [16, 32]}},
                       "trials": trials, "sampler": {"type": "tpe", "seed": 0}, **search}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, db


def trial_runs(db, name):
    return [r for r in mlflow_runs(db, name) if "search/trial" in r.data.tags]


def optuna_trials(tmp_path, name, group="sentiment"):
    storage = f"sqlite:///{tmp_path / 'outputs' / name / 'optuna.db'}"
    return optuna.load_study(study_name=f"{name}.{group}", storage=storage).get_trials()


@pytest.mark.slow  # 8 trials + 1 re-run of the tiny model, two at a time: ~1-2 min on 2 idle cores
def test_a_search_of_eight_trials_prunes_side_by_side_and_reports_the_best_over_seeds(tmp_path):
    path, db = search_study(tmp_path, "srch", 8, seeds=(1, 2),
                            pruner={"type": "median", "n_startup_trials": 2})
    result = run_cli("study", path, "--jobs", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    trials = optuna_trials(tmp_path, "srch")
    assert len(trials) == 8 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    runs = trial_runs(db, "srch")
    (parent,) = [r for r in mlflow_runs(db, "srch") if r.data.tags.get(names.PARENT_TAG) == "true"]
    assert sorted(int(r.data.tags["search/trial"]) for r in runs) == list(range(8))  # one run per trial
    by_number = {t.number: t for t in trials}
    for run in runs:
        trial = by_number[int(run.data.tags["search/trial"])]
        assert run.info.status == "FINISHED" and run.data.tags[names.TAG_PARENT_RUN] == parent.info.run_id
        assert run.data.tags["search/fate"] == {"COMPLETE": "complete", "PRUNED": "pruned"}[trial.state.name]
        assert json.loads(run.data.tags["search/params"]) == trial.params
        assert json.loads(run.data.tags["search/intermediate"]) == [
            trial.intermediate_values[k] for k in sorted(trial.intermediate_values)]
        assert float(run.data.params["train.lr"]) == pytest.approx(trial.params["train.lr"])
    pruned = [r for r in runs if r.data.tags["search/fate"] == "pruned"]
    assert pruned, "no trial pruned"
    for run in pruned:  # stopped before its last epoch as a finished job: tested, its outputs kept
        out = tmp_path / "outputs" / "srch" / run.info.run_name
        assert (out / "metrics.json").is_file() and (out / "best").is_dir() and "test/main" in run.data.metrics
    assert any(len(json.loads(r.data.tags["search/intermediate"])) < EPOCHS for r in pruned)
    # two trials ran side by side
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))

    report = (tmp_path / "report" / "search.md").read_text()
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert f"Best configuration: trial {best.number}, " in report
    assert "Mean ± spread (sample sd) over 2 seed(s): eval/main " in report
    assert "Parameter importance (optuna.importance, its default evaluator): train." in report
    rerun = [r for r in mlflow_runs(db, "srch") if r.info.run_name == "sentiment-best-s2"]
    assert len(rerun) == 1 and rerun[0].info.status == "FINISHED"
    assert float(rerun[0].data.params["train.lr"]) == pytest.approx(best.params["train.lr"])


@pytest.mark.slow  # 3 trials, the runner killed with SIGKILL during the second, then run again
def test_a_search_killed_mid_trial_resumes_without_losing_or_repeating_a_trial(tmp_path):
    path, db = search_study(tmp_path, "killed", 3, pruner="none")
    out = tmp_path / "outputs" / "killed"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    cmd = [sys.executable, "-m", "pipeline", "study", str(path)]
    with (tmp_path / "first.log").open("w") as first_log:
        runner = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=first_log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (out / "sentiment-t001" / "journal.jsonl").is_file() or runner.poll() is not None,
                 what="the second trial training")
        assert runner.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        runner.send_signal(signal.SIGKILL)
    finally:
        runner.kill()
        runner.wait()
    states = [t.state.name for t in optuna_trials(tmp_path, "killed")]
    assert states == ["COMPLETE", "RUNNING"]  # the second trial's job outlives the runner

    again = run_cli("study", path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    trials = optuna_trials(tmp_path, "killed")
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    runs = trial_runs(db, "killed")
    assert sorted(int(r.data.tags["search/trial"]) for r in runs) == [0, 1, 2]  # none lost, none twice
    assert all(r.info.status == "FINISHED" and r.data.tags["search/fate"] == "complete" for r in runs)
    for t in trials:
        (run,) = [r for r in runs if r.data.tags["search/trial"] == str(t.number)]
        assert float(run.data.tags["search/value"]) == pytest.approx(t.value)


@pytest.mark.slow  # 2 trials, each a (fake) Slurm job
def test_under_slurm_each_trial_is_a_job_whose_result_reaches_the_optuna_study(tmp_path, fake_slurm):  # noqa: F811
    path, db = search_study(tmp_path, "sl", 2, pruner="none")
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "slurm": {"partition": "cpu", "time": "00:10:00", "gpus_per_node": 0}}))
    result = run_cli("study", path, "--executor", "slurm", "--jobs", "1", env=fake_slurm)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    submitted = jobs(fake_slurm["FAKE_SLURM"])
    assert [j["opts"]["job-name"] for j in submitted] == ["sl.sentiment-t000", "sl.sentiment-t001"]
    assert all(j["state"] == "RAN" and j["exit"] == 0 and j["opts"]["partition"] == "cpu" for j in submitted)
    trials = optuna_trials(tmp_path, "sl")
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    runs = trial_runs(db, "sl")
    for t in trials:
        (run,) = [r for r in runs if r.data.tags["search/trial"] == str(t.number)]
        assert float(run.data.tags["search/value"]) == pytest.approx(t.value)
