"""The cells of a search study in flight: started where the study runs its cells (this node's
slots and GPUs with --jobs N, or a Slurm job each), polled for their ends and for the evaluations
their journals hold, and a dead runner's jobs that still hold their output_dir waited for (the
search itself, which asks Optuna and tells it each trial's fate: search.py).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.fsutil import lock_held
from pipeline.layout import OutputDir
from pipeline.study.cell_process import CellProcess, last_line
from pipeline.study.devices import cpu_threads, describe
from pipeline.study.runner import OpenStudy, _logs, exit_file
from pipeline.study.schedule import Schedule
from pipeline.study.spec import Cell, Study

log = logging.getLogger("pipeline")

POLL_S = 0.5
"""How often the runner looks at its running cells (their ends, their journals' new evaluations)."""


@dataclass
class Ended:
    """A cell's job that ended, as OpenStudy.outcome reads it."""

    name: str
    exit_code: int
    wall_s: float
    last_line: str


@dataclass
class Job:
    cell: Cell
    gpus: list[str]
    started: float
    process: CellProcess | None = None
    """A local cell's process; None for a Slurm job or a dead runner's job still running (waited for)."""
    orphan: bool = False
    """A job the killed runner started that still holds its output_dir: waited for, then settled."""
    seen: int = 0
    """Evaluations of its journal already reported."""
    values: list[float] = field(default_factory=list)

    def ended(self, study: Study) -> Ended | None:
        if self.process is not None:
            if self.process.exit_code is None:
                return None
            self.process.join()
            return Ended(self.cell.name, self.process.exit_code, self.process.wall_s, self.process.last_line)
        wall = time.perf_counter() - self.started
        if self.orphan:
            if _busy(self.cell):
                return None
            return Ended(self.cell.name, 0 if self.cell.stage_done() else -1, wall, "its job ended unfinished")
        code_file = exit_file(study, self.cell)
        if not code_file.is_file():
            return None
        text = code_file.read_text().strip()
        if not text:  # being written
            return None
        log_path, last = _logs(study) / f"{self.cell.name}.log", ""
        if log_path.is_file():
            with log_path.open(encoding="utf-8", errors="replace") as f:
                last = last_line(f)
        return Ended(self.cell.name, int(text), wall, last)

    def new_values(self, objective: str) -> list[float]:
        """The objective's values its job logged at evaluations since the last call (in order)."""
        values = objective_values(self.cell.output_dir, objective)
        fresh, self.seen = values[self.seen:], len(values)
        self.values = values
        return fresh


def objective_values(output_dir: Path, objective: str) -> list[float]:
    """The objective's value at each evaluation, as the job's journal holds them (one per epoch)."""
    path = OutputDir(output_dir).journal
    if not path.is_file():
        return []
    out = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if f'"{objective}"' not in line or not line.endswith("\n"):  # a line still being written
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("type") == "metric" and record.get("key") == objective:
                out.append(float(record["value"]))
    return out


def _busy(cell: Cell) -> bool:
    """A live job holds the cell's output_dir (its lock, job/lock.py)."""
    return lock_held(OutputDir(cell.output_dir).lock)


class Pool:
    """Cells started where the study runs them (this node's slots and GPUs, or Slurm jobs) and
    polled for their ends."""

    def __init__(self, opened: OpenStudy, jobs: int, gpus: list[str], executor: str, served: str | None):
        self.opened, self.study, self.executor, self.served = opened, opened.study, executor, served
        self.slots = Schedule([], {}, jobs, gpus)
        self.running: dict[str, Job] = {}
        self.ended_q: queue.Queue = queue.Queue()  # CellProcess puts itself here; the pool polls instead
        self.finished: set[str] = set()
        self.failed: set[str] = set()
        """Plain cells settled so far (run_cells), which later cells may need."""

    @property
    def free(self) -> bool:
        return len(self.running) < self.slots.jobs

    def start(self, cell: Cell) -> Job | None:
        """Start `cell` (resume=auto: a cell begun before continues from its checkpoint); None while
        no slot or too few GPUs are free."""
        if not self.free:
            return None
        gpus = self.slots.take(cell)
        if gpus is None:
            return None
        self.slots.running[cell.name] = gpus
        job = Job(cell, gpus, time.perf_counter())
        if _busy(cell):  # the job a killed runner started is still at it: waited for
            job.orphan = True
            log.info("%s: its job from before is still running; waiting for it", cell.name)
        elif self.executor == "slurm":
            self._submit(cell)
        else:
            job.process = self._process(cell, gpus)
        self.running[cell.name] = job
        return job

    def _process(self, cell: Cell, gpus: list[str]) -> CellProcess:
        args = [*cell.args(), f"tracking.parent_run_id={self.opened.parent}"]
        if self.served:
            args.append(f"tracking.uri={self.served}")
        cmd = cell.launcher.command(cell.command, args, f"{self.study.name}-{cell.name}", gpus)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        elif self.slots.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(cpu_threads(cell, self.slots.jobs))
        process = CellProcess(cell.name, cmd, env, _logs(self.study) / f"{cell.name}.log", False, self.ended_q)
        log.info("%s: started on %s (log: %s)", cell.name, describe(gpus), process.log_path)
        process.start()
        return process

    def _submit(self, cell: Cell) -> None:
        from pipeline.study.slurm import _cell_script, _gpus, _job_name, _queued, _sbatch, _write

        if _job_name(self.study, cell) in _queued([_job_name(self.study, cell)]):
            log.info("%s: still queued or running as a Slurm job; not submitted again", cell.name)
            return
        exit_file(self.study, cell).unlink(missing_ok=True)
        script = _write(self.study, cell.name, _cell_script(self.study, cell, self.opened.parent,
                                                             _gpus(self.study, cell)))
        log.info("%s: Slurm job %s", cell.name, _sbatch(script, []))

    def poll(self) -> list[tuple[Job, Ended]]:
        """The jobs that ended since the last call (their slots free again)."""
        out = []
        for name, job in list(self.running.items()):
            end = job.ended(self.study)
            if end is not None and job.orphan and end.exit_code != 0:  # it ended unfinished: continued here
                job.orphan = False
                if self.executor == "slurm":
                    self._submit(job.cell)
                else:
                    job.process = self._process(job.cell, job.gpus)
                continue
            if end is not None:
                del self.running[name]
                self.slots.ended(job.cell, {})
                out.append((job, end))
        return out

    def stop_all(self) -> None:
        for job in self.running.values():
            if job.process is not None:
                job.process.stop()
        for job in self.running.values():
            if job.process is not None:
                job.process.join()

    def run_cells(self, cells: list[Cell]) -> set[str]:
        """Run plain cells (those the search needs, the best trial's re-runs) to their end, each
        after the cells it needs; returns the names of those that failed."""
        done, failed = self.finished, self.failed
        pending = []
        for cell in cells:
            skip = self.opened.skipped(cell) if cell.stage_done() else None
            if skip:
                log.info("%s: finished before; skipped", cell.name)
                self.opened.record(cell, skip)
                done.add(cell.name)
            else:
                pending.append(cell)
        waiting = {c.name for c in pending}
        try:
            while pending or self.running:
                for cell in list(pending):
                    # a needed cell neither settled nor to run here never ran: as good as failed
                    if any(n in failed or (n not in done and n not in waiting) for n in cell.needs):
                        pending.remove(cell)
                        failed.add(cell.name)
                        self.opened.record(cell, {"status": "failed", "exit_code": None,
                                                  "reason": f"needs {', '.join(cell.needs)}, which failed"})
                    elif all(n in done for n in cell.needs) and self.start(cell):
                        pending.remove(cell)
                for job, end in self.poll():
                    waiting.discard(job.cell.name)
                    outcome = self.opened.outcome(job.cell, end)
                    self.opened.record(job.cell, outcome)
                    (done if end.exit_code == 0 else failed).add(job.cell.name)
                    log_end(job, end)
                time.sleep(POLL_S if self.running else 0)
        except BaseException:
            self.stop_all()
            raise
        return failed


def log_end(job: Job, end: Ended, fate: str = "") -> None:
    if end.exit_code == 0:
        log.info("%s: %s in %.1fs", job.cell.name, fate or "finished", end.wall_s)
    else:
        log.warning("%s: failed with exit code %s after %.1fs: %s", job.cell.name, end.exit_code, end.wall_s,
                    end.last_line)
