"""The cells of a search study in flight: started through the study's executor (EXECUTORS: this
node's slots and GPUs with --jobs N, or a Slurm job each), polled for their ends, and a dead
runner's jobs that still hold their output_dir waited for (the search itself, which asks Optuna,
reads each trial's evaluations and tells it each trial's fate: search.py).
"""
from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path

from pipeline.fsutil import lock_held
from pipeline.layout import OutputDir
from pipeline.study.devices import describe
from pipeline.study.executor import Executor, Handle, Waited, start_local
from pipeline.study.runner import OpenStudy
from pipeline.study.schedule import Schedule
from pipeline.study.slurm_job import start_slurm
from pipeline.study.spec import Cell

log = logging.getLogger("pipeline")

POLL_S = 0.5
"""How often the runner looks at its running cells (their ends, their journals' new evaluations)."""

EXECUTORS: dict[str, Executor] = {"local": start_local, "slurm": start_slurm}
"""--executor -> how a cell is started (executor.py's seam)."""


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


def _orphan(cell: Cell) -> Waited:
    """The job a killed runner started, still at the cell: waited for until it lets go of its
    output_dir; it ended unfinished unless its stage finished."""
    return Waited(cell.name, lambda: None if _busy(cell) else (0 if cell.stage_done() else -1,
                                                                "its job ended unfinished"))


class Pool:
    """Cells started through the study's executor, each in a slot (and on GPUs) of its own, and
    polled for their ends."""

    def __init__(self, opened: OpenStudy, slots: int, gpus: list[str], executor: str, served: str | None):
        self.opened, self.local = opened, executor == "local"
        self.launch = functools.partial(EXECUTORS[executor], opened.study, parent=opened.parent, served=served,
                                        slots=slots)
        self.schedule = Schedule([], {}, slots, gpus)
        self.running: dict[str, tuple[Cell, Handle, list[str]]] = {}
        self.orphans: set[str] = set()
        """Running cells whose job a killed runner started: once it ends unfinished, continued here."""
        self.finished: set[str] = set()
        self.failed: set[str] = set()
        """Plain cells settled so far (run_cells), which later cells may need."""

    @property
    def free(self) -> bool:
        return len(self.running) < self.schedule.slots

    def start(self, cell: Cell) -> Handle | None:
        """Start `cell` (resume=auto: a cell begun before continues from its checkpoint); None while
        no slot or too few GPUs are free."""
        if not self.free:
            return None
        gpus = self.schedule.take(cell)
        if gpus is None:
            return None
        self.schedule.running[cell.name] = gpus
        if _busy(cell):  # the job a killed runner started is still at it: waited for
            handle: Handle = _orphan(cell)
            self.orphans.add(cell.name)
            log.info("%s: its job from before is still running; waiting for it", cell.name)
        else:
            handle = self._launch(cell, gpus)
        self.running[cell.name] = (cell, handle, gpus)
        return handle

    def _launch(self, cell: Cell, gpus: list[str]) -> Handle:
        handle = self.launch(cell, gpus)
        if self.local:  # a Slurm job says its own line
            log.info("%s: started on %s (log: %s)", cell.name, describe(gpus), self.opened.study.cell_log(cell))
        return handle

    def poll(self) -> list[tuple[Cell, Handle]]:
        """The cells that ended since the last call (their slots free again)."""
        out = []
        for name, (cell, handle, gpus) in list(self.running.items()):
            if not handle.poll():
                continue
            if name in self.orphans:
                self.orphans.discard(name)
                if handle.exit_code != 0:  # it ended unfinished: continued here
                    self.running[name] = (cell, self._launch(cell, gpus), gpus)
                    continue
            del self.running[name]
            self.schedule.ended(cell, {})
            out.append((cell, handle))
        return out

    def stop_all(self) -> None:
        for _, handle, _ in self.running.values():
            handle.stop()
        for _, handle, _ in self.running.values():
            handle.wait()

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
                for cell, end in self.poll():
                    waiting.discard(cell.name)
                    outcome = self.opened.outcome(cell, end)
                    self.opened.record(cell, outcome)
                    (done if end.exit_code == 0 else failed).add(cell.name)
                    log_end(cell, end)
                time.sleep(POLL_S if self.running else 0)
        except BaseException:
            self.stop_all()
            raise
        return failed


def log_end(cell: Cell, end: Handle, fate: str = "") -> None:
    if end.exit_code == 0:
        log.info("%s: %s in %.1fs", cell.name, fate or "finished", end.wall_s)
    else:
        log.warning("%s: failed with exit code %s after %.1fs: %s", cell.name, end.exit_code, end.wall_s,
                    end.last_line)
