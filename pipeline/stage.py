"""A stage's parts, built before anything is written: the backend, the data, tokenizer and model
(with the teacher and its logits under distillation), the job's record completed with them and,
when resuming, the checkpoint confirmed against them. Everything that can be the user's fault
fails here, before any MLflow run or output exists. The plan (jobs/settle.py) decided the rest.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from transformers import PreTrainedTokenizerBase

from pipeline import models
from pipeline.config.schema import SettledConfig
from pipeline.data import features
from pipeline.data.loaders import shaped_collate
from pipeline.jobs.job_record import JobRecord
from pipeline.jobs.resume import Resume, Resumed, StartOver
from pipeline.jobs.settle import Plan
from pipeline.kd.distill import Distiller, build_distillation
from pipeline.layout import OutputDir
from pipeline.measure.flops import FlopModel, step_flop_model
from pipeline.runtime.backend import Backend
from pipeline.runtime.dist import Runtime
from pipeline.runtime.factory import make_backend
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.tasks.base import SPLITS, Task
from pipeline.tracking import resolve_uri


@dataclass(frozen=True)
class Stage:
    """What build_stage() creates, before any MLflow run or output exists; nothing here changes
    afterwards (what the run changes is the Loop's)."""

    plan: Plan
    examples: dict
    features: dict
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    """The model being trained, on its device, unwrapped: the one handle to it (Loop.wrapped is what
    the backend made of it, to call forward on)."""
    model_spec: str
    backend: Backend
    distiller: Distiller | None
    """Under distillation: the KD loss, with the teacher's logits cached or the teacher live."""
    record: JobRecord
    """What the job trains with, its tokenizer, model and teacher included (same_job.py compares it)."""
    start: Resumed | StartOver
    """From where the job starts: a checkpoint confirmed against this stage, or over."""
    uri: str

    @property
    def cfg(self) -> SettledConfig:
        return self.plan.cfg

    @property
    def rt(self) -> Runtime:
        return self.plan.rt

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def task(self) -> Task:
        return self.plan.task

    @property
    def policy(self) -> PrecisionPolicy:
        return self.plan.policy

    @property
    def out(self) -> OutputDir:
        return self.plan.out

    def forward_loss(self, call: torch.nn.Module, inputs: dict, idx: torch.Tensor, unpadded: bool = False
                     ) -> torch.Tensor:
        """Forward of `call` (self.model or its wrapper) under the precision policy, then the task's
        loss of the batch, or under distillation the KD loss (of self.model's kd_projection).
        `unpadded`: the batch has no padding, so the model gets no attention mask (the losses still
        read it): with a mask, transformers' SDPA path asks the device whether it is all ones, a host
        sync per step."""
        forward_kwargs = self.distiller.forward_kwargs if self.distiller is not None else {}
        model_inputs = {k: v for k, v in inputs.items() if k != "attention_mask"} if unpadded else inputs
        with self.policy.autocast():
            outputs = call(**model_inputs, **forward_kwargs)
        if self.distiller is None:
            return self.task.loss(outputs, inputs)
        return self.distiller.loss(outputs, inputs, idx, self.model)  # the backends wrap self.model itself

    def step_flop_model(self, collate: Callable[[list[dict]], dict]) -> FlopModel:
        """FLOPs of one training row at a few padded lengths, each counted on a real single-row step
        of the unwrapped model, the loss included (KD: the live teacher or the cached logits)."""
        rows = self.features["train"]
        return step_flop_model(self.model, features.sequence_lengths(rows), lambda i: collate([rows[i]]),
                               self._plain_step, self.rt.device)

    def _plain_step(self, batch: dict) -> None:
        """Forward, loss and backward of the unwrapped model, as the loop computes them."""
        idx = batch.pop("idx")
        inputs = {k: v.to(self.rt.device) for k, v in batch.items()}
        self.forward_loss(self.model, inputs, idx).backward()


def build_stage(plan: Plan, start: Resume | StartOver) -> Stage:
    """Everything that can be the user's fault, before a run or an output exists."""
    cfg, rt, task, policy = plan.cfg, plan.rt, plan.task, plan.policy
    policy.apply_matmul_mode()  # the stage's one process-wide setting, applied as it starts
    # a DeepSpeed config is read and checked before data and models load (minutes on a real job)
    backend = make_backend(rt, policy, cfg.train, cfg.deepspeed)
    # the training split is prepared once per node and memory-mapped: its size, digest and texts
    # here, not its rows; dev/test keep their examples (the metrics read them)
    examples = {"train": features.prepare_train(task, cfg.data.train, rt),
                **{split: task.load(getattr(cfg.data, split), split) for split in ("dev", "test")}}
    uri = resolve_uri(cfg.tracking.uri)
    transformers.set_seed(cfg.seed)  # identical initial weights on every rank
    train_texts = examples["train"].texts
    distiller = None
    if plan.kind == "distill":
        model_spec, tokenizer, model, distiller = build_distillation(cfg, task, policy, rt, train_texts)
    else:
        model_spec = cfg.model or task.default_model
        tokenizer, model = models.build(model_spec, task, train_texts, cfg.model_config, cfg.train.max_length)
    if cfg.train.gradient_checkpointing:  # the trained model only: the teacher computes no gradients
        models.checkpoint_activations(model, model_spec)
    prepared = {split: features.prepare_features(task, split, getattr(cfg.data, split), examples[split], tokenizer,
                                                 cfg.train.max_length, rt) for split in SPLITS}
    examples["train"].release()  # the builder's rows: the features are on disk now
    record = plan.record.built(tokenizer, model, distiller.teacher if distiller else None)
    if isinstance(start, Resume):  # the checkpoint against the model, tokenizer and teacher built
        start = start.confirm(record, cfg.accepted_changes)
        record = start.record
    model.to(rt.device)  # parameters stay fp32: autocast casts per op (fp32 master weights)
    if distiller is not None:  # the teacher's logits for the whole training set, once (cached on disk)
        collate = shaped_collate(task.collator(tokenizer), cfg.train, tokenizer.pad_token_id)
        distiller.prepare(prepared["train"], collate, cfg.train.max_length, tokenizer)
    return Stage(plan, examples, prepared, tokenizer, model, model_spec, backend, distiller, record, start, uri)
