"""A stage read back from its output_dir once its job has written its record: what export and its
check, the served model, the model card and the report's AMP step timings know of a stage.

Its configuration is the job record's (job.json, job_record.py): the config as the job settled
it, every default and `auto` filled in, secrets masked. config.yaml says the same for a person to
read, but no reader parses it with defaults of its own: a default that changes would make the
reader and the job disagree. Its task, its best model (best/) and its splits, assembled by the
function the stage assembled them with (data/splits.py), follow from that configuration.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import job_record
from pipeline.config.schema import SettledConfig, from_record
from pipeline.errors import UserError
from pipeline.job_record import JobRecord
from pipeline.layout import OutputDir
from pipeline.tasks import get_task
from pipeline.tasks.base import SPLITS

if TYPE_CHECKING:
    from pipeline.config import DataConfig
    from pipeline.data.splits import Splits
    from pipeline.tasks.base import Task


@dataclass(frozen=True)
class FinishedStage:
    """An output_dir and what its job recorded (read)."""

    out: OutputDir
    """Where the stage is now (cfg.output_dir is where it ran: the folder may have moved since)."""
    record: JobRecord
    cfg: SettledConfig
    """The configuration the job ran with, as its record holds it."""

    @cached_property
    def task(self) -> Task:
        return get_task(self.cfg.task, self.cfg.task_options)

    @property
    def kind(self) -> str:
        """train | distill: a distill stage's record holds its teacher's fingerprint."""
        return "distill" if self.record.teacher is not None else "train"

    @property
    def model_spec(self) -> str:
        """The model the stage trained: model as given, else the default the stage built (the task's;
        under distillation from_teacher: with half the teacher's layers, which the student has)."""
        if self.cfg.model:
            return self.cfg.model
        if self.kind == "train":
            return self.task.default_model
        return f"from_teacher:{(self.record.architecture or {}).get('num_hidden_layers', '')}"

    @property
    def best(self) -> Path | None:
        """best/, where the job has written its model there."""
        return self.out.trained_model()

    def splits(self, wanted: tuple[str, ...] = SPLITS, data: DataConfig | None = None) -> Splits:
        """The stage's splits among `wanted` (data/splits.py), prepared in this one CPU process;
        `data`: other data keys for its task (a draw the stage itself did not hold out)."""
        import torch

        from pipeline.data.splits import read_splits
        from pipeline.runtime.world import Runtime

        local = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
        return read_splits(self.task, data or self.cfg.data, local, wanted)


def read(out: OutputDir | str | Path, reader: str) -> FinishedStage:
    """The stage whose output_dir is `out`; a UserError naming `reader` (the command that needs it),
    the directory and the reason where it holds no job record."""
    out = OutputDir(out)
    record = job_record.read(out.job)
    if record is None:
        raise UserError(f"{reader}: {out}: no {OutputDir.JOB}: not the output_dir of a stage that trained (its "
                        "job writes it as training starts)")
    try:
        cfg = from_record(record.config)
    except UserError as e:
        raise UserError(f"{reader}: {out.job}: {e}") from None
    return FinishedStage(out, record, cfg)
