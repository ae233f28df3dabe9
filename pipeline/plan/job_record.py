"""What a job is: the settings, data, tokenizer, model and teacher it trains with.

A job's record is written into each of its checkpoints (and into output_dir, for the job once it
finished), so that resume=auto can tell a job from another one given the same output_dir
(same_job.py compares two records). The cheap part (settings, global batch, precision, data
fingerprints) is known before any data or model is loaded; the tokenizer, the model's
architecture and the teacher's weights once they are built.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import flatten
from pipeline.config.schema import SettledConfig
from pipeline.config.secrets import redact_config
from pipeline.data import features
from pipeline.layout import CheckpointFiles
from pipeline.runtime.dist import Runtime
from pipeline.runtime.precision import PrecisionPolicy

if TYPE_CHECKING:

    from pipeline.tasks.base import Task

FILE = CheckpointFiles.JOB  # the same name in output_dir: OutputDir.JOB
FINGERPRINTED_SPLITS = ("train", "dev")
"""The splits a job's optimization and model selection read (test is only evaluated at the end)."""


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
        """The record completed with what build_stage made (Stage.identity)."""
        return dataclasses.replace(self, tokenizer=tokenizer, architecture=architecture, teacher=teacher)

    def to_json(self) -> dict[str, Any]:
        """What the checkpointer writes as job.json (parts/checkpoint.py), into each checkpoint and
        into output_dir."""
        return dataclasses.asdict(self)


def read(directory: Path) -> JobRecord | None:
    """The record in directory (a checkpoint or an output_dir); None if it has none."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    raw = json.loads(path.read_text(encoding="utf-8"))
    names = {f.name for f in dataclasses.fields(JobRecord)}
    return JobRecord(**{k: v for k, v in raw.items() if k in names})


def describe(cfg: SettledConfig, task: Task, rt: Runtime, policy: PrecisionPolicy) -> JobRecord:
    """The part of a job's record known before data and models load (settle.settle makes it)."""
    t = cfg.train
    per_rank = f"{t.batch_tokens * t.grad_accum} tokens" if t.batch_tokens else f"{t.batch_size * t.grad_accum} rows"
    amount, unit = per_rank.split()
    return JobRecord(
        # redacted as config.yaml is (no secrets in output_dir), and as JSON reads it back
        config=json.loads(json.dumps({k: v for k, v in flatten(redact_config(cfg.to_dict())).items() if v != {}},
                                     default=str)),  # an empty mapping (model_config={}) is no key
        global_batch=f"{int(amount) * rt.world_size} {unit}", world_size=rt.world_size,
        backend="deepspeed" if rt.backend == "deepspeed" else "torch",
        precision=policy.name,
        # a file's sha256 (remembered: a warm start does not read it again) or a hub dataset's fingerprint
        data={split: {"file": getattr(cfg.data, split) or f"the built-in {task.name} {split} set",
                      "fingerprint": features.source_identity(task, getattr(cfg.data, split), split)}
              for split in FINGERPRINTED_SPLITS})

