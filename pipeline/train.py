"""The training loop: one stage, in any launch mode and precision, readable top to bottom.

run() settles the job into its plan (jobs/settle.py), decides from where it starts (jobs/resume.py:
finished, resume or start over) and builds the stage (stage.py: whatever can be the user's fault
fails before any run or output exists); then it locks output_dir and trains. The phases run in the
order written: set up the loop, resume, train an epoch, end the epoch (evaluate, keep the best
model, checkpoint), finish (test with the best model). The Backend hides single/DDP/DeepSpeed;
every piece of the loop's mutable state is the Loop's, in parts that save and restore themselves,
which a checkpoint collects by name (Loop.parts); pipeline/names.py spells every metric's name.
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipeline import names
from pipeline.config import Config
from pipeline.config.schema import default_output_dir
from pipeline.data import features
from pipeline.data.loaders import Loaders, build_loaders, describe_datasets, real_rows
from pipeline.errors import MachineError
from pipeline.evaluation import evaluate
from pipeline.fsutil import write_json
from pipeline.jobs import lock, outputs, resume, same_job
from pipeline.jobs.settle import settle
from pipeline.layout import CheckpointFiles
from pipeline.loop import checkpoint
from pipeline.loop.best_model import BestModel
from pipeline.loop.checkpoint import Stateful
from pipeline.loop.optim import build_optimizer, give_back, lr_schedule
from pipeline.loop.progress import Progress
from pipeline.loop.step_losses import StepLosses
from pipeline.measure import stall
from pipeline.measure.telemetry import StageMeters
from pipeline.runtime import dist, gc_pause
from pipeline.runtime.dist import AgreedFlag
from pipeline.stage import Stage, build_stage
from pipeline.tracking import StageRun, Tracker, catch_up, start_stage_run, what_ran

log = logging.getLogger("pipeline")
# The schedule steps on every optimizer step and gives skipped ones back later (take_pending_losses);
# when the first step is skipped (fp16's first loss scale), torch would call that a misordered call.
warnings.filterwarnings("ignore", "Detected call of `lr_scheduler", UserWarning)


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written at the step boundary (exit code 143)."""


class Diverged(RuntimeError):
    """Too many consecutive non-finite losses (exit code 1; the last checkpoint is kept)."""


@dataclass
class Loop:
    """Everything the run changes, built once by setup_loop: what the phases share and the parts of
    the loop's state that a checkpoint collects (Loop.parts). The Stage beside it never changes."""

    s: Stage
    tracker: Tracker
    run_id: str | None
    loaders: Loaders
    scheduler: torch.optim.lr_scheduler.LRScheduler
    wrapped: torch.nn.Module
    """The module to call forward on: the backend's wrapper (DDP, DeepSpeed engine) of s.model."""
    epochs: int
    total_steps: int
    preemption: AgreedFlag
    """SIGTERM seen on this rank (its `raised` event), and the step at which every rank acts on it."""
    meters: StageMeters
    """The job's throughput, energy, memory and FLOP totals."""
    progress: Progress = field(default_factory=Progress)
    losses: StepLosses = field(default_factory=StepLosses)
    best: BestModel = field(default_factory=BestModel)

    def parts(self) -> dict[str, Stateful]:
        return {"progress": self.progress, "losses": self.losses, "best": self.best, "meters": self.meters,
                "scheduler": self.scheduler}


def run(cfg: Config, stage: str = "train") -> dict[str, float]:
    """Run one stage; returns the final metrics (also in output_dir/metrics.json)."""
    rt = dist.init(cfg.backend, timeout_s=cfg.dist_timeout, fallback=cfg.fallback)
    if rt is None:  # a surplus torchrun rank under fallback: the others do the work
        return {}
    try:
        lock.check_free(Path(default_output_dir(cfg)), rt)  # a duplicate job fails before reading anything
        plan = settle(cfg, stage, rt)
        start = resume.decide(plan)  # a resume of another job stops here, before data or models load
        if isinstance(start, resume.Finished):
            catch_up(plan.out.root, plan.cfg.tracking.uri, active=rt.is_main)  # what the store lacks of its run
            return start.metrics
        s = build_stage(plan, start)
        with lock.job_lock(s.out.root, s.rt):  # a second job into output_dir: UserError, nothing touched
            return run_locked(s)
    finally:
        dist.shutdown()


def run_locked(s: Stage) -> dict[str, float]:
    """The stage in its MLflow run, from its checkpoint or from scratch (what a previous job left
    in output_dir cleared first)."""
    resumed = s.start if isinstance(s.start, resume.Resumed) else None
    if resumed is None:
        outputs.start_over(s.out.root, s.rt, s.uri, s.start.resuming)
    if s.rt.is_main:
        s.record.write(s.out.root)  # the job a later resume=auto compares with once it finished
    meters = StageMeters(s.rt.device, s.policy.arithmetic, s.rt.world_size, s.compile.counts_compile_time)
    tracker, run_id = start_stage_run(s.cfg, s.rt, s.uri, StageRun(
        s.kind, s.model_spec, s.policy.name, meters.energy_available_anywhere(),
        what_ran(s.cfg, s.rt, s.policy, s.backend, s.model_spec, s.kind), resumed=resumed is not None,
        resume_run_id=resumed.run_id if resumed else None))
    if resumed is not None and resumed.accepted:
        same_job.record_accepted(tracker, s.record, resumed.accepted, resumed.step)
    tracker.log_datasets(describe_datasets(s.cfg.data, s.task, s.examples))
    tracker.set_tags({names.TAG_DATA_CACHE: features.cache_outcome(s.examples["train"], s.features),
                      **({names.TAG_KD_CACHE: s.distiller.cache_outcome} if s.distiller else {}),
                      **({names.TAG_BATCH_FIT: s.batch_fit.describe()} if s.batch_fit else {})})
    gc_pause.resume_after_setup()  # the CLI paused it through set-up (runtime/gc_pause.py)
    preemption = AgreedFlag(s.rt.device)
    try:
        with dist.on_sigterm(preemption.raised):
            final = fit(setup_loop(s, tracker, run_id, meters, preemption), resumed)
    except BaseException as e:
        tracker.end("KILLED" if isinstance(e, (KeyboardInterrupt, Preempted)) else "FAILED")
        raise
    tracker.end("FINISHED")
    tracker.announce(s.cfg.tracking)
    return final


def fit(lp: Loop, resumed: resume.Resumed | None) -> dict[str, float]:
    """Train every epoch (from where a resumed job stopped), then test; returns the final metrics."""
    if resumed is not None:
        restore(lp, resumed)
    else:
        torch.manual_seed(lp.s.cfg.seed + lp.s.rt.rank)  # dropout differs per rank; data order does not
    for epoch in range(lp.progress.epoch, lp.epochs):
        train_epoch(lp, epoch)
        if end_epoch(lp, epoch):
            break
    return finish(lp)


def setup_loop(s: Stage, tracker: Tracker, run_id: str | None, meters: StageMeters, preemption: AgreedFlag) -> Loop:
    """Loaders, the FLOP model, AdamW, the LR schedule and the backend's wrapper."""
    t, rt = s.cfg.train, s.rt
    collate = s.task.collator(s.tokenizer)
    loaders = build_loaders(s.features, collate, t, rt, s.cfg.seed, s.tokenizer.pad_token_id,
                            fill=s.compile.fill_short_batches(distilling=s.distiller is not None))
    steps_per_epoch = math.ceil(len(loaders.train) / t.grad_accum)
    epochs = t.epochs if t.max_steps < 0 else math.ceil(t.max_steps / steps_per_epoch)  # max_steps wins, as in HF
    total_steps = steps_per_epoch * epochs if t.max_steps < 0 else t.max_steps
    meters.flop_model = s.step_flop_model(collate)  # before the wrapper: no collective, no timer
    optimizer, scheduler = build_optimizer(s.model, t, total_steps, fused=s.backend.fused_optimizer)
    wrapped = s.backend.prepare(s.model, optimizer)
    if s.backend.optimizer is not optimizer:  # DeepSpeed's: the schedule sets the lr of what steps
        scheduler = lr_schedule(s.backend.optimizer, t, total_steps)
    for name, content in s.backend.extra_artifacts.items():  # e.g. the resolved DeepSpeed config
        if rt.is_main:
            write_json(s.out / name, content)
            tracker.log_artifact(s.out / name)
    return Loop(s, tracker, run_id, loaders, scheduler, wrapped, epochs, total_steps, preemption, meters)


def restore(lp: Loop, resumed: resume.Resumed) -> None:
    """Model, optimizer, every part of the loop's state and the RNG from a checkpoint; the best
    model's weights from best/."""
    s, ckpt = lp.s, resumed.checkpoint
    try:  # the job's record matched (same_job): a failure here is the files' or the libraries'
        s.backend.load(ckpt.path)
        checkpoint.restore(resumed.bundle, lp.parts())
    except (RuntimeError, KeyError, ValueError, OSError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise MachineError(f"resume: checkpoint {ckpt.path}: cannot be loaded ({reason}); resume=never starts "
                           "over") from e
    ckpt.restore_rng(s.rt.rank)
    lp.best.restore_weights(s.out.root, s.backend)
    if s.rt.is_main:
        log.info("resumed from %s (epoch %d, step %d)", ckpt.path, lp.progress.epoch + 1, lp.progress.step)


def train_epoch(lp: Loop, epoch: int) -> None:
    """This rank's shard of one epoch, an optimizer step every grad_accum micro-batches;
    a checkpoint every train.save_every steps, and one (then Preempted) on SIGTERM."""
    s, t, progress = lp.s, lp.s.cfg.train, lp.progress
    progress.epoch = epoch
    start = progress.epoch_steps * t.grad_accum  # this rank's micro-batches already trained
    lp.loaders.start_epoch(epoch, start)
    lp.wrapped.train()
    lp.meters.start_epoch()
    group_loss = 0.0
    micro_steps = len(lp.loaders.train)
    bar = tqdm(lp.loaders.train, desc=f"epoch {epoch + 1}/{lp.epochs}", leave=False, initial=start,
               total=micro_steps, disable=not s.rt.is_main or not sys.stderr.isatty())
    for i, batch in enumerate(bar, start=start):
        group_start = (i // t.grad_accum) * t.grad_accum
        group_len = min(t.grad_accum, micro_steps - group_start)  # the last group may be short
        last_micro = i - group_start == group_len - 1
        if i == group_start:  # once per optimizer step (a resumed epoch starts at a group's start)
            s.compile.begin_optimizer_step()
        group_loss = group_loss + forward_backward(lp, batch, group_len, last_micro) / group_len
        if not last_micro:
            continue
        stop = optimizer_step(lp, group_loss, epoch + (i + 1) / micro_steps, bar)
        progress.epoch_steps += 1
        group_loss = 0.0
        if stop or (t.save_every and progress.step % t.save_every == 0 and i + 1 < micro_steps):
            lp.meters.pause()  # the save is not training time
            path = save_checkpoint(lp)
            if stop:
                raise Preempted(f"SIGTERM: checkpoint {path} written at step {progress.step}")
            lp.meters.resume()
        if progress.step >= lp.total_steps:
            break
    bar.close()
    if lp.preemption.settle():  # a SIGTERM during the epoch's last step: the ranks agree only now
        lp.meters.pause()
        raise Preempted(f"SIGTERM: checkpoint {save_checkpoint(lp)} written at step {progress.step}")


def forward_backward(lp: Loop, batch: dict, group_len: int, last_micro: bool) -> torch.Tensor:
    """One micro-batch: forward under the precision policy, the (KD) loss, backward; returns the loss."""
    s = lp.s
    idx = batch.pop("idx")
    rows, padded = real_rows(idx), batch["input_ids"].shape[1]  # filler rows (compiled jobs) are not counted
    mask = batch["attention_mask"]
    lp.meters.add_batch(mask[:rows].sum(1).tolist(), len(mask), padded)  # host tensors: no sync
    unpadded = s.compile.drop_mask(mask)  # the host copy: no sync
    inputs = {k: v.to(s.rt.device, non_blocking=True) for k, v in batch.items()}
    # No gradient all-reduce on accumulation micro-steps: only the last one syncs.
    with contextlib.nullcontext() if last_micro else s.backend.no_sync():
        loss = s.forward_loss(lp.wrapped, inputs, idx, unpadded)
        s.backend.backward(loss / group_len)
    return loss.detach()


def optimizer_step(lp: Loop, group_loss: torch.Tensor, epoch_progress: float, bar: tqdm) -> bool:
    """Step (the schedule only when the optimizer really stepped); the loss stays on the device
    until a log boundary, where the ranks' losses and non-finite flags are read in one collective;
    ranks agree on preemption one step after a SIGTERM without waiting for the device. True = stop now."""
    s, progress = lp.s, lp.progress
    result = s.backend.step()
    progress.step += 1
    lp.scheduler.step()  # provisional: a step the backend skipped is taken back when its flag is read
    lp.losses.pending.add(group_loss, result.stepped)
    stop = lp.preemption.poll()
    if progress.step % s.cfg.train.log_every == 0 or progress.step == lp.total_steps:
        take_pending_losses(lp)
        lp.meters.check_compiles()
        loss = lp.losses.close_window()
        metrics = {names.TRAIN_LOSS: loss, names.TRAIN_LR: lp.scheduler.get_last_lr()[0],
                   names.TRAIN_GRAD_NORM: float(result.grad_norm), names.TRAIN_EPOCH: epoch_progress,
                   **lp.losses.amp_metrics(s.backend.loss_scale)}
        lp.tracker.log_metrics(metrics, progress.step)
        bar.set_postfix(loss=f"{loss:.4f}")
    return stop


def take_pending_losses(lp: Loop) -> None:
    """Collective: the steps' losses since the last read into the loss window; the skipped steps
    are given back to the LR schedule (it advanced provisionally on each: between a skipped step
    and this read it runs ahead by the steps skipped, at most log_every); a streak of
    train.max_nonfinite steps on which any rank's loss was non-finite stops the job."""
    s = lp.s
    skipped, diverged_at = lp.losses.read(lp.progress.step, s.rt.world_size, s.cfg.train.max_nonfinite)
    give_back(lp.scheduler, skipped)
    if diverged_at is not None:
        last = checkpoint.latest(s.out.root)
        raise Diverged(f"{lp.losses.nonfinite_streak} consecutive non-finite losses at step {diverged_at}; "
                       f"last good checkpoint: {last.path if last else 'none'}")


def end_epoch(lp: Loop, epoch: int) -> bool:
    """Epoch metrics, dev evaluation, the best model so far, a checkpoint; True = training is over."""
    s, progress = lp.s, lp.progress
    metrics = lp.meters.end_epoch()  # reduced over ranks
    take_pending_losses(lp)  # the epoch's non-finite count is complete
    dev = evaluate(s.model, lp.loaders.dev, s.task, s.policy, s.rt, s.examples["dev"], s.features["dev"],
                   compile=s.compile)
    metrics.update({**lp.losses.amp_metrics(None), **{names.eval_metric(k): v for k, v in dev.scores.items()}})
    lp.tracker.log_metrics(metrics, progress.step)
    if s.rt.is_main:
        log.info("epoch %d/%d  step %d  loss %.4f  dev %s %.4f  %.1f samples/s  %.1fs", epoch + 1, lp.epochs,
                 progress.step, lp.losses.last_loss, s.task.main_metric, dev.main, metrics[names.SAMPLES_PER_S],
                 metrics[names.EPOCH_TIME])
    # keep the best model; stop when the main metric stops improving
    lp.best.consider(dev.scores, lp.meters.totals.train_seconds, s.backend, s.tokenizer, s.out.root, s.rt.is_main)
    done = progress.step >= lp.total_steps or epoch + 1 == lp.epochs
    early = bool(s.cfg.train.patience and lp.best.bad_evals >= s.cfg.train.patience)
    progress.epoch, progress.epoch_steps = epoch + 1, 0
    if not done and not early:
        save_checkpoint(lp)
    if early and s.rt.is_main:
        log.info("early stop: no better dev %s for %d evaluations", s.task.main_metric, lp.best.bad_evals)
    return done or early


def finish(lp: Loop) -> dict[str, float]:
    """Test with the best weights; the final metrics to MLflow, metrics.json and report.txt."""
    s, progress = lp.s, lp.progress
    if lp.best.weights is not None:  # None only if every evaluation scored NaN
        s.backend.load_full_state_dict(lp.best.weights)
    test = evaluate(s.model, lp.loaders.test, s.task, s.policy, s.rt, s.examples["test"],
                    s.features["test"], keep=True, compile=s.compile)
    lp.tracker.set_tags(stall.flag(test.stall, "test", s.rt.is_main))
    final = {**lp.best.metrics, **{names.test_metric(k): v for k, v in test.scores.items()},
             names.TRAIN_LOSS: lp.losses.last_loss, names.TRAIN_STEPS: progress.step,
             **lp.meters.final_metrics(lp.best.time_to_best), **lp.losses.amp_metrics(s.backend.loss_scale)}
    final = {k: v for k, v in final.items() if v is not None}
    if s.rt.is_main:
        final.update(s.bench_inference())
    lp.tracker.log_metrics({k: v for k, v in final.items() if not k.startswith(names.EVAL)}, progress.step)
    if s.rt.is_main:
        report = s.task.report(test.predictions, s.examples["test"], s.features["test"])
        served = outputs.ServedModel(s.task, s.examples["test"]) if s.cfg.tracking.log_model else None
        outputs.write_final(s.out.root, final, report, lp.tracker, served, progress.step)
        log.info("test %s %.4f  |  %.1f samples/s over %.1fs of training  |  outputs in %s", s.task.main_metric,
                 test.main, final[names.SAMPLES_PER_S], lp.meters.totals.train_seconds, s.out)
    return final


def save_checkpoint(lp: Loop) -> Path:
    """Collective: every part of the loop's state, the backend's state and every rank's RNG."""
    take_pending_losses(lp)  # the window holds every rank's losses since the last log
    s = lp.s
    return checkpoint.save(s.out.root, lp.progress.step, checkpoint.collect(lp.parts(), lp.run_id), s.rt.rank,
                           keep=s.cfg.train.keep_checkpoints, write_backend=s.backend.save,
                           files={CheckpointFiles.JOB: s.record.to_json()})
