"""The training loop: one stage, in any launch mode and precision, readable top to bottom.

fit() runs the phases in the order written: set up, restore a checkpoint, train an epoch, end it
(evaluate, keep the best model, checkpoint), finish (test with the best model, keep its predictions
on dev and test); train.eval_every adds evaluations between an epoch's steps, each counted as an
epoch end's. The job around it is job/run.py's; the Backend hides single/DDP/DeepSpeed; each piece
of mutable state is a part that saves and restores itself (Loop.parts), saved by the Checkpointer on
its own cadence; the MetricsProcessor decides when to log and makes every record.
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys
from dataclasses import InitVar, dataclass, field

import torch
from tqdm.auto import tqdm

from pipeline import names, predictions
from pipeline.data import features
from pipeline.data.loaders import Loaders, build_loaders, describe_datasets, real_rows
from pipeline.evaluation import Evaluation, evaluate
from pipeline.job.parts.best_model import BestModel
from pipeline.job.parts.checkpoint import Checkpoint, Checkpointer, Stateful
from pipeline.job.parts.optim import build_optimizer, lr_schedule
from pipeline.job.parts.progress import Progress
from pipeline.job.parts.step_losses import StepLosses
from pipeline.job.records import stage_outputs
from pipeline.job.records.metrics import MetricsProcessor
from pipeline.job.records.start_block import (
    evaluation_data,
    few_rows_warning,
    model_line,
    precision_line,
    run_url,
    start_block,
)
from pipeline.job.stage import Stage
from pipeline.measure import collapse
from pipeline.measure.telemetry import StageMeters
from pipeline.runtime import collectives
from pipeline.runtime.backend import StepLoss
from pipeline.runtime.preemption import AgreedFlag, Preempted, on_sigterm
from pipeline.tasks.base import SPLITS
from pipeline.tracking.tracker import Tracker

log = logging.getLogger("pipeline")


@dataclass
class Loop:
    """Everything the run changes, built once by setup(): what the phases share and the parts of
    the loop's state that a checkpoint collects (parts). The Stage beside it never changes."""

    stage: Stage
    loaders: Loaders
    losses: StepLosses
    """The steps' losses and the LR schedule they move (skipped steps taken back at each read)."""
    wrapped: torch.nn.Module
    """The module to call forward on: the backend's wrapper (DDP, DeepSpeed engine) of stage.model."""
    epochs: int
    total_steps: int
    preemption: AgreedFlag
    """SIGTERM seen on this rank (its `raised` event), and the step at which every rank acts on it."""
    meters: StageMeters
    """The job's throughput, energy, memory and FLOP totals."""
    tracker: InitVar[Tracker]
    progress: Progress = field(default_factory=Progress)
    best: BestModel = field(default_factory=BestModel)
    metrics: MetricsProcessor = field(init=False)
    """When a step is logged, and every record the loop's numbers become."""
    checkpointer: Checkpointer = field(init=False)

    def __post_init__(self, tracker: Tracker) -> None:
        """The metrics processor and the checkpointer, built without writing anything (begin writes)."""
        stage = self.stage
        self.metrics = MetricsProcessor(tracker, self.meters, stage.cfg.train.log_every, self.total_steps,
                                        stage.rt.is_main)
        self.checkpointer = Checkpointer(stage.out, self.parts(), stage.backend, stage.rt.rank, stage.cfg.train,
                                         tracker.run_id, stage.record.to_json(), pending=self.losses,
                                         clock=self.meters)

    def evaluation_due(self, step: int, last_of_epoch: bool) -> bool:
        """train.eval_every's evaluations between steps (an epoch's last step is its end's)."""
        every = self.stage.cfg.train.eval_every
        return bool(every) and step % every == 0 and not last_of_epoch

    @property
    def stopping_early(self) -> bool:
        patience = self.stage.cfg.train.patience
        return self.progress.pruned or bool(patience and self.best.bad_evals >= patience)

    def parts(self) -> dict[str, Stateful]:
        return {"progress": self.progress, "losses": self.losses, "best": self.best, "meters": self.meters,
                "scheduler": self.losses.scheduler}


def fit(stage: Stage, tracker: Tracker, resumed: Checkpoint | None) -> dict[str, float]:
    """Train every epoch (from where a resumed job stopped), then test; returns the final metrics.
    A SIGTERM checkpoints at the next step boundary every rank agrees on (Preempted)."""
    preemption = AgreedFlag()
    with on_sigterm(preemption.raised.set):
        loop = setup(stage, tracker, preemption)
        if resumed is not None:  # model, optimizer, every part and the RNG; the best model's weights as of it
            loop.checkpointer.load(resumed)
            loop.best.restore_weights(resumed.best_weights(stage.out), stage.backend)
        else:
            torch.manual_seed(stage.cfg.seed + stage.rt.rank)  # dropout differs per rank; data order does not
        begin(loop)
        for epoch in range(loop.progress.epoch, loop.epochs):
            train_epoch(loop, epoch)
            if end_epoch(loop, epoch):
                break
        return finish(loop)


def setup(stage: Stage, tracker: Tracker, preemption: AgreedFlag) -> Loop:
    """The FLOP model, the meters, loaders, AdamW, the LR schedule, the backend's wrapper; the Loop
    around them."""
    train_cfg, rt = stage.cfg.train, stage.rt
    collate = stage.task.collator(stage.tokenizer)
    flop_model = stage.step_flop_model(collate)  # before the wrapper: no collective, no timer
    meters = StageMeters(rt.device, stage.policy.arithmetic, rt.world_size, stage.compile.compiled,
                         flop_model)
    loaders = build_loaders(stage.features, collate, train_cfg, rt, stage.cfg.seed, stage.tokenizer.pad_token_id,
                            fill=stage.compile.fill_short_batches(distilling=stage.distiller is not None))
    steps_per_epoch = math.ceil(len(loaders.train) / train_cfg.grad_accum)
    # max_steps wins, as in HF
    epochs = train_cfg.epochs if train_cfg.max_steps < 0 else math.ceil(train_cfg.max_steps / steps_per_epoch)
    total_steps = steps_per_epoch * epochs if train_cfg.max_steps < 0 else train_cfg.max_steps
    optimizer, scheduler = build_optimizer(stage.model, train_cfg, total_steps, fused=stage.backend.fused_optimizer)
    wrapped = stage.backend.prepare(stage.model, optimizer, train_cfg)  # the batch split the job runs with
    if stage.backend.optimizer is not optimizer:  # DeepSpeed's: the schedule sets the lr of what steps
        scheduler = lr_schedule(stage.backend.optimizer, train_cfg, total_steps)
    losses = StepLosses(scheduler, stage.out, rt.world_size, train_cfg.max_nonfinite)
    return Loop(stage, loaders, losses, wrapped, epochs, total_steps, preemption, meters, tracker,
                best=BestModel(order=(stage.task.main_metric, *stage.task.tie_breakers)))


def begin(loop: Loop) -> None:
    """Collective, what the loop writes as it starts: the run's tags (what the data and teacher
    caches did, the batch finder's choice, energy_available), its datasets, the backend's files (the
    resolved DeepSpeed config), and the job's record into output_dir."""
    stage = loop.stage
    tags = {names.TAG_DATA_CACHE: features.cache_outcome(stage.examples["train"], stage.features),
            **({names.TAG_KD_CACHE: stage.distiller.cache_outcome} if stage.distiller else {}),
            **({names.TAG_BATCH_FIT: stage.batch_found} if stage.batch_found else {}),
            **({names.TAG_STUDENT_INIT: stage.student_init} if stage.student_init else {})}
    counts = {split: len(rows) for split, rows in stage.examples.items()}
    evaluated, note = evaluation_data(stage.cfg.data, counts)
    if note and stage.rt.is_main:  # what the job evaluates on where it is not a file of its own
        log.info(note)
    few = few_rows_warning(stage.cfg.data, counts)
    if few and stage.rt.is_main:
        log.warning(few)
    # rank 0 logs the datasets: the others' would digest every dev and test example for nothing
    datasets = describe_datasets(stage.cfg.data, stage.task, stage.examples) if stage.rt.is_main else []
    loop.metrics.begin(stage.out, stage.backend.extra_artifacts, {**tags, **evaluated}, datasets)
    loop.metrics.tracker.log_metrics(stage.size_figures(), 0)  # rank 0's tracker is the active one
    loop.checkpointer.write_job()
    if stage.rt.is_main:
        tracker = loop.metrics.tracker
        log.info(start_block(
            task=stage.task.name,
            model=model_line(stage.model_spec, stage.size, stage.teacher_size, stage.student_init),
            precision=precision_line(stage.cfg.precision, stage.policy.name, stage.rt.device.type),
            backend=stage.rt.backend, world_size=stage.rt.world_size,
            examples={split: len(stage.examples[split]) for split in SPLITS if split in stage.examples},
            steps=loop.total_steps,
            epochs=loop.epochs, output_dir=str(stage.out), uri=tracker.uri or "",
            run=run_url(tracker.uri or "", tracker.experiment_id, tracker.run_id)))


def train_epoch(loop: Loop, epoch: int) -> None:
    """This rank's shard of one epoch, an optimizer step every grad_accum micro-batches, a dev
    evaluation every train.eval_every steps (an early stop ends the epoch there); the checkpointer
    saves on its cadence and on SIGTERM (then Preempted)."""
    stage, grad_accum, progress = loop.stage, loop.stage.cfg.train.grad_accum, loop.progress
    progress.epoch = epoch
    start = progress.epoch_steps * grad_accum  # this rank's micro-batches already trained
    if loop.stopping_early:  # resumed at the step where an early stop ended the epoch: none left
        start = len(loop.loaders.train)
    loop.loaders.start_epoch(epoch, start)
    loop.wrapped.train()
    loop.meters.start_epoch()
    group_loss: StepLoss | None = None
    micro_steps = len(loop.loaders.train)
    bar = tqdm(loop.loaders.train, desc=f"epoch {epoch + 1}/{loop.epochs}", leave=False, initial=start,
               total=micro_steps, disable=not stage.rt.is_main or not sys.stderr.isatty())
    for i, batch in enumerate(bar, start=start):
        group_start = (i // grad_accum) * grad_accum
        group_len = min(grad_accum, micro_steps - group_start)  # the last group may be short
        last_micro = i - group_start == group_len - 1
        if i == group_start:  # once per optimizer step (a resumed epoch starts at a group's start)
            stage.compile.begin_step()
        loss = forward_backward(loop, batch, group_len, last_micro) / group_len
        group_loss = loss if group_loss is None else group_loss + loss
        if not last_micro:
            continue
        stop = optimizer_step(loop, group_loss, epoch + (i + 1) / micro_steps, bar)
        progress.epoch_steps += 1
        group_loss = None
        epoch_end = i + 1 == micro_steps
        if loop.evaluation_due(progress.step, epoch_end):  # before the step's checkpoint
            evaluate_between_steps(loop, epoch)
            epoch_end = loop.stopping_early  # an early stop ends the epoch at this step
        saved = loop.checkpointer.after_step(progress.step, preempted=stop, last_of_epoch=epoch_end)
        if stop:
            raise Preempted(f"SIGTERM: checkpoint {saved} written at step {progress.step}")
        if progress.step >= loop.total_steps or epoch_end:
            break
    bar.close()
    if loop.preemption.last_answer():  # a SIGTERM during the epoch's last step: the ranks agree only now
        saved = loop.checkpointer.after_step(progress.step, preempted=True, last_of_epoch=True)
        raise Preempted(f"SIGTERM: checkpoint {saved} written at step {progress.step}")


def forward_backward(loop: Loop, batch: dict, group_len: int, last_micro: bool) -> StepLoss:
    """One micro-batch: forward under the precision policy, the (KD) loss, backward; returns the
    loss with its named terms, detached."""
    stage = loop.stage
    idx = batch.pop("idx")
    rows, padded = real_rows(idx), batch["input_ids"].shape[1]  # filler rows (compiled jobs) are not counted
    mask = batch["attention_mask"]
    loop.meters.add_batch(mask[:rows].sum(1).tolist(), len(mask), padded)  # host tensors: no sync
    unpadded = stage.compile.drop_mask(mask)  # the host copy: no sync
    inputs = {k: v.to(stage.rt.device, non_blocking=True) for k, v in batch.items()}
    # No gradient all-reduce on accumulation micro-steps: only the last one syncs.
    with contextlib.nullcontext() if last_micro else stage.backend.no_sync():
        loss = stage.forward_loss(loop.wrapped, inputs, idx, unpadded)
        stage.backend.backward(loss.total / group_len)
    return loss.detach()


def optimizer_step(loop: Loop, group_loss: StepLoss | torch.Tensor, epoch_progress: float, bar: tqdm) -> bool:
    """Step; the loss and whether the update was applied stay on the device (StepLosses) until a
    log step, where the ranks' losses and flags are read in one collective; ranks agree on
    preemption one step after a SIGTERM without waiting for the device. True = stop now."""
    backend, progress, losses = loop.stage.backend, loop.progress, loop.losses
    result = backend.step()
    progress.step += 1
    losses.add(group_loss, result.stepped)
    stop = loop.preemption.poll()
    if loop.metrics.should_log(progress.step):
        losses.read(progress.step)
        loss = losses.close_window()
        loop.metrics.log_step(progress.step, {**losses.figures(), names.TRAIN_LR: losses.lr,
                                              names.TRAIN_GRAD_NORM: float(result.grad_norm),
                                              names.TRAIN_EPOCH: epoch_progress,
                                              **losses.amp_figures(backend.loss_scale)})
        bar.set_postfix(loss=f"{loss:.4f}")
    return stop


def evaluate_between_steps(loop: Loop, epoch: int) -> None:
    """Collective, train.eval_every: a dev evaluation and the best model so far after this step, the
    training clocks paused meanwhile (as for a checkpoint)."""
    loop.meters.pause()
    dev = evaluate_dev(loop)
    loop.metrics.log_dev(loop.progress.step, dev.figures(names.eval_metric), loop.stage.task.main_metric)
    keep_best(loop, dev, epoch, loop.meters.totals.train_seconds + loop.meters.throughput.seconds)
    loop.wrapped.train()
    loop.meters.resume()


def end_epoch(loop: Loop, epoch: int) -> bool:
    """Epoch metrics, dev evaluation, the best model so far, a checkpoint; True = training is over."""
    stage, progress = loop.stage, loop.progress
    # one collective: the epoch's clocks stop, its figures and the steps still pending over every rank
    reduced = collectives.reduce_local(collectives.join(meters=loop.meters.epoch_local(), losses=loop.losses.local()))
    meters = loop.meters.epoch_figures(reduced.part("meters"))
    loop.losses.take(reduced.part("losses"), progress.step)  # the epoch's non-finite count is complete
    has_dev = stage.cfg.data.evaluates("dev")
    dev = evaluate_dev(loop) if has_dev and progress.evaluated_at != progress.step else None
    figures = {**meters, names.TRAIN_EPOCH_LOSS: loop.losses.close_epoch(), **loop.losses.amp_figures(None),
               **(dev.figures(names.eval_metric) if dev else {})}
    loop.metrics.log_epoch(progress.step, figures, epoch, loop.epochs, stage.task.main_metric)
    if dev is not None:
        keep_best(loop, dev, epoch, loop.meters.totals.train_seconds)
    elif not has_dev:  # data.dev=skip: the model kept is the last one
        keep_best(loop, None, epoch, loop.meters.totals.train_seconds)
    done = progress.step >= loop.total_steps or epoch + 1 == loop.epochs
    early = loop.stopping_early
    progress.epoch, progress.epoch_steps = epoch + 1, 0
    loop.checkpointer.at_epoch_end(progress.step, training_over=done or early)
    if early and progress.pruned and stage.rt.is_main:
        log.info("stopped: the search pruned this trial (%s)", stage.out.stop_request)
    elif early and stage.rt.is_main:
        log.info("early stop: no better dev evaluation (%s) for %d evaluations", ", ".join(loop.best.order),
                 loop.best.bad_evals)
    return done or early


def evaluate_dev(loop: Loop) -> Evaluation:
    """Collective: the dev split's scores at this step; whether a search pruned the job meanwhile
    (rank 0 reads its stop request, every rank learns it)."""
    stage = loop.stage
    progress = loop.progress
    progress.evaluated_at = progress.step
    dev = evaluate(stage.model, loop.loaders.dev, stage.task, stage.policy, stage.rt, stage.examples["dev"],
                   stage.features["dev"], compile=stage.compile)
    stop_asked = stage.rt.is_main and stage.out.stop_request.is_file()
    progress.pruned = progress.pruned or collectives.broadcast_object(stop_asked)
    return dev


def keep_best(loop: Loop, dev: Evaluation | None, epoch: int, train_seconds: float) -> None:
    """Keep the best model (the main metric, then the task's tie-breakers) with the training seconds
    that reached it; an evaluation that is not better counts towards early stopping. No dev
    evaluation (None): the model as it is now."""
    stage = loop.stage
    loop.best.consider(None if dev is None else dev.scores, epoch + 1, train_seconds, stage.backend,
                       stage.tokenizer, stage.out, stage.rt.is_main, step=loop.progress.step)


def finish(loop: Loop) -> dict[str, float]:
    """Test with the best weights and predict dev with them once more (a split the job does not have:
    nothing of it); the final metrics to MLflow, metrics.json, report.txt and each split's
    predictions file."""
    stage = loop.stage
    if loop.best.weights is not None:  # None only if every evaluation scored NaN
        stage.backend.load_full_state_dict(loop.best.weights)
    # dev again rather than the best evaluation's predictions: the best weights are what a resume
    # restores, so this holds whichever job reached them
    kept = {split: evaluate(stage.model, getattr(loop.loaders, split), stage.task, stage.policy, stage.rt,
                            stage.examples[split], stage.features[split], keep=True, compile=stage.compile)
            for split in predictions.SPLITS if stage.cfg.data.evaluates(split)}
    test = kept.get("test")
    serving = stage.bench_inference() if stage.rt.is_main else {}
    final = loop.metrics.log_final(loop.progress.step, *final_figures(loop, test, serving))
    if stage.rt.is_main:
        report = stage_outputs.NO_TEST if test is None else stage.task.report(
            test.predictions, stage.examples["test"], stage.features["test"])
        stage_outputs.write_predictions(stage.out, stage.task, kept, stage.examples, stage.features,
                                        stage.model_spec, stage.policy.name, stage.cfg.seed)
        stage_outputs.write_outputs(loop.metrics.tracker, stage.out, final, report, loop.progress.step, stage.task,
                                    stage_outputs.example_rows(stage.examples), stage.cfg.tracking.log_model)
        stage_outputs.announce(loop.meters, final, stage.task.main_metric, test and test.main, stage.out)
    return final


def final_figures(loop: Loop, test: Evaluation | None, serving: dict[str, float]) -> tuple[dict, dict[str, str]]:
    """The job's final figures by name (the best evaluation's eval/ ones and its epoch, the test
    scores, the last logged loss and its terms, the whole job's perf/ and energy/ figures, AMP health, rank 0's
    `serving` figures) and the run's tags about them (the test split's collapse, why the best epoch)."""
    best, losses = loop.best, loop.losses
    figures = {**best.metrics, names.BEST_EPOCH: best.epoch, **(test.figures(names.test_metric) if test else {}),
               **losses.figures(), names.TRAIN_STEPS: loop.progress.step,
               names.TRAIN_EPOCHS: loop.progress.epoch, **loop.meters.final_figures(best.time_to_best),
               **losses.amp_figures(loop.stage.backend.loss_scale), **serving}
    tags = {**(collapse.flag(test.stall, "test", loop.stage.rt.is_main) if test else {}),
            **({names.TAG_BEST_REASON: best.reason} if best.reason else {})}
    return figures, tags

