"""Knowledge distillation: the frozen teacher, the loss made of the terms of kd/registry.py and the
teacher-logit cache; the student built from the teacher (`model=from_teacher:N`) is student.py's.

loss = (1 - alpha) * task loss + alpha * T^2 * KL(teacher || student at temperature T)
       + the sum of every other term that is on, times its weight (hidden_weight * hidden, ...),
each term in fp32 (the KD term from log-probabilities, log_target=True, so 16-bit logits never
produce inf or NaN). The KD term is per row for sentence tasks, per labelled token for NER, over
start and end positions for QA (Task.kd_pairs says which logits pair up); the layer-wise terms
(hidden, attention) are over kd.layer_map's layer pairs and need the teacher live. Each term is
returned by name (task and the registry's names) and logged as train/loss_<term>.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from pipeline import models
from pipeline.config import Config, KDConfig
from pipeline.errors import UserError
from pipeline.fsutil import cache_root
from pipeline.kd import registry, teacher_cache
from pipeline.kd.student import from_teacher, is_from_teacher, teacher_overrides
from pipeline.layout import OutputDir
from pipeline.runtime import collectives
from pipeline.runtime.backend import Backend, StepLoss
from pipeline.runtime.compiler import OFF, CompilePolicy
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.world import Runtime
from pipeline.tasks.base import Task

if TYPE_CHECKING:
    import datasets
    import numpy as np
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.utils import ModelOutput

log = logging.getLogger("pipeline")


def load_teacher(spec: str, task: Task, overrides: dict, max_length: int = 512
                 ) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """(tokenizer, model) of the teacher: a train stage's output dir (its best/), hub id or local model;
    a UserError where it takes fewer than `max_length` tokens (train.max_length)."""
    try:  # a train stage's output_dir stands for its best model
        return models.build(str(OutputDir(Path(spec).expanduser()).trained_model() or spec), task, [], overrides,
                            max_length=max_length, teacher=True)
    except UserError as e:
        raise UserError(str(e).replace("config: model=", "config: kd.teacher=", 1)) from None


def build_distillation(cfg: Config, task: Task, policy: PrecisionPolicy, rt: Runtime, backend: Backend,
                       train_texts: Iterable[str], compile_policy: CompilePolicy = OFF
                       ) -> tuple[str, PreTrainedTokenizerBase, PreTrainedModel, Distiller]:
    """(student spec, tokenizer, student, Distiller) of a `distill` stage that `backend` will run;
    every check that can be the user's fault happens here, before any run exists."""
    if not cfg.kd.teacher:
        raise UserError("config: kd.teacher: required by distill (a train stage's output_dir, hub id or local model)")
    teacher_tokenizer, teacher = load_teacher(cfg.kd.teacher, task, teacher_overrides(cfg.model, cfg.model_config),
                                              cfg.train.max_length)
    spec = cfg.model or f"from_teacher:{max(1, teacher.config.num_hidden_layers // 2)}"
    if is_from_teacher(spec):
        student = from_teacher(spec, teacher, task, cfg.model_config)
        tokenizer = teacher_tokenizer
    else:
        tokenizer, student = models.build(spec, task, train_texts, cfg.model_config, cfg.train.max_length)
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"config: kd.teacher={cfg.kd.teacher}: its tokenizer differs from the student's "
                        f"(model={cfg.model}); per-token distillation needs one tokenizer for both")
    distiller = Distiller(cfg.kd, cfg.train.eval_batch_size, task, policy, rt, teacher, compile_policy)
    distiller.watch_student(student)
    if backend.shards_parameters and hasattr(student, "kd_projections"):
        # ZeRO-3 prefetches parameters by the modules' order in the last forward: projections run
        # after the student's forward in training but not in evaluation, so the gather of the best
        # model finds their prefetched parameters still in flight
        raise UserError(f"config: kd.hidden_weight={cfg.kd.hidden_weight}: a student of another width than its "
                        f"teacher ({student.config.hidden_size} vs {teacher.config.hidden_size}) needs learned "
                        "projections, which DeepSpeed ZeRO-3 cannot gather outside the model's forward; use "
                        "ZeRO-2, DDP, or a student of the teacher's width")
    return spec, tokenizer, student, distiller


class Distiller:
    """Frozen teacher outside DDP/DeepSpeed; logits from its cache. With the cache the teacher
    goes to the device only for each rank's share of the pass on a cache miss and is dropped once
    the cache is complete, so its memory is never charged to the student's peak; a live teacher
    (no cache, or a term that reads more than its logits) sits on this rank's device."""

    def __init__(self, kd: KDConfig, eval_batch_size: int, task: Task, policy: PrecisionPolicy, rt: Runtime,
                 teacher: PreTrainedModel, compile: CompilePolicy = OFF) -> None:
        self.compile = compile
        """The stage's compile policy, for the teacher's forward (compiled when it moves to the device)."""
        self.task, self.policy, self.rt, self.teacher_spec = task, policy, rt, kd.teacher
        self.kd = kd
        self.terms = registry.on(kd)
        """The registry's terms this job computes, in the order they add to the loss."""
        self.computes: dict[str, registry.Compute] = {}
        """Each term of `terms` built for the student watch_student was given, by name."""
        self.layer_pairs: list[tuple[int, int]] = []
        """kd.layer_map as checked against the student and the teacher, where a layer-wise term is on
        or the map is given."""
        live = any(t.live for t in self.terms)
        self.use_cache = kd.cache and not live
        if kd.cache and live and rt.is_main:
            log.info("%s > 0: the teacher runs live every step (the cache holds logits only)",
                     " or ".join(f"kd.{t.weight}" for t in registry.TERMS.values() if t.live))
        # asked of both forwards (student and teacher), where a term reads their hidden states
        hidden = any(t.needs == registry.HIDDEN_STATES for t in self.terms)
        self.forward_kwargs = {"output_hidden_states": True} if hidden else {}
        self.eval_batch_size = eval_batch_size
        # eval mode (no dropout), no gradients; on the device in the policy's compute dtype when it runs
        self.teacher = teacher.eval().requires_grad_(False)
        if not self.use_cache:
            self._teacher_to_device()
        self.teacher_fingerprint = models.fingerprint(self.teacher, weights=True,
                                                      config=teacher_cache.computing_config(self.teacher))
        """The teacher's config and weights, for the job's record (kept once the cache frees the teacher)."""
        self.cached: dict[str, torch.Tensor] | None = None
        self.cache_hit: bool | None = None

    # ------------------------------------------------------------------ cache
    @property
    def cache_outcome(self) -> str:
        """The run's kd_cache tag: hit | miss | off (the teacher runs live)."""
        return {True: "hit", False: "miss", None: "off"}[self.cache_hit]

    def prepare(self, features: datasets.Dataset, collate: Callable[[list[dict]], dict], max_length: int,
                tokenizer: PreTrainedTokenizerBase) -> None:
        """The teacher's outputs for every training feature, from the cache or computed once, each
        rank over its share. All ranks agree on hit or miss: one that misses makes all compute (a
        node-local cache can hold the file on one node and not on another). The key reads the token
        ids themselves, so `tokenizer` (where it was loaded from, its other settings) is not in it."""
        if not self.use_cache:
            return
        lengths, inputs_digest = teacher_cache.read_inputs(features)
        key = teacher_cache.cache_key(self.teacher, self.task, self.policy.name, max_length, inputs_digest)
        path = cache_root() / "teacher_logits" / key / "logits.safetensors"
        seen = collectives.all_gather_objects((key, path.is_file()))
        if len({k for k, _ in seen}) > 1:  # their shares would mix two teachers or two datasets
            raise UserError(f"kd.teacher={self.teacher_spec}: the ranks' training features or teacher weights differ "
                            "(every node must read the same data.train and kd.teacher)")
        self.cache_hit = all(hit for _, hit in seen)
        if self.cache_hit:
            self.cached = load_file(path)
        else:
            self.cached = self._split_pass(features, collate, max_length, lengths)
            if self.rt.local_rank == 0:  # one writer per node: the cache dir may be node-local
                teacher_cache.write(path, self.cached)
        self.teacher = None  # the cache answers from here on: free the teacher's memory
        if self.rt.device.type == "cuda":
            torch.cuda.empty_cache()  # give its blocks back, out of the reserved-memory figure too

    def _split_pass(self, features: datasets.Dataset, collate: Callable[[list[dict]], dict], max_length: int,
                    lengths: np.ndarray) -> dict[str, torch.Tensor]:
        """This rank's share of the teacher pass, then every rank's share gathered (fp16, CPU)."""
        world = self.rt.world_size
        shares = teacher_cache.deal_batches(lengths, self.eval_batch_size, world)
        if self.rt.is_main:
            log.info("teacher-logit cache miss: the teacher runs over %d training features, %s", len(features),
                     f"split across {world} ranks" if world > 1 else "in this process")
        start = time.perf_counter()
        self._teacher_to_device()
        local = self._teacher_pass(features, collate, max_length, shares[self.rt.rank])
        seconds = time.perf_counter() - start
        # a rank without rows (fewer batches than ranks) learns the outputs' shapes from the others
        shapes = next(s for s in collectives.all_gather_objects({k: tuple(v.shape[1:]) for k, v in local.items()}) if s)
        cache = teacher_cache.gather_shares(local, shares, len(features), shapes)
        if self.rt.is_main:
            rows = [sum(len(b) for b in share) for share in shares]
            log.info("teacher pass: %s features per rank, %.1f s on rank 0", " + ".join(map(str, rows)), seconds)
        return cache

    @torch.inference_mode()
    def _teacher_pass(self, features: datasets.Dataset, collate: Callable[[list[dict]], dict], max_length: int,
                      batches: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """The teacher's outputs for `batches` (arrays of row numbers), their rows in that order, fp16."""
        out: dict[str, list] = {}
        for rows in batches:
            batch = collate([features[int(i)] for i in rows])
            batch.pop("idx")
            self.compile.begin_step()  # no student step is in flight here
            for name, value in self._teacher_logits(batch).items():
                value = value.float().cpu()
                if self.task.kd_outputs[name]:  # per-token: pad [B, L, ...] to max_length, masked out
                    pad = [0, 0] * (value.dim() - 2) + [0, max_length - value.shape[1]]
                    value = F.pad(value, pad, value=-1e4)
                out.setdefault(name, []).append(value.to(torch.float16))
        return {name: torch.cat(parts) for name, parts in out.items()}

    def _cached_rows(self, name: str, idx: torch.Tensor, length: int) -> torch.Tensor:
        """The cached rows of this micro-batch (per-token outputs cut to its length) on the device.
        On a GPU they are gathered into pinned memory and copied without blocking the host: the
        caching host allocator keeps the block until the copy is done, so reuse is safe."""
        table = self.cached[name][:, :length] if self.task.kd_outputs[name] else self.cached[name]
        if self.rt.device.type != "cuda":
            return table[idx]
        staged = torch.empty((len(idx), *table.shape[1:]), dtype=table.dtype, pin_memory=True)
        torch.index_select(table, 0, idx, out=staged)
        return staged.to(self.rt.device, non_blocking=True)

    def _teacher_to_device(self) -> None:
        self.teacher = self.compile.compile(self.teacher.to(self.rt.device, dtype=self.policy.compute_dtype))

    def _teacher_logits(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs = {k: v.to(self.rt.device) for k, v in batch.items() if k in teacher_cache.MODEL_INPUTS}
        with torch.inference_mode(), self.policy.autocast():
            outputs = self.teacher(**inputs, **self.forward_kwargs)
        wanted = {name: outputs[name] for name in self.task.kd_outputs}
        if self.forward_kwargs:
            wanted[registry.HIDDEN_STATES] = outputs.hidden_states
        return wanted

    def watch_student(self, student: PreTrainedModel) -> None:
        """Build every term that is on for `student`, before its optimizer exists (a term's
        projections are its parameters): kd.layer_map, where given or a layer-wise term is on, is
        checked against both models; the layer-wise terms hook Q/K/V on the mapped layers of both and
        attach the projections to it."""
        teacher = getattr(self.teacher, "_orig_mod", self.teacher)  # the module itself, compiled or not
        self.computes = {t.name: t.build(self.kd, self.task, self.policy, student, teacher) for t in self.terms}
        layer_wise = any(t.layer_wise for t in self.terms)
        if layer_wise or self.kd.layer_map:  # a map given is checked even with no term to use it
            self.layer_pairs = registry.layer_pairs(self.kd, student, teacher)
            if layer_wise and self.rt.is_main:
                log.info("layer-wise terms over student:teacher layers %s%s",
                         ",".join(f"{s}:{t}" for s, t in self.layer_pairs),
                         f"; hidden states through learned projections {student.config.hidden_size} -> "
                         f"{teacher.config.hidden_size}" if hasattr(student, "kd_projections") else "")

    # ------------------------------------------------------------------ loss
    def loss(self, student_outputs: ModelOutput, batch: dict, idx: torch.Tensor,
             student: torch.nn.Module | None = None) -> StepLoss:
        """The KD loss of a micro-batch and its named terms, each unweighted (logged as
        train/loss_<term>); `student` is the unwrapped student (its kd_projections). The terms are
        those watch_student built."""
        if self.cached is not None:
            teacher = {name: self._cached_rows(name, idx, batch["input_ids"].shape[1]) for name in self.task.kd_outputs}
        else:
            teacher = self._teacher_logits({k: v for k, v in batch.items()})
        task_loss = self.task.loss(student_outputs, batch).float()
        loss = (1 - self.kd.alpha) * task_loss
        terms = {"task": task_loss}
        for term in self.terms:
            terms[term.name] = self.computes[term.name](student_outputs, teacher, batch, student)
            loss = loss + getattr(self.kd, term.weight) * terms[term.name]
        return StepLoss(loss, terms)
