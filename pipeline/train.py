"""The training loop: one stage, in any launch mode and precision, readable top to bottom.

run() does everything that can be the user's fault first (config, device, data, model), so a
bad input fails before any MLflow run or output exists; then fit() trains, evaluates each
epoch, keeps the best model, and reports. The Backend hides single/DDP/DeepSpeed.
"""
from __future__ import annotations

import contextlib
import logging
import math
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
import yaml
from torch.utils.data import DataLoader, DistributedSampler, Subset
from tqdm.auto import tqdm

from pipeline import models, telemetry
from pipeline.config import Config, flatten
from pipeline.fsutil import atomic_dir, write_json
from pipeline.runtime import dist, precision
from pipeline.runtime.backend import make_backend
from pipeline.tasks import get_task
from pipeline.tasks.base import SPLITS
from pipeline.tracking import Tracker, resolve_uri

log = logging.getLogger("pipeline")


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
        model_spec = cfg.model or task.default_model
        tokenizer, model = models.build(model_spec, task, task.texts(examples["train"]), cfg.model_config,
                                        cfg.train.max_length)

        out = Path(cfg.output_dir)
        tracker = Tracker(out, active=rt.is_main)
        if rt.is_main:
            (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True))
        tags = {
            "task": cfg.task, "model": model_spec, "precision": policy.name, "precision_requested": cfg.precision,
            "backend": rt.backend, "launcher": rt.launcher, "world_size": rt.world_size,
            "num_nodes": rt.num_nodes, "stage": stage, "procedure": stage, "device": telemetry.device_name(rt.device),
            "device_type": rt.device.type, "seed": cfg.seed, "study": "",
            "energy_available": "false",  # no energy counter is read yet: never a made-up zero
            **telemetry.environment_tags(), **cfg.tracking.tags,
        }
        run_name = cfg.tracking.run_name or f"{cfg.task}-{model_spec.split('/')[-1]}-{policy.name}"
        tracker.start(uri, cfg.tracking.experiment, run_name, tags, flatten(cfg.to_dict()))
        tracker.log_artifact(out / "config.yaml")
        try:
            figures = fit(cfg, rt, policy, task, examples, tokenizer, model, tracker, out)
        except BaseException as e:
            tracker.end("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise
        tracker.end("FINISHED")
        if rt.is_main and tracker.run_id:
            ui = "python -m pipeline ui" + (f" --uri {uri}" if cfg.tracking.uri else "")
            log.info("MLflow run %s (experiment '%s') in %s\n    open it: %s --experiment %s",
                     tracker.run_id, cfg.tracking.experiment, uri, ui, cfg.tracking.experiment)
        return figures
    finally:
        dist.shutdown()


def fit(cfg: Config, rt, policy, task, examples, tokenizer, model, tracker: Tracker, out: Path) -> dict:
    t = cfg.train
    collate = task.collator(tokenizer)
    features = {split: task.featurize(examples[split], tokenizer, t.max_length, split) for split in SPLITS}

    # Every rank sees a disjoint slice of each epoch's permutation; the seed makes the
    # permutation identical across ranks and equal to a single process's.
    sampler = DistributedSampler(features["train"], num_replicas=rt.world_size, rank=rt.rank,
                                 shuffle=True, seed=cfg.seed)
    train_loader = DataLoader(features["train"], batch_size=t.batch_size, sampler=sampler, collate_fn=collate,
                              num_workers=t.num_workers, pin_memory=rt.device.type == "cuda")
    eval_loaders = {split: DataLoader(Subset(features[split], range(rt.rank, len(features[split]), rt.world_size)),
                                      batch_size=t.eval_batch_size, collate_fn=collate)
                    for split in ("dev", "test")}

    steps_per_epoch = math.ceil(len(train_loader) / t.grad_accum)
    epochs = t.epochs if t.max_steps < 0 else math.ceil(t.max_steps / steps_per_epoch)  # max_steps wins, as in HF
    total_steps = steps_per_epoch * epochs if t.max_steps < 0 else t.max_steps

    model.to(rt.device)  # parameters stay fp32: autocast casts per op (fp32 master weights)
    optimizer = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr)
    scheduler = transformers.get_linear_schedule_with_warmup(
        optimizer, num_warmup_steps=math.ceil(t.warmup_ratio * total_steps), num_training_steps=total_steps)
    backend = make_backend(rt, policy, t.max_grad_norm)
    model = backend.prepare(model, optimizer)

    step = skipped = nonfinite = bad_evals = 0
    best_main, best_state, best_figures, time_to_best = -math.inf, None, {}, None
    run_meter = telemetry.ThroughputMeter(rt.device)
    peak: dict[str, float] = {}
    epoch_times: list[float] = []
    last_loss = math.nan
    torch.manual_seed(cfg.seed + rt.rank)  # dropout differs per rank; data order does not

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        telemetry.reset_peak_memory(rt.device)
        meter = telemetry.ThroughputMeter(rt.device)
        meter.start()
        window_loss, window_n, group_loss = 0.0, 0, 0.0
        micro_steps = len(train_loader)
        bar = tqdm(train_loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False,
                   disable=not rt.is_main or not sys.stderr.isatty())
        for i, batch in enumerate(bar):
            group_start = (i // t.grad_accum) * t.grad_accum
            group_len = min(t.grad_accum, micro_steps - group_start)  # the last group may be short
            last_micro = i - group_start == group_len - 1
            batch.pop("idx")
            meter.add(len(batch["input_ids"]), int(batch["attention_mask"].sum()))  # host tensor: no sync
            inputs = {k: v.to(rt.device, non_blocking=True) for k, v in batch.items()}

            # No gradient all-reduce on accumulation micro-steps: only the last one syncs.
            with contextlib.nullcontext() if last_micro else backend.no_sync():
                with policy.autocast():
                    loss = model(**inputs).loss
                backend.backward(loss / group_len)
            group_loss = group_loss + loss.detach() / group_len
            if not last_micro:
                continue

            result = backend.step()
            step += 1
            if result.stepped:
                scheduler.step()  # a step the loss scaler skipped does not advance the schedule
            else:
                skipped += 1
            loss_value = float(group_loss)  # the device is already synced by step()
            group_loss = 0.0
            if math.isfinite(loss_value):
                window_loss, window_n = window_loss + loss_value, window_n + 1
            else:
                nonfinite += 1
            if step % t.log_every == 0 or step == total_steps:
                mean_loss, n = dist.all_reduce([window_loss, window_n])
                last_loss = mean_loss / n if n else math.nan
                figures = {"train/loss": last_loss, "train/lr": scheduler.get_last_lr()[0],
                           "train/grad_norm": float(result.grad_norm), "train/epoch": epoch + i / micro_steps}
                if backend.loss_scale is not None:
                    figures["amp/loss_scale"] = backend.loss_scale
                tracker.log_metrics(figures, step)
                bar.set_postfix(loss=f"{last_loss:.4f}")
                window_loss, window_n = 0.0, 0
            if step >= total_steps:
                break
        bar.close()
        elapsed = meter.stop()  # training steps only: evaluation and saving come after

        # ---- epoch figures, reduced over ranks (sums of work, the slowest rank's time)
        samples, tokens = dist.all_reduce([meter.samples, meter.tokens])
        (elapsed,) = dist.all_reduce([elapsed], op="max")
        run_meter.samples += samples
        run_meter.tokens += tokens
        run_meter.seconds += elapsed
        epoch_times.append(elapsed)
        mem = telemetry.peak_memory(rt.device)
        mem = dict(zip(mem, dist.all_reduce(list(mem.values()), op="max")))
        peak = {k: max(v, peak.get(k, 0.0)) for k, v in mem.items()}
        scores = evaluate(backend.module, eval_loaders["dev"], task, policy, rt, examples["dev"], features["dev"])
        figures = {"perf/epoch_time_s": elapsed, "perf/train_samples_per_s": samples / elapsed,
                   "perf/train_tokens_per_s": tokens / elapsed, **mem,
                   "amp/skipped_steps": skipped, "amp/nonfinite_losses": nonfinite,
                   **{f"eval/{k}": v for k, v in scores.items()}}
        tracker.log_metrics(figures, step)
        if rt.is_main:
            log.info("epoch %d/%d  step %d  loss %.4f  dev %s %.4f  %.1f samples/s  %.1fs", epoch + 1, epochs,
                     step, last_loss, task.main_metric, scores["main"], samples / elapsed, elapsed)

        # ---- keep the best model; stop when the main metric stops improving
        if scores["main"] > best_main:
            best_main, bad_evals, time_to_best = scores["main"], 0, run_meter.seconds
            best_figures = {f"eval/{k}": v for k, v in scores.items()}
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in backend.module.state_dict().items()}
            if rt.is_main:
                with atomic_dir(out / "best", replace=True) as tmp:
                    backend.module.save_pretrained(tmp, safe_serialization=True)
                    tokenizer.save_pretrained(tmp)
        else:
            bad_evals += 1
        if step >= total_steps or (t.patience and bad_evals >= t.patience):
            if t.patience and bad_evals >= t.patience and rt.is_main:
                log.info("early stop: no better dev %s for %d evaluations", task.main_metric, bad_evals)
            break

    # ---- test with the best weights, then the final figures
    if best_state is not None:  # None only if every evaluation scored NaN
        backend.module.load_state_dict(best_state)
    test_scores = evaluate(backend.module, eval_loaders["test"], task, policy, rt, examples["test"],
                           features["test"], keep=True)
    final = {
        **best_figures,
        **{f"test/{k}": v for k, v in test_scores.items() if k != "_predictions"},
        "train/loss": last_loss, "train/steps": step,
        "perf/train_time_s": run_meter.seconds, "perf/time_to_best_s": time_to_best,
        "perf/epoch_time_s": float(np.mean(epoch_times)),
        "perf/train_samples_per_s": run_meter.samples / run_meter.seconds,
        "perf/train_tokens_per_s": run_meter.tokens / run_meter.seconds,
        **peak, "amp/skipped_steps": skipped, "amp/nonfinite_losses": nonfinite,
    }
    if backend.loss_scale is not None:
        final["amp/loss_scale"] = backend.loss_scale
    tracker.log_metrics({k: v for k, v in final.items() if not k.startswith("eval/")}, step)
    if rt.is_main:
        write_json(out / "metrics.json", final)
        report = task.report(test_scores["_predictions"], examples["test"], features["test"])
        (out / "report.txt").write_text(report, encoding="utf-8")
        for name in ("metrics.json", "report.txt"):
            tracker.log_artifact(out / name)
        if cfg.tracking.log_model:
            tracker.log_artifact(out / "best", "best")
        log.info("test %s %.4f  |  %.1f samples/s over %.1fs of training  |  outputs in %s", task.main_metric,
                 test_scores["main"], final["perf/train_samples_per_s"], run_meter.seconds, out)
    return final


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
    order = np.argsort(np.concatenate([g[0] for g in gathered]), kind="stable")
    keys = next(g[1].keys() for g in gathered if g[1])
    predictions = {k: np.concatenate([g[1][k] for g in gathered if g[1]])[order] for k in keys}
    scores = task.metrics(predictions, examples, features)
    scores["main"] = scores[task.main_metric]
    if any(g[2] for g in gathered):
        scores["loss"] = sum(g[2] for g in gathered) / len(features)
    if keep:
        scores["_predictions"] = predictions
    return scores


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases and LayerNorm weights (the BERT recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
