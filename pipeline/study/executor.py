"""Where a study's cells run: the executor seam. An executor starts one cell (or one of its
post-stage steps) and returns its `Handle`: `poll()` says whether it ended, and then its
`exit_code`, `last_line` (the last error line of its output, else its last line) and `wall_s`
are set; `stop()` passes a SIGTERM on to a cell this runner started (it checkpoints at its next
step), `wait()` waits for such a cell to end; both do nothing for a cell it only watches.

    start(study, cell, gpus, parent=..., served=..., slots=..., echo=..., step=...) -> Handle

`start_local` runs it as a process on this node (cell_process.py), on the GPUs `gpus` the caller's
slots gave it; slurm_job.start_slurm submits it as a Slurm job. `launch` is the one place a cell's
command line and environment are built, for both.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from pipeline.study.cell_process import CellProcess
from pipeline.study.devices import cpu_threads
from pipeline.study.spec import Cell, Study


class Waited:
    """A cell whose end is only looked for (a Slurm job, a job a killed runner started): `check`
    returns (exit code, last line) once it ended, else None. What it runs is not this runner's to
    stop or wait for."""

    def __init__(self, name: str, check: Callable[[], tuple[int, str] | None]):
        self.name, self.check = name, check
        self.started = time.perf_counter()
        self.exit_code: int | None = None
        self.last_line = ""
        self.wall_s = 0.0

    def poll(self) -> bool:
        if self.exit_code is None and (found := self.check()) is not None:
            (self.exit_code, self.last_line), self.wall_s = found, time.perf_counter() - self.started
        return self.exit_code is not None

    def stop(self) -> None:
        pass

    def wait(self) -> None:
        pass


def launch(study: Study, cell: Cell, parent: str, gpus: list[str] | None, served: str | None = None,
           slots: int = 1, step: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a cell's process: its stage under its launcher, a child
    of the study's parent run, tracking to `served` (the study's MLflow server) when there is one;
    or its post-stage `step`. It sees only its `gpus`; on the CPU, with `slots` cells side by side,
    its share of the cores."""
    if step is not None:
        cmd = cell.step_command(step, served)
    else:
        args = [*cell.args(), f"tracking.parent_run_id={parent}", *([f"tracking.uri={served}"] if served else [])]
        cmd = cell.launcher.command(cell.kind, args, f"{study.name}-{cell.name}", gpus)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    elif slots > 1 and "OMP_NUM_THREADS" not in os.environ:  # cells side by side on the CPU
        env["OMP_NUM_THREADS"] = str(cpu_threads(cell, slots))
    return cmd, env


def start_local(study: Study, cell: Cell, gpus: list[str], parent: str, served: str | None = None, slots: int = 1,
                echo: bool = False, step: str | None = None) -> CellProcess:
    """The cell's process on this node, its output in its log (and on the console with `echo`)."""
    cmd, env = launch(study, cell, parent, gpus, served, slots, step)
    process = CellProcess(cell.name, cmd, env, study.cell_log(cell), echo)
    process.start()
    return process


Handle = CellProcess | Waited
"""A started cell: a process this runner started, or a job it watches."""
Executor = Callable[..., Handle]
"""start_local's signature: (study, cell, gpus, parent=, served=, slots=, echo=, step=) -> its handle."""
