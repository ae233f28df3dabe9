"""A study's cells side by side and on Slurm.

Which cells may start (their teacher finished, a slot and their GPUs free), the GPUs each gets
and the one-line refusals are checked on the schedule itself, without processes. Concurrent
cells on CPU are checked end to end by tests/integration/test_study.py, whose small study runs with
`--jobs 2`. This machine has no Slurm: a fake `sbatch` and `squeue` stand in for it (the fake
sbatch records each submission and runs its script at once, in submission order, honouring
afterok and --kill-on-invalid-dep as Slurm does), so the test checks what is submitted, the
dependencies, the resume rules and the report job; not a real cluster's scheduling.
"""
import re
from pathlib import Path

import pytest
import yaml

from pipeline.errors import UserError
from pipeline.study.devices import check_devices, cpu_threads, width
from pipeline.study.schedule import Schedule
from pipeline.study.spec import Cell, Launcher


def cell(name, launcher=None, needs=()):
    return Cell(name=name, procedure="train", kind="train", launcher=launcher or Launcher(),
                output_dir=Path("/nowhere") / name, overrides=[], values={}, tables=[], needs=list(needs))


def start_all(schedule):
    return [(c.name, ids) for c, ids in schedule.startable()]


def test_a_dependant_starts_only_after_its_teacher_finished():
    teacher, student, other = cell("teacher"), cell("student", needs=["teacher"]), cell("other")
    schedule = Schedule([teacher, student, other], {}, slots=4, gpus=[])
    assert start_all(schedule) == [("teacher", []), ("other", [])]  # the student waits
    schedule.ended(other, {"status": "finished"})
    assert start_all(schedule) == []
    schedule.ended(teacher, {"status": "finished"})
    assert start_all(schedule) == [("student", [])]
    assert schedule.count() == "[2/3 done, 1 running]"


def test_a_failed_teacher_leaves_its_dependants_unrun_and_the_rest_goes_on():
    teacher, student, other = cell("teacher"), cell("student", needs=["teacher"]), cell("other")
    schedule = Schedule([teacher, student, other], {}, slots=1, gpus=[])
    assert start_all(schedule) == [("teacher", [])]  # --jobs 1: one at a time, in run order
    schedule.ended(teacher, {"status": "failed"})
    assert [(c.name, broken) for c, broken in schedule.blocked()] == [("student", ["teacher"])]
    assert start_all(schedule) == [("other", [])]


def test_each_cell_gets_gpus_of_its_own():
    ddp = Launcher("torchrun", 2)
    cells = [cell("a", ddp), cell("b"), cell("c", ddp), cell("d")]
    schedule = Schedule(cells, {}, slots=8, gpus=["0", "1", "2", "3"])
    assert start_all(schedule) == [("a", ["0", "1"]), ("b", ["2"]), ("d", ["3"])]  # c waits for two free GPUs
    schedule.ended(cells[1], {"status": "finished"})
    assert start_all(schedule) == []  # one free is not enough for c
    schedule.ended(cells[0], {"status": "finished"})
    assert start_all(schedule) == [("c", ["0", "1"])]


def test_torchrun_auto_takes_the_whole_node_and_the_cpu_has_no_devices():
    assert width(cell("x", Launcher("torchrun", "gpu")), 8) == 8
    cpu = Schedule([cell("x", Launcher("torchrun", 4))], {}, slots=1, gpus=[])
    assert start_all(cpu) == [("x", [])]  # CPU: cells share the cores


def test_a_cell_wider_than_the_node_is_refused_up_front():
    with pytest.raises(UserError, match=r"cell wide needs 4 GPUs \(torchrun:4\) but 2 are visible \(0,1\)"):
        check_devices([cell("wide", Launcher("torchrun", 4))], ["0", "1"])
    with pytest.raises(UserError, match="the deepspeed launcher takes GPU indices"):
        check_devices([cell("ds", Launcher("deepspeed", 1))], ["GPU-aa", "GPU-bb"])


def test_deepspeed_cell_is_told_its_gpus():
    cmd = Launcher("deepspeed", 2).command("train", ["seed=1"], "id", ["2", "3"])
    assert cmd[1:3] == ["--include", "localhost:2,3"]  # --num_gpus would take GPUs 0 and 1


def _cli(args, capsys):
    from pipeline.cli import main

    code = main([str(a) for a in args])
    return code, capsys.readouterr()


@pytest.mark.parametrize("args,spec,message", [
    (["--jobs", "0"], {"name": "x"}, "error: study: --jobs 0: must be >= 1"),
    (["--executor", "slurm"], {"name": "x"}, "slurm.partition: required by --executor slurm (the partition of the "
     "cells' jobs): set partition: NAME in the study file's `slurm:` mapping, or slurm.partition=NAME on the command "
     "line"),
    (["--executor", "slurm", "--dry-run"], {"name": "x"}, "slurm.partition: required by --executor slurm"),
    (["--executor", "slurm", "--dry-run"], {"name": "x", "slurm": {"partition": "gpu"},
                                            "launcher": {"type": "torchrun", "nproc": "auto"}},
     "slurm.gpus_per_node: required for cell train: its launcher's nproc=auto does not say how many GPUs to ask "
     "for; set gpus_per_node: N in the study file's `slurm:` mapping, or slurm.gpus_per_node=N on the command line"),
    (["--executor", "slurm", "--dry-run", "slurm.gpus=2"], {"name": "x"}, "slurm.gpus: unknown key"),
    (["--executor", "slurm", "--dry-run", "slurm.partition=gpu", "slurm.cpus_per_task=many"], {"name": "x"},
     "slurm.cpus_per_task: 'many': must be an integer >= 0"),
    ([], {"name": "x", "slurm": {"partition": "gpu", "time": 14400}}, "slurm.time: 14400: expected one word"),
    ([], {"name": "x", "slurm": {"gpus": 2}}, "slurm.gpus: unknown key"),
], ids=["jobs", "partition", "dry-run partition", "dry-run gpus", "command-line key", "command-line count", "time",
        "key"])
def test_bad_concurrency_input_is_one_line_exit_2(tmp_path, capsys, args, spec, message):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"output_root": str(tmp_path / "out"), **spec}))
    code, out = _cli(["study", path, *args], capsys)
    assert code == 2
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.err
    assert not (tmp_path / "out").exists()


def test_slurm_settings_on_the_command_line_are_the_studys_own_over_its_files(tmp_path, capsys):
    """slurm.KEY=VALUE on the study's command line: its slurm settings, not a cell's key; a value
    there wins over the file's, each slurm.extra adds one sbatch option, and the report's job is
    given them again."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "output_root": str(tmp_path / "out"),
                                    "slurm": {"partition": "cpu", "extra": ["--constraint=h100"]}}))
    code, printed = _cli(["study", path, "--executor", "slurm", "--dry-run", "slurm.partition=gpu",
                          "slurm.time=01:00:00", "slurm.cpus_per_task=8", "slurm.extra=--exclusive"], capsys)
    assert code == 0, printed.err
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=01:00:00", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --constraint=h100", "#SBATCH --exclusive"):
        assert f"    {line}\n" in printed.out, line
    (cell,) = [line for line in printed.out.splitlines() if " -m pipeline train " in line]
    assert "slurm." not in cell  # the cells' jobs train as the file says
    (report,) = [line for line in printed.out.splitlines() if "--report-only" in line]
    assert report.endswith("--report-only slurm.partition=gpu slurm.time=01:00:00 slurm.cpus_per_task=8 "
                           "slurm.extra=--exclusive")


def test_a_slurm_dry_run_prints_every_script_and_its_dependencies_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    path = tmp_path / "kd.yaml"
    path.write_text(yaml.safe_dump({
        "name": "kd", "output_root": str(out), "overrides": [f"tracking.uri=sqlite:///{tmp_path}/m.db"],
        "slurm": {"partition": "gpu", "time": "01:00:00", "extra": ["--constraint=h100"]},
        "procedures": {"teacher": {"command": "train"},
                       "student": {"command": "distill", "launcher": {"type": "torchrun", "nproc": 2},
                                   "overrides": ["kd.teacher=${teacher.output_dir}"]},
                       "done": {"command": "train"}},
        "matrix": {"tasks": ["sentiment"], "procedures": ["teacher", "student", "done"]},
    }))
    (out / "kd" / "sentiment-done").mkdir(parents=True)
    (out / "kd" / "sentiment-done" / "metrics.json").write_text("{}")  # finished before: not submitted
    code, printed = _cli(["study", path, "--executor", "slurm", "--dry-run"], capsys)
    assert code == 0, printed.err
    slurm_jobs = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^- (\S+)\n  (sbatch .+)\n((?:    .*\n)+)", printed.out, re.M)}
    assert list(slurm_jobs) == ["sentiment-teacher", "sentiment-student", "_report"]
    scripts = out / "kd" / "_slurm"
    assert slurm_jobs["sentiment-teacher"][0] == f"sbatch --parsable {scripts / 'sentiment-teacher.sbatch'}"
    assert slurm_jobs["sentiment-student"][0] == ("sbatch --parsable '--dependency=afterok:<sentiment-teacher>' "
                                                 f"--kill-on-invalid-dep=yes {scripts / 'sentiment-student.sbatch'}")
    assert slurm_jobs["_report"][0].startswith("sbatch --parsable "
                                               "'--dependency=afterany:<sentiment-teacher>:<sentiment-student>' ")
    student = slurm_jobs["sentiment-student"][1]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=01:00:00", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --constraint=h100", "#SBATCH --job-name=kd.sentiment-student"):
        assert f"    {line}\n" in student
    assert "torch.distributed.run --nproc_per_node 2" in student and "pipeline distill" in student
    assert "- sentiment-done [finished: would skip]" in printed.out
    assert sorted(p.name for p in (out / "kd").iterdir()) == ["sentiment-done"]  # no script, no log folder
    assert not (tmp_path / "m.db").exists()  # no MLflow run either


def test_a_dataset_logged_by_two_runs_at_once_is_linked_not_lost():
    """MLflow inserts a dataset after looking it up; the run that loses that race fails on the
    unique key and logs it again, which then links the dataset the other run inserted."""
    from mlflow.exceptions import MlflowException

    from pipeline.tracking.store import _retry_dataset_race

    calls = []

    def log_inputs(run_id, datasets):
        calls.append(run_id)
        if len(calls) == 1:
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, "
                                  "datasets.name, datasets.digest")

    _retry_dataset_race(log_inputs)("run", datasets=[])
    assert calls == ["run", "run"]
    with pytest.raises(MlflowException, match="other"):
        _retry_dataset_race(lambda *a, **k: (_ for _ in ()).throw(MlflowException("other")))("run")


def test_cells_side_by_side_on_a_cpu_split_its_cores():
    """N cells at once on a CPU each take cores / N threads (a torchrun cell's processes share its part)."""
    assert cpu_threads(cell("one"), slots=2, cores=16) == 8
    assert cpu_threads(cell("ddp", Launcher("torchrun", 2)), slots=2, cores=16) == 4
    assert cpu_threads(cell("many"), slots=4, cores=2) == 1
