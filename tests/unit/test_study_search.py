"""A study's search block: what it accepts and refuses (one line naming search.KEY), the command
line's equivalent, the trial cells planned from it, the journal read for the pruner, and the report
on an Optuna study with known trials. The runs themselves: tests/integration/test_study_search.py."""
import json
import re

import optuna
import pytest
import yaml

from pipeline.study import load_study
from pipeline.study.search import search_report
from pipeline.study.search_plan import best_cells, plan_search, trial_cell
from pipeline.study.trial_pool import objective_values


def _cli(args, capsys):
    from pipeline.cli import main

    code = main([str(a) for a in args])
    return code, capsys.readouterr()


def _study_file(tmp_path, search, **more):
    spec = {"name": "s", "output_root": str(tmp_path / "out"), "report_dir": str(tmp_path / "report"),
            "overrides": [f"tracking.uri=sqlite:///{tmp_path}/m.db"],
            "matrix": {"tasks": ["sentiment"], "seeds": [1, 2, 3]}, **more}
    if search is not None:
        spec["search"] = search
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


SPACE = {"train.lr": {"log_uniform": [1e-5, 1e-3]}}
BAD = [
    ({}, "search.space: required"),
    ({"space": {"train.lr": {"normal": [0, 1]}}}, "search.space.train.lr: 'normal': expected one of"),
    ({"space": {"train.lr": {"log_uniform": [1e-3, 1e-5]}}}, "search.space.train.lr: log_uniform: expected [LOW"),
    ({"space": {"train.lr": {"log_uniform": [0, 1e-3]}}}, "search.space.train.lr: log_uniform: the low bound"),
    ({"space": {"train.lrr": {"uniform": [0.1, 0.2]}}}, "search.space.train.lrr: unknown key 'train.lrr'"),
    ({"space": {"kd.alpha": {"uniform": [0.1, 1.5]}}}, "search.space.kd.alpha: kd.alpha=1.5: must be in [0, 1]"),
    ({"space": {"train.epochs": {"int": [1.5, 3]}}}, "search.space.train.epochs: int: the bounds must be integers"),
    ({"space": SPACE, "pruner": "patience"}, "search.pruner: 'patience': expected one of"),
    ({"space": SPACE, "pruner": {"type": "median", "n_startup": 2}}, "search.pruner: median: "),
    ({"space": SPACE, "direction": "up"}, "search.direction: 'up': must be maximize or minimize"),
    ({"space": SPACE, "objective": "eval/main:up"}, "search.objective: 'eval/main:up': a metric's name holds no colon"),
    ({"space": SPACE, "objective": "eval/f1"},
     "search.objective: eval/f1: task sentiment logs no such metric (did you mean eval/macro_f1? its dev scores: "
     "eval/main, eval/loss, eval/accuracy"),
    ({"space": SPACE, "trials": 0}, "search.trials: 0: must be an integer >= 1"),
    ({"space": SPACE, "procedures": ["teacher"]}, "search.procedures: 'teacher': no cell runs it"),
    ({"space": SPACE, "storage": "optuna.db"}, "search.storage: 'optuna.db': expected a database URL"),
    ({"space": SPACE, "budget": 3}, "search.budget: unknown key"),
]


@pytest.mark.parametrize("search,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_a_bad_search_block_is_one_line_naming_its_key(tmp_path, capsys, search, message):
    path = _study_file(tmp_path, search)
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 2, out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), out.err
    assert message in lines[0]
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_dev_objective_for_cells_without_dev_evaluation_is_one_line(tmp_path, capsys):
    path = _study_file(tmp_path, {"space": SPACE}, overrides=[
        f"tracking.uri=sqlite:///{tmp_path}/m.db", "data.train=mine.tsv", "data.dev=skip"])
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 2 and out.err.strip() == (
        f"error: {path}: search.objective: eval/main is a dev figure, and cell sentiment has data.dev=skip (no dev "
        "evaluation): give it dev data, or a test/ objective")


def test_a_test_objective_for_cells_without_a_test_split_is_one_line(tmp_path, capsys):
    path = _study_file(tmp_path, {"space": SPACE, "objective": "test/main"}, overrides=[
        f"tracking.uri=sqlite:///{tmp_path}/m.db", "data.train=mine.tsv", "data.dev=holdout:0.1"])
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 2 and out.err.strip() == (
        f"error: {path}: search.objective: test/main is a test figure, and cell sentiment has no test split "
        "(data.test unset): give it data.test, or an eval/ objective")
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_command_line_searches_a_study_without_a_search_block(tmp_path, capsys):
    path = _study_file(tmp_path, None)
    code, out = _cli(["study", path, "--dry-run", "--space", "train.lr=log_uniform:1e-5:1e-3",
                      "--space", "train.batch_size=categorical:16,32", "--trials", "5",
                      "--objective", "eval/loss:min", "--pruner", "hyperband"], capsys)
    assert code == 0, out.err
    assert "5 trials per group (tpe sampler, hyperband pruner) of eval/loss (minimize)" in out.out
    assert "train.lr log_uniform [1e-05, 0.001]; train.batch_size categorical {16, 32}" in out.out
    trial = re.search(r"train.lr, train.batch_size: sampled by the tpe sampler as each trial starts \(SAMPLED "
                      r"below\); trial 0: (.+)", out.out).group(1)
    # the trial's values after the study's overrides, before the runner's own
    assert re.search(r"seed=1 train\.lr=SAMPLED train\.batch_size=SAMPLED output_dir=\S+/s/sentiment-t000 ", trial)
    assert "tracking.tags.search/trial=0" in trial and "tracking.tags.report_tables=none" in trial
    assert "then the best trial with seed(s) 2, 3" in out.out
    assert not (tmp_path / "out").exists()


def test_the_command_line_lays_its_options_over_the_file(tmp_path):
    path = _study_file(tmp_path, {"space": SPACE, "trials": 9, "pruner": "median"})
    study, _ = load_study(path, [], {"trials": 4, "sampler": "random"})
    assert (study.search.trials, study.search.sampler, study.search.pruner) == (4, {"type": "random"},
                                                                               {"type": "median"})
    assert [d.key for d in study.search.space] == ["train.lr"]


def test_teachers_run_first_and_the_students_are_searched_per_seed_group(tmp_path):
    path = _study_file(tmp_path, {"space": {"kd.alpha": {"uniform": [0.1, 0.9]}, "kd.temperature": "int:1:8"}},
                       procedures={"teacher": {"command": "train"},
                                   "kd": {"command": "distill", "overrides": ["kd.teacher=${teacher.output_dir}"]}},
                       matrix={"tasks": ["wikiqa"], "procedures": ["teacher", "kd"], "seeds": [1, 2]})
    study, cells = load_study(path)
    needed, groups = plan_search(study, cells)
    assert [c.name for c in needed] == ["wikiqa-teacher-s1", "wikiqa-teacher-s2"]
    (group,) = groups
    assert group.name == "wikiqa-kd" and [c.name for c in group.cells] == ["wikiqa-kd-s1", "wikiqa-kd-s2"]
    trial = trial_cell(study, group, 7, {"kd.alpha": 0.25, "kd.temperature": 4})
    args = trial.args()
    assert trial.output_dir == tmp_path / "out" / "s" / "wikiqa-kd-t007"
    assert f"kd.teacher={tmp_path / 'out' / 's' / 'wikiqa-teacher-s1'}" in args  # the first seed's teacher
    assert args.index("kd.alpha=0.25") > args.index("seed=1") and "kd.temperature=4" in args
    assert [a for a in args if a.startswith("output_dir=")] == [f"output_dir={trial.output_dir}"]
    assert trial.needs == ["wikiqa-teacher-s1"]
    (rerun,) = best_cells(study, group, {"kd.alpha": 0.25})
    assert rerun.name == "wikiqa-kd-best-s2" and "seed=2" in rerun.args() and "kd.alpha=0.25" in rerun.args()
    assert f"kd.teacher={tmp_path / 'out' / 's' / 'wikiqa-teacher-s2'}" in rerun.args()


def test_the_pruner_reads_each_evaluation_from_the_journal_once_written(tmp_path):
    lines = [{"type": "metric", "key": "eval/main", "value": 0.5, "step": 10, "ts": 1},
             {"type": "metric", "key": "eval/loss", "value": 0.9, "step": 10, "ts": 1},
             {"type": "metric", "key": "eval/main", "value": 0.625, "step": 20, "ts": 2}]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"type": "metric", "key": "eval/main", "val'
    (tmp_path / "journal.jsonl").write_text(text)  # its last line still being written
    assert objective_values(tmp_path, "eval/main") == [0.5, 0.625]
    assert objective_values(tmp_path, "eval/loss") == [0.9]
    assert objective_values(tmp_path / "none", "eval/main") == []


def test_the_report_gives_trials_importance_best_config_and_its_spread_over_seeds(tmp_path):
    path = _study_file(tmp_path, {"space": {"train.lr": {"log_uniform": [1e-5, 1e-3]},
                                            "train.batch_size": {"categorical": [16, 32]}}})
    study, cells = load_study(path)
    _, (group,) = plan_search(study, cells)
    from pipeline.study.search import optuna_study

    opt = optuna_study(study, group)
    dists = {"train.lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True),
             "train.batch_size": optuna.distributions.CategoricalDistribution([16, 32])}
    for lr, bs, curve in [(1e-4, 16, [0.5, 0.7]), (1e-5, 32, [0.2]), (5e-4, 16, [0.6, 0.8]), (2e-5, 32, [0.3, 0.4])]:
        pruned = len(curve) == 1
        opt.add_trial(optuna.trial.create_trial(
            params={"train.lr": lr, "train.batch_size": bs}, distributions=dists,
            value=None if pruned else curve[-1], intermediate_values=dict(enumerate(curve, 1)),
            state=optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE))
    best = opt.best_trial
    assert best.number == 2
    for seed, value in (("1", 0.8), ("2", 0.7), ("3", 0.9)):  # the best's search seed, then its re-runs
        cell = trial_cell(study, group, 2, best.params) if seed == "1" else next(
            c for c in best_cells(study, group, best.params) if c.values["seeds"] == seed)
        cell.output_dir.mkdir(parents=True)
        (cell.output_dir / "metrics.json").write_text(json.dumps({"eval/main": value, "test/main": value - 0.1}))
    text = search_report(study, [group])
    assert "| 1 | pruned | - | 1e-05 | 32 | 0.200 |" in text
    assert "| 2 | complete | 0.8000 | 0.0005 | 16 | 0.600, 0.800 |" in text
    assert re.search(r"Parameter importance \(optuna.importance, its default evaluator\): train\.\S+ \d\.\d\d, "
                     r"train\.\S+ \d\.\d\d", text)
    assert "Best configuration: trial 2, train.lr=0.0005, train.batch_size=16" in text
    assert "over 3 seed(s): eval/main 0.8000 ± 0.1000; test/main 0.7000 ± 0.1000." in text
    rerun = text.split("```")[1]
    assert "-m pipeline train " in rerun and "seed=1 train.lr=0.0005 train.batch_size=16" in rerun
    assert "output_dir=" not in rerun and "resume=auto" not in rerun


def _searched(tmp_path, trials, space=None):
    """A study of one group whose Optuna study holds `trials`: (train.lr, train.batch_size, value) each,
    completed."""
    space = space or {"train.lr": {"log_uniform": [1e-5, 1e-3]}, "train.batch_size": {"categorical": [16, 32]}}
    study, cells = load_study(_study_file(tmp_path, {"space": space}))
    _, (group,) = plan_search(study, cells)
    from pipeline.study.search import optuna_study

    opt = optuna_study(study, group)
    dists = {"train.lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True),
             "train.batch_size": optuna.distributions.CategoricalDistribution([16, 32])}
    for lr, bs, value in trials:
        params = {k: v for k, v in (("train.lr", lr), ("train.batch_size", bs)) if k in space}
        opt.add_trial(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                value=value, intermediate_values={1: value}))
    return study, group


def _importance(text):
    return re.search(r"Parameter importance \(optuna.importance, its default evaluator\): (.+)", text).group(1)


def test_a_search_whose_trials_all_scored_alike_says_so_and_ranks_nothing(tmp_path):
    """Four runs collapsed to one class score alike: no importance, the best trial a tie."""
    study, group = _searched(tmp_path, [(2.5e-5, 16, 0.3333), (1e-4, 32, 0.3333), (4e-4, 16, 0.3333),
                                        (7e-5, 32, 0.3333)])
    text = search_report(study, [group])
    assert "Every completed trial (4) scored eval/main 0.3333: the search found no difference" in text
    assert _importance(text) == "n/a (every completed trial scored 0.3333)"
    assert ("Best configuration: a tie of trials 0, 1, 2, 3 (eval/main 0.3333 with their search seed); Optuna's "
            "best trial is the first of them, trial 0, train.lr=2.5e-05, train.batch_size=16, and it is the one "
            "re-run over the study's seeds.") in text


@pytest.mark.parametrize("trials,space,why", [
    ([(1e-4, 16, 0.5), (2e-4, 32, 0.6)], None, "n/a (2 distinct values among 2 completed trials: 2 parameters "
                                               "take at least 3)"),
    ([(1e-4, None, 0.5), (2e-4, None, 0.6), (3e-4, None, 0.7)], {"train.lr": {"log_uniform": [1e-5, 1e-3]}},
     "n/a (one parameter searched: its share is 1 whatever the trials scored)"),
])
def test_importance_is_left_out_where_the_values_cannot_rank_the_parameters(tmp_path, trials, space, why):
    study, group = _searched(tmp_path, trials, space)
    text = search_report(study, [group])
    assert _importance(text) == why
    assert "a tie of trials" not in text and "Every completed trial" not in text


def test_a_trial_whose_run_stalled_is_marked_stalled(tmp_path):
    """The stall tag a trial's job put on its run (measure/collapse.py) reaches search.md."""
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from helpers import tracking_db
    from pipeline.names import TAG_CELL, TAG_STALL_REASON, TAG_STALLED, TAG_STUDY

    study, group = _searched(tmp_path, [(1e-4, 16, 0.3333), (2e-4, 32, 0.61), (3e-4, 16, 0.72), (5e-4, 32, 0.7)])
    client = MlflowClient(f"sqlite:///{tracking_db(tmp_path)}")
    experiment = client.create_experiment(study.name)
    for cell, stalled in (("sentiment-t000", "true"), ("sentiment-t001", "false"), ("other-t002", "true")):
        client.create_run(experiment, tags={TAG_STUDY: study.name, TAG_CELL: cell, TAG_STALLED: stalled,
                                            TAG_STALL_REASON: "one class predicted for every row"})
    opened = SimpleNamespace(client=client, experiment_id=experiment, study=study)
    text = search_report(study, [group], opened)
    assert "| 0 | complete (stalled) | 0.3333 |" in text and "| 1 | complete | 0.6100 |" in text
    assert "(the trial's test predictions collapsed, so its eval/main ranks no configuration): trial 0: one class " \
           "predicted for every row." in text


def test_shipped_search_studies_plan(capsys):
    from helpers import ROOT

    expected = {"bangla_search.yaml": (20, ["sentiment", "ner", "error_cls", "qa"], []),
                "wikiqa_kd_search.yaml": (24, ["wikiqa-kd"], ["wikiqa-teacher-s42", "wikiqa-teacher-s43",
                                                               "wikiqa-teacher-s44"])}
    for name, (trials, groups, needed) in expected.items():
        code, out = _cli(["study", ROOT / "launch" / "studies" / name, "--dry-run"], capsys)
        assert code == 0, out.err
        assert out.out.startswith(f"study {name[:-5]}: a search, {trials} trials per group")
        assert re.findall(r"^- needed first: (\S+)", out.out, re.M) == needed
        assert re.findall(r"^- (?!needed)(\S+):", out.out, re.M) == groups
        assert out.out.count("then the best trial with seed(s) 43, 44") == len(groups)


def test_the_champion_alias_moves_only_beyond_the_seed_spread(tmp_path):
    from mlflow import MlflowClient

    from helpers import tracking_db
    from pipeline.study.champion import beats, crown

    assert beats(0.80, 0.01, 0.70, 0.02, "maximize") and not beats(0.71, 0.01, 0.70, 0.02, "maximize")
    assert beats(0.30, 0.01, 0.40, 0.02, "minimize") and not beats(0.45, 0.01, 0.40, 0.02, "minimize")
    client = MlflowClient(f"sqlite:///{tracking_db(tmp_path)}")
    experiment = client.create_experiment("e")
    client.create_registered_model("m")

    def version():
        run = client.create_run(experiment).info.run_id
        return run, client.create_model_version("m", source=str(tmp_path), run_id=run).version

    first_run, first = version()
    said = crown(client, "m", [first_run], [0.70, 0.72, 0.68], "eval/main", "maximize")
    assert said == f"m v{first} (eval/main 0.7000 ± 0.0200 over 3 seed(s)) is the champion"
    close_run, close = version()  # better by less than the spread: the champion stays
    said = crown(client, "m", [close_run], [0.715, 0.705, 0.725], "eval/main", "maximize")
    assert "not crowned: it does not beat champion v1 (0.7000 ± 0.0200) beyond the seed spread" in said
    assert client.get_model_version_by_alias("m", "champion").version == first
    far_run, far = version()
    said = crown(client, "m", [far_run], [0.80, 0.81, 0.79], "eval/main", "maximize")
    assert said.endswith(f"is the champion, after v{first}")
    assert client.get_model_version_by_alias("m", "champion").version == far
    assert float(client.get_model_version("m", far).tags["search/mean"]) == pytest.approx(0.8)


# ------------------------------------------------------------------ the objective, and trials that fail


def test_a_mistyped_direction_is_refused_before_any_trial(tmp_path, capsys):
    """--objective METRIC:WAY takes max or min: `eval/main:up` is one line naming --objective, exit 2,
    and nothing starts (it was once a metric's name no job logs, and every trial ran for nothing)."""
    path = _study_file(tmp_path, None)
    code, out = _cli(["study", path, "--dry-run", "--space", "train.lr=log_uniform:1e-5:1e-3", "--objective",
                      "eval/main:up"], capsys)
    assert code == 2 and out.err.strip() == ("error: study: --objective eval/main:up: 'up' is no direction: expected "
                                             "METRIC, METRIC:max or METRIC:min (eval/main:max, eval/loss:min)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("task,objective,near", [
    ("sentiment", "eval/mian", "eval/main"), ("sentiment", "test/f1", "test/macro_f1"),
    ("qa", "eval/exact_match", "eval/exact"), ("qa", "eval/loss", None),  # QA's dev windows: no answer span, no loss
    ("wikiqa", "eval/MAP", "eval/map"), ("sentiment", "perf/samples_per_s", "perf/train_samples_per_s")])
def test_an_objective_the_task_never_logs_is_refused_with_the_nearest_name(tmp_path, capsys, task, objective, near):
    path = _study_file(tmp_path, {"space": SPACE, "objective": objective},
                       matrix={"tasks": [task], "seeds": [1]})
    code, out = _cli(["study", path, "--dry-run"], capsys)
    assert code == 2, out
    assert out.err.startswith(f"error: {path}: search.objective: {objective}: task {task} logs no such metric (")
    assert near is None or f"(did you mean {near}? its dev scores: eval/main, " in out.err
    assert len(out.err.strip().splitlines()) == 1


@pytest.mark.parametrize("task,objective", [("ner", "eval/f1_symptom"), ("qa", "test/HasAns_f1"),
                                            ("wikiqa", "test/mrr"), ("sentiment", "eval/loss"),
                                            ("sentiment", "perf/train_samples_per_s")])
def test_an_objective_the_task_logs_is_taken(tmp_path, task, objective):
    study, _ = load_study(_study_file(tmp_path, {"space": SPACE, "objective": objective},
                                      matrix={"tasks": [task], "seeds": [1]}))
    assert study.search.objective == objective


class _Store:
    """The study's store as the search writes it: tags per run, the parent's included."""

    def __init__(self, study):
        self.study, self.parent, self.experiment_id, self.uri = study, "parent", "0", "fake://"
        self.client, self.tags = self, {}

    def outcome(self, cell, end):  # a job that ended with exit 0 and its run FINISHED
        return {"status": "finished", "exit_code": end.exit_code, "run_id": f"run-{cell.name}", "wall_s": 1.0}

    def set_tag(self, run, key, value):
        self.tags.setdefault(run, {})[key] = value

    def set_terminated(self, run, status):
        self.tags.setdefault(run, {})["status"] = status

    def finish(self):
        return 0  # every trial's run FINISHED: the store alone counts them all finished

    def search_runs(self, *args, **kwargs):
        return []


def _jobs_that_finish_without(monkeypatch, metrics):
    """Each trial's job ends at once with exit 0, leaving `metrics` as its metrics.json."""
    from pipeline.study import search, trial_pool
    from pipeline.study.executor import Waited

    def start(study, cell, gpus, **kwargs):
        cell.output_dir.mkdir(parents=True, exist_ok=True)
        (cell.output_dir / "metrics.json").write_text(json.dumps(metrics))
        return Waited(cell.name, lambda: (0, "done"))

    monkeypatch.setitem(trial_pool.EXECUTORS, "local", start)
    monkeypatch.setattr(search, "POLL_S", 0)


def test_a_trial_whose_job_logs_no_objective_fails_and_says_why(tmp_path, monkeypatch, caplog):
    """The reason is on the console, in Optuna's trial attributes, on the trial's run and on the
    parent run; a search whose every trial failed exits non-zero although every job exited 0."""
    from pipeline.names import TAG_TRIAL_FATE, TAG_TRIAL_REASON
    from pipeline.study import search

    path = _study_file(tmp_path, {"space": SPACE, "trials": 2, "sampler": {"type": "random", "seed": 0}})
    study, cells = load_study(path)
    store = _Store(study)
    monkeypatch.setattr(search.OpenStudy, "open", classmethod(lambda cls, study, cells: store))
    monkeypatch.setattr(search, "write_search_report", lambda *a: tmp_path / "search.md")
    _jobs_that_finish_without(monkeypatch, {"test/main": 0.5})  # eval/main (the objective) missing
    caplog.set_level("INFO", logger="pipeline")
    assert search.run_search(study, cells, slots=1) == 1
    why = "eval/main: not logged by the job (search.objective)"
    trials = search.optuna_study(study, plan_search(study, cells)[1][0], create=False).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2
    assert [t.user_attrs.get(search.FAIL_REASON) for t in trials] == [why, why]
    for name in ("sentiment-t000", "sentiment-t001"):
        assert store.tags[f"run-{name}"][TAG_TRIAL_FATE] == "failed"
        assert store.tags[f"run-{name}"][TAG_TRIAL_REASON] == why
        assert store.tags["parent"][f"search/failed.{name}"] == why
        assert f"{name}: failed after " in caplog.text and f"s: {why}" in caplog.text
    assert "every trial of sentiment failed" in caplog.text


def test_a_search_with_a_completed_trial_keeps_the_stores_exit_code(tmp_path, monkeypatch):
    from pipeline.study import search

    study, cells = load_study(_study_file(tmp_path, {"space": SPACE, "trials": 1}))
    store = _Store(study)
    monkeypatch.setattr(search.OpenStudy, "open", classmethod(lambda cls, study, cells: store))
    monkeypatch.setattr(search, "write_search_report", lambda *a: tmp_path / "search.md")
    monkeypatch.setattr(search, "_best_reruns", lambda opened, groups: [])
    _jobs_that_finish_without(monkeypatch, {"eval/main": 0.7})
    assert search.run_search(study, cells, slots=1) == 0
    assert store.tags["run-sentiment-t000"]["search/fate"] == "complete"
    assert not any(k.startswith("search/failed.") for k in store.tags.get("parent", {}))


def test_the_report_counts_a_failed_trial_as_failed_with_its_reason():
    """A trial's run ended FINISHED (its job exited 0) but gave no value: a failed cell in the report
    and the closing line, its reason beside it."""
    from types import SimpleNamespace

    from pipeline.names import TAG_TRIAL_FATE, TAG_TRIAL_REASON
    from pipeline.report.cells import _row

    tags = {TAG_TRIAL_FATE: "failed", TAG_TRIAL_REASON: "eval/main: not logged by the job (search.objective)"}
    run = SimpleNamespace(data=SimpleNamespace(tags=tags, params={}, metrics={}),
                          info=SimpleNamespace(status="FINISHED", run_id="r"))
    row = _row(None, "sentiment-t000", {}, run)
    assert (row["status"], row["reason"]) == ("failed", tags[TAG_TRIAL_REASON])
