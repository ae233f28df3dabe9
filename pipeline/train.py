"""The training loop: one stage, in any launch mode and precision, readable top to bottom.

run() does everything that can be the user's fault first (config, device, data, model), so a
bad input fails before any MLflow run or output exists; then it locks output_dir (one job per
folder) and resumes, starts over or, for a finished job, does nothing. The stage's phases run
in the order they are written below: set up the optimization, resume, train an epoch, end the
epoch (evaluate, keep the best model, checkpoint), finish (test with the best model, write the
figures). The Backend hides single/DDP/DeepSpeed, StageMeters turns meters into figures, and
pipeline/names.py spells every figure's name.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from pipeline import checkpoint, features, lock, models, names, outputs
from pipeline.checkpoint import LoopState
from pipeline.config import Config
from pipeline.data import Loaders, build_loaders, describe_datasets, real_rows, shaped_collate
from pipeline.distill import Distiller, build_distillation
from pipeline.evaluation import evaluate
from pipeline.fsutil import atomic_dir, write_json, write_text
from pipeline.optim import build_optimizer, give_back
from pipeline.runtime import collector, dist, precision
from pipeline.runtime.backend import Backend
from pipeline.runtime.dist import Runtime
from pipeline.runtime.factory import make_backend
from pipeline.runtime.fallback import fit_to_world
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.step_figures import AgreedFlag, PendingLosses
from pipeline.tasks import get_task
from pipeline.tasks.base import SPLITS, Task
from pipeline.telemetry import FlopModel, StageMeters, count_flops
from pipeline.tracking import Tracker, resolve_uri, start_stage_run, what_ran

log = logging.getLogger("pipeline")
# The schedule steps on every optimizer step and gives skipped ones back later (take_pending_losses);
# when the first step is skipped (fp16's first loss scale), torch would call that a misordered call.
warnings.filterwarnings("ignore", "Detected call of `lr_scheduler", UserWarning)


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written at the step boundary (exit code 143)."""


class Diverged(RuntimeError):
    """Too many consecutive non-finite losses (exit code 1; the last checkpoint is kept)."""


@dataclass
class Stage:
    """What the phases of one stage share: the parts built by build_stage(), then the loop's."""

    cfg: Config
    rt: Runtime
    stage: str
    """train | distill."""
    policy: PrecisionPolicy
    task: Task
    examples: dict
    features: dict
    tokenizer: Any
    model: torch.nn.Module
    """The model to call: the backend's wrapper (DDP, DeepSpeed engine) once prepared."""
    model_spec: str
    backend: Backend
    distiller: Distiller | None
    meters: StageMeters
    uri: str
    tracker: Tracker | None = None
    loaders: Loaders | None = None
    scheduler: Any = None
    state: LoopState = field(default_factory=LoopState)
    pending: PendingLosses = field(default_factory=PendingLosses)
    """Step losses not yet read from the device (read at log boundaries, epoch ends, checkpoints)."""
    sigterm: AgreedFlag | None = None
    best_state: dict | None = None
    """The best model's weights (CPU, fp32): the final test runs with them."""
    epochs: int = 0
    total_steps: int = 0

    @property
    def out(self) -> Path:
        return Path(self.cfg.output_dir)


def run(cfg: Config, stage: str = "train") -> dict[str, float]:
    """Run one stage; returns the final figures (also in output_dir/metrics.json)."""
    rt = dist.init(cfg.backend, timeout_s=cfg.dist_timeout, fallback=cfg.fallback)
    if rt is None:  # a surplus torchrun rank under fallback: the others do the work
        return {}
    try:
        cfg, rt = fit_to_world(cfg, rt)  # fewer processes than planned: same global batch
        out = Path(cfg.resolve().output_dir)
        lock.check_free(out, rt)  # a duplicate job fails before loading anything
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # elastic restart
        resuming = cfg.resume == "auto" or restarted
        finished = dist.broadcast_object(outputs.finished_figures(out, rt)) if resuming else None
        if finished is not None:
            return finished
        s = build_stage(cfg, stage, rt)
        with lock.job_lock(s.out, rt):  # a second job into output_dir: UserError, nothing touched
            return run_locked(s, resuming)
    finally:
        dist.shutdown()


def run_locked(s: Stage, resuming: bool) -> dict[str, float]:
    """Resume from the newest usable checkpoint or start over; the stage, in its MLflow run."""
    ckpt = checkpoint.latest(s.out) if resuming else None
    resume_state = ckpt.load_state() if ckpt else None
    if ckpt is None:
        outputs.start_over(s.out, s.rt, s.uri, resuming)
    s.tracker, run_id = start_stage_run(
        s.cfg, s.rt, s.stage, s.model_spec, s.policy.name, s.uri, s.meters.energy_available_anywhere(),
        resumed=ckpt is not None, resume_run_id=resume_state["loop"]["run_id"] if resume_state else None,
        ran=what_ran(s.cfg, s.rt, s.policy, s.backend, s.model_spec, s.stage))
    s.tracker.log_datasets(describe_datasets(s.cfg.data, s.task, s.examples))
    s.tracker.set_tags({names.TAG_DATA_CACHE: features.cache_outcome(s.examples["train"], s.features)})
    collector.resume_after_setup()  # the CLI paused it through set-up (runtime/collector.py)
    try:
        with dist.sigterm_flag() as preempt:
            figures = fit(s, preempt, ckpt, resume_state, run_id)
    except BaseException as e:
        s.tracker.end("KILLED" if isinstance(e, (KeyboardInterrupt, Preempted)) else "FAILED")
        raise
    s.tracker.end("FINISHED")
    s.tracker.announce(s.cfg.tracking)
    return figures


def build_stage(cfg: Config, stage: str, rt: Runtime) -> Stage:
    """Everything that can be the user's fault, before a run or an output exists."""
    policy = precision.resolve(cfg.precision, rt.device)
    cfg = cfg.resolve(device_type=rt.device.type)  # compile, batch shapes, loader workers for this device
    task = get_task(cfg.task, cfg.task_options)
    # a DeepSpeed config is read and checked before data and models load (minutes on a real job);
    # the distill stage's default student (from_teacher:N) needs the teacher, but only the kind of
    # model matters to the defaults resolve() fills
    planned_spec = cfg.model or (task.default_model if stage == "train" else "from_teacher:")
    backend = make_backend(rt, policy, cfg.resolve(planned_spec, task).train, cfg.deepspeed)
    # the training split is prepared once per node and memory-mapped: its size, digest and texts
    # here, not its rows; dev/test keep their examples (the metrics read them)
    examples = {"train": features.prepare_train(task, cfg.data.train, rt),
                **{split: task.load(getattr(cfg.data, split), split) for split in ("dev", "test")}}
    uri = resolve_uri(cfg.tracking.uri)
    transformers.set_seed(cfg.seed)  # identical initial weights on every rank
    train_texts = examples["train"].texts
    distiller = None
    if stage == "distill":
        model_spec, tokenizer, model, distiller = build_distillation(cfg, task, policy, rt, train_texts)
    else:
        model_spec = cfg.model or task.default_model
        tokenizer, model = models.build(model_spec, task, train_texts, cfg.model_config, cfg.train.max_length)
    cfg = cfg.resolve(model_spec, task)
    prepared = {split: features.prepare_features(task, split, getattr(cfg.data, split), examples[split], tokenizer,
                                                 cfg.train.max_length, rt) for split in SPLITS}
    examples["train"].release()  # the builder's rows: the features are on disk now
    return Stage(cfg, rt, stage, policy, task, examples, prepared, tokenizer, model, model_spec, backend,
                 distiller, StageMeters(rt.device, policy.name, rt.world_size, cfg.train.compile != "off"), uri)


def fit(s: Stage, preempt, ckpt, resume_state, run_id) -> dict:
    """Train every epoch (from where a resumed job stopped), then test; returns the final figures."""
    setup_optimization(s)
    s.state = LoopState(run_id=run_id)
    if resume_state is not None:
        resume(s, ckpt, resume_state)
    else:
        torch.manual_seed(s.cfg.seed + s.rt.rank)  # dropout differs per rank; data order does not
    for epoch in range(s.state.epoch, s.epochs):
        train_epoch(s, epoch, preempt)
        if end_epoch(s, epoch):
            break
    return finish(s)


def setup_optimization(s: Stage) -> None:
    """Loaders, AdamW, the LR schedule, the backend's wrapper and the teacher's cache."""
    t, rt = s.cfg.train, s.rt
    collate = s.task.collator(s.tokenizer)
    # compiled: short batches filled to full rows, so graphs replay (not under KD: its loss would count them)
    s.loaders = build_loaders(s.features, collate, t, rt, s.cfg.seed, s.tokenizer.pad_token_id,
                              fill=t.compile != "off" and s.distiller is None)
    steps_per_epoch = math.ceil(len(s.loaders.train) / t.grad_accum)
    s.epochs = t.epochs if t.max_steps < 0 else math.ceil(t.max_steps / steps_per_epoch)  # max_steps wins, as in HF
    s.total_steps = steps_per_epoch * s.epochs if t.max_steps < 0 else t.max_steps

    s.model.to(rt.device)  # parameters stay fp32: autocast casts per op (fp32 master weights)
    if s.distiller is not None:  # the teacher's logits for the whole training set, once (cached on disk)
        s.distiller.prepare(s.features["train"], shaped_collate(collate, t, s.tokenizer.pad_token_id), t.max_length,
                            s.tokenizer)
        s.tracker.set_tags({names.TAG_KD_CACHE: {True: "hit", False: "miss", None: "off"}[s.distiller.cache_hit]})
    s.meters.flop_model = count_step_flops(s, collate)  # before the wrapper: no collective, no timer
    optimizer, s.scheduler = build_optimizer(s.model, t, s.total_steps, fused=rt.backend != "deepspeed")
    s.model = s.backend.prepare(s.model, optimizer)
    s.sigterm = AgreedFlag(rt.device)
    for name, content in s.backend.extra_artifacts.items():  # e.g. the resolved DeepSpeed config
        if rt.is_main:
            write_json(s.out / name, content)
            s.tracker.log_artifact(s.out / name)


def count_step_flops(s: Stage, collate) -> FlopModel:
    """FLOPs of one training row at up to three padded lengths (the shortest, the longest and one
    between), each counted on a real single-row forward and backward of the unwrapped model, the
    loss included (KD: the live teacher or the cached logits), in eval mode with the math attention
    kernel (whose FLOPs equal the fused kernels' formulas); gradients and RNG are left as they were.
    Runs before the timer and before the backend wraps the model."""
    train_rows = s.features["train"]
    by_length = {}
    for i, length in enumerate(features.sequence_lengths(train_rows)):  # from Arrow, no list of rows
        by_length.setdefault(length, i)
    lengths = sorted(by_length)
    candidates = dict.fromkeys([lengths[0], lengths[-1], lengths[len(lengths) // 2], *lengths])  # spread first
    per_row: dict[int, float] = {}
    devices = [s.rt.device] if s.rt.device.type == "cuda" else []
    training = s.model.training
    s.model.eval()  # dropout costs no counted FLOPs; eval mode draws no random numbers
    # the math attention kernel: FlopCounterMode has no formula for CPU's fused one, which eval picks
    with torch.random.fork_rng(devices=devices), sdpa_kernel(SDPBackend.MATH):
        for length in candidates:
            batch = collate([train_rows[by_length[length]]])
            padded = batch["input_ids"].shape[1]
            if padded in per_row:
                continue
            per_row[padded] = count_flops(functools.partial(plain_step, s, batch))
            if len(per_row) == 3:
                break
    s.model.zero_grad(set_to_none=True)
    s.model.train(training)
    return FlopModel(per_row)


def forward_loss(s: Stage, inputs: dict, idx: torch.Tensor, module, unpadded: bool = False) -> torch.Tensor:
    """Forward under the precision policy, then the task's loss of the batch, or under distillation
    the KD loss (`module`: the unwrapped student, whose kd_projection it uses). `unpadded`: the
    batch has no padding, so the model gets no attention mask (the losses still read it): with a
    mask, transformers' SDPA path asks the device whether it is all ones, a host sync per step."""
    forward_kwargs = s.distiller.forward_kwargs if s.distiller is not None else {}
    model_inputs = {k: v for k, v in inputs.items() if k != "attention_mask"} if unpadded else inputs
    with s.policy.autocast():
        outputs = s.model(**model_inputs, **forward_kwargs)
    if s.distiller is None:
        return s.task.loss(outputs, inputs)
    return s.distiller.loss(outputs, inputs, idx, module)


def plain_step(s: Stage, batch: dict) -> None:
    """Forward, loss and backward of the unwrapped model, as forward_backward computes them."""
    idx = batch.pop("idx")
    inputs = {k: v.to(s.rt.device) for k, v in batch.items()}
    forward_loss(s, inputs, idx, s.model).backward()


def resume(s: Stage, ckpt, resume_state: dict) -> None:
    """Model, optimizer, schedule, loop position and RNG from a checkpoint; the best model so far."""
    s.backend.load(ckpt.path)
    s.scheduler.load_state_dict(resume_state["scheduler"])
    s.state = LoopState(**{**resume_state["loop"], "run_id": s.state.run_id})  # the window: summed over ranks
    ckpt.restore_rng(s.rt.rank)
    if (s.out / "best" / "model.safetensors").is_file():
        from safetensors.torch import load_file

        saved = load_file(s.out / "best" / "model.safetensors")  # without the kd_projection, if any
        s.best_state = {**s.backend.full_state_dict(), **{k: v.float() for k, v in saved.items()}}
    if s.rt.is_main:
        log.info("resumed from %s (epoch %d, step %d)", ckpt.path, s.state.epoch + 1, s.state.step)


def train_epoch(s: Stage, epoch: int, preempt) -> None:
    """This rank's shard of one epoch, an optimizer step every grad_accum micro-batches;
    a checkpoint every train.save_every steps, and one (then Preempted) on SIGTERM."""
    t, state = s.cfg.train, s.state
    state.epoch = epoch
    s.loaders.start_epoch(epoch, state.batches_done)
    s.model.train()
    s.meters.start_epoch()
    group_loss = 0.0
    micro_steps = len(s.loaders.train)
    bar = tqdm(s.loaders.train, desc=f"epoch {epoch + 1}/{s.epochs}", leave=False, initial=state.batches_done,
               total=micro_steps, disable=not s.rt.is_main or not sys.stderr.isatty())
    for i, batch in enumerate(bar, start=state.batches_done):
        group_start = (i // t.grad_accum) * t.grad_accum
        group_len = min(t.grad_accum, micro_steps - group_start)  # the last group may be short
        last_micro = i - group_start == group_len - 1
        group_loss = group_loss + forward_backward(s, batch, group_len, last_micro) / group_len
        if not last_micro:
            continue
        stop = optimizer_step(s, group_loss, epoch + (i + 1) / micro_steps, preempt, bar)
        state.batches_done = i + 1
        group_loss = 0.0
        if stop or (t.save_every and state.step % t.save_every == 0 and i + 1 < micro_steps):
            s.meters.pause()  # the save is not training time
            path = save_checkpoint(s)
            if stop:
                raise Preempted(f"SIGTERM: checkpoint {path} written at step {state.step}")
            s.meters.resume()
        if state.step >= s.total_steps:
            break
    bar.close()
    if s.sigterm.settle():  # a SIGTERM during the epoch's last step: the ranks agree only now
        s.meters.pause()
        raise Preempted(f"SIGTERM: checkpoint {save_checkpoint(s)} written at step {state.step}")


def forward_backward(s: Stage, batch: dict, group_len: int, last_micro: bool) -> torch.Tensor:
    """One micro-batch: forward under the precision policy, the (KD) loss, backward; returns the loss."""
    idx = batch.pop("idx")
    rows, padded = real_rows(idx), batch["input_ids"].shape[1]  # filler rows (compiled jobs) are not counted
    mask = batch["attention_mask"]
    s.meters.add_batch(rows, int(mask[:rows].sum()), padded)  # host tensors: no sync
    # compiled: one graph whether or not a batch has padding (the mask check is traced, no sync)
    unpadded = s.cfg.train.compile == "off" and bool(mask.all())
    inputs = {k: v.to(s.rt.device, non_blocking=True) for k, v in batch.items()}
    if s.cfg.train.compile == "reduce-overhead":
        torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs may be overwritten now
    # No gradient all-reduce on accumulation micro-steps: only the last one syncs.
    with contextlib.nullcontext() if last_micro else s.backend.no_sync():
        loss = forward_loss(s, inputs, idx, s.backend.module, unpadded)
        s.backend.backward(loss / group_len)
    return loss.detach()


def optimizer_step(s: Stage, group_loss: torch.Tensor, epoch_progress: float, preempt, bar) -> bool:
    """Step (the schedule only when the optimizer really stepped); the loss stays on the device
    until a log boundary, where the ranks' losses and non-finite flags are read in one collective;
    ranks agree on preemption one step after a SIGTERM without waiting for the device. True = stop now."""
    t, state = s.cfg.train, s.state
    result = s.backend.step()
    state.step += 1
    s.scheduler.step()  # provisional: a step the backend skipped is taken back when its flag is read
    s.pending.add(group_loss, result.stepped)
    stop = s.sigterm.poll(preempt.is_set())
    if state.step % t.log_every == 0 or state.step == s.total_steps:
        take_pending_losses(s)
        s.meters.check_compiles()
        mean_loss, n = state.loss_window
        state.last_loss = mean_loss / n if n else math.nan
        figures = {names.TRAIN_LOSS: state.last_loss, names.TRAIN_LR: s.scheduler.get_last_lr()[0],
                   names.TRAIN_GRAD_NORM: float(result.grad_norm), names.TRAIN_EPOCH: epoch_progress,
                   **amp_figures(s)}
        s.tracker.log_metrics(figures, state.step)
        bar.set_postfix(loss=f"{state.last_loss:.4f}")
        state.loss_window = [0.0, 0]
    return stop


def take_pending_losses(s: Stage) -> None:
    """Collective: the steps' losses since the last read into the loss window (the finite steps'
    losses summed over ranks), the non-finite count and the skipped steps, which the LR schedule
    gives back (it advanced provisionally on each: between a skipped step and this read it runs
    ahead by the steps skipped, at most log_every); a streak of train.max_nonfinite steps on
    which any rank's loss was non-finite stops the job, naming the step the streak reached it."""
    state, first = s.state, s.state.step - len(s.pending) + 1
    pending = s.pending.take()
    skipped = sum(skip for _, _, skip in pending)
    state.skipped += skipped
    give_back(s.scheduler, skipped)
    for k, (nonfinite, total, _) in enumerate(pending):
        if not nonfinite:
            state.loss_window = [state.loss_window[0] + total, state.loss_window[1] + s.rt.world_size]
            state.nonfinite_streak = 0
            continue
        state.nonfinite += 1
        state.nonfinite_streak += 1
        if state.nonfinite_streak >= s.cfg.train.max_nonfinite:
            last = checkpoint.latest(s.out)
            raise Diverged(f"{state.nonfinite_streak} consecutive non-finite losses at step {first + k}; "
                           f"last good checkpoint: {last.path if last else 'none'}")


def end_epoch(s: Stage, epoch: int) -> bool:
    """Epoch figures, dev evaluation, the best model so far, a checkpoint; True = training is over."""
    t, state, rt = s.cfg.train, s.state, s.rt
    figures = s.meters.end_epoch(state)  # reduced over ranks
    take_pending_losses(s)  # the epoch's non-finite count is complete
    scores = evaluate(s.backend.module, s.loaders.dev, s.task, s.policy, rt, s.examples["dev"], s.features["dev"])
    figures.update({**amp_figures(s, scale=False), **{names.eval_metric(k): v for k, v in scores.items()}})
    s.tracker.log_metrics(figures, state.step)
    if rt.is_main:
        log.info("epoch %d/%d  step %d  loss %.4f  dev %s %.4f  %.1f samples/s  %.1fs", epoch + 1, s.epochs,
                 state.step, state.last_loss, s.task.main_metric, scores["main"], figures[names.SAMPLES_PER_S],
                 figures[names.EPOCH_TIME])

    # keep the best model; stop when the main metric stops improving
    if scores["main"] > state.best_main:
        state.best_main, state.bad_evals, state.time_to_best = scores["main"], 0, state.train_seconds
        state.best_figures = {names.eval_metric(k): v for k, v in scores.items()}
        s.best_state = s.backend.full_state_dict()  # collective under ZeRO-3 (gathers the shards)
        if rt.is_main:
            with atomic_dir(s.out / "best", replace=True) as tmp:  # fp32, whatever dtype the module trains in
                models.save_pretrained_fp32(s.backend.module, s.best_state, s.tokenizer, tmp)
    else:
        state.bad_evals += 1
    done = state.step >= s.total_steps or epoch + 1 == s.epochs
    early = bool(t.patience and state.bad_evals >= t.patience)
    state.epoch, state.batches_done = epoch + 1, 0
    if not done and not early:
        save_checkpoint(s)
    if early and rt.is_main:
        log.info("early stop: no better dev %s for %d evaluations", s.task.main_metric, state.bad_evals)
    return done or early


def finish(s: Stage) -> dict:
    """Test with the best weights; the final figures to MLflow, metrics.json and report.txt."""
    state, rt = s.state, s.rt
    if s.best_state is not None:  # None only if every evaluation scored NaN
        s.backend.load_full_state_dict(s.best_state)
    test_scores = evaluate(s.backend.module, s.loaders.test, s.task, s.policy, rt, s.examples["test"],
                           s.features["test"], keep=True)
    final = {
        **state.best_figures,
        **{names.test_metric(k): v for k, v in test_scores.items() if k != "_predictions"},
        names.TRAIN_LOSS: state.last_loss, names.TRAIN_STEPS: state.step,
        **s.meters.final_figures(state), **amp_figures(s),
    }
    final = {k: v for k, v in final.items() if v is not None}
    s.tracker.log_metrics({k: v for k, v in final.items() if not k.startswith(names.EVAL)}, state.step)
    if rt.is_main:
        write_json(s.out / "metrics.json", final)
        report = s.task.report(test_scores["_predictions"], s.examples["test"], s.features["test"])
        write_text(s.out / "report.txt", report)
        for name in ("metrics.json", "report.txt"):
            s.tracker.log_artifact(s.out / name)
        if s.cfg.tracking.log_model:
            s.tracker.log_artifact(s.out / "best", "best")
        log.info("test %s %.4f  |  %.1f samples/s over %.1fs of training  |  outputs in %s", s.task.main_metric,
                 test_scores["main"], final[names.SAMPLES_PER_S], state.train_seconds, s.out)
    return final


def amp_figures(s: Stage, scale: bool = True) -> dict:
    """AMP health: skipped steps, non-finite losses and (fp16) the current loss scale."""
    figures = {names.SKIPPED_STEPS: s.state.skipped, names.NONFINITE_LOSSES: s.state.nonfinite}
    if scale and s.backend.loss_scale is not None:
        figures[names.LOSS_SCALE] = s.backend.loss_scale
    return figures


def save_checkpoint(s: Stage) -> Path:
    """Collective: scheduler, loop state, the backend's state and every rank's RNG."""
    take_pending_losses(s)  # the window holds every rank's losses since the last log
    loop = dataclasses.asdict(s.state)
    bundle = {"scheduler": s.scheduler.state_dict(), "loop": loop}
    return checkpoint.save(s.out, s.state.step, bundle, s.rt.rank, keep=s.cfg.train.keep_checkpoints,
                           write_backend=s.backend.save)
