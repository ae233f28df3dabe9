"""`pipeline ui` as a user meets it, in a real browser: headless Chromium loads the printed URL
of a small finished study and the rendered page shows the training runs, their metrics and the
compare view of the study's cells. Skipped, with the reason, where Chromium is not installed
(`make test` installs Debian's `chromium` when it can). Screenshots are kept under
outputs/test-artifacts/ for a person to open."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from helpers import FAST, ROOT, mlflow_runs, run_cli, tracking_db
from pipeline import names

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "outputs" / "test-artifacts"
STUDY = "uitiny"


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (Debian package `chromium`); the browser check needs it")
    tmp = tmp_path_factory.mktemp("uistudy")
    db = tracking_db(tmp)
    spec = {"name": STUDY, "output_root": str(tmp / "outputs"), "report_dir": str(tmp / "report"),
            "overrides": [*FAST, "train.max_steps=4", "train.epochs=1", f"tracking.uri=sqlite:///{db}"],
            "matrix": {"tasks": ["sentiment"], "precisions": ["fp32", "auto"]}}
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = run_cli("study", path)
    assert result.returncode == 0, result.stderr[-3000:]
    return {"db": db, "log": result.stderr}


@pytest.fixture
def ui_server(finished_study):
    """Start `pipeline ui ARGS`; yields a function returning the printed URL once the server answers."""
    procs = []

    def start(*args):
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "ui", *args, "--uri",
                                 f"sqlite:///{finished_study['db']}"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(proc)
        line = proc.stdout.readline()
        match = re.search(r"(http://[\d.]+:\d+)/(\S*)", line)
        assert match, line
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(match.group(1) + "/health", timeout=5)
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "the UI did not answer"
                time.sleep(0.5)
        session = subprocess.run(["ps", "-s", str(proc.pid), "-o", "args="], capture_output=True, text=True).stdout
        assert "mlflow.server.jobs" not in session  # no job runner: the UI of training runs has no jobs to run
        return match.group(0)

    yield start
    for proc in procs:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


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


def test_study_ends_with_the_command_that_opens_its_comparison(finished_study):
    assert f"python -m pipeline ui --uri sqlite:///{finished_study['db']} --study {STUDY}" in finished_study["log"]


def test_experiment_opens_on_the_training_runs_not_the_genai_overview(ui_server, finished_study):
    url = ui_server("--experiment", STUDY)
    assert "/runs?workflowType=machine_learning" in url
    dom = render(url, "ui-experiment-runs.png")
    assert "matching runs" in dom and ">Runs<" in dom  # the runs table of the Model training view
    assert STUDY in dom  # the study's parent run, its cells nested under it
    assert "No data available for the selected time range" not in dom  # the GenAI overview's empty traces


def test_study_opens_the_compare_view_of_its_finished_cells(ui_server, finished_study):
    url = ui_server("--study", STUDY)
    children = {r.info.run_id for r in mlflow_runs(finished_study["db"], STUDY)
                if r.data.tags.get(names.PARENT_TAG) != "true"}
    assert "#/compare-runs?runs=" in url and all(run_id in url for run_id in children)
    dom = render(url, "ui-study-compare.png")
    assert "Comparing 2 Runs" in dom
    for metric in (names.EVAL_MAIN, names.SAMPLES_PER_S, names.PEAK_RSS):
        assert metric in dom
    for run_id in children:
        assert run_id in dom


def test_unknown_study_is_one_line_exit_2(finished_study):
    result = run_cli("ui", "--study", "nosuch", "--uri", f"sqlite:///{finished_study['db']}")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: ui: --study nosuch: no experiment 'nosuch' in sqlite:///{finished_study['db']}"
