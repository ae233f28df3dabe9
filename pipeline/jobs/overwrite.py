"""A job that starts over never removes another job's work: before anything loads, the job asked for
against the record of what output_dir holds (a finished job's, else its newest checkpoint's),
compared as a resume compares them (same_job.py) plus the model and teacher as named. The same job
starts over as before; another one is refused in one line naming the differences, unless
overwrite=true (then start_over removes what the other job left)."""
from __future__ import annotations

from pipeline import job_record
from pipeline.errors import UserError
from pipeline.job_record import JobRecord
from pipeline.jobs import same_job
from pipeline.layout import OutputDir
from pipeline.parts import checkpoint
from pipeline.plan.settle import Plan
from pipeline.runtime import dist

NAMED = ("model", "kd.teacher")
"""Compared by what they make when a job resumes (same_job.COMPARED_ELSEWHERE); here, before anything
is built, by what the config names: another model or teacher is another job."""


@dist.on_main
def refuse_another_job(plan: Plan, resuming: bool) -> None:
    """Collective, read on global rank 0: a UserError if output_dir holds another job's finished
    outputs or checkpoints and overwrite is not set. `resuming` (resume=auto found nothing usable to
    continue, and no finished job: resume.decide) leaves nothing of a job to keep."""
    if plan.cfg.overwrite or resuming:
        return
    out = plan.out
    held = _held(out)
    if held is None:
        return
    what, record = held
    found = differences(record, plan.record) if record else None
    if found == []:
        return
    named = "no record of its job (job.json)" if found is None else "; ".join(found)
    raise UserError(refusal(out, what, named))


def refusal(out: OutputDir, what: str, named: str) -> str:
    return (f"output_dir {out} holds another job's {what} ({named}): another output_dir keeps both; "
            "overwrite=true removes them and starts this job there")


def differences(old: JobRecord, new: JobRecord) -> list[str]:
    """What makes `new` another job than `old`, a line each: the settings a resume compares, then the
    model and teacher as the configs name them."""
    found = [str(c) for c in same_job.settings_changes(old, new)]
    return found + [f"{k}: {old.config.get(k)} -> {new.config.get(k)}" for k in NAMED
                    if old.config.get(k) != new.config.get(k)]


def _held(out: OutputDir) -> tuple[str, JobRecord | None] | None:
    """What of a job output_dir holds: its finished outputs, else its newest complete checkpoint
    (manifest written), with that job's record; None for neither."""
    if out.metrics.is_file():
        return "finished outputs", job_record.read(out.job)
    written = checkpoint.complete(out)
    if written:
        return "checkpoints", job_record.read(written[-1].job)
    return None
