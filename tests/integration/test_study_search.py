"""A search study run through the executor seam (study/executor.py).

The search itself (sampling, pruning, failed trials, the runner killed mid-trial, the re-runs of the
best trial, the report) runs in this process with fake cells (FakeCell): each poll of a trial's
handle writes its next evaluation to its journal as a job does, and its end writes what a finished
job leaves (metrics.json, best/, an ended journal), which the runner replays into the trial's
MLflow run. One test keeps the real path: trial cells as stage processes side by side, started by
executor.start_local, one of them pruned and stopping at its next evaluation. Under Slurm (faked:
tests/integration/test_study_concurrency.py) each trial's job runs a FakeCell in a process."""
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from helpers import mlflow_runs, tracking_db
from integration.test_study_concurrency import fake_slurm, jobs  # noqa: F401 (a fixture)
from pipeline import names
from pipeline.layout import OutputDir
from pipeline.study import search, slurm_job, trial_pool
from pipeline.study.executor import Waited
from pipeline.tracking import catch_up, journal
from pipeline.tracking.journal import append

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


def search_study(tmp_path, name, trials, seeds=(1,), epochs=EPOCHS, **search_block):
    db = tracking_db(tmp_path)
    data = small_sentiment(tmp_path / "data", {"train": 320, "dev": 96, "test": 64})
    spec = {"name": name, "output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
            "overrides": ["model=preset:bangla-tiny", "model_config.initializer_range=0.05", "train.max_length=32",
                          f"train.epochs={epochs}", "tracking.system_metrics=false", "infer.bench=false", *data,
                          f"tracking.uri=sqlite:///{db}"],
            "matrix": {"tasks": ["sentiment"], "seeds": list(seeds)},
            "search": {"space": {"train.lr": {"log_uniform": [1e-5, 3e-3]},
                                 "train.batch_size": {"categorical": [16, 32]}},
                       "trials": trials, "sampler": {"type": "tpe", "seed": 0}, **search_block}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, db


def trial_runs(db, name):
    return [r for r in mlflow_runs(db, name) if "search/trial" in r.data.tags]


def optuna_trials(tmp_path, name, group="sentiment"):
    storage = f"sqlite:///{tmp_path / 'outputs' / name / 'optuna.db'}"
    return optuna.load_study(study_name=f"{name}.{group}", storage=storage).get_trials()


def study_cli(*args) -> int:
    """`python -m pipeline study ARGS` in this process (its executor and settings as patched)."""
    from pipeline.cli import main

    return main(["study", *map(str, args)])


# ------------------------------------------------------------------ fake cells, in this process


def curve(params: dict[str, str], epoch: int) -> float:
    """A fake trial's dev score at an evaluation: best near lr 3e-4 and batch 16, rising per epoch."""
    gap = abs(math.log10(float(params["train.lr"])) - math.log10(3e-4))
    return round(max(0.05, 0.9 - 0.15 * gap - (0.05 if params["train.batch_size"] == "32" else 0.0))
                 * (0.7 + 0.1 * epoch), 6)


class FakeCell:
    """One cell's job, advanced one evaluation per poll of its handle: it writes to its journal and
    output_dir what a job writes, and ends as a job does (after its last epoch, or at the first
    evaluation after its stop request, tested and FINISHED; `fail`: exit 1 before its first, its run
    FAILED)."""

    def __init__(self, args: list[str], parent: str, fail=False):
        args = dict(a.split("=", 1) for a in args)
        self.out, self.parent, self.fail = OutputDir(args["output_dir"]), parent, fail
        self.params = {k: v for k, v in args.items() if not k.startswith(("tracking.", "output_dir"))}
        self.epochs, self.uri = int(args.get("train.epochs", EPOCHS)), args["tracking.uri"]
        self.tags = {k[len("tracking.tags."):]: v for k, v in args.items() if k.startswith("tracking.tags.")}
        self.experiment, self.run_name = args["tracking.experiment"], args["tracking.run_name"]
        self.epoch = len(self.logged())

    def logged(self) -> list[float]:
        return trial_pool.objective_values(self.out.root, "eval/main")

    def step(self) -> tuple[int, str] | None:
        path = self.out.journal
        if self.epoch == 0 and not path.is_file():
            self.out.root.mkdir(parents=True, exist_ok=True)
            append(path, journal.start(self.uri, self.experiment, self.run_name, self.tags, self.params),
                   journal.run(None))
        if self.fail:  # its run FAILED in the store, as a job's live tracking leaves it
            append(path, journal.end("FAILED"))
            catch_up(self.out.root, self.uri, {names.TAG_PARENT_RUN: self.parent}, say=False)
            return 1, "error: the fake cell failed"
        self.epoch += 1
        value = curve(self.params, self.epoch)
        append(path, journal.metric("eval/main", value, self.epoch * 10, int(time.time() * 1000)))
        if self.epoch < self.epochs and not self.out.stop_request.exists():
            return None
        best = max(self.logged())
        (self.out.root / "best").mkdir(exist_ok=True)
        self.out.metrics.write_text(json.dumps({"eval/main": best, "test/main": best - 0.05}))
        append(path, journal.metric("test/main", best - 0.05, self.epoch * 10, int(time.time() * 1000)),
               journal.end("FINISHED"))
        return 0, ""


@pytest.fixture
def fake_cells(monkeypatch):
    """The study's local executor replaced by FakeCell, in this process, its polls unpaced and its
    cells tracking to the store itself (one writer: this process). Returns what it saw: each start,
    the most trials running at once, and the cells to fail (by name)."""
    seen = {"started": [], "most_at_once": 0, "fail": set(), "running": set()}

    def start(study, cell, gpus, parent, **_):
        fake = FakeCell(cell.args(), parent, fail=cell.name in seen["fail"])
        seen["started"].append(cell.name)
        seen["running"].add(cell.name)
        seen["most_at_once"] = max(seen["most_at_once"], len(seen["running"]))

        def check():
            ended = fake.step()
            if ended is not None:
                seen["running"].discard(cell.name)
            return ended
        return Waited(cell.name, check)

    monkeypatch.setitem(trial_pool.EXECUTORS, "local", start)
    monkeypatch.setattr(search, "POLL_S", 0)
    monkeypatch.setattr(trial_pool, "POLL_S", 0)
    monkeypatch.setattr(search, "tracking_for_cells", lambda study, uri, jobs, n: contextlib.nullcontext(uri))
    return seen


@pytest.mark.slow  # 8 fake trials and 1 re-run in this process: the MLflow store's writes (~10 s)
def test_a_search_of_eight_trials_prunes_side_by_side_and_reports_the_best_over_seeds(tmp_path, fake_cells):
    path, db = search_study(tmp_path, "srch", 8, seeds=(1, 2), pruner={"type": "median", "n_startup_trials": 2})
    assert study_cli(path, "--jobs", "2") == 0

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
        if trial.state.name == "COMPLETE":
            assert float(run.data.tags["search/value"]) == pytest.approx(trial.value)
    pruned = [r for r in runs if r.data.tags["search/fate"] == "pruned"]
    assert pruned, "no trial pruned"
    assert any(len(json.loads(r.data.tags["search/intermediate"])) < EPOCHS for r in pruned)
    assert fake_cells["most_at_once"] == 2  # two trials side by side

    report = (tmp_path / "report" / "search.md").read_text()
    best = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert f"Best configuration: trial {best.number}, " in report
    assert "Mean ± spread (sample sd) over 2 seed(s): eval/main " in report
    assert "Parameter importance (optuna.importance, its default evaluator): train." in report
    rerun = [r for r in mlflow_runs(db, "srch") if r.info.run_name == "sentiment-best-s2"]
    assert len(rerun) == 1 and rerun[0].info.status == "FINISHED"
    assert float(rerun[0].data.params["train.lr"]) == pytest.approx(best.params["train.lr"])
    assert fake_cells["started"][-1] == "sentiment-best-s2"  # after every trial


@pytest.mark.slow  # 3 fake trials in this process
def test_a_failed_trial_is_told_failed_and_the_search_goes_on(tmp_path, fake_cells):
    path, db = search_study(tmp_path, "fails", 3, pruner="none")
    fake_cells["fail"].add("sentiment-t001")
    assert study_cli(path) == 1  # a trial failed
    assert [t.state.name for t in optuna_trials(tmp_path, "fails")] == ["COMPLETE", "FAIL", "COMPLETE"]
    (failed,) = [r for r in mlflow_runs(db, "fails") if r.info.run_name == "sentiment-t001"]
    assert failed.info.status == "FAILED"
    report = (tmp_path / "report" / "search.md").read_text()
    assert "3 trials (2 complete, 1 fail)" in report and "| 1 | fail | - |" in report


class Killed(BaseException):
    """The runner dying mid-trial (as a SIGKILL would leave it: the trial RUNNING in Optuna)."""


@pytest.mark.slow  # 3 fake trials, the runner killed during the second, then run again, in this process
def test_a_search_killed_mid_trial_resumes_without_losing_or_repeating_a_trial(tmp_path, fake_cells, monkeypatch):
    path, db = search_study(tmp_path, "killed", 3, pruner="none")
    out = tmp_path / "outputs" / "killed"
    start = trial_pool.EXECUTORS["local"]

    def dies_in_the_second_trial(study, cell, gpus, parent, **kw):
        handle = start(study, cell, gpus, parent, **kw)
        if cell.name != "sentiment-t001":
            return handle
        check = handle.check

        def then_die():
            check()  # its first evaluation written, the runner dies
            raise Killed
        handle.check = then_die
        return handle

    monkeypatch.setitem(trial_pool.EXECUTORS, "local", dies_in_the_second_trial)
    with pytest.raises(Killed):
        study_cli(path)
    assert [t.state.name for t in optuna_trials(tmp_path, "killed")] == ["COMPLETE", "RUNNING"]
    assert len(trial_pool.objective_values(out / "sentiment-t001", "eval/main")) == 1

    monkeypatch.setitem(trial_pool.EXECUTORS, "local", start)
    fake_cells["started"].clear()
    assert study_cli(path) == 0
    assert fake_cells["started"] == ["sentiment-t001", "sentiment-t002"]  # the second continued, the first not rerun
    trials = optuna_trials(tmp_path, "killed")
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    runs = trial_runs(db, "killed")
    assert sorted(int(r.data.tags["search/trial"]) for r in runs) == [0, 1, 2]  # none lost, none twice
    assert all(r.info.status == "FINISHED" and r.data.tags["search/fate"] == "complete" for r in runs)
    for t in trials:
        (run,) = [r for r in runs if r.data.tags["search/trial"] == str(t.number)]
        assert float(run.data.tags["search/value"]) == pytest.approx(t.value)
        assert len(json.loads(run.data.tags["search/intermediate"])) == EPOCHS  # each evaluation told once


@pytest.mark.slow  # 2 fake trials, the first interrupted, in this process
def test_ctrl_c_of_a_search_is_one_line_exit_130_and_its_parent_run_killed(tmp_path, fake_cells, monkeypatch, capsys):
    path, db = search_study(tmp_path, "stopped", 2, pruner="none")
    start = trial_pool.EXECUTORS["local"]

    def ctrl_c_in_the_first_trial(study, cell, gpus, parent, **kw):
        handle = start(study, cell, gpus, parent, **kw)
        handle.check = lambda: (_ for _ in ()).throw(KeyboardInterrupt)
        return handle

    monkeypatch.setitem(trial_pool.EXECUTORS, "local", ctrl_c_in_the_first_trial)
    assert study_cli(path) == 130
    storage = tmp_path / "outputs" / "stopped" / "optuna.db"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"interrupted: study stopped: the running trials stopped at their next step and are resumed by the next "
        f"run; sqlite:///{storage} keeps every trial told; to continue: python -m pipeline study {path}")
    (parent,) = [r for r in mlflow_runs(db, "stopped") if r.data.tags.get(names.PARENT_TAG) == "true"]
    assert parent.info.status == "KILLED"


@pytest.mark.slow  # the resumed trial's job finished while no runner watched: told, not started again
def test_a_trial_whose_job_finished_after_the_runner_died_is_only_told(tmp_path, fake_cells, monkeypatch):
    path, db = search_study(tmp_path, "told", 2, pruner="none")
    start = trial_pool.EXECUTORS["local"]

    def dies_in_the_second_trial(study, cell, gpus, parent, **kw):
        handle = start(study, cell, gpus, parent, **kw)
        if cell.name == "sentiment-t001":
            check = handle.check

            def finish_then_die():
                while check() is None:  # the job runs to its end on its own
                    pass
                raise Killed
            handle.check = finish_then_die
        return handle

    monkeypatch.setitem(trial_pool.EXECUTORS, "local", dies_in_the_second_trial)
    with pytest.raises(Killed):
        study_cli(path)
    monkeypatch.setitem(trial_pool.EXECUTORS, "local", start)
    fake_cells["started"].clear()
    assert study_cli(path) == 0
    assert fake_cells["started"] == []
    assert [t.state.name for t in optuna_trials(tmp_path, "told")] == ["COMPLETE", "COMPLETE"]
    assert sorted(int(r.data.tags["search/trial"]) for r in trial_runs(db, "told")) == [0, 1]


# ------------------------------------------------------------------ the real launcher path


@pytest.mark.slow  # 2 trials of the tiny model as stage processes, side by side
def test_trials_run_as_stage_processes_side_by_side_and_a_pruned_one_stops_at_its_next_evaluation(
        tmp_path, monkeypatch):
    """The runner in this process, its trials real stages (executor.start_local) tracking through the
    study's MLflow server; the pruner's say made certain (trial 1 pruned at its first evaluation) so
    the stage's own stop at a stop request is what is checked."""
    path, db = search_study(tmp_path, "real", 2, pruner={"type": "median", "n_startup_trials": 1})
    monkeypatch.setattr(optuna.trial.Trial, "should_prune", lambda trial: trial.number == 1)
    # the search looks often, so the stop request lands within the epoch after the pruned evaluation
    # even on a loaded machine (the stage's own stop is what is checked, not the search's pace)
    monkeypatch.setattr(search, "POLL_S", 0.05)
    assert study_cli(path, "--jobs", "2") == 0

    trials = optuna_trials(tmp_path, "real")
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    runs = trial_runs(db, "real")
    (parent,) = [r for r in mlflow_runs(db, "real") if r.data.tags.get(names.PARENT_TAG) == "true"]
    assert sorted(int(r.data.tags["search/trial"]) for r in runs) == [0, 1]
    by_number = {t.number: t for t in trials}
    for run in runs:
        trial = by_number[int(run.data.tags["search/trial"])]
        assert run.info.status == "FINISHED" and run.data.tags[names.TAG_PARENT_RUN] == parent.info.run_id
        assert json.loads(run.data.tags["search/intermediate"]) == [
            trial.intermediate_values[k] for k in sorted(trial.intermediate_values)]
        assert float(run.data.params["train.lr"]) == pytest.approx(trial.params["train.lr"])
    (pruned,) = [r for r in runs if r.data.tags["search/fate"] == "pruned"]
    # stopped at the evaluation after the one it was pruned at, as a finished job: tested, its outputs kept
    assert len(json.loads(pruned.data.tags["search/intermediate"])) == 2 < EPOCHS
    out = tmp_path / "outputs" / "real" / pruned.info.run_name
    assert (out / "metrics.json").is_file() and (out / "best").is_dir() and "test/main" in pruned.data.metrics
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # two trials ran side by side
    assert "Best configuration: trial " in (tmp_path / "report" / "search.md").read_text()


def fake_cell_command(study, cell, parent, gpus, *_, **__):
    """The command of a FakeCell run to its end in a process of its own (a Slurm job's)."""
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; from integration.test_study_search import FakeCell; "
            "fake = FakeCell(sys.argv[3:], sys.argv[2]); ended = None\n"
            "while ended is None: ended = fake.step()\n"
            "sys.exit(ended[0])")
    return [sys.executable, "-c", code, str(Path(__file__).parents[1]), parent, *cell.args()], {}


@pytest.mark.slow  # 2 trials, each a (fake) Slurm job running a fake cell
def test_under_slurm_each_trial_is_a_job_whose_result_reaches_the_optuna_study(tmp_path, fake_slurm,  # noqa: F811
                                                                              monkeypatch):
    path, db = search_study(tmp_path, "sl", 2, pruner="none")
    monkeypatch.setattr(slurm_job, "launch", fake_cell_command)
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "slurm": {"partition": "cpu", "time": "00:10:00", "gpus_per_node": 0}}))
    for key, value in fake_slurm.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(trial_pool, "POLL_S", 0.1)
    assert study_cli(path, "--executor", "slurm", "--jobs", "1") == 0
    submitted = jobs(fake_slurm["FAKE_SLURM"])
    assert [j["opts"]["job-name"] for j in submitted] == ["sl.sentiment-t000", "sl.sentiment-t001"]
    assert all(j["state"] == "RAN" and j["exit"] == 0 and j["opts"]["partition"] == "cpu" for j in submitted)
    trials = optuna_trials(tmp_path, "sl")
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    runs = trial_runs(db, "sl")
    for t in trials:
        (run,) = [r for r in runs if r.data.tags["search/trial"] == str(t.number)]
        assert float(run.data.tags["search/value"]) == pytest.approx(t.value)
