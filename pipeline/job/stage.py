"""A stage's parts, built before anything is written: the backend, the data, tokenizer and model
(with the teacher and its logits under distillation). Everything that can be the user's fault
fails here, before any MLflow run or output exists. The plan (job/plan.py) decided the rest;
the job around the stage (its record, the resume, the lock, the run) is job/run.py's.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
import transformers
from transformers import PreTrainedTokenizerBase

from pipeline import models, names
from pipeline.data import features
from pipeline.data.loaders import shaped_collate
from pipeline.data.splits import read_splits
from pipeline.job.plan import Plan
from pipeline.kd import student
from pipeline.kd.distill import Distiller, build_distillation
from pipeline.measure import inference, memory
from pipeline.measure.flops import FlopModel, ModelSize, model_size, step_flop_model
from pipeline.measure.load import LoadSampler
from pipeline.runtime.backend import Backend, StepLoss
from pipeline.runtime.factory import make_backend

log = logging.getLogger("pipeline")


@dataclass(frozen=True, kw_only=True)
class Stage(Plan):
    """The plan with what build_stage() created, before any MLflow run or output exists; nothing here
    changes afterwards (what the run changes is the Loop's). Its `record` is the plan's completed
    with what was built (JobRecord.built: the model's architecture, the tokenizer, the teacher's
    fingerprint): what its checkpoints carry and a resume compares. Plan.resplit (the batch
    finder's answer) gives the same stage with its global batch split otherwise."""

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
    size: ModelSize
    """The trained model's parameters and forward FLOPs at train.max_length (kd_projections left out)."""
    teacher_size: ModelSize | None = None
    """Under distillation: the teacher's, measured alike."""
    student_init: str | None = None
    """Under distillation: how the student started (kd/student.py init_of)."""

    def size_figures(self) -> dict[str, float]:
        """The run's model/* metrics, and under distillation the student's ratios to its teacher."""
        against = student.ratios(self.size, self.teacher_size) if self.teacher_size else {}
        return {**self.size.figures(), **against}

    @property
    def teacher(self) -> torch.nn.Module | None:
        """A live or cached-logits distillation's teacher model, if it is loaded."""
        return self.distiller.teacher if self.distiller is not None else None

    def forward_loss(self, call: torch.nn.Module, inputs: dict, idx: torch.Tensor, unpadded: bool = False
                     ) -> StepLoss:
        """Forward of `call` (self.model or its wrapper) under the precision policy, then the task's
        loss of the batch, or under distillation the KD loss and its named terms (of self.model's
        kd_projections).
        `unpadded`: the batch has no padding (CompilePolicy.drop_mask), so the model gets no attention
        mask (the losses still read it)."""
        forward_kwargs = self.distiller.forward_kwargs if self.distiller is not None else {}
        with self.policy.autocast():
            outputs = call(**self.model_inputs(inputs, unpadded), **forward_kwargs)
        if self.distiller is None:
            return StepLoss(self.task.loss(outputs, inputs))
        return self.distiller.loss(outputs, inputs, idx, self.model)  # the backends wrap self.model itself

    def model_inputs(self, inputs: dict, unpadded: bool) -> dict:
        """The batch as the model takes it: without a mask when it has no padding; with its mask in
        SDPA's 4D form where the policy and the model take one (no host sync in transformers)."""
        if unpadded:
            return {k: v for k, v in inputs.items() if k != "attention_mask"}
        if self.prepared_mask:
            return {**inputs, "attention_mask": inputs["attention_mask"][:, None, None, :].bool()}
        return inputs

    @cached_property
    def prepared_mask(self) -> bool:
        """Whether a padded batch's mask is handed to the model already in SDPA's 4D form (where the
        model takes one), so transformers does not ask the device whether it is all ones: eager
        only, as a compiled forward traces that check (no sync)."""
        return not self.compile.compiled and models.takes_prepared_mask(self.model)

    def step_flop_model(self, collate: Callable[[list[dict]], dict]) -> FlopModel:
        """FLOPs of one training row at a few padded lengths, each counted on a real single-row step
        of the unwrapped model, the loss included (KD: the live teacher or the cached logits)."""
        rows = self.features["train"]
        return step_flop_model(self.model, features.sequence_lengths(rows), lambda i: collate([rows[i]]),
                               self.plain_step, self.rt.device)

    def bench_inference(self) -> dict[str, float]:
        """What best/ costs to serve on this device (measure/inference.py), at the test split's median
        and longest lengths (dev's, or train's, in a job without one), in the stage's precision and
        the others the device runs: the infer/* metrics, or none with infer.bench=false. Rank 0's,
        after the test evaluation."""
        infer, best = self.cfg.infer, self.out.trained_model()
        if not infer.bench or best is None:
            log.info("inference benchmark skipped: %s", "no best model" if infer.bench else "infer.bench=false")
            return {}
        t0 = time.perf_counter()
        saved = models.SavedModel(str(best))
        served = next(split for split in ("test", "dev", "train") if split in self.features)
        lengths = inference.typical_lengths(features.sequence_lengths(self.features[served]),
                                            self.cfg.train.pad_to_multiple_of, self.cfg.train.max_length)
        # the other ranks wait in a collective meanwhile: rank 0 takes every core, as a server would
        with inference.serving_threads(self.rt.device), LoadSampler(self.rt.device) as load:
            result = inference.bench(saved.served(), self.rt.device, lengths=lengths,
                                     precisions=inference.inference_precisions(self.policy.name, self.rt.device),
                                     batch_size=infer.batch_size, budget_s=infer.budget_s)
        first = result.measurements[0]
        log.info("inference (%s, %d tokens): %.1f ms at batch 1 (p50), %.0f samples/s at batch %d; measured in %.1fs",
                 first.precision, first.length, first.latency_ms_p50, first.samples_per_s, result.batch_size,
                 time.perf_counter() - t0)
        return {**result.figures(), **load.last.figures(names.INFER_LOAD)}

    def plain_step(self, batch: dict) -> None:
        """Forward, loss and backward of the unwrapped model, as the loop computes them."""
        idx = batch.pop("idx")
        inputs = {k: v.to(self.rt.device) for k, v in batch.items()}
        self.forward_loss(self.model, inputs, idx).total.backward()


def build_stage(plan: Plan) -> Stage:
    """Everything that can be the user's fault, before a run or an output exists: the backend (a
    DeepSpeed config read and checked first), the data prepared, the tokenizer and model built
    (with the teacher and its logits under distillation), the model on its device."""
    cfg, rt, task, policy = plan.cfg, plan.rt, plan.task, plan.policy
    policy.apply_matmul_mode()  # the stage's process-wide settings, applied as it starts
    memory.cap(rt.device, cfg.train.memory_limit_mb)  # a GPU behaves as one of this size
    # a DeepSpeed config is read and checked before data and models load (minutes on a real job)
    backend = make_backend(rt, policy, plan.compile, cfg.train, cfg.deepspeed)
    splits = read_splits(task, cfg.data, rt)  # the rows now, their features once the tokenizer exists
    examples = splits.examples
    transformers.set_seed(cfg.seed)  # identical initial weights on every rank
    train_texts = examples["train"].texts
    distiller = None
    if plan.kind == "distill":
        model_spec, tokenizer, model, distiller = build_distillation(cfg, task, policy, rt, backend, train_texts,
                                                                     plan.compile)
    else:
        model_spec = cfg.model or task.default_model
        tokenizer, model = models.build(model_spec, task, train_texts, cfg.model_config, cfg.train.max_length)
    if cfg.train.gradient_checkpointing:  # the trained model only: the teacher computes no gradients
        models.checkpoint_activations(model, model_spec)
    identity = {"architecture": models.architecture(model), "tokenizer": features.tokenizer_identity(tokenizer),
                "teacher": distiller.teacher_fingerprint if distiller is not None else None}
    prepared = splits.features(tokenizer, cfg.train.max_length)
    examples["train"].release()  # the builder's rows: the features are on disk now
    size = model_size(task.model_class, model.config, cfg.train.max_length)
    lineage = {}
    if distiller is not None:  # before prepare(), which may free the teacher
        lineage = {"teacher_size": model_size(task.model_class, distiller.teacher.config, cfg.train.max_length),
                   "student_init": student.init_of(model_spec, model.config, distiller.teacher.config)}
    model.to(rt.device)  # fp32 here; bf16-pure: the backend casts it once it holds the fp32 masters
    if distiller is not None:  # the teacher's logits for the whole training set, once (cached on disk)
        distiller.prepare(prepared["train"], shaped_collate(task.collator(tokenizer), cfg.train,
                                                            tokenizer.pad_token_id), cfg.train.max_length, tokenizer)
    planned = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    return Stage(**{**planned, "record": plan.record.built(**identity)}, examples=examples, features=prepared,
                 tokenizer=tokenizer, model=model, model_spec=model_spec, backend=backend, distiller=distiller,
                 size=size, **lineage)
