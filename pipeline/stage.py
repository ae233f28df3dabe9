"""A stage's parts, built before anything is written: the backend, the data, tokenizer and model
(with the teacher and its logits under distillation), the job's record completed with them and,
when resuming, the checkpoint confirmed against them. Everything that can be the user's fault
fails here, before any MLflow run or output exists. The plan (jobs/settle.py) decided the rest.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
import transformers
from transformers import PreTrainedTokenizerBase

from pipeline import models, names
from pipeline.config.schema import SettledConfig
from pipeline.data import features
from pipeline.data.loaders import shaped_collate
from pipeline.jobs import batch_fit
from pipeline.jobs.batch_fit import BatchFit
from pipeline.jobs.job_record import JobRecord
from pipeline.jobs.resume import Resume, Resumed, StartOver
from pipeline.jobs.settle import Plan
from pipeline.kd.distill import Distiller, build_distillation
from pipeline.layout import OutputDir
from pipeline.loop.best_model import model_dir_of
from pipeline.loop.optim import build_optimizer
from pipeline.measure import inference, memory
from pipeline.measure.flops import FlopModel, step_flop_model
from pipeline.measure.load import LoadSampler
from pipeline.runtime.backend import Backend
from pipeline.runtime.compiler import CompilePolicy
from pipeline.runtime.dist import Runtime
from pipeline.runtime.factory import make_backend
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.tasks.base import SPLITS, Task
from pipeline.tracking import resolve_uri

log = logging.getLogger("pipeline")


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
    batch_fit: BatchFit | None = None
    """Under train.batch_size=auto: the split the batch finder chose (the plan holds it)."""

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

    @property
    def compile(self) -> CompilePolicy:
        return self.plan.compile

    def forward_loss(self, call: torch.nn.Module, inputs: dict, idx: torch.Tensor, unpadded: bool = False
                     ) -> torch.Tensor:
        """Forward of `call` (self.model or its wrapper) under the precision policy, then the task's
        loss of the batch, or under distillation the KD loss (of self.model's kd_projection).
        `unpadded`: the batch has no padding (CompilePolicy.drop_mask), so the model gets no attention
        mask (the losses still read it)."""
        forward_kwargs = self.distiller.forward_kwargs if self.distiller is not None else {}
        with self.policy.autocast():
            outputs = call(**self.model_inputs(inputs, unpadded), **forward_kwargs)
        if self.distiller is None:
            return self.task.loss(outputs, inputs)
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
        return self.compile.prepares_padded_mask and models.takes_prepared_mask(self.model)

    def step_flop_model(self, collate: Callable[[list[dict]], dict]) -> FlopModel:
        """FLOPs of one training row at a few padded lengths, each counted on a real single-row step
        of the unwrapped model, the loss included (KD: the live teacher or the cached logits)."""
        rows = self.features["train"]
        return step_flop_model(self.model, features.sequence_lengths(rows), lambda i: collate([rows[i]]),
                               self._plain_step, self.rt.device)

    def bench_inference(self) -> dict[str, float]:
        """What best/ costs to serve on this device (measure/inference.py), at the test split's median
        and longest lengths, in the stage's precision and the others the device runs: the infer/*
        metrics, or none with infer.bench=false. Rank 0's, after the test evaluation."""
        infer, best = self.cfg.infer, model_dir_of(self.out.root)
        if not infer.bench or best is None:
            log.info("inference benchmark skipped: %s", "no best model" if infer.bench else "infer.bench=false")
            return {}
        t0 = time.perf_counter()
        saved = models.SavedModel(str(best))
        lengths = inference.typical_lengths(features.sequence_lengths(self.features["test"]),
                                            self.cfg.train.pad_to_multiple_of, self.cfg.train.max_length)
        # the other ranks wait in a collective meanwhile: rank 0 takes every core, as a server would
        with inference.serving_threads(self.rt.device), LoadSampler(self.rt.device) as load:
            result = inference.bench(saved.load, self.rt.device, vocab_size=saved.config.vocab_size,
                                     input_names=saved.tokenizer.model_input_names, lengths=lengths,
                                     precisions=inference.inference_precisions(self.policy.name, self.rt.device),
                                     size_mb=saved.size_mb,
                                     settings=inference.BenchSettings(infer.batch_size, infer.budget_s))
        first = result.measurements[0]
        log.info("inference (%s, %d tokens): %.1f ms at batch 1 (p50), %.0f samples/s at batch %d; measured in %.1fs",
                 first.precision, first.length, first.latency_ms_p50, first.samples_per_s, result.batch_size,
                 time.perf_counter() - t0)
        return {**result.metrics(), **load.last.metrics(names.INFER_LOAD)}

    def fit_batch(self) -> Stage:
        """train.batch_size=auto: this stage with its global batch split into the largest micro-batch
        that fits the device, and its evaluation batch found (jobs/batch_fit.py); the model's weights
        and the RNG as they were. A UserError when even one row does not fit."""
        cfg, device, model = self.cfg, self.rt.device, self.model
        longest = {split: _longest(self.features[split]) for split in SPLITS}  # (row, length)
        eval_split = max(("dev", "test"), key=lambda split: longest[split][1])
        row = {"train": self.features["train"][longest["train"][0]],
               "eval": self.features[eval_split][longest[eval_split][0]]}
        collate = shaped_collate(self.task.collator(self.tokenizer), cfg.train, self.tokenizer.pad_token_id)
        saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        was_training = model.training
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            try:
                found = batch_fit.find(
                    cfg.train.batch_size * cfg.train.grad_accum,
                    math.ceil(max(len(self.features["dev"]), len(self.features["test"])) / self.rt.world_size),
                    _released(device, lambda rows, limit: self._train_trial(collate([row["train"]] * rows), limit)),
                    _released(device, lambda rows, limit: self._eval_trial(collate([row["train"]]),
                                                                           collate([row["eval"]] * rows), limit)),
                    memory.capacity(device, cfg.train.memory_limit_mb) - self.backend.standing_bytes(model),
                    f"{max(length for _, length in longest.values())} tokens")
            finally:
                model.load_state_dict(saved)
                model.train(was_training)
                memory.release(device)
        if self.rt.is_main:
            log.info("train.batch_size=auto: %s", found.describe())
        plan = self.plan.resplit(found.batch_size, found.grad_accum, found.eval_batch_size)
        record = dataclasses.replace(self.record, config=plan.record.config)
        # the backend read the split (DeepSpeed's micro-batch and accumulation "auto" values): again
        backend = make_backend(self.rt, self.policy, self.compile, plan.cfg.train, cfg.deepspeed)
        return dataclasses.replace(self, plan=plan, record=record, backend=backend, batch_fit=found)

    def _train_trial(self, batch: dict, limit: int) -> int | None:
        """One training step at `batch` (forward, loss, backward, a fused-or-not AdamW step as the
        backend builds it): its peak bytes, or None when it ran out of memory."""
        def measure() -> int:
            self.model.train()
            with memory.measured(self.rt.device, self._standing(), limit) as peak:
                self._optimizer_step(batch)
            return peak.bytes
        return self._unless_out_of_memory(measure)

    def _eval_trial(self, one_row: dict, batch: dict, limit: int) -> int | None:
        """A forward pass without gradients at `batch`, beside the optimizer's state (a one-row step
        made it, its gradients freed, as the loop leaves them before evaluating): its peak bytes,
        or None when it ran out of memory."""
        def measure() -> int:
            self.model.train()
            optimizer = self._optimizer_step(one_row)
            self.model.zero_grad(set_to_none=True)
            self.model.eval()
            state = [t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
            with memory.measured(self.rt.device, [*self._standing(), *state], limit) as peak, torch.no_grad():
                inputs = {k: v.to(self.rt.device) for k, v in batch.items() if k != "idx"}
                with self.policy.autocast():
                    self.model(**inputs)
            return peak.bytes
        return self._unless_out_of_memory(measure)

    def _optimizer_step(self, batch: dict) -> torch.optim.Optimizer:
        """A fresh AdamW (fused or not, as the backend builds it) stepped once on `batch`'s
        gradients, so its state exists; returned, for the caller to count or drop."""
        optimizer, _ = build_optimizer(self.model, self.cfg.train, 1, fused=self.backend.fused_optimizer)
        self._plain_step(dict(batch))
        optimizer.step()
        return optimizer

    def _unless_out_of_memory(self, measure: Callable[[], int]) -> int | None:
        """`measure()`'s peak bytes, or None when it ran out of memory; the gradients dropped either
        way. The trial's tensors (its optimizer among them) go with its frame; the memory itself is
        given back once the trial returned (_released)."""
        try:
            return measure()
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not memory.is_out_of_memory(e):
                raise
            return None
        finally:
            self.model.zero_grad(set_to_none=True)

    def _standing(self) -> list[torch.Tensor]:
        """The tensors that live on the device through a step: the model's parameters, buffers and
        gradients, and a live teacher's (the CPU's tensor count starts from them)."""
        modules = [self.model] + ([self.distiller.teacher] if self.distiller and self.distiller.teacher else [])
        return [t for m in modules for p in (*m.parameters(), *m.buffers())
                for t in (p, p.grad) if t is not None]

    def _plain_step(self, batch: dict) -> None:
        """Forward, loss and backward of the unwrapped model, as the loop computes them."""
        idx = batch.pop("idx")
        inputs = {k: v.to(self.rt.device) for k, v in batch.items()}
        self.forward_loss(self.model, inputs, idx).backward()


def build_stage(plan: Plan, start: Resume | StartOver) -> Stage:
    """Everything that can be the user's fault, before a run or an output exists."""
    cfg, rt, task, policy = plan.cfg, plan.rt, plan.task, plan.policy
    policy.apply_matmul_mode()  # the stage's process-wide settings, applied as it starts
    memory.cap(rt.device, cfg.train.memory_limit_mb)  # a GPU behaves as one of this size
    # a DeepSpeed config is read and checked before data and models load (minutes on a real job)
    backend = make_backend(rt, policy, plan.compile, cfg.train, cfg.deepspeed)
    # the training split is prepared once per node and memory-mapped: its size, digest and texts
    # here, not its rows; dev/test keep their examples (the metrics read them)
    examples = {"train": features.prepare_train(task, cfg.data.train, rt),
                **{split: task.load(getattr(cfg.data, split), split) for split in ("dev", "test")}}
    uri = resolve_uri(cfg.tracking.uri)
    transformers.set_seed(cfg.seed)  # identical initial weights on every rank
    train_texts = examples["train"].texts
    distiller = None
    if plan.kind == "distill":
        model_spec, tokenizer, model, distiller = build_distillation(cfg, task, policy, rt, train_texts, plan.compile)
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
    model.to(rt.device)  # fp32 here; bf16-pure: the backend casts it once it holds the fp32 masters
    if distiller is not None:  # the teacher's logits for the whole training set, once (cached on disk)
        collate = shaped_collate(task.collator(tokenizer), cfg.train, tokenizer.pad_token_id)
        distiller.prepare(prepared["train"], collate, cfg.train.max_length, tokenizer)
    stage = Stage(plan, examples, prepared, tokenizer, model, model_spec, backend, distiller, record, start, uri)
    return stage.fit_batch() if plan.find_batch else stage


def _released(device: torch.device, trial: Callable[[int, int], int | None]) -> Callable[[int, int], int | None]:
    """The trial, then its memory given back once it has returned: an out-of-memory exception's
    traceback holds the failed step's tensors until the handler is left."""
    def run(rows: int, limit: int) -> int | None:
        peak = trial(rows, limit)
        memory.release(device)
        return peak
    return run


def _longest(rows) -> tuple[int, int]:
    """(index, length) of a split's longest row."""
    lengths = features.sequence_lengths(rows)
    i = max(range(len(lengths)), key=lengths.__getitem__)
    return i, lengths[i]
