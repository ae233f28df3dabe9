"""The Hugging Face Trainer as a contender: built one way for every benchmark that compares the
pipeline against it (bench_overhead.py, bench_vs_trainer.py, bench_step_vs_trainer.py,
studies/bench_wikiqa_vs_trainer.py).

The caller brings the model and features (common.build_model: the pipeline's model factory, the
same seed); `run` trains them with DataCollatorWithPadding, nothing saved or logged, evaluated after
each epoch when given an eval set, on the GPU where there is one, and counts the time as the
pipeline counts it: training steps only, the evaluations subtracted (TrainClock) and the time
Dynamo spent compiling left out. TrainingArguments not set here are the caller's (`recipe(...)`:
the pipeline's recipe) or the Trainer's own defaults.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

import torch
import transformers

from common import WORK


def recipe(batch_size: int, lr: float, warmup: float = 0.1, weight_decay: float = 0.01) -> dict:
    """TrainingArguments for the pipeline's recipe: batch, lr, linear warm-up (a ratio) then linear
    decay, AdamW's weight decay (not on biases and LayerNorm weights, on both sides), clipping at 1.0."""
    return {"per_device_train_batch_size": batch_size, "learning_rate": lr, "warmup_steps": warmup,
            "weight_decay": weight_decay, "max_grad_norm": 1.0, "lr_scheduler_type": "linear"}


class TrainClock(transformers.TrainerCallback):
    """Training time only, as the pipeline counts it: evaluations are subtracted."""

    def __init__(self):
        self.start = self.eval_start = self.eval_seconds = 0.0
        self.elapsed = None

    def on_train_begin(self, *_, **__):
        self.start = time.perf_counter()

    def on_epoch_end(self, *_, **__):
        self.eval_start = time.perf_counter()

    def on_evaluate(self, *_, **__):
        self.eval_seconds += time.perf_counter() - self.eval_start

    def on_train_end(self, *_, **__):
        self.elapsed = time.perf_counter() - self.start - self.eval_seconds


@dataclass
class TrainerRun:
    trainer: transformers.Trainer
    seconds: float
    """Training time: evaluations and compilation left out."""
    compile_s: float
    """Dynamo's compile time during train() (evaluation's compilations included: a bound)."""
    samples_per_s: float
    """Training samples over `seconds`: whole epochs' rows, or steps x batch under max_steps."""

    def selected(self, order: tuple[str, ...]) -> dict[str, float]:
        """The dev metrics (as compute_metrics names them, and `loss`) of the epoch the pipeline's
        model selection would keep among the Trainer's evaluations (parts/best_model.beats: `order`
        is the task's main metric and tie-breakers), so both sides report the same epoch's figures."""
        from pipeline.job.parts.best_model import beats

        best = None
        for logged in self.trainer.state.log_history:
            scores = {k[len("eval_"):]: v for k, v in logged.items() if k.startswith("eval_")}
            if order[0] in scores and beats(scores, best, order) is not None:
                best = scores
        return best or {}


def run(model, tokenizer, train_set, *, precision: str, seed: int, epochs: int | None = None,
        max_steps: int | None = None, eval_set=None, compute_metrics=None, group_by_length: bool = False,
        **arguments) -> TrainerRun:
    """Train `model` on `train_set` (features; the pipeline's `idx` column is dropped) with the
    Trainer for `epochs` or `max_steps`; `eval_set` and `compute_metrics` evaluate after each epoch.
    group_by_length: the Trainer's length-grouped sampling (a `length` column, so it measures no row
    itself). `arguments`: further TrainingArguments, or others than these defaults (recipe(...),
    torch_compile=True, logging_steps=1, ...)."""
    from pipeline.runtime import compiler

    if (epochs is None) == (max_steps is None):
        raise ValueError("trainer_contender.run: epochs or max_steps, one of them")

    def without_idx(features):
        return features.remove_columns("idx") if "idx" in features.column_names else features

    train_set = without_idx(train_set)
    if group_by_length:
        train_set = train_set.add_column("length", [len(ids) for ids in train_set["input_ids"]])
        arguments["train_sampling_strategy"] = "group_by_length"
    if eval_set is not None:
        eval_set = without_idx(eval_set)
    training = transformers.TrainingArguments(**{
        "output_dir": tempfile.mkdtemp(dir=WORK), "bf16": precision == "bf16", "use_cpu": not torch.cuda.is_available(),
        "seed": seed, "data_seed": seed, "num_train_epochs": epochs or 1, "max_steps": -1 if epochs else max_steps,
        "eval_strategy": "epoch" if eval_set is not None else "no", "save_strategy": "no", "logging_strategy": "no",
        "report_to": [], "disable_tqdm": True, **arguments})
    clock = TrainClock()
    trainer = transformers.Trainer(model=model, args=training, train_dataset=train_set, eval_dataset=eval_set,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer),
                                   compute_metrics=compute_metrics, callbacks=[clock])
    compiling = compiler.compile_seconds()
    trainer.train()
    compiling = compiler.compile_seconds() - compiling
    seconds = clock.elapsed - compiling
    samples = len(train_set) * epochs if epochs else \
        trainer.state.global_step * training.per_device_train_batch_size  # the last batch may be short
    return TrainerRun(trainer, seconds, compiling, samples / seconds)
