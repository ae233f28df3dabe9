"""What a job is: the settings, data, tokenizer, model and teacher it trains with.

A job's record is written into each of its checkpoints and into output_dir (the checkpointer's
job.json), so that resume=auto can tell a job from another one given the same output_dir
(job/same_job.py compares two records). The cheap part (settings, global batch, precision, data
fingerprints) is known before any data or model is loaded (job/plan.py describes it); the
tokenizer, the model's architecture and the teacher's weights once they are built (Stage.record).
A plain value and its file: nothing here imports the rest of the pipeline.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("train", "distill")
"""The kinds of job: a teacher (or any model) fine-tuned, or a student distilled from a teacher."""


@dataclass(frozen=True)
class JobRecord:
    config: dict[str, Any]
    """The resolved config, flattened to dotted keys, secrets masked."""
    global_batch: str
    """Rows (or tokens, with train.batch_tokens) per optimizer step over all ranks."""
    world_size: int
    backend: str
    """torch | deepspeed: whose checkpoint layout the job writes."""
    precision: str
    """The resolved precision policy (precision=auto is bf16 on one machine, fp32 on another)."""
    data: dict[str, dict[str, str]]
    """Split -> {"file": what the config names, "fingerprint": a content hash or hub fingerprint}."""
    tokenizer: str | None = None
    architecture: dict[str, Any] | None = None
    """models.architecture(): what the checkpoint's weights need of the model."""
    teacher: str | None = None
    """Under distillation: a digest of the teacher's config and weights."""
    accepted: list[str] = field(default_factory=list)
    """Changes a resumed job was told to accept (accept_changes), one line each, oldest first."""

    def built(self, tokenizer: str, architecture: dict[str, Any], teacher: str | None) -> JobRecord:
        """The record completed with what build_stage made (Stage.record)."""
        return dataclasses.replace(self, tokenizer=tokenizer, architecture=architecture, teacher=teacher)

    def to_json(self) -> dict[str, Any]:
        """What the checkpointer writes as job.json (job/parts/checkpoint.py), into each checkpoint and
        into output_dir."""
        return dataclasses.asdict(self)


def read(file: Path) -> JobRecord | None:
    """The record in `file` (a checkpoint's or an output_dir's job.json); None if there is none."""
    if not file.is_file():
        return None
    raw = json.loads(file.read_text(encoding="utf-8"))
    names = {f.name for f in dataclasses.fields(JobRecord)}
    return JobRecord(**{k: v for k, v in raw.items() if k in names})
