"""The default output_dir of a job: it names the task, the model, the precision and (distill) the
teacher, so two default jobs that train something else never share one directory."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config.schema import Config


def default_output_dir(cfg: Config, model_spec: str, teacher: str | None = None) -> str:
    """output_dir as given, else outputs/TASK-MODEL-PRECISION, and -kd-TEACHER for a distill stage:
    two default jobs that train another model, or from another teacher, never share one."""
    if cfg.output_dir:
        return cfg.output_dir
    return f"outputs/{cfg.task}-{model_slug(model_spec)}-{cfg.precision}" + (
        f"-kd-{model_slug(teacher)}" if teacher else "")


def model_slug(spec: str) -> str:
    """A model spec as a directory name: preset:bangla-tiny -> bangla-tiny, org/name -> name, a
    local model -> its directory's name (a stage's best/ -> that stage's output_dir name),
    from_teacher:N -> studentN."""
    if spec.startswith("from_teacher:"):
        return "student" + spec.partition(":")[2]
    path = Path(spec.partition(":")[2] if spec.startswith("preset:") else spec.rstrip("/"))
    name = path.parent.name if path.name == "best" and path.parent.name else path.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
