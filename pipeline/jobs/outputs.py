"""The life of an output_dir between jobs: a job that finished stays finished, and a job that
starts over leaves nothing of the previous one to mix with its own (the lock that keeps two live
jobs apart is lock.py; what a finishing job writes is tracking/metrics.py's)."""
from __future__ import annotations

import json
import logging
import shutil

from pipeline.layout import OutputDir
from pipeline.runtime import dist
from pipeline.runtime.dist import Runtime
from pipeline.tracking import settle_abandoned_run

log = logging.getLogger("pipeline")


def finished_metrics(out: OutputDir) -> dict | None:
    """A job that finished wrote metrics.json last: its metrics, else None."""
    if not out.metrics.is_file():
        return None
    return json.loads(out.metrics.read_text(encoding="utf-8"))


def start_over(out: OutputDir, rt: Runtime, uri: str, resuming: bool) -> None:
    """Collective: a job that does not resume removes what a previous job left in output_dir
    (checkpoints, best model, final metrics), so nothing of the two mixes and a later
    resume=auto continues this job; the previous job's run, if it never ended, is synced from its
    journal and marked FAILED (its journal kept aside if the store cannot take it)."""
    if rt.is_main:
        leftovers = [name for name in OutputDir.PREVIOUS_JOB if (out / name).exists()]
        removing = f" (removing {', '.join(leftovers)})" if leftovers else ""
        if resuming and (leftovers or out.journal.is_file()):
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
