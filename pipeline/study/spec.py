"""The parsed study: its launchers, procedures, matrix blocks and the cells planned from them.

The study-file format these come from is described in `pipeline/study/__init__.py`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import UserError
from pipeline.layout import OutputDir

AXES = ("tasks", "models", "precisions", "procedures", "seeds")
"""The matrix axes, in the order a cell's name lists their values."""
AXIS_KEY = {"tasks": "task", "models": "model", "precisions": "precision", "seeds": "seed"}
"""Axis -> the config key its value sets (a procedure sets a command and overrides instead)."""
LAUNCHERS = ("none", "torchrun", "deepspeed")
POST_STAGE = {"export": ("exporting", lambda out: out.export_check)}
"""The steps a procedure may run after its stage, in this order, each `python -m pipeline STEP
OUTPUT_DIR OPTIONS` in the cell's slot (the procedure's key STEP gives its options, parser.py):
step -> (the progress line's word for it, the file of the OutputDir it writes last: once that is
there, the step is done)."""


def study_error(path: Path, key: str, reason: str) -> UserError:
    """The one-line error for a study file: the file, the key, why."""
    return UserError(f"{path}: {key}: {reason}")


@dataclass
class Launcher:
    """How a stage process is started: directly, under torchrun, or under the deepspeed launcher."""

    kind: str = "none"
    nproc: int | str = 1
    """Processes per node (torchrun also takes auto, gpu, cpu)."""
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous when nnodes > 1 (default $MASTER_ADDR:29500)."""
    config: str | None = None
    """DeepSpeed JSON config (deepspeed only)."""

    def command(self, kind: str, args: list[str], rdzv_id: str, gpus: list[str] | None = None) -> list[str]:
        """The command line; `gpus`: the GPU indices the cell was given (the deepspeed launcher is
        told them with --include: given --num_gpus it takes GPUs 0..N-1 whatever is visible)."""
        module = ["-m", "pipeline", kind, *args]
        if self.kind == "torchrun":
            head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(self.nproc)]
            if self.nnodes == 1:
                head.append("--standalone")
            else:  # this starts the local agent; the other nodes run the same command
                endpoint = self.rdzv_endpoint or f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:29500"
                head += ["--nnodes", str(self.nnodes), "--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint,
                         "--rdzv_id", rdzv_id]
            return head + module
        if self.kind == "deepspeed":
            exe = Path(sys.executable).with_name("deepspeed")  # the launcher beside this interpreter
            head = [str(exe) if exe.exists() else "deepspeed"]
            head += ["--include", f"localhost:{','.join(gpus)}"] if gpus else ["--num_gpus", str(self.nproc)]
            if self.nnodes > 1:
                head += ["--num_nodes", str(self.nnodes)]
            return head + ["--module", "pipeline", kind, *args]
        return [sys.executable, *module]

    def overrides(self) -> list[str]:
        if self.kind == "deepspeed":
            return ["backend=deepspeed"] + ([f"deepspeed={self.config}"] if self.config else [])
        return []

    def describe(self) -> str:
        if self.kind == "none":
            return "none"
        nodes = f"x{self.nnodes} nodes" if self.nnodes > 1 else ""
        return f"{self.kind}:{self.nproc}{nodes}"


@dataclass
class Procedure:
    name: str
    kind: str = "train"
    """train | distill (job_record.KINDS): the study file's `command`."""
    overrides: list[tuple[str, str]] = field(default_factory=list)
    """(key=value, where it came from) pairs; the origin names the study-file key in errors."""
    launcher: Launcher | None = None
    after: dict[str, list[str]] = field(default_factory=dict)
    """Its post-stage steps (POST_STAGE) -> their options: `export: {int8: true}` is
    {"export": ["--check", "--int8"]}."""


@dataclass
class Block:
    """One matrix: the product of its axes. An absent axis is None (not varied)."""

    index: int
    axes: dict[str, dict[str, list[tuple[str, str]]] | None]
    """axis -> {value: overrides of that value} (ordered), or None."""
    overrides: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class SlurmSettings:
    """The study file's `slurm` mapping: what every cell's job asks Slurm for (`--executor slurm`)."""

    partition: str | None = None
    time: str | None = None
    """A cell's time limit, in Slurm's format (HH:MM:SS, D-HH:MM:SS)."""
    account: str | None = None
    qos: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    gpus_per_node: int | None = None
    """GPUs of a cell whose launcher's nproc is auto/gpu (other cells ask for their nproc); 0: cells on CPUs."""
    extra: list[str] = field(default_factory=list)
    """More sbatch options, each as on the command line (--constraint=h100)."""
    report_time: str = "00:30:00"
    """The time limit of the job that writes the report after the last cell."""


@dataclass
class Study:
    name: str
    path: Path
    config: str | None
    overrides: list[tuple[str, str]]
    extra: list[tuple[str, str]]
    """Command-line overrides: applied to every cell after the study file's own."""
    scoped: dict[str, list[tuple[str, str]]]
    """Command-line PROCEDURE:key=value overrides: procedure -> its cells' overrides, applied last."""
    launcher: Launcher
    procedures: dict[str, Procedure]
    blocks: list[Block]
    output_root: Path
    report_dir: Path
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    search: object | None = None
    """The `search` block, a search_spec.Search (a layer above this one): each searched cell becomes
    an Optuna study of trials (study/search.py)."""
    timing: bool = True
    """Whether the report it writes times models side by side (`study --no-timing`: not, as `report
    --no-timing`)."""

    @property
    def logs(self) -> Path:
        """OUTPUT_ROOT/NAME/_logs: each cell's log, a Slurm job's exit code, the MLflow server's log."""
        return self.output_root / self.name / "_logs"

    def cell_log(self, cell: Cell) -> Path:
        """The cell's log: every attempt at it (cell_process.open_attempt), its processes' whole output."""
        return self.logs / f"{cell.name}.log"


@dataclass
class Cell:
    name: str
    procedure: str
    kind: str
    launcher: Launcher
    output_dir: Path
    overrides: list[tuple[str, str]]
    values: dict[str, str]
    """The block's axis values of this cell: axis name (tasks, models, ...) -> value."""
    tables: list[str]
    needs: list[str] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    """Effective task, model, precision, seed (from the resolved config), for the report."""
    after: dict[str, list[str]] = field(default_factory=dict)
    """The procedure's post-stage steps and their options (Procedure.after)."""

    def args(self) -> list[str]:
        return [text for text, _ in self.overrides]

    def step_command(self, step: str, uri: str | None) -> list[str]:
        """A post-stage step on the stage's outputs (the export: its best/ exported, checked and
        logged on its run), tracking to `uri` when the study serves its store."""
        return [sys.executable, "-m", "pipeline", step, str(self.output_dir), *self.after[step],
                *(["--uri", uri] if uri else [])]

    def steps_left(self) -> list[str]:
        """Its post-stage steps not done yet, in the order they run."""
        out = OutputDir(self.output_dir)
        return [step for step in self.after if not POST_STAGE[step][1](out).is_file()]

    def stage_done(self) -> bool:
        """The stage finished (it writes metrics.json last)."""
        return OutputDir(self.output_dir).metrics.is_file()

    def done(self) -> bool:
        """The stage finished, and so did each of its post-stage steps (the export writes
        export/check.json last)."""
        return self.stage_done() and not self.steps_left()
