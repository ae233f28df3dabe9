"""`--executor slurm`: each cell of a study as one Slurm job, submitted with `sbatch`.

A cell's job asks for its launcher's GPUs per node and nodes, and the study file's partition and
time limit (`slurm` in the study file); a cell that refers to another's output waits for that
job with `--dependency=afterok:ID`, and is cancelled by Slurm if it fails
(`--kill-on-invalid-dep=yes`). One job per cell rather than a job array: each dependant waits on
its own teacher, where an array's dependency holds for all its tasks at once. A last job, after
every cell's job has ended (`afterany`), runs `study --report-only`: the outcomes on the parent
run and the report. Submitting the study again skips the cells that finished and those whose
job Slurm still holds (`squeue`, by job name), so it resumes the study as a local run does.

The scripts are kept in OUTPUT_ROOT/STUDY/_slurm/CELL.sbatch (resubmit one by hand with
`sbatch`); each job writes its output to _logs/CELL.log and its exit code to _logs/CELL.exit.

`--dry-run` makes the same checks of the study file (`check`) and prints each script with the
sbatch command that would submit it, dependencies named by cell, writing and submitting nothing.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.errors import UserError
from pipeline.study.cell_process import ATTEMPT
from pipeline.study.runner import OpenStudy, _finished_before, _logs, exit_file, report_only
from pipeline.study.spec import Cell, Study, study_error

log = logging.getLogger("pipeline")

# written into a command where the job's own value goes, then replaced by the shell variable
MASTER, VISIBLE = "__MASTER_ADDR__", "__CUDA_VISIBLE_DEVICES__"

# the cell runs in the background so the script can pass Slurm's SIGTERM on (--signal=B:TERM@120:
# the stage checkpoints and exits 143) and still write the exit code
RUN_AND_KEEP_CODE = """{command} &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
code=0; wait "$child" || code=$?
while kill -0 "$child" 2>/dev/null; do code=0; wait "$child" || code=$?; done
echo "$code" > {exit_file}
exit "$code"
"""


def check(study: Study, cells: list[Cell]) -> dict[str, int]:
    """What a submission needs of the study file, checked before anything is written (a one-line
    UserError naming the key): the partition; each cell's GPUs per node, returned by cell name."""
    if not study.slurm.partition:
        raise study_error(study.path, "slurm.partition", "required by --executor slurm (the partition of the cells' "
                                                         "jobs)")
    return {c.name: _gpus(study, c) for c in cells}


def dry_run(study: Study, cells: list[Cell], extra: list[str]) -> int:
    """Print every job a submission would make: its sbatch command (a dependency on another job named
    <CELL>, by the cell it waits for) and its script; check what a submission checks, write nothing."""
    gpus = check(study, cells)
    folder = _scripts(study)
    print(f"study {study.name}: {len(cells)} cells as Slurm jobs on partition {study.slurm.partition}; scripts would "
          f"be written to {folder} (PARENT: the study's MLflow run); nothing written or submitted")
    missing = [tool for tool in ("sbatch", "squeue") if shutil.which(tool) is None]
    if missing:
        print(f"note: {' and '.join(missing)} not on PATH here: submit where Slurm's commands are")
    submitted: list[str] = []
    for cell in cells:
        if _finished_before(cell):
            print(f"\n- {cell.name} [finished: would skip]")
            continue
        after = [f"<{n}>" for n in cell.needs if n in submitted]
        submitted.append(cell.name)
        _show(cell.name, folder, _cell_script(study, cell, "PARENT", gpus[cell.name]), after, "afterok")
    if submitted:
        _show("_report", folder, _report_script(study, extra), [f"<{n}>" for n in submitted], "afterany")
    return 0


def _show(name: str, folder: Path, script: str, after: list[str], kind: str) -> None:
    print(f"\n- {name}\n  {shlex.join(_sbatch_command(folder / f'{name}.sbatch', after, kind))}")
    print("".join(f"    {line}\n" for line in script.rstrip("\n").splitlines()), end="")


def submit_study(study: Study, cells: list[Cell], extra: list[str]) -> int:
    """Submit the cells that have yet to run, then the report's job; returns 0 once submitted."""
    gpus = check(study, cells)
    for tool in ("sbatch", "squeue"):
        if shutil.which(tool) is None:
            raise UserError(f"study: --executor slurm: {tool} is not on PATH (run it where Slurm's commands are)")
    opened = OpenStudy.open(study, cells)
    uri, parent = opened.uri, opened.parent
    if uri.startswith("sqlite:"):
        log.warning("study %s: the cells' jobs write the sqlite store %s over a shared filesystem, one writer per "
                    "job at a time at best; for many cells at once set tracking.uri to an MLflow server",
                    study.name, uri)
    queued = _queued([_job_name(study, c) for c in cells])
    ids: dict[str, str] = {}
    for i, cell in enumerate(cells, 1):
        count = f"[{i}/{len(cells)}]"
        if opened.skipped(cell):
            log.info("%s %s: finished before; skipped", count, cell.name)
            continue
        name = _job_name(study, cell)
        if name in queued:
            ids[cell.name] = queued[name]
            log.info("%s %s: still queued or running as job %s; not submitted again", count, cell.name, queued[name])
            continue
        after = [ids[n] for n in cell.needs if n in ids]
        script = _write(study, cell.name, _cell_script(study, cell, parent, gpus[cell.name]))
        ids[cell.name] = _sbatch(script, after)
        log.info("%s %s: job %s (%s GPU(s) x %d node(s)%s)", count, cell.name, ids[cell.name], gpus[cell.name],
                 cell.launcher.nnodes, f", after {','.join(after)}" if after else "")
    if not ids:
        log.info("study %s: every cell finished before; the report now", study.name)
        return report_only(study, cells)
    report = _write(study, "_report", _report_script(study, extra))
    job = _sbatch(report, list(ids.values()), "afterany")
    log.info("study %s: %d cell job(s) submitted; job %s writes the report after the last (log: %s); watch them with "
             "squeue --name=%s", study.name, len(ids), job, _logs(study) / "_report.log",
             ",".join(_job_name(study, c) for c in cells if c.name in ids))
    return 0


def _gpus(study: Study, cell: Cell) -> int:
    """GPUs per node of a cell's job: its processes per node, or slurm.gpus_per_node for auto/gpu."""
    nproc = cell.launcher.nproc
    if study.slurm.gpus_per_node is not None and (study.slurm.gpus_per_node == 0 or not isinstance(nproc, int)):
        return study.slurm.gpus_per_node
    if not isinstance(nproc, int):
        raise study_error(study.path, "slurm.gpus_per_node", f"required for cell {cell.name}: its launcher's "
                                                             f"nproc={nproc} does not say how many GPUs to ask for")
    return 1 if cell.launcher.kind == "none" else nproc


def _job_name(study: Study, cell: Cell) -> str:
    return f"{study.name}.{cell.name}"


def _header(study: Study, name: str, time: str | None, log_path: Path) -> list[str]:
    s = study.slurm
    opts = [f"--job-name={name}", f"--partition={s.partition}", f"--output={log_path.resolve()}",
            f"--chdir={Path.cwd()}"]
    opts += [f"--{flag}={value}" for flag, value in (("time", time), ("account", s.account), ("qos", s.qos),
                                                     ("cpus-per-task", s.cpus_per_task), ("mem", s.mem))
             if value is not None]
    return ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts)]


def _cell_script(study: Study, cell: Cell, parent: str, gpus: int) -> str:
    launcher = cell.launcher
    nodes = launcher.nnodes
    if nodes > 1:  # the rendezvous on the job's first node, known once the job starts
        launcher = dataclasses.replace(launcher, rdzv_endpoint=f"{MASTER}:29500")
    visible = [VISIBLE] if launcher.kind == "deepspeed" and gpus else None  # the GPUs Slurm gave the job
    cmd = shlex.join(launcher.command(cell.command, [*cell.args(), f"tracking.parent_run_id={parent}"],
                                      f"{study.name}-{cell.name}", visible))
    cmd = cmd.replace(MASTER, "${MASTER_ADDR}").replace(VISIBLE, "${CUDA_VISIBLE_DEVICES}")
    lines = _header(study, _job_name(study, cell), study.slurm.time, _logs(study) / f"{cell.name}.log")
    lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --signal=B:TERM@120"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    lines += [f"#SBATCH {o}" for o in study.slurm.extra]
    # the log keeps every attempt at the cell, each under its line (cell_process.open_attempt's)
    log_path = shlex.quote(str((_logs(study) / f"{cell.name}.log").resolve()))
    attempt = f"$(( $(grep -c '^{ATTEMPT}' {log_path} 2>/dev/null) + 1 ))"
    lines += ["#SBATCH --open-mode=append", "export PYTHONUNBUFFERED=1",
              f"echo \"{ATTEMPT}{attempt}, $(date -u '+%Y-%m-%d %H:%M:%S') UTC (job $SLURM_JOB_ID) ===\""]
    if nodes > 1:  # one torchrun agent per node
        lines.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)')
        cmd = f"srun --ntasks-per-node=1 {cmd}"
    lines.append(RUN_AND_KEEP_CODE.format(command=cmd, exit_file=shlex.quote(str(exit_file(study, cell).resolve()))))
    return "\n".join(lines)


def _report_script(study: Study, extra: list[str]) -> str:
    lines = _header(study, f"{study.name}.report", study.slurm.report_time, _logs(study) / "_report.log")
    cmd = [sys.executable, "-m", "pipeline", "study", str(study.path.resolve()), "--report-only", *extra]
    return "\n".join([*lines, f"exec {shlex.join(cmd)}", ""])


def _scripts(study: Study) -> Path:
    return study.output_root / study.name / "_slurm"


def _write(study: Study, name: str, text: str) -> Path:
    folder = _scripts(study)
    folder.mkdir(parents=True, exist_ok=True)
    _logs(study).mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.sbatch"
    path.write_text(text, encoding="utf-8")
    return path


def _sbatch(script: Path, after: list[str], kind: str = "afterok") -> str:
    """Submit a script to start once the jobs `after` have ended (afterok: each of them with exit 0)."""
    done = subprocess.run(_sbatch_command(script, after, kind), capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"study: sbatch {script.name}: {' '.join((done.stderr or done.stdout).split())[:300]}")
    return done.stdout.strip().split(";")[0]  # --parsable: ID or ID;CLUSTER


def _sbatch_command(script: Path, after: list[str], kind: str) -> list[str]:
    cmd = ["sbatch", "--parsable"]
    if after:
        cmd.append(f"--dependency={kind}:{':'.join(after)}")
        if kind == "afterok":  # a dependant of a failed cell is cancelled, not left pending for ever
            cmd.append("--kill-on-invalid-dep=yes")
    return [*cmd, str(script)]


def _queued(names: list[str]) -> dict[str, str]:
    """Job name -> id of this user's jobs Slurm still holds (pending or running) among `names`."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    cmd = ["squeue", "--noheader", "--format=%i %j", f"--name={','.join(names)}"] + ([f"--user={user}"] if user else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"study: squeue: {' '.join((done.stderr or done.stdout).split())[:300]}")
    pairs = (line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    return {name.strip(): job for job, name in pairs}
