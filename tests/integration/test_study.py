"""The study runner and the comparison report: the tests that train a model or start a process (the
others are in tests/unit/test_study.py)."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest
import yaml

from helpers import FAST, ROOT, mlflow_runs, run_cli, tracking_db
from pipeline import names, predictions
from unit.test_study import _cli  # noqa: F401

STUDY = "tiny"


def client_for(db):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{db}")


def read_table(path):
    """A report CSV as written: the marks failed, missing and n/a stay strings."""
    return pd.read_csv(path, keep_default_na=False)


def parent_runs(db, experiment):
    return [r for r in mlflow_runs(db, experiment) if r.data.tags.get(names.PARENT_TAG) == "true"]


def child_runs(db, experiment):
    return [r for r in mlflow_runs(db, experiment) if r.data.tags.get(names.PARENT_TAG) != "true"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The small study, run twice: two cells at a time, then one at a time (it resumes the first)."""
    tmp = tmp_path_factory.mktemp("study")
    db = tracking_db(tmp)
    spec = {
        "name": STUDY,
        "output_root": str(tmp / "outputs"),
        "report_dir": str(tmp / "report"),
        "overrides": [*FAST, "train.max_steps=10", f"tracking.uri=sqlite:///{db}"],
        "procedures": {
            # exits 2 at start (the data file does not exist); the cell after it never runs
            "broken": {"command": "train", "overrides": [f"data.train={tmp / 'missing.tsv'}",
                                                         "data.dev=samples", "data.test=samples"]},
            "needs_broken": {"command": "distill", "launcher": {"type": "torchrun", "nproc": 2},
                             "overrides": ["kd.teacher=${broken.output_dir}"]},
        },
        "matrix": [
            # the seed-1 cells also log their best model (tracking.log_model=true)
            {"tasks": ["sentiment"], "precisions": ["fp32", "auto"],
             "seeds": {1: ["tracking.log_model=true"], 2: []}},
            {"tasks": ["sentiment"], "procedures": ["broken", "needs_broken"]},
        ],
    }
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    t0 = time.perf_counter()
    first = run_cli("study", path, "--jobs", "2")
    t1 = time.perf_counter()
    runs_after_first = {r.info.run_id for r in mlflow_runs(db, STUDY)}
    second = run_cli("study", path)
    t2 = time.perf_counter()
    return {"tmp": tmp, "db": db, "path": path, "first": first, "second": second, "first_s": t1 - t0,
            "second_s": t2 - t1, "runs_after_first": runs_after_first,
            "outputs": tmp / "outputs" / STUDY, "report": tmp / "report"}


FINISHED = ["sentiment-fp32-s1", "sentiment-fp32-s2", "sentiment-auto-s1", "sentiment-auto-s2"]
LOGGED_MODELS = ["sentiment-fp32-s1", "sentiment-auto-s1"]


@pytest.mark.slow
def test_study_runs_every_cell_and_records_the_crash(study):
    first = study["first"]
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]  # 1: some cell failed
    log = first.stdout + first.stderr
    assert re.search(r"sentiment-broken: failed with exit code 2 .*missing\.tsv: no such file", log)
    assert "sentiment-needs_broken: not run: it needs sentiment-broken, which failed" in log
    children = child_runs(study["db"], STUDY)
    assert sorted(r.data.tags["cell"] for r in children) == sorted(FINISHED)  # no run for bad input
    assert all(r.info.status == "FINISHED" for r in children)
    for cell in FINISHED:
        assert (study["outputs"] / cell / "metrics.json").is_file()
    (parent,) = parent_runs(study["db"], STUDY)
    outcome = json.loads(parent.data.tags[names.CELL_TAG_PREFIX + "sentiment-broken"])
    assert (outcome["status"], outcome["exit_code"]) == ("failed", 2)
    assert "no such file" in outcome["reason"]
    assert json.loads(parent.data.tags[names.CELL_TAG_PREFIX + "sentiment-needs_broken"])["status"] == "failed"
    assert parent.info.status == "FAILED"  # a cell failed; the next invocation retries it


@pytest.mark.slow
def test_concurrent_cells_lose_nothing_in_tracking(study):
    """Two stages at once wrote through the study's MLflow server: each run holds every record of
    its job's journal (each metric point, at its step) and every final figure of metrics.json."""
    from pipeline.tracking import read_journal

    client = client_for(study["db"])
    runs = {r.data.tags["cell"]: r for r in child_runs(study["db"], STUDY)}
    for cell in FINISHED:
        run = runs[cell]
        points = [r for r in read_journal(study["outputs"] / cell / "journal.jsonl") if r["type"] == "metric"]
        assert points
        for key in {p["key"] for p in points}:
            logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            assert logged == sorted((p["step"], p["value"]) for p in points if p["key"] == key), (cell, key)
        final = json.loads((study["outputs"] / cell / "metrics.json").read_text())
        for key, value in final.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert run.data.metrics[key] == pytest.approx(value, rel=1e-12), (cell, key)


@pytest.mark.slow
def test_cells_ran_side_by_side_with_one_progress_line_per_start_and_end(study):
    log = study["first"].stdout + study["first"].stderr
    assert re.search(r"\[0/6 done, 2 running\] sentiment-\S+: started on CPU \(log: ", log)
    for cell in FINISHED:
        assert re.search(rf"\[\d/6 done, \d running\] {cell}: finished in [\d.]+s on CPU", log)
        # the stage's own output stays in its log: two at once would interleave on the console
        kept = (study["outputs"] / "_logs" / f"{cell}.log").read_text()
        assert kept.startswith("=== attempt 1, ") and "\n+ " in kept and "samples/s over" in kept
    assert "samples/s over" not in log
    assert log.index("sentiment-broken: failed") < log.index("sentiment-needs_broken: not run")


@pytest.mark.slow
def test_parent_run_holds_the_children(study):
    (parent,) = parent_runs(study["db"], STUDY)  # one parent, reopened by the second invocation
    for run in child_runs(study["db"], STUDY):
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags[names.TAG_STUDY] == STUDY
        assert run.data.tags[names.TAG_PROCEDURE] == "train"
        assert run.info.run_name == run.data.tags["cell"]
        assert run.data.tags["seed"] in ("1", "2")
    artifacts = {a.path for a in client_for(study["db"]).list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/amp_table.csv", "report/speedup.png"} <= artifacts


@pytest.mark.slow
def test_cells_log_their_models_in_the_study_experiment(study):
    """MLflow's own search: the study's experiment (its Models page) holds the model of each cell
    that logged one, its source the cell's run; MLflow's `Default` experiment holds none."""
    client = client_for(study["db"])
    experiment_id = client.get_experiment_by_name(STUDY).experiment_id
    cells = {r.info.run_id: r.data.tags["cell"] for r in child_runs(study["db"], STUDY)}
    models = client.search_logged_models([experiment_id])
    assert sorted(cells[m.source_run_id] for m in models) == sorted(LOGGED_MODELS)
    assert {m.experiment_id for m in models} == {experiment_id}
    assert list(client.search_logged_models(["0"])) == []


@pytest.mark.slow
def test_second_invocation_skips_finished_cells(study):
    second = study["second"]
    assert second.returncode == 1  # the broken cell is retried and fails again
    log = second.stdout + second.stderr
    for cell in FINISHED:
        assert f"{cell}: finished before; skipped" in log
        assert f"tracking.run_name={cell}" not in log  # no stage process was started for it
    assert "sentiment-broken: failed with exit code 2" in log
    assert {r.info.run_id for r in mlflow_runs(study["db"], STUDY)} == study["runs_after_first"]


@pytest.mark.slow
def test_report_numbers_are_the_runs_metrics(study):
    report = study["report"]
    metrics = {c: json.loads((study["outputs"] / c / "metrics.json").read_text()) for c in FINISHED}
    cells = pd.read_csv(report / "cells.csv").set_index("cell")
    for cell, m in metrics.items():
        row = cells.loc[cell]
        assert row.status == "finished"
        assert row.main == pytest.approx(m[names.TEST_MAIN], rel=1e-9)
        assert row.samples_per_s == pytest.approx(m[names.SAMPLES_PER_S], rel=1e-9)
        assert row.peak_mem_mb == pytest.approx(m[names.PEAK_RSS], rel=1e-9)
        assert row.memory == "CPU peak RSS"
    assert cells.loc["sentiment-broken"].status == "failed" and cells.loc["sentiment-broken"].exit_code == 2

    amp = read_table(report / "amp_table.csv")
    assert len(amp) == 1
    row = amp.iloc[0]

    def mean(prefix, key):
        return (metrics[f"sentiment-{prefix}-s1"][key] + metrics[f"sentiment-{prefix}-s2"][key]) / 2

    assert (row.fp32_seeds, row.amp_seeds) == ("2/2", "2/2")
    assert float(row.fp32_samples_per_s) == pytest.approx(mean("fp32", names.SAMPLES_PER_S), rel=1e-9)
    assert float(row.amp_main) == pytest.approx(mean("auto", names.TEST_MAIN), rel=1e-9)
    if row.amp_precision == "fp32":  # precision=auto without bf16: one precision on both sides, nothing compared
        assert row.speedup_pct == row.mem_reduction_pct == "same precision: nothing to compare"
    else:
        assert float(row.speedup_pct) == pytest.approx(
            (mean("auto", names.SAMPLES_PER_S) / mean("fp32", names.SAMPLES_PER_S) - 1) * 100, rel=1e-9)
        assert float(row.mem_reduction_pct) == pytest.approx(
            (1 - mean("auto", names.PEAK_RSS) / mean("fp32", names.PEAK_RSS)) * 100, rel=1e-9)
    assert float(row.retention_pct) == pytest.approx(mean("auto", names.TEST_MAIN) / mean("fp32", names.TEST_MAIN)
                                                     * 100, rel=1e-9)
    assert row.fp32_energy_j == "n/a"  # CPU: tagged energy_available=false, never a zero

    kd = read_table(report / "kd_table.csv").set_index("procedure")
    assert kd.loc["broken"].status == "failed" and kd.loc["broken"].samples_per_s == "failed"
    assert kd.loc["needs_broken"].test_f1 == "failed"
    stats = pd.read_csv(report / "seed_stats.csv")
    assert set(stats.metric) == {"main", "samples_per_s", "peak_mem_mb"}
    assert set(stats.exceeds_spread) <= {"yes", "no"}
    text = (report / "report.md").read_text()
    # precision=auto is bf16 on a CPU with bf16 and fp32 on one without: the headline says which
    if row.amp_precision == "fp32":
        assert "AMP resolved to fp32 in every cell" in text and "nothing to compare" in text
    else:
        assert (f"Averaged over 1 task x model cell on a CPU with {row.cpu_bf16}" in text
                and f"AMP ({row.amp_precision}) trained" in text)
        # the pair's step timed side by side in the report's process: fp32 and bf16 alternating
        step = json.loads((report / "amp_step.json").read_text())
        (timed,) = step["pairs"].values()
        assert timed["precision"] == row.amp_precision and len(timed["amp_ms_by_step"]) == step["steps"]
        assert timed["speedup"] == pytest.approx(timed["fp32_step_ms"] / timed["amp_step_ms"])
        assert f"**{row.amp_precision} {timed['speedup']:.2f}x** (medians of" in text
    assert "| failed |" in text
    for png in ("speedup.png", "memory_reduction.png", "retention.png", "kd.png"):
        assert (report / png).stat().st_size > 1000


@pytest.fixture(scope="module")
def ui_server(study):
    """Start `pipeline ui ARGS` on the study's store; yields a function returning a URL it printed
    (the page it opens, or another line's by its label) once the server answers. The tests of this
    module share a server per ARGS (the UI is read-only)."""
    procs, urls = [], {}

    def start(*args, page="MLflow UI"):
        """The URL printed after `page: ` (the page it opens, or `its logged models`)."""
        if args not in urls:
            urls[args] = launch(args)
        return urls[args][page]

    def launch(args):
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "ui", *args, "--uri", f"sqlite:///{study['db']}"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        procs.append(proc)
        printed = {}
        while "MLflow UI" not in printed:  # the page it opens is the last line before the server's
            line = proc.stdout.readline()
            match = re.match(r"(.+?): (http://[\d.]+:\d+)/(\S*)", line)
            assert match, line
            printed[match.group(1)] = match.group(2) + "/" + match.group(3)
        base = re.match(r"http://[\d.]+:\d+", printed["MLflow UI"]).group(0)
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=5)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "the UI did not answer"
                time.sleep(0.5)
        session = subprocess.run(["ps", "-s", str(proc.pid), "-o", "args="], capture_output=True, text=True).stdout
        assert "mlflow.server.jobs" not in session  # no job runner: the UI of training runs has no jobs to run
        return printed

    yield start
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_ui_serves_the_study_experiment(ui_server, study):
    url = ui_server("--experiment", STUDY)
    match = re.search(r"(http://[\d.]+:\d+)/#/experiments/(\w+)", url)
    assert match, url
    base, experiment_id = match.groups()
    body = json.dumps({"experiment_ids": [experiment_id], "max_results": 100}).encode()
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(request, timeout=30))
    served = {r["info"]["run_id"] for r in answer["runs"]}
    assert served == {r.info.run_id for r in mlflow_runs(study["db"], STUDY)}
    # some cells logged models: their Models page is printed too
    assert ui_server("--experiment", STUDY, page="its logged models") == (
        f"{base}/#/experiments/{experiment_id}/models?workflowType=machine_learning")


# ------------------------------------------------------------------ the study in a browser
# `pipeline ui` as a user meets it: headless Chromium loads the printed URL and the rendered page
# shows the training runs, their metrics and the compare view of the study's cells. Skipped, with
# the reason, where Chromium is not installed (`make test` installs Debian's `chromium` when it
# can). Screenshots are kept under outputs/test-artifacts/ for a person to open.

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "outputs" / "test-artifacts"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian "
                                    "package `chromium`); the browser check needs it")


def render(url: str, screenshot: str) -> str:
    """The page's DOM after its scripts ran, and a screenshot of it: one headless Chromium, a
    tall window so the page renders its tables below the fold too. The time limit is generous:
    the MLflow server shares two cores with a second pytest worker."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                          "--window-size=1600,4000", f"--screenshot={ARTIFACTS / screenshot}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=300).stdout
    assert (ARTIFACTS / screenshot).stat().st_size > 10_000
    (ARTIFACTS / screenshot).with_suffix(".html").write_text(dom, encoding="utf-8")
    return dom


@pytest.mark.slow
def test_study_ends_with_the_command_that_opens_its_comparison(study):
    log = study["first"].stdout + study["first"].stderr
    assert f"python -m pipeline ui --uri sqlite:///{study['db']} --study {STUDY}" in log


@pytest.mark.slow
@needs_chromium
def test_experiment_opens_on_the_training_runs_not_the_genai_overview(ui_server):
    url = ui_server("--experiment", STUDY)
    assert "/runs?workflowType=machine_learning" in url
    dom = render(url, "ui-experiment-runs.png")
    assert "matching runs" in dom and ">Runs<" in dom  # the runs table of the Model training view
    assert STUDY in dom  # the study's parent run, its cells nested under it
    assert "No data available for the selected time range" not in dom  # the GenAI overview's empty traces


@pytest.mark.slow
@needs_chromium
def test_study_opens_the_compare_view_of_its_finished_cells(ui_server, study):
    url = ui_server("--study", STUDY)
    children = {r.info.run_id for r in child_runs(study["db"], STUDY)}
    assert "#/compare-runs?runs=" in url and all(run_id in url for run_id in children)
    dom = render(url, "ui-study-compare.png")
    assert f"Comparing {len(FINISHED)} Runs" in dom
    # the metrics table lists every metric the cells logged, sorted; it is virtualized, so the DOM holds
    # its first rows only (how many depends on the box, not on the runs)
    shown = re.findall(r'">([\w/.-]+)<i class="fa fa-chart-line', dom)
    logged = sorted(set().union(*(r.data.metrics for r in child_runs(study["db"], STUDY))))
    assert len(shown) >= 10 and shown == logged[:len(shown)], shown
    for metric in (names.agreement_metric("fp32"), names.EVAL_MAIN):  # the report's agreement, beside the scores
        assert metric in shown
    for run_id in children:
        assert run_id in dom


@pytest.mark.slow
@needs_chromium
def test_study_ui_prints_its_models_page_listing_each_model_with_its_run(ui_server, study):
    """`pipeline ui --study` also prints the experiment's Models page: the cells' logged models, each
    in a row with a link to the run it came from."""
    client = client_for(study["db"])
    experiment_id = client.get_experiment_by_name(STUDY).experiment_id
    url = ui_server("--study", STUDY, page="its logged models")
    assert url.endswith(f"/#/experiments/{experiment_id}/models?workflowType=machine_learning")
    dom = render(url, "ui-study-models.png")
    runs = {r.data.tags["cell"]: r.info.run_id for r in child_runs(study["db"], STUDY)}
    for cell in LOGGED_MODELS:
        assert re.search(rf'href="[^"]*/experiments/{experiment_id}/runs/{runs[cell]}"[^>]*>[^<]*{cell}<', dom), cell
    assert "sentiment-fp32-s2" not in dom  # a cell without a model has no row


@pytest.mark.slow
def test_ui_of_an_unknown_study_is_one_line_exit_2(study, capsys):
    code, out = _cli(["ui", "--study", "nosuch", "--uri", f"sqlite:///{study['db']}"], capsys)
    assert code == 2
    assert out.err.strip() == f"error: ui: --study nosuch: no experiment 'nosuch' in sqlite:///{study['db']}"


# ------------------------------------------------------------------ the report on hand-built runs


def log_run(client, experiment_id, parent_id, cell, tags, metrics, status="FINISHED"):
    run = client.create_run(experiment_id, run_name=cell, tags={"cell": cell, names.TAG_STUDY: "hand",
                                                                "mlflow.parentRunId": parent_id, **tags})
    for key, value in metrics.items():
        client.log_metric(run.info.run_id, key, value)
    client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


def plan_entry(task, model, precision, procedure="train", seed=1, tables=("amp",), command="train", needs=(),
               **outcome):
    return json.dumps({"task": task, "model": model, "precision": precision, "seed": seed, "procedure": procedure,
                       "command": command, "launcher": "none", "tables": list(tables), "needs": list(needs),
                       "status": "finished", **outcome})


def cpu_metrics(main, sps, rss, epoch=10.0, accuracy=None):
    """A classification run's figures on a CPU; its test scores are the main metric (macro-F1)
    and the accuracy (default: main + 0.01)."""
    return {names.TEST_MAIN: main, names.test_metric("macro_f1"): main,
            names.test_metric("accuracy"): main + 0.01 if accuracy is None else accuracy,
            names.test_metric("loss"): 0.5 - main / 10, names.EVAL_MAIN: main - 0.05, names.SAMPLES_PER_S: sps,
            names.PEAK_RSS: rss, names.EPOCH_TIME: epoch, names.TRAIN_TIME: 3 * epoch}


LABELS = ["Positive", "Negative", "Neutral"]


def sentiment_rows(pred: str) -> list[dict]:
    """Ten test rows of gold PPPPNNNUUU predicted as `pred` spells, each predicted class at 0.8."""
    gold = "PPPPNNNUUU"
    full = dict(zip("PNU", LABELS))
    return [{"id": str(i), "gold": full[g], "pred": full[p], "probs": [0.8 if c == p else 0.1 for c in "PNU"]}
            for i, (g, p) in enumerate(zip(gold, pred))]


def wikiqa_rows(scores: list[float]) -> list[dict]:
    gold = [1, 0, 0, 1, 0, 0]
    return [{"id": f"q{i // 3}:{i % 3}", "question": f"q{i // 3}", "score": s, "pred": int(s > 0.5), "gold": g}
            for i, (s, g) in enumerate(zip(scores, gold))]


# fp32 s1 misses row 9; bf16 s1 also misses rows 0-3 (only FP32 right on 4: McNemar p = 2 x 0.5^4 = 0.125,
# agreement 6/10); fp32 s2 misses row 4 too (the seed noise: 9/10 agree), bf16 s2 predicts as fp32 s2
HAND_PREDICTIONS = {
    "a-fp32-s1": ("m1", "fp32", 1, sentiment_rows("PPPPNNNUUP")),
    "a-bf16-s1": ("m1", "bf16", 1, sentiment_rows("NNNNNNNUUP")),
    "a-fp32-s2": ("m1", "fp32", 2, sentiment_rows("PPPPPNNUUP")),
    "a-bf16-s2": ("m1", "bf16", 2, sentiment_rows("PPPPPNNUUP")),
    # the student disagrees with its teacher on 2 of 6 candidates, the teacher right on both
    "teacher": ("mini", "fp32", 1, wikiqa_rows([0.9, 0.2, 0.1, 0.8, 0.3, 0.2])),
    "kd_fp32-s1": ("from_teacher:2", "fp32", 1, wikiqa_rows([0.9, 0.7, 0.1, 0.4, 0.3, 0.2])),
}


# slow: a new MLflow SQLite store, 14 runs and four charts take 10-15 s
@pytest.fixture(scope="module")
def hand_report(tmp_path_factory):
    from pipeline.report import write_report

    tmp = tmp_path_factory.mktemp("hand")
    db = tmp / "h.db"
    client = client_for(db)
    exp = client.create_experiment("hand", artifact_location=(tmp / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="hand",
                               tags={names.PARENT_TAG: "true", names.TAG_STUDY: "hand"}).info.run_id
    cpu = {"device_type": "cpu", "energy_available": "false", names.TAG_CPU_BF16: "AVX512-BF16"}
    plan = {}

    run_ids = {}

    def cell(name, task, model, precision, resolved, metrics, seed=1, status="FINISHED", **extra):
        tags = {k: extra.pop(k) for k in list(extra) if k == names.TAG_BATCH_FIT}
        plan[name] = plan_entry(task, model, precision, seed=seed, **extra)
        if metrics is not None:
            run_ids[name] = log_run(client, exp, parent, name, {**cpu, "precision": resolved,
                                                                "precision_requested": precision, "seed": str(seed),
                                                                **tags}, metrics, status)

    # sentiment x m1: two seeds per side, known means
    cell("a-fp32-s1", "sentiment", "m1", "fp32", "fp32", cpu_metrics(0.80, 100, 1000), seed=1)
    cell("a-fp32-s2", "sentiment", "m1", "fp32", "fp32", cpu_metrics(0.82, 110, 1000), seed=2)
    cell("a-bf16-s1", "sentiment", "m1", "bf16", "bf16", cpu_metrics(0.79, 150, 800), seed=1)
    cell("a-bf16-s2", "sentiment", "m1", "bf16", "bf16", cpu_metrics(0.81, 160, 820), seed=2)
    # ner x m1: the AMP run crashed mid-training (its partial figures must not show)
    cell("b-fp32", "ner", "m1", "fp32", "fp32", cpu_metrics(0.60, 50, 500))
    cell("b-bf16", "ner", "m1", "bf16", "bf16", {names.SAMPLES_PER_S: 999.0}, status="FAILED")
    plan["b-bf16"] = plan_entry("ner", "m1", "bf16", status="failed", exit_code=1, reason="RuntimeError: boom")
    # qa x m1: the FP32 cell never ran
    cell("c-fp32", "qa", "m1", "fp32", "fp32", None)
    plan["c-fp32"] = plan_entry("qa", "m1", "fp32", status="planned")
    cell("c-bf16", "qa", "m1", "bf16", "bf16", {**cpu_metrics(0.5, 80, 700), names.test_metric("exact"): 0.375})
    # error_cls x m1: a saturated task, FP32 and AMP give the same test scores for each seed
    # (only the loss differs): "identical", never a bare "kept 100.0%"
    for seed in (1, 2):
        cell(f"e-fp32-s{seed}", "error_cls", "m1", "fp32", "fp32", cpu_metrics(0.91, 100, 1000), seed=seed)
        cell(f"e-bf16-s{seed}", "error_cls", "m1", "bf16", "bf16",
             {**cpu_metrics(0.91, 150, 800), names.test_metric("loss"): 0.4}, seed=seed)

    def kd(f1, sec, j, mem):  # KD procedures on a GPU: energy measured, allocated memory
        return {names.TEST_MAIN: f1, names.test_metric("f1"): f1, names.test_metric("precision"): f1 + 0.1,
                names.test_metric("recall"): f1 - 0.1, names.test_metric("map"): 0.7, names.test_metric("mrr"): 0.71,
                names.TRAIN_TIME: sec, names.SAMPLES_PER_S: 1000 / sec, names.PEAK_MEM_ALLOCATED: mem,
                names.PEAK_MEM_RESERVED: mem + 100, names.ENERGY_JOULES: j, names.GPU_UTIL: 90 - sec,
                names.AVG_POWER: j / sec}

    gpu = {"device_type": "cuda", "energy_available": "true"}
    for name, proc, precision, seed, metrics in (
            ("teacher", "teacher", "fp32", 1, kd(0.60, 40, 4000, 2000)),
            ("baseline", "baseline", "fp32", 1, kd(0.40, 20, 2000, 900)),
            ("baseline-s2", "baseline", "fp32", 2, kd(0.42, 20, 2000, 900)),
            ("kd_fp32-s1", "kd_fp32", "fp32", 1, kd(0.50, 25, 2500, 1000)),
            ("kd_fp32-s2", "kd_fp32", "fp32", 2, kd(0.52, 27, 2700, 1000)),
            ("kd_amp-s1", "kd_amp", "fp16", 1, kd(0.51, 15, 1500, 600)),
            ("kd_amp-s2", "kd_amp", "fp16", 2, kd(0.49, 17, 1700, 600))):
        command = "distill" if proc.startswith("kd") else "train"
        plan[name] = plan_entry("wikiqa", "mini", precision, procedure=proc, seed=seed, tables=("kd",),
                                command=command, needs=["teacher"] if command == "distill" else [],
                                wall_s=metrics[names.TRAIN_TIME] + 12.5)
        served = {names.INFER_PARAMS: 22.7e6 if proc == "teacher" else 15.6e6, names.INFER_PARAMS_NO_EMBED: 1e7,
                  names.INFER_SIZE_MB: 90.0 if proc == "teacher" else 60.0,
                  names.infer_metric(names.INFER_SAMPLES_PER_S, "fp32", "median"): 40.0 if proc == "teacher" else 120.0,
                  names.infer_metric(names.INFER_LATENCY_P50, "fp32", "median"): 20.0 if proc == "teacher" else 8.0}
        run_ids[name] = log_run(client, exp, parent, name, {**gpu, "precision": precision,
                                                            names.TAG_PROCEDURE: proc, "stage": command},
                                {**metrics, **served})
    # the memory ceiling's ladder (in no AMP or KD table): fp32 fits batches 16 and 32 and runs out of
    # memory at 64, fp16 fits all three; the finder reached a micro-batch of 32 in fp32
    capped = {"grad_accum": 1, "memory_limit_mb": 12288, "tables": ()}
    for precision, fits in (("fp32", (16, 32)), ("fp16", (16, 32, 64))):
        for n in (16, 32, 64):
            name = f"ceiling-{precision}-b{n}"
            if n in fits:
                cell(name, "sentiment", "bert", precision, precision, cpu_metrics(0.5, 10, 5000), procedure=f"b{n}",
                     batch_size=n, **capped, **{names.TAG_BATCH_FIT: f"micro-batch {n} x grad_accum 1 (peak {100 * n} "
                                                                     "MiB), of 12288 MiB (emulated cap)"})
            else:
                plan[name] = plan_entry("sentiment", "bert", precision, procedure=f"b{n}", batch_size=n, **capped,
                                        status="failed", exit_code=1, reason="error: out of memory: "
                                        "train.batch_size=64 at 256 tokens under train.memory_limit_mb=12288: ...")
    cell("ceiling-fp32-finder", "sentiment", "bert", "fp32", "fp32", cpu_metrics(0.5, 10, 5000), procedure="finder",
         batch_size="auto", **{**capped, "grad_accum": 8},
         **{names.TAG_BATCH_FIT: "micro-batch 32 x grad_accum 4 (peak 3300 MiB), eval batch 64 (peak 900 MiB), of "
                                 "12288 MiB less 10%"})
    for name, entry in plan.items():
        client.set_tag(parent, names.CELL_TAG_PREFIX + name, entry)
    for name, (model, precision, seed, rows) in HAND_PREDICTIONS.items():  # as the jobs keep them
        path = tmp / name / "test.jsonl"
        task = "wikiqa" if "kd" in name or name == "teacher" else "sentiment"
        predictions.write(path, rows, task=task, split="test", labels=["0", "1"] if task == "wikiqa" else LABELS,
                          data="d1gest", model=model, precision=precision, seed=seed)
        client.log_artifact(run_ids[name], str(path), "predictions")
    client.set_terminated(parent, status="FAILED")
    out = write_report(f"sqlite:///{db}", "hand", tmp / "report")
    return {"out": out, "client": client, "parent": parent}


@pytest.mark.slow
def test_report_deltas_and_marks(hand_report):
    amp = read_table(hand_report["out"] / "amp_table.csv").set_index("task")
    a = amp.loc["sentiment"]
    assert float(a.fp32_samples_per_s) == pytest.approx(105)
    assert float(a.amp_samples_per_s) == pytest.approx(155)
    assert float(a.speedup_pct) == pytest.approx((155 / 105 - 1) * 100)
    assert float(a.mem_reduction_pct) == pytest.approx((1 - 810 / 1000) * 100)
    assert float(a.retention_pct) == pytest.approx(0.80 / 0.81 * 100)
    assert (a.fp32_energy_j, a.amp_energy_j) == ("n/a", "n/a")
    assert a.memory == "CPU peak RSS"
    b = amp.loc["ner"]
    assert float(b.fp32_main) == pytest.approx(0.60)
    assert (b.amp_main, b.amp_samples_per_s, b.speedup_pct, b.retention_pct) == ("failed",) * 4
    c = amp.loc["qa"]
    assert (c.fp32_main, c.speedup_pct) == ("missing", "missing")
    assert float(c.amp_main) == pytest.approx(0.5)
    text = (hand_report["out"] / "report.md").read_text()
    assert ("Averaged over 2 task x model cells (2 more failed or are missing: ner / m1: bf16 failed; qa / m1: fp32 "
            "missing) on a CPU with AVX512-BF16 (bf16 dot "
            "products; no AMX), AMP (bf16) trained 48.8% faster than FP32 (samples/s), used 19.5% less peak memory "
            "(CPU peak RSS) (CPU peak RSS is the whole process's and counts the bf16 copies of the weights that "
            "autocast keeps beside the fp32 ones; the activation memory AMP saves shows on a GPU, where the paper "
            "measured) and kept 99.4% of FP32's F1; the scores, pair by pair, are below the table." in text)
    assert "RuntimeError: boom" in text
    # no run's best/ is on this machine: the AMP step is not timed, and the report says why
    assert ("- sentiment / m1: AMP step not timed side by side: the FP32 side's best/ or job.json is not on "
            "this machine." in text)
    assert not (hand_report["out"] / "amp_step.json").exists()


@pytest.mark.slow
def test_report_amp_table_has_every_metric_the_paper_reports(hand_report):
    """F1 (the main metric), accuracy and exact match per side, as the paper reports them per task."""
    amp = read_table(hand_report["out"] / "amp_table.csv").set_index("task")
    assert float(amp.loc["sentiment"].fp32_test_accuracy) == pytest.approx(0.82)  # 0.81, 0.83
    assert float(amp.loc["sentiment"].amp_test_accuracy) == pytest.approx(0.81)
    assert amp.loc["sentiment"].amp_test_exact == "n/a"  # sentiment has no exact match
    assert float(amp.loc["qa"].amp_test_exact) == pytest.approx(0.375)
    text = (hand_report["out"] / "report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| task | model | AMP precision"))
    assert ("| FP32 F1 | AMP F1 | FP32 accuracy | AMP accuracy | FP32 EM | AMP EM | FP32 peak MB" in header)
    qa_row = next(line for line in text.splitlines() if line.startswith("| qa | m1 |"))
    assert "| missing | 0.3750 |" in qa_row


@pytest.mark.slow
def test_report_headline_averages_beside_the_papers_figures(hand_report):
    """Speed-up, memory reduction and retention averaged over the cells that finished both sides,
    one row per AMP precision, and the paper's 44.5% / 17.6% / 99.7% in a row labelled as its own."""
    text = (hand_report["out"] / "report.md").read_text()
    # sentiment +47.6% and error_cls +50.0% speed-up; 19.0% and 20.0% less memory; 98.8% and 100% kept
    assert ("| this study: bf16 vs fp32 | 2 | +48.8% | +19.5% | 99.4% | CPU peak RSS | a CPU with AVX512-BF16 "
            "(bf16 dot products; no AMX) |" in text)
    assert ("| the paper (arXiv 2512.00829): RTX 4070, fp16 AMP with dynamic loss scaling, 4 tasks x 4 models | 16 "
            "| +44.5% | +17.6% | 99.7% | GPU memory | RTX 4070 12 GB |" in text)
    assert "the last row is the paper's own figures, not measured here" in text


@pytest.mark.slow
def test_report_kd_table_has_the_thesis_columns(hand_report):
    """Per procedure: the cell's total time, training time, GPU utilisation and average power
    beside energy and P/R/F1; on the CPU rows the NVML figures are n/a, never 0."""
    kd = read_table(hand_report["out"] / "kd_table.csv").set_index("procedure")
    row = kd.loc["kd_fp32"]
    assert float(row.cell_wall_s) == pytest.approx(26 + 12.5)  # the runner's clock, start to finish
    assert float(row.gpu_util_pct) == pytest.approx(90 - 26)
    assert float(row.avg_power_w) == pytest.approx((2500 / 25 + 2700 / 27) / 2)
    text = (hand_report["out"] / "report.md").read_text()
    kd_section = text.split("## Knowledge distillation procedures")[1]
    header = next(line for line in kd_section.splitlines() if line.startswith("| task | procedure | stage"))
    assert ("| total time s | export s | training s | samples/s | peak MB | memory | GPU util % | avg power W | "
            "energy J | P | R | F1 | MAP | MRR |" in header)
    cells = pd.read_csv(hand_report["out"] / "cells.csv").set_index("cell")
    assert cells.loc["a-fp32-s1", ["gpu_util_pct", "avg_power_w", "energy_j"]].isna().all()


@pytest.mark.slow
def test_report_memory_ceiling_ladder(hand_report):
    """Per precision, each rung of the batch ladder fits with its peak or ran out of memory, and the
    batch finder's largest micro-batch beside them; fp32 and fp16 stay separate rows."""
    ceiling = pd.read_csv(hand_report["out"] / "ceiling_table.csv", keep_default_na=False).set_index("precision")
    assert list(ceiling.index) == ["fp32", "fp16"]
    assert ceiling.loc["fp32", ["batch 16", "batch 32", "batch 64"]].tolist() == [
        "fits (peak 1600 MiB)", "fits (peak 3200 MiB)", "out of memory"]
    assert ceiling.loc["fp16", "batch 64"] == "fits (peak 6400 MiB)"
    assert ceiling.loc["fp32", "finder: largest micro-batch"] == "32 (peak 3300 MiB)"
    assert ceiling.loc["fp16", "finder: largest micro-batch"] == ""  # no finder cell in fp16
    assert str(ceiling.loc["fp32", "cap MiB"]) == "12288"
    text = (hand_report["out"] / "report.md").read_text()
    assert "## Memory ceiling: which batch fits under the cap" in text
    assert "| sentiment | bert | fp32 | 12288 | fits (peak 1600 MiB) | fits (peak 3200 MiB) | out of memory |" in text


@pytest.mark.slow
def test_report_says_what_the_scores_show_with_their_spread(hand_report):
    """Retention in words with its seed spread and verdict; identical test scores called so,
    never a bare 100.0%; a single seed says there is no spread (issue 16)."""
    text = (hand_report["out"] / "report.md").read_text()
    # 0.80 / 0.81; pooled std sqrt((0.0141^2 + 0.0141^2) / 2) = 0.0141 = 1.7% of 0.81
    assert ("sentiment / m1: AMP (bf16) kept 98.8% ± 1.7% of FP32 macro-F1 over 2 seeds (0.8000 ± 0.0141 vs "
            "0.8100 ± 0.0141): within the seed spread (|difference| 0.0100, 2 x pooled std 0.0283)." in text)
    assert ("error_cls / m1: AMP (bf16) and FP32 gave identical test scores in every metric (macro-F1 0.9100) for "
            "each of the 2 seeds run in both: most likely the same predictions" in text)
    assert "100.0%" not in text
    amp = read_table(hand_report["out"] / "amp_table.csv").set_index("task")
    assert amp.loc["error_cls"].identical_seeds == "2/2" and amp.loc["sentiment"].identical_seeds == "0/2"
    assert float(amp.loc["sentiment"].retention_spread_pct) == pytest.approx(100 * math.sqrt(0.0002) / 0.81)
    assert "qa / m1: no finished FP32 run: nothing to compare." in text
    # the students against the baseline (2 seeds a side) and their teacher (one seed)
    assert ("wikiqa: kd_fp32 scored F1 0.5100 ± 0.0141 vs 0.4100 ± 0.0141 for the baseline `baseline` (+0.1000): "
            "above the baseline beyond the seed spread; distillation recovered 53% of the baseline-to-teacher gap."
            in text)
    assert ("wikiqa: kd_fp32 scored F1 0.5100 ± 0.0141 vs 0.6000 for its teacher `teacher` (-0.0900): fewer than "
            "2 seeds a side: no spread to tell this difference from noise." in text)


@pytest.mark.slow
def test_report_says_what_amp_and_kd_change_in_the_predictions_against_the_seed_noise(hand_report):
    out, client = hand_report["out"], hand_report["client"]
    pairs = pd.read_csv(out / "prediction_pairs.csv")
    amp = pairs[pairs.comparison == "sentiment / m1: bf16 vs fp32"].set_index("pair")
    s1 = amp[amp.seed == "s1"].iloc[0]
    assert (s1.agreement_pct, s1.only_reference_right, s1.only_compared_right) == (60.0, 4, 0)
    assert s1.mcnemar_p == pytest.approx(0.125)
    assert amp[amp.seed == "s2"].iloc[0].agreement_pct == 100.0 and amp[amp.seed == "s2"].iloc[0].mcnemar_p == 1.0
    noise = amp.loc["fp32 vs fp32 (seed noise)"]
    assert noise.seed == "s1 vs s2" and noise.agreement_pct == 90.0
    # every predicted class at 0.8: ECE = |0.8 - accuracy|; Brier = mean of 0.06 (right) and 1.46 (wrong)
    assert s1.ece_reference == pytest.approx(0.1) and s1.ece_compared == pytest.approx(0.3)
    assert s1.brier_compared == pytest.approx(0.5 * 0.06 + 0.5 * 1.46)
    text = (out / "report.md").read_text()
    section = text.split("## What the predictions say")[1]
    assert ("sentiment / m1: bf16 vs fp32**: bf16 changed 40.0% of test predictions against FP32 (two FP32 seeds "
            "differ on 10.0%)") in section and "within the seed noise" in section
    assert ("the student `kd_fp32` disagrees with its teacher `teacher` on 33.3% of test rows, of which 100% its "
            "teacher `teacher` had right") in section
    assert "reliability_sentiment_m1_bf16_vs_fp32.png" in section and (out / "reliability_sentiment_m1_bf16_vs_fp32.png"
                                                                      ).stat().st_size > 1000
    assert "| 80.0% |" in text.split("## AMP vs FP32")[1].split("## ")[0]  # the paper table's agreement column
    (bf16,) = [r for r in client.search_runs([client.get_run(hand_report["parent"]).info.experiment_id])
               if r.info.run_name == "a-bf16-s1"]
    assert bf16.data.metrics[names.agreement_metric("fp32")] == 60.0
    assert bf16.data.metrics[names.agreement_metric("fp32", "seed_noise")] == 90.0
    assert json.loads((out / "agreement.json").read_text())[0]["mcnemar"]["p"] == pytest.approx(0.125)


@pytest.mark.slow
def test_report_payoff_never_divides_the_runs_own_inference_figures(hand_report):
    """The runs' infer/* figures say 3x; their models are on no disk here, so nothing is timed side by
    side and the payoff states sizes and scores, and why there is no speed-up."""
    payoff = read_table(hand_report["out"] / "payoff.csv").set_index("procedure")
    assert list(payoff.index) == ["teacher", "kd_fp32", "kd_amp", "baseline"]
    raw = pd.read_csv(hand_report["out"] / "payoff.csv")
    assert raw.throughput_x.isna().all() and raw.latency_x.isna().all()
    assert float(payoff.loc["kd_amp", "params_pct"]) == pytest.approx(100 * 15.6 / 22.7)
    assert float(payoff.loc["baseline", "retained_pct"]) == pytest.approx(100 * 0.41 / 0.60)
    kd_section = (hand_report["out"] / "report.md").read_text().split("## Knowledge distillation procedures")[1]
    assert kd_section.lstrip().startswith("### What the student buys")
    assert "Inference not measured side by side: " in kd_section
    assert ("- **wikiqa: kd_amp keeps 83% of the teacher's F1 with 69% of its parameters" in kd_section
            and "3.0x" not in kd_section)
    assert not (hand_report["out"] / "side_by_side.json").exists()


@pytest.mark.slow
def test_report_kd_table(hand_report):
    kd = read_table(hand_report["out"] / "kd_table.csv").set_index("procedure")
    assert list(kd.index) == ["teacher", "baseline", "kd_fp32", "kd_amp"]
    row = kd.loc["kd_fp32"]
    assert float(row.train_time_s) == pytest.approx(26)
    assert float(row.energy_j) == pytest.approx(2600)
    assert float(row.energy_j_std) == pytest.approx(math.sqrt(2 * 100**2))
    assert float(row.test_f1) == pytest.approx(0.51)
    assert float(row.test_precision) == pytest.approx(0.61)
    assert float(row.test_map) == pytest.approx(0.7) and float(row.test_mrr) == pytest.approx(0.71)
    assert row.memory == "CUDA peak allocated" and float(row.peak_mem_mb) == pytest.approx(1000)
    assert row.seeds == "2/2"
    assert (hand_report["out"] / "kd.png").stat().st_size > 1000


@pytest.mark.slow
def test_report_seed_statistics(hand_report):
    stats = pd.read_csv(hand_report["out"] / "seed_stats.csv")
    by = {(r.comparison, r.metric): r for r in stats.itertuples()}
    main = by[("sentiment / m1: bf16 vs fp32", "main")]
    assert main.diff == pytest.approx(-0.01) and main.pooled_std == pytest.approx(math.sqrt(0.0002))
    assert main.exceeds_spread == "no"  # 0.01 < 2 x 0.0141
    assert main.identical_seeds == "0/2" and by[("error_cls / m1: bf16 vs fp32", "main")].identical_seeds == "2/2"
    speed = by[("sentiment / m1: bf16 vs fp32", "samples_per_s")]
    assert speed.diff == pytest.approx(50) and speed.exceeds_spread == "yes"  # 50 > 2 x 7.07
    kd_speed = by[("wikiqa: kd_amp vs kd_fp32", "samples_per_s")]
    assert kd_speed.reference_mean == pytest.approx((1000 / 25 + 1000 / 27) / 2)
    kd_main = by[("wikiqa: kd_fp32 vs baseline", "main")]  # the student against the baseline
    assert kd_main.diff == pytest.approx(0.10) and kd_main.exceeds_spread == "yes"  # 0.1 > 2 x 0.0141
    assert by[("wikiqa: kd_amp vs baseline", "test_map")].diff == pytest.approx(0.0)
    assert not any(c.startswith(("ner", "qa")) for c in stats.comparison)  # one seed: no spread to compare
    assert not any(c.endswith("vs teacher") for c in stats.comparison)  # the teacher ran one seed


@pytest.mark.slow
def test_report_files_and_parent_artifacts(hand_report):
    out = hand_report["out"]
    for name in ("report.md", "cells.csv", "amp_table.csv", "kd_table.csv", "seed_stats.csv", "payoff.csv",
                 "speedup.png", "memory_reduction.png", "retention.png", "kd.png"):
        assert (out / name).is_file(), name
    logged = {a.path for a in hand_report["client"].list_artifacts(hand_report["parent"], "report")}
    assert "report/report.md" in logged and "report/kd.png" in logged


@pytest.mark.slow  # creating the MLflow SQLite store alone takes 2-7 s
def test_report_unknown_experiment_is_exit_2(tmp_path, capsys):
    code, out = _cli(["report", "--experiment", "nope", "--uri", f"sqlite:///{tmp_path}/x.db",
                      "--out", tmp_path / "r"], capsys)
    assert code == 2 and "report: --experiment nope: no such experiment" in out.err
