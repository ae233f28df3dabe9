"""Hugging Face TrainingArguments' names and this project's keys: the one table that both the
near-miss hint of an unknown key (keys.py) and docs/configuration.md's section for Trainer users
(reference.py) read, so the two cannot disagree."""
from __future__ import annotations

from typing import NamedTuple

from pipeline.config.precision_modes import listed


class TrainerName(NamedTuple):
    """One TrainingArguments name (or a Trainer callback's) and what a user writes here instead."""

    name: str
    """As TrainingArguments spells it."""
    setting: str | None
    """This project's `key` or `key=value`; None: nothing here corresponds (`differs` says why)."""
    differs: str = ""
    """How the default or the meaning differs from the Trainer's; "" when they are the same."""

    @property
    def key(self) -> str | None:
        return self.setting.partition("=")[0] if self.setting else None


TRAINER_NAMES = (
    TrainerName("output_dir", "output_dir", "optional: unset = outputs/TASK-MODEL-PRECISION"),
    TrainerName("overwrite_output_dir", "overwrite", "the same job re-run continues or starts over on its own "
                "outputs; overwrite=true is needed only to replace another job's"),
    TrainerName("resume_from_checkpoint", "resume", "resume=auto: the newest complete checkpoint of output_dir; "
                "resume=PATH: that checkpoint (of the same job only; what followed it is undone)"),
    TrainerName("num_train_epochs", "train.epochs", "a whole number; unset = the task's (3; error_cls 5, qa 8)"),
    TrainerName("max_steps", "train.max_steps"),
    TrainerName("per_device_train_batch_size", "train.batch_size", "default 16 (Trainer: 8); auto finds the "
                "largest that fits"),
    TrainerName("auto_find_batch_size", "train.batch_size=auto", "finds the batch before training, keeping the "
                "global batch, instead of halving it after an out-of-memory error"),
    TrainerName("per_device_eval_batch_size", "train.eval_batch_size", "default 64 (Trainer: 8)"),
    TrainerName("gradient_accumulation_steps", "train.grad_accum"),
    TrainerName("learning_rate", "train.lr", "unset = the task's (5e-5; WikiQA 1e-4), 3e-4 for presets"),
    TrainerName("weight_decay", "train.weight_decay", "default 0.01 (Trainer: 0.0)"),
    TrainerName("warmup_ratio", "train.warmup_ratio", "default 0.1 (Trainer: 0.0)"),
    TrainerName("warmup_steps", "train.warmup_ratio", "a fraction of the optimizer steps, not a count"),
    TrainerName("lr_scheduler_type", None, "one schedule: linear warm-up, then linear decay to zero"),
    TrainerName("optim", None, "AdamW (fused on a GPU) only"),
    TrainerName("max_grad_norm", "train.max_grad_norm"),
    TrainerName("fp16", "precision=fp16", f"one key for the precision: {listed()}"),
    TrainerName("bf16", "precision=bf16", "one key for the precision; bf16-pure keeps the module in bf16"),
    TrainerName("tf32", "precision=tf32", "fp32 (the default) keeps TF32 off"),
    TrainerName("seed", "seed"),
    TrainerName("logging_steps", "train.log_every", "default 10 (Trainer: 500)"),
    TrainerName("logging_dir", None, "everything is logged to MLflow (tracking.uri) and output_dir"),
    TrainerName("report_to", "tracking.uri", "MLflow only, always on"),
    TrainerName("run_name", "tracking.run_name", "unset = task-model-precision"),
    TrainerName("eval_strategy", "train.eval_every", "dev evaluation at each epoch's end, and also every "
                "train.eval_every optimizer steps when set"),
    TrainerName("evaluation_strategy", "train.eval_every", "dev evaluation at each epoch's end, and also every "
                "train.eval_every optimizer steps when set"),
    TrainerName("eval_steps", "train.eval_every", "0 (default): at epoch ends only; N: every N optimizer steps "
                "and at epoch ends"),
    TrainerName("save_strategy", "train.save_every", "a checkpoint at each epoch's end, and also every "
                "train.save_every optimizer steps when set"),
    TrainerName("save_steps", "train.save_every", "0 (default): at epoch ends only (Trainer: 500)"),
    TrainerName("save_total_limit", "train.keep_checkpoints", "default 2 (Trainer: unset, every checkpoint kept)"),
    TrainerName("load_best_model_at_end", None, "always: the best dev evaluation's model is tested and saved in "
                "best/"),
    TrainerName("metric_for_best_model", None, "the task's main metric, then its tie-breakers and the dev loss "
                "(docs/outputs.md)"),
    TrainerName("early_stopping_patience", "train.patience", "EarlyStoppingCallback's; 0 (default) never stops "
                "early"),
    TrainerName("dataloader_num_workers", "train.num_workers", "unset = 2 on a GPU, 0 on a CPU (Trainer: 0)"),
    TrainerName("group_by_length", "train.group_by_length", "unset = the task's default (Trainer: false)"),
    TrainerName("gradient_checkpointing", "train.gradient_checkpointing"),
    TrainerName("torch_compile", "train.compile", "default auto: compiled on one GPU, off on a CPU (Trainer: "
                "false)"),
    TrainerName("deepspeed", "deepspeed", "a file or a shipped config's name (zero0 ... zero3, zero2_offload)"),
    TrainerName("ddp_timeout", "dist_timeout"),
)

BY_NAME = {t.name: t for t in TRAINER_NAMES}


def hint(word: str) -> str:
    """' (...)' for a dotted key whose last part is a TrainingArguments name (learning_rate,
    train.learning_rate): the key to write here, else why there is none; '' for any other word."""
    found = BY_NAME.get(word.rpartition(".")[2].lower())
    if found is None:
        return ""
    if found.setting is None:
        return f" (the Hugging Face Trainer's {found.name} has no key here: {found.differs})"
    return f" (did you mean {found.setting}? as the Hugging Face Trainer's {found.name}: docs/configuration.md)"
