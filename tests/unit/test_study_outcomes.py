"""A study's cells as its report says they ended: the outcome the finished study recorded, the same
outcome read back by `study --report-only` from what each cell left beside its log, and a cell's
time, stage and export together.

The cells' processes are stand-ins that have already ended (`Ended`): each writes its log as a
stage does, and a stage that finishes leaves its outputs and its MLflow run; the runner, the
store and the report are the real ones.
"""
import json

import pandas as pd
import pytest
import yaml

from helpers import tracking_db
from pipeline import names
from pipeline.study import load_study, report_only, run_study
from pipeline.study.cell_process import last_line, open_attempt

OOM = ("error: out of memory: train.batch_size=32 at 18 tokens under train.memory_limit_mb=12: one training step "
       "needs more (the cap emulated on a CPU: the step's tensors counted)")


class Ended:
    """A cell's process, ended as soon as it started: its output in the cell's log, its exit code
    and its wall time as given."""

    def __init__(self, name, log_path, cmd, code, output, wall_s):
        with open_attempt(log_path) as log:
            log.write("".join(f"{line}\n" for line in [f"+ {' '.join(cmd)}", *output]))
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.exit_code, self.last_line, self.wall_s = code, last_line(f"{line}\n" for line in output), wall_s

    def poll(self):
        return True

    def stop(self):
        pass

    def wait(self):
        pass


def finish_stage(study, cell, parent, train_time_s):
    """What a stage that finished leaves: its metrics.json and its FINISHED run under the study's parent."""
    from mlflow import MlflowClient

    uri = next(text for text, _ in study.overrides if text.startswith("tracking.uri=")).split("=", 1)[1]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(study.name).experiment_id
    tags = {names.TAG_CELL: cell.name, names.TAG_STUDY: study.name, names.TAG_PARENT_RUN: parent,
            names.TAG_PROCEDURE: cell.procedure, names.TAG_STAGE: cell.kind}
    run = client.create_run(experiment, run_name=cell.name, tags=tags).info.run_id
    client.log_metric(run, names.TRAIN_TIME, train_time_s)
    client.set_terminated(run, status="FINISHED")
    cell.output_dir.mkdir(parents=True, exist_ok=True)
    (cell.output_dir / "metrics.json").write_text(json.dumps({names.TRAIN_TIME: train_time_s}))


@pytest.fixture
def cells_end_as(monkeypatch):
    """The runner's cells replaced by stand-ins: `ends[cell or (cell, step)]` -> (exit code, output
    lines, wall s, train time s of a stage that finishes)."""
    ends = {}

    def start(study, cell, gpus, parent, served=None, slots=1, echo=False, step=None):
        code, output, wall_s, train_s = ends[cell.name if step is None else (cell.name, step)]
        if step is None and code == 0:
            finish_stage(study, cell, parent, train_s)
        elif code == 0:  # the export's check, written last
            (cell.output_dir / "export").mkdir(parents=True, exist_ok=True)
            (cell.output_dir / "export" / "check.json").write_text("{}")
        return Ended(cell.name, study.cell_log(cell), ["stand-in", step or "stage"], code, output, wall_s)

    monkeypatch.setattr("pipeline.study.runner.start_local", start)
    return ends


def write_study(tmp_path, spec):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"output_root": str(tmp_path / "outputs"), "report_dir": str(tmp_path / "report"),
                                    **spec}))
    return load_study(str(path), [])


def report_files(report):
    return {name: (report / name).read_text() for name in ("report.md", "cells.csv", "ceiling_table.csv")}


def test_report_only_says_what_the_finished_study_said_of_a_cell_out_of_memory(tmp_path, cells_end_as):
    """docs/faults.md: a cell that ran out of memory shows as "out of memory" in the ceiling table;
    `--report-only` later (after an interrupted study, or the report job on Slurm) writes the same
    report, the cell's exit code and its one-line reason kept, never "its job was cancelled"."""
    db = tracking_db(tmp_path)
    study, cells = write_study(tmp_path, {
        "name": "ladder",
        "overrides": ["model=preset:bangla-tiny", "train.memory_limit_mb=12", "train.grad_accum=1",
                      f"tracking.uri=sqlite:///{db}"],
        "procedures": {"b32": {"overrides": ["train.batch_size=32"]}},
        "matrix": {"tasks": ["sentiment"], "procedures": ["b32"]},
    })
    (cell,) = cells
    cells_end_as[cell.name] = (1, ["preparing data and model", OOM], 7.5, None)
    assert run_study(study, cells) == 1
    finished = report_files(study.report_dir)
    assert pd.read_csv(study.report_dir / "ceiling_table.csv")["batch 32"].tolist() == ["out of memory"]

    assert report_only(study, cells) == 1
    assert report_files(study.report_dir) == finished
    row = pd.read_csv(study.report_dir / "cells.csv").set_index("cell").loc[cell.name]
    assert (row.status, row.exit_code, row.reason) == ("failed", 1, OOM)


def test_a_cells_total_time_is_its_stage_and_its_export(tmp_path, cells_end_as):
    """The KD table's total time of a cell that exports spans its whole life in its slot, stage and
    export (never the export alone, shorter than its training); the export's own time beside it.
    `--report-only` keeps both."""
    db = tracking_db(tmp_path)
    study, cells = write_study(tmp_path, {
        "name": "kd",
        "overrides": ["model=preset:bangla-tiny", f"tracking.uri=sqlite:///{db}"],
        "procedures": {"teacher": {"command": "train"},
                       "kd_amp": {"command": "distill", "overrides": ["kd.teacher=${teacher.output_dir}"],
                                  "export": True}},
        "matrix": {"tasks": ["sentiment"], "procedures": ["teacher", "kd_amp"]},
    })
    cells_end_as["sentiment-teacher"] = (0, ["done"], 30.0, 20.0)
    cells_end_as["sentiment-kd_amp"] = (0, ["done"], 60.0, 48.6)
    cells_end_as[("sentiment-kd_amp", "export")] = (0, ["exported"], 12.0, None)
    assert run_study(study, cells) == 0
    written = kd_times(study.report_dir)
    assert written == {"kd_amp": ["72.0", "48.6", "12.0"], "teacher": ["30.0", "20.0", "n/a"]}
    assert "| total time s | export s | training s |" in (study.report_dir / "report.md").read_text()

    assert report_only(study, cells) == 0
    assert kd_times(study.report_dir) == written


def kd_times(report):
    """Procedure -> its total time, training time and export time as the KD table writes them."""
    kd = pd.read_csv(report / "kd_table.csv", keep_default_na=False, dtype=str).set_index("procedure")
    return {p: kd.loc[p, ["cell_wall_s", "train_time_s", "cell_export_s"]].tolist() for p in kd.index}
