"""One cell of a study as one Slurm job: its script, its submission with `sbatch`, and what Slurm
still holds (`squeue`). The script runs the cell's command (executor.launch) and writes its exit
code beside its log (cell_end.exit_file), which is how the runner learns that the job ended. slurm.py
submits a whole study this way; `start_slurm` one cell, the executor of a search's trials.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import subprocess
from pathlib import Path

from pipeline.errors import UserError
from pipeline.study import cell_end
from pipeline.study.cell_process import ATTEMPT
from pipeline.study.executor import Waited, launch
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


def exit_code(study: Study, cell: Cell) -> tuple[int, str] | None:
    """(the exit code, the last line that says why) once the cell's job wrote its exit code; None
    before (or while the job is writing it)."""
    end = cell_end.read(study, cell)
    if end is None:
        return None
    return end["exit_code"], cell_end.log_last_line(study.cell_log(cell))


WHERE = "set {key}: {value} in the study file's `slurm:` mapping, or slurm.{key}={value} on the command line"
"""Where a study's slurm settings are set, as a refusal of a missing one says."""


def gpus_per_node(study: Study, cell: Cell) -> int:
    """GPUs per node of a cell's job: its processes per node, or slurm.gpus_per_node for auto/gpu."""
    nproc = cell.launcher.nproc
    if study.slurm.gpus_per_node is not None and (study.slurm.gpus_per_node == 0 or not isinstance(nproc, int)):
        return study.slurm.gpus_per_node
    if not isinstance(nproc, int):
        raise study_error(study.path, "slurm.gpus_per_node", f"required for cell {cell.name}: its launcher's "
                                                             f"nproc={nproc} does not say how many GPUs to ask for; "
                                                             f"{WHERE.format(key='gpus_per_node', value='N')}")
    return 1 if cell.launcher.kind == "none" else nproc


def job_name(study: Study, cell: Cell) -> str:
    """The cell's job's name, by which a submission again finds it in Slurm's queue."""
    return f"{study.name}.{cell.name}"


def header(study: Study, name: str, time: str | None, log_path: Path) -> list[str]:
    """A job script's first lines: the shell and the #SBATCH options every job of the study takes."""
    s = study.slurm
    opts = [f"--job-name={name}", f"--partition={s.partition}", f"--output={log_path.resolve()}",
            f"--chdir={Path.cwd()}"]
    opts += [f"--{flag}={value}" for flag, value in (("time", time), ("account", s.account), ("qos", s.qos),
                                                     ("cpus-per-task", s.cpus_per_task), ("mem", s.mem))
             if value is not None]
    return ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts)]


def cell_script(study: Study, cell: Cell, parent: str, gpus: int) -> str:
    """The job script that runs the cell (a child of the run `parent`) on its nodes and `gpus` GPUs
    per node, appending to its log."""
    launcher = cell.launcher
    nodes = launcher.nnodes
    if nodes > 1:  # the rendezvous on the job's first node, known once the job starts
        launcher = dataclasses.replace(launcher, rdzv_endpoint=f"{MASTER}:29500")
    visible = [VISIBLE] if launcher.kind == "deepspeed" and gpus else None  # the GPUs Slurm gave the job
    cmd, _ = launch(study, dataclasses.replace(cell, launcher=launcher), parent, visible)
    command = shlex.join(cmd).replace(MASTER, "${MASTER_ADDR}").replace(VISIBLE, "${CUDA_VISIBLE_DEVICES}")
    lines = header(study, job_name(study, cell), study.slurm.time, study.cell_log(cell))
    lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1", "#SBATCH --signal=B:TERM@120"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    lines += [f"#SBATCH {o}" for o in study.slurm.extra]
    # the log keeps every attempt at the cell, each under its line (cell_process.open_attempt's)
    log_path = shlex.quote(str(study.cell_log(cell).resolve()))
    attempt = f"$(( $(grep -c '^{ATTEMPT}' {log_path} 2>/dev/null) + 1 ))"
    lines += ["#SBATCH --open-mode=append", "export PYTHONUNBUFFERED=1",
              f"echo \"{ATTEMPT}{attempt}, $(date -u '+%Y-%m-%d %H:%M:%S') UTC (job $SLURM_JOB_ID) ===\""]
    if nodes > 1:  # one torchrun agent per node
        lines.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)')
        command = f"srun --ntasks-per-node=1 {command}"
    lines.append(RUN_AND_KEEP_CODE.format(command=command,
                                          exit_file=shlex.quote(str(cell_end.exit_file(study, cell).resolve()))))
    return "\n".join(lines)


def scripts(study: Study) -> Path:
    """OUTPUT_ROOT/STUDY/_slurm: the job scripts, kept to resubmit one by hand."""
    return study.output_root / study.name / "_slurm"


def write(study: Study, name: str, text: str) -> Path:
    """The job script `name`.sbatch written (and the log folder its job writes to made)."""
    folder = scripts(study)
    folder.mkdir(parents=True, exist_ok=True)
    study.logs.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.sbatch"
    path.write_text(text, encoding="utf-8")
    return path


def sbatch(script: Path, after: list[str], kind: str = "afterok") -> str:
    """Submit a script to start once the jobs `after` have ended (afterok: each of them with exit 0)."""
    done = subprocess.run(sbatch_command(script, after, kind), capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"study: sbatch {script.name}: {' '.join((done.stderr or done.stdout).split())[:300]}")
    return done.stdout.strip().split(";")[0]  # --parsable: ID or ID;CLUSTER


def sbatch_command(script: Path, after: list[str], kind: str) -> list[str]:
    cmd = ["sbatch", "--parsable"]
    if after:
        cmd.append(f"--dependency={kind}:{':'.join(after)}")
        if kind == "afterok":  # a dependant of a failed cell is cancelled, not left pending for ever
            cmd.append("--kill-on-invalid-dep=yes")
    return [*cmd, str(script)]


def queued(names: list[str]) -> dict[str, str]:
    """Job name -> id of this user's jobs Slurm still holds (pending or running) among `names`."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    cmd = ["squeue", "--noheader", "--format=%i %j", f"--name={','.join(names)}"] + ([f"--user={user}"] if user else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"study: squeue: {' '.join((done.stderr or done.stdout).split())[:300]}")
    pairs = (line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    return {name.strip(): job for job, name in pairs}


def start_slurm(study: Study, cell: Cell, gpus: list[str], parent: str, **_) -> Waited:
    """The executor of a search's trials under --executor slurm: the cell submitted as a job of its
    own (unless Slurm still holds its job), its end looked for in its exit file. `gpus`, and
    start_local's other settings, are Slurm's to decide."""
    name = job_name(study, cell)
    if name in queued([name]):
        log.info("%s: still queued or running as a Slurm job; not submitted again", cell.name)
    else:
        cell_end.clear(study, cell)
        script = write(study, cell.name, cell_script(study, cell, parent, gpus_per_node(study, cell)))
        log.info("%s: Slurm job %s", cell.name, sbatch(script, []))
    return Waited(cell.name, lambda: exit_code(study, cell))
