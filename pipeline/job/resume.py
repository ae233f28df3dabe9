"""What a job continues from, and the life of its output_dir between jobs: one value, `Resume`.

`decide(plan)` reads output_dir once on global rank 0, before any data or model loads (every rank
gets the answer): the job finished already (`finished`: its metrics, nothing to do), it continues
from the newest usable checkpoint (`checkpoint`) or the one resume=PATH names, or it starts over
(neither). Another live job in
output_dir (lock.py), a resume of another job, or of a finished job asked for more, stops here in
one line (same_job.py says what may differ), as does starting over on another job's work (its
finished outputs or checkpoints, compared as a resume compares them plus the model and teacher as
named) unless overwrite=true; the same finished job asked for again is finished (its outputs kept)
unless overwrite=true. `Resume.compare` is the one comparison of the job
asked for with the one it continues, at the phase the job's record was made: settled (the
settings) or built (the model's architecture, the tokenizer, the teacher's weights too). Once the
stage is built, `confirm` makes that comparison and loads the checkpoint's bundle; a job that
continues from nothing clears what a previous job left (`start_over`), one that continues from a
named checkpoint what its job did after it (`rewind`: best/ back to the checkpoint's best model).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import fsutil, job_record, names
from pipeline.config.schema import RESUME_WORDS
from pipeline.errors import UserError
from pipeline.job import lock, same_job
from pipeline.job.parts import checkpoint
from pipeline.job.parts.best_model import BestModel
from pipeline.job.parts.checkpoint import Checkpoint
from pipeline.job.parts.progress import Progress
from pipeline.job.plan import Plan
from pipeline.job.same_job import Change, param_value
from pipeline.job.stage import Stage
from pipeline.job_record import JobRecord
from pipeline.layout import CheckpointFiles, OutputDir
from pipeline.runtime import collectives
from pipeline.runtime.world import Runtime
from pipeline.tracking import Tracker, settle_abandoned_run, unfinished_run

log = logging.getLogger("pipeline")


@dataclass
class Resume:
    """What this job continues from: nothing (both None), a checkpoint, or a finished job (its
    final metrics); the record of the job it continues and the changes accepted against it."""

    out: OutputDir
    auto: bool
    """resume=auto was asked for (or an elastic restart): start_over says it found nothing usable."""
    checkpoint: Checkpoint | None = None
    metrics: dict | None = None
    """A finished job's final metrics (metrics.json, written last)."""
    trained: JobRecord | None = None
    """The record of the job it continues (a checkpoint's job.json, or a finished job's)."""
    accepted: list[Change] = field(default_factory=list)
    """The changes accepted against it (accept_changes), recorded on the run."""
    named: bool = False
    """The checkpoint is the one resume=PATH names, maybe older than the job's newest."""

    @property
    def finished(self) -> bool:
        return self.metrics is not None

    def compare(self, asked: JobRecord, accept: list[str], built: bool) -> None:
        """The job asked for against the one it continues (nothing to compare when it continues
        from nothing), at the phase `asked` was made: `built` adds what only a built stage knows.
        A UserError for a change it may not make; the accepted ones kept."""
        if self.finished:
            same_job.check_finished(self.out, self.trained, asked)
        elif self.checkpoint is not None:
            check = same_job.check_built if built else same_job.check_settings
            self.accepted += check(self.checkpoint.path, self.trained, asked, accept)

    def confirm(self, stage: Stage, accept: list[str]) -> Stage:
        """Collective: the built stage against the checkpoint (a UserError if the model no longer fits
        or the tokenizer or teacher changed unaccepted), then the checkpoint's bundle; returns the
        stage with the job's record from now on: every change accepted in its life."""
        if self.checkpoint is None:
            return stage
        self.compare(stage.record, accept, built=True)
        step = self.checkpoint.saved("progress", Progress()).step
        carried = [*self.trained.accepted, *(f"{c} (at step {step})" for c in self.accepted)]
        return dataclasses.replace(stage, record=dataclasses.replace(stage.record, accepted=carried))

    def record_accepted(self, tracker: Tracker, record: JobRecord) -> None:
        """A resumed job that goes on with changes says so: a warning line, a tag listing every change
        accepted in the run's life (`record`: confirm's stage's), a param per change accepted now
        (MLflow keeps a param's first value: these are new keys)."""
        if not self.accepted:
            return
        log.warning("resume: continuing with changed settings (accept_changes): %s; the run mixes them and is "
                    "tagged %s", "; ".join(map(str, self.accepted)), names.TAG_RESUMED_WITH_CHANGES)
        tracker.set_tags({names.TAG_RESUMED_WITH_CHANGES: " | ".join(record.accepted)})
        step = self.checkpoint.step
        tracker.log_params({f"resumed_at_step_{step}.{c.key}": f"{param_value(c.old)} -> {param_value(c.new)}"
                            for c in self.accepted})

    def rewind(self, rt: Runtime) -> None:
        """Collective: a job resumed from a named checkpoint (resume=PATH) drops what its job did after
        it: the newer checkpoints are removed, and best/, if another model became best after it,
        holds the checkpoint's best model again (its weights from the checkpoint), or goes where the
        checkpoint knows none."""
        if self.named and rt.is_main:
            out, ckpt = self.out, self.checkpoint
            newer = [c.path for c in checkpoint.complete(out) if c.step > ckpt.step]
            then = ckpt.path / CheckpointFiles.BEST
            knows_best = bool(ckpt.saved("best", BestModel()).metrics)
            stale = out.best_weights.is_file() and (
                not knows_best or (then.is_file() and not _same_content(out.best_weights, then)))
            if newer or stale:
                log.warning("resume=%s: undoing what the job did after it: %s", ckpt.path, ", ".join(
                    [*(f"{p.name} removed" for p in newer),
                     *([f"{out.BEST}/ {'back to its best model' if knows_best else 'removed'}"] if stale else [])]))
            for path in newer:
                shutil.rmtree(path)
            if stale and knows_best:
                _best_again(out, then)
            elif stale:
                shutil.rmtree(out.best)
        collectives.barrier()

    def start_over(self, rt: Runtime, uri: str) -> str | None:
        """Collective: a job that continues from nothing removes what a previous job left in
        output_dir (checkpoints, best model, final metrics), so nothing of the two mixes and a later
        resume=auto continues this job; the previous job's run, if it never ended, is synced from its
        journal and marked FAILED (its journal kept aside if the store cannot take it). Returns, on
        rank 0, the run of a previous job that did not finish: the new run supersedes it."""
        out, superseded = self.out, None
        if rt.is_main:
            leftovers = [name for name in OutputDir.PREVIOUS_JOB if (out / name).exists()]
            removing = f" (removing {', '.join(leftovers)})" if leftovers else ""
            if self.auto and (leftovers or out.journal.is_file()):
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
                log.warning("the previous job's MLflow run %s never ended: synced from its journal and marked "
                            "FAILED", abandoned)
            superseded = unfinished_run(out)
        collectives.barrier()
        return superseded


NAMED = ("model", "kd.teacher")
"""Compared by what they make when a job resumes (same_job.COMPARED_ELSEWHERE); when a job starts over,
before anything is built, by what the config names: another model or teacher is another job."""


@collectives.on_main
def decide(plan: Plan) -> Resume:
    """Collective, read on global rank 0: what this job continues from; a UserError when it may do
    nothing: another job holds output_dir live (lock.py), a resume would continue another job or a
    finished one asked for more (same_job.py), or starting over would remove another job's work
    without overwrite=true."""
    out = plan.out
    lock.refuse_if_busy(out)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # an elastic restart resumes
    if plan.cfg.resume not in RESUME_WORDS and not restarted:  # a restart continues from the newest
        return _named(plan)
    auto = plan.cfg.resume == "auto" or restarted
    # what output_dir holds: a finished job's outputs (metrics.json, written last), else its newest
    # checkpoint (one whose files match their manifest, to resume; one fully written, to keep),
    # with that job's record
    finished = out.metrics.is_file()
    ckpt = None
    if not finished:
        ckpt = next(reversed(checkpoint.complete(out)), None) if not auto else checkpoint.latest(out)
    held = finished or ckpt is not None
    trained = job_record.read(out.job if ckpt is None else ckpt.job) if held else None
    if auto:  # resume=auto with nothing usable starts over: there is nothing of a job to keep
        metrics = json.loads(out.metrics.read_text(encoding="utf-8")) if finished else None
        start = Resume(out, auto=True, checkpoint=ckpt, metrics=metrics, trained=trained)
        start.compare(plan.record, plan.cfg.accepted_changes, built=False)
        return start
    if held and not plan.cfg.overwrite:  # starting over never removes another job's work
        what = "finished outputs" if finished else "checkpoints"
        found = _another_job(trained, plan.record) if trained else None
        if found != []:
            named = "no record of its job (job.json)" if found is None else "; ".join(found)
            raise UserError(f"output_dir {out} holds another job's {what} ({named}): another output_dir keeps "
                            "both; overwrite=true removes them and starts this job there")
        if finished:  # the same job's command again keeps its results: only overwrite=true trains it anew
            return Resume(out, auto=False, metrics=json.loads(out.metrics.read_text(encoding="utf-8")),
                          trained=trained)
    return Resume(out, auto=False)


def _named(plan: Plan) -> Resume:
    """resume=PATH: a complete checkpoint of this output_dir whose job is this one (the comparison
    resume=auto makes), in a job not finished; else a UserError naming why."""
    out, path = plan.out, Path(plan.cfg.resume)
    ckpt = checkpoint.named(path)
    owner = path.resolve().parent.parent
    if path.resolve().parent != out.checkpoints.resolve():
        raise UserError(f"resume={path}: a checkpoint of another output_dir ({owner}), not of this job's ({out}); "
                        f"to continue that job: output_dir={owner}")
    if out.metrics.is_file():
        raise UserError(f"resume={path}: {out} holds a finished job (its {out.metrics.name}); a finished job is not "
                        "resumed: resume=never overwrite=true starts over")
    start = Resume(out, auto=False, checkpoint=ckpt, trained=job_record.read(ckpt.job), named=True)
    start.compare(plan.record, plan.cfg.accepted_changes, built=False)
    return start


def _same_content(a: Path, b: Path) -> bool:
    return os.path.samefile(a, b) or fsutil.file_sha256(a) == fsutil.file_sha256(b)


def _best_again(out: OutputDir, weights: Path) -> None:
    """best/ with `weights` (a checkpoint's best.safetensors) beside its other files (config, tokenizer,
    card: the same model), replaced whole."""
    with fsutil.atomic_dir(out.best, replace=True) as tmp:
        for path in out.best.iterdir():
            if path != out.best_weights and path.is_file():
                shutil.copy2(path, tmp / path.name)
        checkpoint.link_or_copy(weights, tmp / out.best_weights.name)


def _another_job(old: JobRecord, new: JobRecord) -> list[str]:
    """What makes `new` another job than `old`, a line each: the settings a resume compares, then the
    model and teacher as the configs name them."""
    found = [str(c) for c in same_job.settings_changes(old, new)]
    return found + [f"{k}: {old.config.get(k)} -> {new.config.get(k)}" for k in NAMED
                    if old.config.get(k) != new.config.get(k)]
