"""One stage as a job, from the command line's config to its final metrics: build, train, close.

run() settles the job into its plan, joining its world (job/plan.py), decides what it does with
output_dir (resume.py: refused while another job holds it or would lose its work, finished, from a
checkpoint, or over), builds the stage (stage.py: whatever can be the user's fault fails before
any run or output exists; batch_finder.py under train.batch_size=auto, or the memory cap emulated
on a CPU) and confirms a checkpoint
against what was built (the stage's record, the job's from then on); then, holding the lock, it
clears what a previous job left (Resume.start_over) or did after the checkpoint named
(Resume.rewind), opens the MLflow run and hands the stage to
the loop (loop.py), and closes the run with how the loop ended.
"""
from __future__ import annotations

import logging

from pipeline.config import Config
from pipeline.errors import Interrupted
from pipeline.job import batch_finder, lock, resume
from pipeline.job.loop import fit
from pipeline.job.parts import checkpoint
from pipeline.job.plan import settle
from pipeline.job.records.stage_run import StageRun, start_stage_run, what_ran
from pipeline.job.records.start_block import precision_line, settled_line
from pipeline.job.stage import Stage, build_stage
from pipeline.layout import OutputDir
from pipeline.runtime import gc_pause, world
from pipeline.runtime.preemption import Preempted
from pipeline.tracking import catch_up, resolve_uri

log = logging.getLogger("pipeline")


def run(cfg: Config, kind: str = "train") -> dict[str, float]:
    """Run one stage (kind: train | distill); returns the final metrics (also in output_dir/metrics.json).
    Ctrl-C once output_dir is known: Interrupted, saying what it left there."""
    plan = None
    try:
        plan = settle(cfg, kind)  # joins the job's world (world.init)
        if plan is None:  # a surplus torchrun rank under fallback: the others do the work
            return {}
        rt = plan.rt
        # another job's output_dir, a resume of another job or starting over on its work stops here
        start = resume.decide(plan)
        if start.finished:  # what its journal holds and the store lacks, replayed first
            if rt.is_main:
                log.info("%s: this job finished before (%s); nothing to train, its outputs are kept. To train "
                         "again: overwrite=true (starts over there) or another output_dir", plan.out, plan.out.metrics)
            catch_up(plan.out, plan.cfg.tracking.uri, active=rt.is_main)
            return start.metrics
        uri = resolve_uri(plan.cfg.tracking.uri)
        if rt.is_main:  # what the job resolved, before data and models load (seconds to minutes)
            model = plan.cfg.model or (plan.task.default_model if kind == "train" else "from_teacher (kd.teacher's)")
            log.info(settled_line(kind, plan.cfg.task, model,
                                  precision_line(plan.cfg.precision, plan.policy.name, rt.device.type),
                                  rt.backend, rt.world_size, plan.cfg.output_dir))
        stage = build_stage(plan)
        if plan.find_batch:
            stage = batch_finder.fit_batch(stage)
        elif plan.cfg.train.memory_limit_mb is not None and plan.rt.device.type == "cpu":
            stage = batch_finder.check_batch(stage)  # a GPU's allocator enforces the cap itself
        # a checkpoint against the model, tokenizer and teacher: the stage's record, the job's from now on
        stage = start.confirm(stage, plan.cfg.accepted_changes)
        with lock.job_lock(plan.out):  # a second job into output_dir: UserError, nothing touched
            return _run_locked(stage, start, uri)
    except KeyboardInterrupt:
        if plan is None or not plan.rt.is_main:
            raise
        raise Interrupted(*interrupted_at(plan.out)) from None
    finally:
        world.shutdown()


def interrupted_at(out: OutputDir) -> tuple[str, tuple[str, ...]]:
    """What a job stopped by Ctrl-C leaves in output_dir, and the arguments that continue it."""
    ckpt = next(reversed(checkpoint.complete(out)), None)
    if ckpt is None:
        return f"no checkpoint in {out} (train.save_every sets how often one is written); the same command " \
               "starts over", ()
    return f"{ckpt.path} (step {ckpt.step}) is the last checkpoint", ("resume=auto",)


def _run_locked(stage: Stage, start: resume.Resume, uri: str) -> dict[str, float]:
    """The stage in its MLflow run, from its checkpoint or from scratch (what a previous job left
    in output_dir cleared first)."""
    ckpt = start.checkpoint
    ran = what_ran(stage.cfg, stage.rt, stage.policy, stage.backend, stage.model_spec, stage.kind)
    superseded = None  # the run of an unfinished job before this one, retired once this job's opens
    if ckpt is None:
        superseded = start.start_over(stage.rt, uri)
    else:
        start.rewind(stage.rt)
    tracker = start_stage_run(stage.cfg, stage.rt, uri, StageRun(
        stage.kind, stage.model_spec, stage.policy.name, ran,
        resumed=ckpt is not None, resume_run_id=ckpt.run_id if ckpt else None, supersedes=superseded))
    start.record_accepted(tracker, stage.record)
    gc_pause.resume_after_setup()  # the CLI paused it through set-up (runtime/gc_pause.py)
    try:
        final = fit(stage, tracker, ckpt)
    except BaseException as e:
        tracker.end("KILLED" if isinstance(e, (KeyboardInterrupt, Preempted)) else "FAILED")
        raise
    tracker.end("FINISHED")
    tracker.announce(stage.cfg.tracking)
    return final
