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

import logging
import shlex
import shutil
import sys
from pathlib import Path

from pipeline.errors import UserError
from pipeline.study import cell_end
from pipeline.study.runner import OpenStudy, report_only
from pipeline.study.slurm_job import (
    WHERE,
    cell_script,
    gpus_per_node,
    header,
    job_name,
    queued,
    sbatch,
    sbatch_command,
    scripts,
    write,
)
from pipeline.study.spec import Cell, Study, study_error

log = logging.getLogger("pipeline")


def check(study: Study, cells: list[Cell]) -> dict[str, int]:
    """What a submission needs of the study file, checked before anything is written (a one-line
    UserError naming the key): the partition; each cell's GPUs per node, returned by cell name."""
    if not study.slurm.partition:
        raise study_error(study.path, "slurm.partition", "required by --executor slurm (the partition of the cells' "
                                                         f"jobs): {WHERE.format(key='partition', value='NAME')}")
    return {c.name: gpus_per_node(study, c) for c in cells}


def dry_run(study: Study, cells: list[Cell], extra: list[str]) -> int:
    """Print every job a submission would make: its sbatch command (a dependency on another job named
    <CELL>, by the cell it waits for) and its script; check what a submission checks, write nothing."""
    gpus = check(study, cells)
    folder = scripts(study)
    print(f"study {study.name}: {len(cells)} cells as Slurm jobs on partition {study.slurm.partition}; scripts would "
          f"be written to {folder} (PARENT: the study's MLflow run); nothing written or submitted")
    missing = [tool for tool in ("sbatch", "squeue") if shutil.which(tool) is None]
    if missing:
        print(f"note: {' and '.join(missing)} not on PATH here: submit where Slurm's commands are")
    submitted: list[str] = []
    for cell in cells:
        if cell.done():
            print(f"\n- {cell.name} [finished: would skip]")
            continue
        after = [f"<{n}>" for n in cell.needs if n in submitted]
        submitted.append(cell.name)
        _show(cell.name, folder, cell_script(study, cell, "PARENT", gpus[cell.name]), after, "afterok")
    if submitted:
        _show("_report", folder, _report_script(study, extra), [f"<{n}>" for n in submitted], "afterany")
    return 0


def _show(name: str, folder: Path, script: str, after: list[str], kind: str) -> None:
    print(f"\n- {name}\n  {shlex.join(sbatch_command(folder / f'{name}.sbatch', after, kind))}")
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
    held = queued([job_name(study, c) for c in cells])
    ids: dict[str, str] = {}
    for i, cell in enumerate(cells, 1):
        count = f"[{i}/{len(cells)}]"
        if opened.skipped(cell):
            log.info("%s %s: finished before; skipped", count, cell.name)
            continue
        name = job_name(study, cell)
        if name in held:
            ids[cell.name] = held[name]
            log.info("%s %s: still queued or running as job %s; not submitted again", count, cell.name, held[name])
            continue
        after = [ids[n] for n in cell.needs if n in ids]
        cell_end.clear(study, cell)  # the report job reads this job's end, not an earlier one's
        script = write(study, cell.name, cell_script(study, cell, parent, gpus[cell.name]))
        ids[cell.name] = sbatch(script, after)
        log.info("%s %s: job %s (%s GPU(s) x %d node(s)%s)", count, cell.name, ids[cell.name], gpus[cell.name],
                 cell.launcher.nnodes, f", after {','.join(after)}" if after else "")
    if not ids:
        log.info("study %s: every cell finished before; the report now", study.name)
        return report_only(study, cells)
    report = write(study, "_report", _report_script(study, extra))
    job = sbatch(report, list(ids.values()), "afterany")
    log.info("study %s: %d cell job(s) submitted; job %s writes the report after the last (log: %s); watch them with "
             "squeue --name=%s", study.name, len(ids), job, study.logs / "_report.log",
             ",".join(job_name(study, c) for c in cells if c.name in ids))
    return 0


def _report_script(study: Study, extra: list[str]) -> str:
    lines = header(study, f"{study.name}.report", study.slurm.report_time, study.logs / "_report.log")
    cmd = [sys.executable, "-m", "pipeline", "study", str(study.path.resolve()), "--report-only",
           *([] if study.timing else ["--no-timing"]), *extra]
    return "\n".join([*lines, f"exec {shlex.join(cmd)}", ""])

