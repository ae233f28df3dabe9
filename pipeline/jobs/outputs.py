"""The life of an output_dir between jobs: a job that finished stays finished, and a job that
starts over leaves nothing of the previous one to mix with its own (the lock that keeps two live
jobs apart is lock.py)."""
from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.fsutil import write_json, write_text
from pipeline.layout import OutputDir
from pipeline.runtime import dist
from pipeline.runtime.dist import Runtime
from pipeline.tracking import Tracker, settle_abandoned_run
from pipeline.tracking.served_model import save_served_model

if TYPE_CHECKING:
    from pipeline.tasks.base import Task

log = logging.getLogger("pipeline")
MODEL_NAME = "model"
"""The logged model's name in the run (models:/MODEL_ID, or registered from the run's outputs)."""


@dataclass(frozen=True)
class ServedModel:
    """What tracking.log_model=true logs best/ with: the task (its serving pipeline) and examples
    (the input example: the first test rows)."""

    task: Task
    examples: list[dict]


def finished_metrics(out: Path, rt: Runtime) -> dict | None:
    """A job that finished wrote metrics.json last: its metrics (on rank 0), else None."""
    path = OutputDir(out).metrics
    if not rt.is_main or not path.is_file():
        return None
    log.info("%s: this job finished before (%s); nothing to train. To train again: resume=never "
             "(starts over) or another output_dir", out, path)
    return json.loads(path.read_text(encoding="utf-8"))


def start_over(out: Path, rt: Runtime, uri: str, resuming: bool) -> None:
    """Collective: a job that does not resume removes what a previous job left in output_dir
    (checkpoints, best model, final metrics), so nothing of the two mixes and a later
    resume=auto continues this job; the previous job's run, if it never ended, is synced from its
    journal and marked FAILED (its journal kept aside if the store cannot take it)."""
    if rt.is_main:
        layout = OutputDir(out)
        leftovers = [name for name in OutputDir.PREVIOUS_JOB if (layout / name).exists()]
        removing = f" (removing {', '.join(leftovers)})" if leftovers else ""
        if resuming and (leftovers or layout.journal.is_file()):
            log.warning("resume=auto: no usable checkpoint in %s; starting over%s", out, removing)
        elif leftovers:
            log.warning("%s holds a previous job's outputs; resume=never: starting over%s", out, removing)
        for name in leftovers:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
            else:
                (out / name).unlink()
        abandoned = settle_abandoned_run(out, uri)
        if abandoned:
            log.warning("the previous job's MLflow run %s never ended: synced from its journal and marked FAILED",
                        abandoned)
    dist.barrier()


def write_final(out: Path, metrics: dict[str, float], report: str, tracker: Tracker, served: ServedModel | None,
                step: int) -> None:
    """Rank 0: the final metrics and the report, into output_dir and the run (with best/ as an MLflow
    model, if asked: `served`); metrics.json last of all, so its presence says the job finished."""
    layout = OutputDir(out)
    write_text(layout.report, report)
    saved = served is not None and _save_served(layout, served)
    write_json(layout.metrics, metrics)
    for path in (layout.metrics, layout.report):
        tracker.log_artifact(path)
    if saved:
        tracker.log_model(layout.mlflow_model, MODEL_NAME, step)  # after the metrics: it links them
    elif served is not None:
        tracker.log_artifact(layout.best, OutputDir.BEST)


def _save_served(layout: OutputDir, served: ServedModel) -> bool:
    """best/ as an MLflow model in output_dir; a failure is a warning, as any tracking failure: the
    job's results stand (best/ is there to log by hand)."""
    if not (layout.best / "config.json").is_file():
        return False
    if served.task.serving_task is None:
        log.info("tracking.log_model: no transformers pipeline serves task %s; best/ uploaded as files",
                 served.task.name)
        return False
    try:
        save_served_model(layout.best, served.task, served.examples, layout.mlflow_model)
    except Exception as e:  # noqa: BLE001 - a library's failure to build the pipeline must not fail the job
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        log.warning("tracking.log_model: best/ could not be saved as an MLflow model (%s); not logged", reason)
        return False
    return True
