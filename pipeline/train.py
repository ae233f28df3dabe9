"""The training loop: one stage, in any launch mode and precision, readable top to bottom.

run() does everything that can be the user's fault first (config, device, data, model), so a
bad input fails before any MLflow run or output exists; then fit() trains, evaluates each
epoch, keeps the best model, checkpoints, and reports. The Backend hides single/DDP/DeepSpeed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
import yaml
from torch.utils.data import DataLoader, DistributedSampler, Subset
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from pipeline import checkpoint, models, telemetry
from pipeline.config import Config, flatten
from pipeline.errors import UserError
from pipeline.fsutil import atomic_dir, write_json
from pipeline.runtime import dist, precision
from pipeline.runtime.backend import make_backend
from pipeline.tasks import get_task
from pipeline.tasks.base import SPLITS
from pipeline.tracking import Tracker, redact, redact_config, resolve_uri

log = logging.getLogger("pipeline")


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written at the step boundary (exit code 143)."""


class Diverged(RuntimeError):
    """Too many consecutive non-finite losses (exit code 1; the last checkpoint is kept)."""


@dataclass
class LoopState:
    """Everything about the loop's position and history that a resumed job needs."""

    epoch: int = 0
    batches_done: int = 0  # micro-batches of `epoch` already trained (a multiple of grad_accum)
    step: int = 0
    skipped: int = 0
    nonfinite: int = 0
    nonfinite_streak: int = 0
    bad_evals: int = 0
    best_main: float = -math.inf
    best_figures: dict = field(default_factory=dict)
    time_to_best: float | None = None
    train_seconds: float = 0.0
    samples: float = 0.0
    tokens: float = 0.0
    joules: float = 0.0
    epoch_times: list = field(default_factory=list)
    peak: dict = field(default_factory=dict)
    last_loss: float = math.nan
    run_id: str | None = None


def run(cfg: Config, stage: str = "train") -> dict[str, float]:
    """Run one stage; returns the final figures (also in output_dir/metrics.json)."""
    rt = dist.init(cfg.backend)
    try:
        # Everything that can be the user's fault, before a run or an output exists.
        policy = precision.resolve(cfg.precision, rt.device)
        task = get_task(cfg.task, cfg.task_options)
        examples = {split: task.load(getattr(cfg.data, split), split) for split in SPLITS}
        uri = resolve_uri(cfg.tracking.uri)
        transformers.set_seed(cfg.seed)  # identical initial weights on every rank
        distiller = None
        if stage == "distill":
            model_spec, tokenizer, model, distiller = build_distillation(cfg, task, policy, rt, examples)
        else:
            model_spec = cfg.model or task.default_model
            tokenizer, model = models.build(model_spec, task, task.texts(examples["train"]), cfg.model_config,
                                            cfg.train.max_length)
        if cfg.train.lr is None:  # random-init presets need a larger step than fine-tuning does
            cfg.train.lr = 3e-4 if model_spec.startswith("preset:") else 5e-5
        backend = make_backend(rt, policy, cfg)  # resolves and checks a DeepSpeed config, if any
        features = {split: task.featurize(examples[split], tokenizer, cfg.train.max_length, split) for split in SPLITS}

        out = Path(cfg.output_dir)
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # elastic restart
        ckpt = checkpoint.latest(out) if cfg.resume == "auto" or restarted else None
        resume_state = ckpt.load_state() if ckpt else None
        energy = telemetry.EnergyMeter(rt.device)
        (energy_ok,) = dist.all_reduce([float(energy.available)], op="max")  # any rank that measures

        tracker = Tracker(out, active=rt.is_main, resume=ckpt is not None)
        resolved = redact_config({**cfg.to_dict(), "tracking": {**cfg.to_dict()["tracking"], "uri": uri}})
        if rt.is_main:
            (out / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True))  # no secrets
        tags = {
            "task": cfg.task, "model": model_spec, "precision": policy.name, "precision_requested": cfg.precision,
            "backend": rt.backend, "launcher": rt.launcher, "world_size": rt.world_size,
            "num_nodes": rt.num_nodes, "stage": stage, "procedure": stage, "device": telemetry.device_name(rt.device),
            "device_type": rt.device.type, "seed": cfg.seed, "study": "",
            "energy_available": "true" if energy_ok else "false",
            **telemetry.environment_tags(), **cfg.tracking.tags,
        }
        if cfg.tracking.parent_run_id:
            tags["mlflow.parentRunId"] = cfg.tracking.parent_run_id
        run_name = cfg.tracking.run_name or f"{cfg.task}-{model_spec.split('/')[-1]}-{policy.name}"
        resume_run = resume_state["loop"]["run_id"] if resume_state else None
        tracker.start(uri, cfg.tracking.experiment, run_name, tags, flatten(resolved),
                      resume_run_id=resume_run)
        tracker.log_artifact(out / "config.yaml")
        run_id = dist.broadcast_object(tracker.run_id)
        if cfg.tracking.system_metrics and rt.local_rank == 0:
            tracker.start_system_metrics(run_id, uri, f"node{rt.rank // max(1, rt.world_size // rt.num_nodes)}-"
                                         f"{socket.gethostname()}", cfg.tracking.system_metrics_interval)
        try:
            with _sigterm_flag() as preempt:
                figures = fit(cfg, rt, policy, task, examples, features, tokenizer, model, backend, tracker, out,
                              energy, preempt, ckpt, resume_state, run_id, distiller)
        except BaseException as e:
            tracker.end("KILLED" if isinstance(e, (KeyboardInterrupt, Preempted)) else "FAILED")
            raise
        tracker.end("FINISHED")
        if rt.is_main and run_id:
            ui = "python -m pipeline ui" + (f" --uri {redact(uri)}" if cfg.tracking.uri else "")
            log.info("MLflow run %s (experiment '%s') in %s\n    open it: %s --experiment %s",
                     run_id, cfg.tracking.experiment, redact(uri), ui, cfg.tracking.experiment)
        return figures
    finally:
        dist.shutdown()


def build_distillation(cfg: Config, task, policy, rt, examples):
    """Teacher, student and Distiller for a `distill` stage (all checks before any run exists)."""
    from pipeline import distill

    if not cfg.kd.teacher:
        raise UserError("config: kd.teacher: required by distill (a train stage's output_dir, hub id or local model)")
    teacher_tokenizer, teacher = distill.load_teacher(cfg.kd.teacher, task, cfg.model_config)
    spec = cfg.model or f"from_teacher:{max(1, teacher.config.num_hidden_layers // 2)}"
    if spec.startswith("from_teacher:"):
        try:
            n_layers = int(spec.split(":", 1)[1])
        except ValueError:
            raise UserError(f"config: model={spec}: expected from_teacher:N with N a number of layers") from None
        student, _ = distill.student_from_teacher(n_layers, teacher, task)
        tokenizer = teacher_tokenizer
    else:
        tokenizer, student = models.build(spec, task, task.texts(examples["train"]), cfg.model_config,
                                          cfg.train.max_length)
    distiller = distill.Distiller(cfg, task, policy, rt, teacher, teacher_tokenizer, tokenizer)
    if cfg.kd.hidden_weight and distill.attach_projection(student, teacher) and rt.is_main:
        log.info("hidden-state term: a learned projection %d -> %d", student.config.hidden_size,
                 teacher.config.hidden_size)
    return spec, tokenizer, student, distiller


def fit(cfg: Config, rt, policy, task, examples, features, tokenizer, model, backend, tracker: Tracker, out: Path,
        energy, preempt, ckpt, resume_state, run_id, distiller=None) -> dict:
    t = cfg.train
    collate = task.collator(tokenizer)

    # Every rank sees a disjoint slice of each epoch's permutation; the seed makes the
    # permutation identical across ranks and equal to a single process's. Loaders get their
    # own generators so that creating an iterator never draws from the global RNG (which
    # drives dropout and must continue exactly after a resume).
    lengths = [len(ids) for ids in features["train"]["input_ids"]] if t.group_by_length else None
    sampler = ResumableSampler(features["train"], num_replicas=rt.world_size, rank=rt.rank, shuffle=True,
                               seed=cfg.seed, lengths=lengths, batch_size=t.batch_size)
    train_loader = DataLoader(features["train"], batch_size=t.batch_size, sampler=sampler, collate_fn=collate,
                              num_workers=t.num_workers, pin_memory=rt.device.type == "cuda",
                              generator=torch.Generator().manual_seed(cfg.seed))
    eval_loaders = {split: DataLoader(Subset(features[split], eval_shard(len(features[split]), rt)),
                                      batch_size=t.eval_batch_size, collate_fn=collate,
                                      generator=torch.Generator().manual_seed(cfg.seed))
                    for split in ("dev", "test")}

    steps_per_epoch = math.ceil(len(train_loader) / t.grad_accum)
    epochs = t.epochs if t.max_steps < 0 else math.ceil(t.max_steps / steps_per_epoch)  # max_steps wins, as in HF
    total_steps = steps_per_epoch * epochs if t.max_steps < 0 else t.max_steps

    model.to(rt.device)  # parameters stay fp32: autocast casts per op (fp32 master weights)
    # the fused kernel (CPU and CUDA) is one pass over all parameters, as the HF Trainer's default;
    # DeepSpeed wraps the optimizer in its own partitioned one, where the default is the safe choice
    optimizer = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, fused=rt.backend != "deepspeed")
    scheduler = transformers.get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=math.ceil(t.warmup_ratio * total_steps), num_training_steps=total_steps)
    model = backend.prepare(model, optimizer)
    forward_kwargs = distiller.forward_kwargs if distiller is not None else {}
    if distiller is not None:  # the teacher's logits for the whole training set, once (cached on disk)
        distiller.prepare(features["train"], collate, t.max_length, tokenizer)
        tracker.set_tags({"kd_cache": {True: "hit", False: "miss", None: "off"}[distiller.cache_hit]})
    for name, content in backend.extra_artifacts.items():  # e.g. the resolved DeepSpeed config
        if rt.is_main:
            write_json(out / name, content)
            tracker.log_artifact(out / name)

    state = LoopState(run_id=run_id)
    best_state = None
    if resume_state is not None:
        backend.load(ckpt.path)
        scheduler.load_state_dict(resume_state["scheduler"])
        state = LoopState(**{**resume_state["loop"], "run_id": run_id})
        ckpt.restore_rng(rt.rank)
        if (out / "best" / "model.safetensors").is_file():
            from safetensors.torch import load_file

            saved = load_file(out / "best" / "model.safetensors")  # without the kd_projection, if any
            best_state = {**backend.full_state_dict(), **{k: v.float() for k, v in saved.items()}}
        if rt.is_main:
            log.info("resumed from %s (epoch %d, step %d)", ckpt.path, state.epoch + 1, state.step)
    else:
        torch.manual_seed(cfg.seed + rt.rank)  # dropout differs per rank; data order does not
    device_name = telemetry.device_name(rt.device)
    peak_tflops = telemetry.peak_tflops(device_name, policy.name) if rt.device.type == "cuda" else None
    flops_per_sample = None

    def save_checkpoint():
        bundle = {"scheduler": scheduler.state_dict(), "loop": dataclasses.asdict(state)}
        return checkpoint.save(out, state.step, bundle, rt.rank, keep=t.keep_checkpoints, write_backend=backend.save)

    for epoch in range(state.epoch, epochs):
        state.epoch = epoch
        sampler.set_epoch(epoch)
        sampler.skip = state.batches_done * t.batch_size
        model.train()
        telemetry.reset_peak_memory(rt.device)
        meter = telemetry.ThroughputMeter(rt.device)
        meter.start()
        energy.start()
        window_loss, window_n, group_loss = 0.0, 0, 0.0
        micro_steps = len(train_loader)
        bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False, initial=state.batches_done,
                   total=micro_steps, disable=not rt.is_main or not sys.stderr.isatty())
        for i, batch in enumerate(bar, start=state.batches_done):
            group_start = (i // t.grad_accum) * t.grad_accum
            group_len = min(t.grad_accum, micro_steps - group_start)  # the last group may be short
            last_micro = i - group_start == group_len - 1
            idx = batch.pop("idx")
            n_samples = len(batch["input_ids"])
            meter.add(n_samples, int(batch["attention_mask"].sum()))  # host tensor: no sync
            inputs = {k: v.to(rt.device, non_blocking=True) for k, v in batch.items()}

            # FLOPs are counted once, on the first micro-batch (forward + backward).
            counter = FlopCounterMode(display=False) if flops_per_sample is None else contextlib.nullcontext()
            # No gradient all-reduce on accumulation micro-steps: only the last one syncs.
            with counter, contextlib.nullcontext() if last_micro else backend.no_sync():
                with policy.autocast():
                    outputs = model(**inputs, **forward_kwargs)
                loss = outputs.loss if distiller is None else distiller.loss(outputs, inputs, idx, backend.module)
                backend.backward(loss / group_len)
            if flops_per_sample is None:
                flops_per_sample = counter.get_total_flops() / n_samples
            group_loss = group_loss + loss.detach() / group_len
            if not last_micro:
                continue

            result = backend.step()
            state.step += 1
            state.batches_done = i + 1
            if result.stepped:
                scheduler.step()  # a step the loss scaler skipped does not advance the schedule
            else:
                state.skipped += 1
            loss_value = float(group_loss)  # the device is already synced by step()
            group_loss = 0.0
            # one small collective agrees on preemption and non-finite losses on every rank
            stop, any_nonfinite = dist.all_reduce([float(preempt.is_set()), float(not math.isfinite(loss_value))],
                                                  op="max")
            if any_nonfinite:
                state.nonfinite += 1
                state.nonfinite_streak += 1
                if state.nonfinite_streak >= t.max_nonfinite:
                    last = checkpoint.latest(out)
                    raise Diverged(f"{state.nonfinite_streak} consecutive non-finite losses at step {state.step}; "
                                   f"last good checkpoint: {last.path if last else 'none'}")
            else:
                window_loss, window_n = window_loss + loss_value, window_n + 1
                state.nonfinite_streak = 0
            if state.step % t.log_every == 0 or state.step == total_steps:
                mean_loss, n = dist.all_reduce([window_loss, window_n])
                state.last_loss = mean_loss / n if n else math.nan
                figures = {"train/loss": state.last_loss, "train/lr": scheduler.get_last_lr()[0],
                           "train/grad_norm": float(result.grad_norm), "train/epoch": epoch + (i + 1) / micro_steps,
                           "amp/skipped_steps": state.skipped, "amp/nonfinite_losses": state.nonfinite}
                if backend.loss_scale is not None:
                    figures["amp/loss_scale"] = backend.loss_scale
                tracker.log_metrics(figures, state.step)
                bar.set_postfix(loss=f"{state.last_loss:.4f}")
                window_loss, window_n = 0.0, 0
            if stop or (t.save_every and state.step % t.save_every == 0 and i + 1 < micro_steps):
                meter.stop()  # the save is not training time
                path = save_checkpoint()
                if stop:
                    raise Preempted(f"SIGTERM: checkpoint {path} written at step {state.step}")
                meter.start()
            if state.step >= total_steps:
                break
        bar.close()
        elapsed = meter.stop()  # training steps only: evaluation and saving come after
        joules_here = energy.stop()

        # ---- epoch figures, reduced over ranks (sums of work, the slowest rank's time)
        samples, tokens = dist.all_reduce([meter.samples, meter.tokens])
        (elapsed,) = dist.all_reduce([elapsed], op="max")
        state.samples += samples
        state.tokens += tokens
        state.train_seconds += elapsed
        state.epoch_times.append(elapsed)
        mem = telemetry.peak_memory(rt.device)
        mem = dict(zip(mem, dist.all_reduce(list(mem.values()), op="max")))
        state.peak = {k: max(v, state.peak.get(k, 0.0)) for k, v in mem.items()}
        scores = evaluate(backend.module, eval_loaders["dev"], task, policy, rt, examples["dev"], features["dev"])
        figures = {"perf/epoch_time_s": elapsed, "perf/train_samples_per_s": samples / elapsed,
                   "perf/train_tokens_per_s": tokens / elapsed, **mem,
                   "amp/skipped_steps": state.skipped, "amp/nonfinite_losses": state.nonfinite,
                   **{f"eval/{k}": v for k, v in scores.items()}}
        figures.update(compute_figures(flops_per_sample, samples, elapsed, peak_tflops, rt.world_size))
        figures.update(energy_figures(energy, joules_here, samples, elapsed))
        state.joules += figures.get("energy/joules", 0.0)
        tracker.log_metrics(figures, state.step)
        if rt.is_main:
            log.info("epoch %d/%d  step %d  loss %.4f  dev %s %.4f  %.1f samples/s  %.1fs", epoch + 1, epochs,
                     state.step, state.last_loss, task.main_metric, scores["main"], samples / elapsed, elapsed)

        # ---- keep the best model; stop when the main metric stops improving
        if scores["main"] > state.best_main:
            state.best_main, state.bad_evals, state.time_to_best = scores["main"], 0, state.train_seconds
            state.best_figures = {f"eval/{k}": v for k, v in scores.items()}
            best_state = backend.full_state_dict()  # collective under ZeRO-3 (gathers the shards)
            if rt.is_main:
                with atomic_dir(out / "best", replace=True) as tmp:
                    backend.module.save_pretrained(tmp, state_dict=dict(best_state), safe_serialization=True)  # it consumes the dict
                    tokenizer.save_pretrained(tmp)
        else:
            state.bad_evals += 1
        done = state.step >= total_steps or epoch + 1 == epochs
        early = bool(t.patience and state.bad_evals >= t.patience)
        state.epoch, state.batches_done = epoch + 1, 0
        if not done and not early:
            save_checkpoint()
        if early and rt.is_main:
            log.info("early stop: no better dev %s for %d evaluations", task.main_metric, state.bad_evals)
        if done or early:
            break

    # ---- test with the best weights, then the final figures
    if best_state is not None:  # None only if every evaluation scored NaN
        backend.load_full_state_dict(best_state)
    test_scores = evaluate(backend.module, eval_loaders["test"], task, policy, rt, examples["test"],
                           features["test"], keep=True)
    final = {
        **state.best_figures,
        **{f"test/{k}": v for k, v in test_scores.items() if k != "_predictions"},
        "train/loss": state.last_loss, "train/steps": state.step,
        "perf/train_time_s": state.train_seconds, "perf/time_to_best_s": state.time_to_best,
        "perf/epoch_time_s": float(np.mean(state.epoch_times)),
        "perf/train_samples_per_s": state.samples / state.train_seconds,
        "perf/train_tokens_per_s": state.tokens / state.train_seconds,
        **state.peak, "amp/skipped_steps": state.skipped, "amp/nonfinite_losses": state.nonfinite,
        **compute_figures(flops_per_sample, state.samples, state.train_seconds, peak_tflops, rt.world_size),
    }
    if state.joules:
        final.update({"energy/joules": state.joules, "energy/avg_power_w": state.joules / state.train_seconds,
                      "energy/joules_per_sample": state.joules / state.samples})
    if backend.loss_scale is not None:
        final["amp/loss_scale"] = backend.loss_scale
    final = {k: v for k, v in final.items() if v is not None}
    tracker.log_metrics({k: v for k, v in final.items() if not k.startswith("eval/")}, state.step)
    if rt.is_main:
        write_json(out / "metrics.json", final)
        report = task.report(test_scores["_predictions"], examples["test"], features["test"])
        (out / "report.txt").write_text(report, encoding="utf-8")
        for name in ("metrics.json", "report.txt"):
            tracker.log_artifact(out / name)
        if cfg.tracking.log_model:
            tracker.log_artifact(out / "best", "best")
        log.info("test %s %.4f  |  %.1f samples/s over %.1fs of training  |  outputs in %s", task.main_metric,
                 test_scores["main"], final["perf/train_samples_per_s"], state.train_seconds, out)
    return final


def compute_figures(flops_per_sample, samples, seconds, peak_tflops, world_size) -> dict:
    """Achieved TFLOP/s of the job and, on a GPU in the peak table, MFU."""
    if not flops_per_sample or not seconds:
        return {}
    (flops_per_sample,) = dist.all_reduce([flops_per_sample], op="max")
    tflops = flops_per_sample * samples / seconds / 1e12
    figures = {"perf/flops_per_sample": flops_per_sample, "perf/tflops": tflops}
    if peak_tflops:
        figures["perf/mfu"] = tflops / (peak_tflops * world_size)
    return figures


def energy_figures(energy, joules_here, samples, seconds) -> dict:
    """Energy of the epoch summed over the job's GPUs (each counted once, by UUID)."""
    readings = dist.all_gather_objects((energy.uuid, joules_here, energy.mean_utilization)
                                       if energy.available else None)
    per_gpu = {r[0]: r for r in readings if r is not None}
    if not per_gpu:
        return {}
    joules = sum(r[1] for r in per_gpu.values())
    figures = {"energy/joules": joules, "energy/avg_power_w": joules / seconds,
               "energy/joules_per_sample": joules / samples}
    utils = [r[2] for r in per_gpu.values() if r[2] is not None]
    if utils:
        figures["energy/gpu_util_pct"] = float(np.mean(utils))
    return figures


@torch.inference_mode()
def evaluate(module, loader, task, policy, rt, examples, features, keep: bool = False) -> dict:
    """Task metrics on a split: each rank predicts its shard, predictions are gathered by idx."""
    module.eval()
    indices, parts, loss_sum = [], [], 0.0
    for batch in loader:
        indices.append(batch.pop("idx").numpy())
        inputs = {k: v.to(rt.device, non_blocking=True) for k, v in batch.items()}
        with policy.autocast():
            outputs = module(**inputs)
        if outputs.get("loss") is not None:  # heads without targets in eval (QA windows) have none
            loss_sum += float(outputs.loss) * len(indices[-1])
        parts.append(task.predictions(outputs, batch))
    local = (np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64),
             {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}, loss_sum)
    gathered = dist.all_gather_objects(local)
    # rows ordered by idx; a row two ranks both predicted (shard padding) is kept once
    _, first = np.unique(np.concatenate([g[0] for g in gathered]), return_index=True)
    keys = next(g[1].keys() for g in gathered if g[1])
    predictions = {k: np.concatenate([g[1][k] for g in gathered if g[1]])[first] for k in keys}
    scores = task.metrics(predictions, examples, features)
    scores["main"] = scores[task.main_metric]
    if any(g[2] for g in gathered):
        scores["loss"] = sum(g[2] for g in gathered) / sum(len(g[0]) for g in gathered)
    if keep:
        scores["_predictions"] = predictions
    return scores


def eval_shard(n: int, rt) -> list[int]:
    """This rank's rows of an eval split: every rank gets the same number of rows (ZeRO-3 runs
    its forward passes in lockstep), the last ranks wrap around to rows already covered."""
    per_rank = math.ceil(n / rt.world_size)
    return [(rt.rank + rt.world_size * j) % n for j in range(per_rank)]


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way (after a resume) and, given the
    sequence lengths, groups similar lengths into the same global batch."""

    skip = 0

    def __init__(self, dataset, *, lengths: list[int] | None = None, batch_size: int = 1, **kwargs):
        super().__init__(dataset, **kwargs)
        self.lengths, self.batch_size = lengths, batch_size

    def __iter__(self):
        if self.lengths is None:
            indices = list(super().__iter__())
        else:
            # Trainer's grouping over global batches; rank r takes every world_size-th index, as
            # DistributedSampler does, so each rank's micro-batch holds similar lengths too.
            # (Imported here: it pulls in the Trainer's helpers, which no other run needs.)
            from transformers.trainer_pt_utils import get_length_grouped_indices

            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = get_length_grouped_indices(self.lengths, self.batch_size * self.num_replicas,
                                               generator=generator)
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
            indices = order[self.rank:self.total_size:self.num_replicas]
        return iter(indices[self.skip:])  # len() stays the whole epoch: the loop counts positions in it


@contextlib.contextmanager
def _sigterm_flag():
    """SIGTERM (Slurm time limit, spot preemption) sets a flag the loop checks at step boundaries."""
    import threading

    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases and LayerNorm weights (the BERT recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
