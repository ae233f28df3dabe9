"""The one entry point of the resume decision: what a job does with its output_dir.

`decide(plan)` answers, before any data or model loads, from what global rank 0 reads in
output_dir once (every rank gets its answer): the job finished already (`Finished`: its metrics,
nothing to do), continue from the newest usable checkpoint (`FromCheckpoint`), or start over
(`StartOver`). Another live job in output_dir (lock.py), a resume of another job, or of a finished
job asked for more, stops here in one line (same_job.py says what may differ). Once the stage is
built, `FromCheckpoint.confirm` compares what only a built stage knows (the model's architecture,
the tokenizer, the teacher's weights) and loads the checkpoint's bundle: `Resumed`, what the loop
restores (a job that starts over clears output_dir: outputs.start_over).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from pipeline import job_record
from pipeline.job_record import JobRecord
from pipeline.jobs import lock, outputs, same_job
from pipeline.jobs.same_job import Change
from pipeline.parts import checkpoint
from pipeline.parts.checkpoint import Checkpoint, LoadedCheckpoint
from pipeline.plan.settle import Plan
from pipeline.runtime import dist

__all__ = ["Finished", "FromCheckpoint", "Resumed", "StartOver", "decide"]


@dataclass(frozen=True)
class Finished:
    """The job finished in output_dir before: its final metrics."""

    metrics: dict


@dataclass(frozen=True)
class StartOver:
    """No checkpoint to continue from."""

    resuming: bool
    """resume=auto was asked for (and found nothing usable): start_over says so."""


@dataclass(frozen=True)
class Resumed:
    """A checkpoint confirmed against the built stage: what the loop restores and records."""

    loaded: LoadedCheckpoint
    """The checkpoint and its bundle (state.pt: the loop's parts and the run id)."""
    record: JobRecord
    """The job's record from now on, with every change accepted in its life."""
    accepted: list[Change]
    """The changes accepted by this resume (recorded on the run)."""

    @property
    def step(self) -> int:
        return self.loaded.step

    @property
    def run_id(self) -> str | None:
        return self.loaded.run_id


@dataclass(frozen=True)
class FromCheckpoint:
    """Continue from `checkpoint`, whose job's settings match the plan (or the changes are accepted),
    once the built stage is confirmed against it."""

    checkpoint: Checkpoint
    trained: JobRecord
    """The checkpoint's record of its job."""
    accepted: list[Change]
    """The settings' changes accepted (accept_changes)."""

    def confirm(self, built: JobRecord, accept: list[str]) -> Resumed:
        """Collective: the built stage against the checkpoint (a UserError if the model no longer fits
        or the tokenizer or teacher changed unaccepted), then the checkpoint's bundle."""
        accepted = [*self.accepted, *same_job.check_built(self.checkpoint.path, self.trained, built, accept)]
        loaded = LoadedCheckpoint(self.checkpoint, self.checkpoint.load_bundle())
        carried = [*self.trained.accepted, *(f"{c} (at step {loaded.step})" for c in accepted)]
        return Resumed(loaded, dataclasses.replace(built, accepted=carried), accepted)


@dist.on_main
def decide(plan: Plan) -> Finished | FromCheckpoint | StartOver:
    """Collective, read on global rank 0: what this job does with its output_dir; a UserError when
    it may do nothing (another job holds it, or holds the job asked for otherwise)."""
    out, asked = plan.out, plan.record
    lock.refuse_if_busy(out)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # an elastic restart resumes
    if plan.cfg.resume != "auto" and not restarted:
        return StartOver(resuming=False)
    # what output_dir holds: a finished job's metrics, else its newest usable checkpoint; that job's record
    metrics = outputs.finished_metrics(out)
    ckpt = checkpoint.latest(out) if metrics is None else None
    if metrics is None and ckpt is None:
        return StartOver(resuming=True)
    trained = job_record.read(out.job if ckpt is None else ckpt.job)
    if ckpt is None:
        same_job.check_finished(out, trained, asked)
        return Finished(metrics)
    return FromCheckpoint(ckpt, trained, same_job.check_settings(ckpt.path, trained, asked, plan.cfg.accepted_changes))

