"""Knowledge distillation: the frozen teacher, the KD loss, the teacher-logit cache, and the
DistilBERT-style student initialisation (`model=from_teacher:N`).

loss = alpha * T^2 * KL(teacher || student at temperature T) + (1 - alpha) * task loss,
computed in fp32 from log-probabilities (log_target=True), so 16-bit logits never produce
inf or NaN. Per row for sentence tasks, per labelled token for NER, over start and end
positions for QA (Task.kd_pairs says which logits pair up). With kd.hidden_weight > 0 the loss
adds hidden_weight * MSE(last hidden states) over real tokens (TinyBERT-style), through a
learned projection when the student is narrower than the teacher. With kd.attention_weight > 0
it adds attention_weight * the MiniLMv2 relation KL of the last layers' Q, K and V, read by
forward hooks on their projections (the attention kernel, SDPA or flash, is left alone). Each
term is returned by name (task, kd, hidden, attention) and logged as train/loss_<term>.
"""
from __future__ import annotations

import logging
import math
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
from pipeline.kd import teacher_cache
from pipeline.layout import OutputDir
from pipeline.parts.model_card import spaced_layers
from pipeline.parts.step_losses import StepLoss
from pipeline.runtime import dist
from pipeline.runtime.compiler import OFF, CompilePolicy
from pipeline.runtime.dist import Runtime
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.tasks.base import Task

if TYPE_CHECKING:
    import datasets
    import numpy as np
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.utils import ModelOutput

log = logging.getLogger("pipeline")


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 * KL(teacher || student) at temperature T, averaged over rows, in fp32."""
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    return F.kl_div(s, t, reduction="batchmean", log_target=True) * temperature**2


def hidden_mse(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the real (mask == 1) tokens and the hidden dimension, in fp32."""
    mask = mask.unsqueeze(-1).float()
    squared = (student_hidden.float() - teacher_hidden.float()).pow(2) * mask
    return squared.sum() / (mask.sum() * student_hidden.shape[-1]).clamp(min=1)


def self_relation(states: torch.Tensor, heads: int, mask: torch.Tensor) -> torch.Tensor:
    """MiniLMv2's self-attention relation of one of Q, K or V [B, L, D]: split into `heads`
    relation heads of D/heads, log softmax(X X^T / sqrt(D/heads)) over the real (mask == 1) keys,
    [B, heads, L, L], in fp32. Its shape does not depend on D, so teacher and student may differ in
    width and attention heads."""
    b, length, width = states.shape
    if width % heads:
        raise UserError(f"config: kd.relation_heads={heads}: must divide the hidden size {width}")
    x = states.float().view(b, length, heads, width // heads).transpose(1, 2)
    scores = x @ x.transpose(-1, -2) / math.sqrt(width // heads)
    scores = scores.masked_fill(~mask.bool()[:, None, None, :], torch.finfo(torch.float32).min)
    return F.log_softmax(scores, dim=-1)


def relation_kl(student: torch.Tensor, teacher: torch.Tensor, heads: int, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher relation || student relation) of one of Q, K, V, averaged over the real
    queries and the relation heads (MiniLMv2), in fp32."""
    s, t = self_relation(student, heads, mask), self_relation(teacher, heads, mask)
    keys = mask.bool()[:, None, None, :]
    per_query = (t.exp() * (t - s)).masked_fill(~keys, 0.0).sum(-1)  # [B, heads, L]
    queries = mask.float()[:, None, :]
    return (per_query * queries).sum() / (queries.sum() * heads).clamp(min=1)


RELATIONS = ("query", "key", "value")


def last_layer_projections(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The query, key and value projections (nn.Linear) of the model's last encoder layer."""
    found: dict[int, dict[str, torch.nn.Module]] = {}
    for name, module in model.named_modules():
        parts = name.split(".")
        if isinstance(module, torch.nn.Linear) and parts[-1] in RELATIONS and "layer" in parts:
            index = parts[parts.index("layer") + 1]
            if index.isdigit():
                found.setdefault(int(index), {})[parts[-1]] = module
    if not found or set(found[max(found)]) != set(RELATIONS):
        raise UserError(f"config: kd.attention_weight: {type(model).__name__} has no query/key/value projections "
                        "in encoder layers to read attention relations from")
    return found[max(found)]


class Recorder:
    """The outputs of the projections it hooks, by name, as the model computes them (with their
    graph, for the student)."""

    def __init__(self, projections: dict[str, torch.nn.Module]) -> None:
        self.seen: dict[str, torch.Tensor] = {}
        for name, module in projections.items():
            module.register_forward_hook(lambda _m, _i, out, name=name: self.seen.__setitem__(name, out))

    def take(self) -> dict[str, torch.Tensor]:
        seen, self.seen = self.seen, {}
        return seen


def attach_projection(student: PreTrainedModel, teacher: PreTrainedModel) -> bool:
    """A learned student-width -> teacher-width map for the hidden-state term, as a submodule of
    the student: it trains, syncs and checkpoints with it, and save_pretrained leaves it out."""
    width, teacher_width = student.config.hidden_size, teacher.config.hidden_size
    if width == teacher_width:
        return False
    student.kd_projection = torch.nn.Linear(width, teacher_width)
    student._keys_to_ignore_on_save = set(student._keys_to_ignore_on_save or ()) | {
        "kd_projection.weight", "kd_projection.bias"}
    return True


def load_teacher(spec: str, task: Task, overrides: dict, max_length: int = 512
                 ) -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """(tokenizer, model) of the teacher: a train stage's output dir (its best/), hub id or local model;
    a UserError where it takes fewer than `max_length` tokens (train.max_length)."""
    try:  # a train stage's output_dir stands for its best model
        return models.build(str(OutputDir(Path(spec).expanduser()).trained_model() or spec), task, [], overrides,
                            max_length=max_length, teacher=True)
    except UserError as e:
        raise UserError(str(e).replace("config: model=", "config: kd.teacher=", 1)) from None


def student_from_teacher(n_layers: int, teacher: PreTrainedModel, task: Task) -> tuple[PreTrainedModel, list[int]]:
    """The teacher's embeddings, head and N of its layers, evenly spaced (DistilBERT took
    every other layer of BERT-base: 0, 2, ..., 10 for N=6)."""
    total = teacher.config.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise UserError(f"config: model=from_teacher:{n_layers}: the teacher has {total} layers")
    chosen = spaced_layers(n_layers, total)
    config = teacher.config.__class__.from_dict({**teacher.config.to_dict(), "num_hidden_layers": n_layers})
    student = task.model_class.from_config(config, dtype=torch.float32)  # trainable: fp32 whatever the teacher's dtype
    source = teacher.state_dict()
    mapped = {}
    for key in student.state_dict():  # load_state_dict copies into the fp32 parameters
        teacher_key = key
        if ".layer." in key:
            head, _, rest = key.partition(".layer.")
            index, _, tail = rest.partition(".")
            teacher_key = f"{head}.layer.{chosen[int(index)]}.{tail}"
        mapped[key] = source[teacher_key]
    student.load_state_dict(mapped)
    return student, chosen


def build_distillation(cfg: Config, task: Task, policy: PrecisionPolicy, rt: Runtime, train_texts: Iterable[str],
                       compile_policy: CompilePolicy = OFF
                       ) -> tuple[str, PreTrainedTokenizerBase, PreTrainedModel, Distiller]:
    """(student spec, tokenizer, student, Distiller) of a `distill` stage; every check that can
    be the user's fault happens here, before any run exists."""
    if not cfg.kd.teacher:
        raise UserError("config: kd.teacher: required by distill (a train stage's output_dir, hub id or local model)")
    teacher_tokenizer, teacher = load_teacher(cfg.kd.teacher, task, cfg.model_config, cfg.train.max_length)
    spec = cfg.model or f"from_teacher:{max(1, teacher.config.num_hidden_layers // 2)}"
    if spec.startswith("from_teacher:"):
        try:
            n_layers = int(spec.split(":", 1)[1])
        except ValueError:
            raise UserError(f"config: model={spec}: expected from_teacher:N with N a number of layers") from None
        student, _ = student_from_teacher(n_layers, teacher, task)
        tokenizer = teacher_tokenizer
    else:
        tokenizer, student = models.build(spec, task, train_texts, cfg.model_config, cfg.train.max_length)
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"config: kd.teacher={cfg.kd.teacher}: its tokenizer differs from the student's "
                        f"(model={cfg.model}); per-token distillation needs one tokenizer for both")
    distiller = Distiller(cfg.kd, cfg.train.eval_batch_size, task, policy, rt, teacher, compile_policy)
    distiller.watch_student(student)
    if cfg.kd.hidden_weight and attach_projection(student, teacher) and rt.is_main:
        log.info("hidden-state term: a learned projection %d -> %d", student.config.hidden_size,
                 teacher.config.hidden_size)
    return spec, tokenizer, student, distiller


class Distiller:
    """Frozen teacher outside DDP/DeepSpeed; logits from its cache. With the cache the teacher
    goes to the device only for each rank's share of the pass on a cache miss and is dropped once
    the cache is complete, so its memory is never charged to the student's peak; a live teacher
    (no cache, or the hidden-state term) sits on this rank's device."""

    def __init__(self, kd: KDConfig, eval_batch_size: int, task: Task, policy: PrecisionPolicy, rt: Runtime,
                 teacher: PreTrainedModel, compile: CompilePolicy = OFF) -> None:
        self.compile = compile
        """The stage's compile policy, for the teacher's forward (compiled when it moves to the device)."""
        self.alpha, self.temperature, self.hidden_weight = kd.alpha, kd.temperature, kd.hidden_weight
        self.task, self.policy, self.rt, self.teacher_spec = task, policy, rt, kd.teacher
        self.attention_weight, self.relation_heads = kd.attention_weight, kd.relation_heads
        live = self.hidden_weight or self.attention_weight  # the cache holds logits, not hidden states or Q/K/V
        self.use_cache = kd.cache and not live
        if kd.cache and live and rt.is_main:
            log.info("kd.hidden_weight or kd.attention_weight > 0: the teacher runs live every step "
                     "(the cache holds logits only)")
        self.teacher_qkv = Recorder(last_layer_projections(teacher)) if self.attention_weight else None
        self.student_qkv: Recorder | None = None
        # asked of both forwards (student and teacher): the hidden-state term needs their hidden states
        self.forward_kwargs = {"output_hidden_states": True} if self.hidden_weight else {}
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
        seen = dist.all_gather_objects((key, path.is_file()))
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
        shapes = next(s for s in dist.all_gather_objects({k: tuple(v.shape[1:]) for k, v in local.items()}) if s)
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
        if self.hidden_weight:
            wanted["hidden"] = outputs.hidden_states[-1]
        return wanted

    def watch_student(self, student: PreTrainedModel) -> None:
        """Hook the student's last layer's Q/K/V projections for the attention-relation term."""
        if self.attention_weight:
            self.student_qkv = Recorder(last_layer_projections(student))
            self.relation_heads = self.relation_heads or student.config.num_attention_heads

    # ------------------------------------------------------------------ loss
    def loss(self, student_outputs: ModelOutput, batch: dict, idx: torch.Tensor,
             student: torch.nn.Module | None = None) -> StepLoss:
        """The KD loss of a micro-batch and its named terms, each unweighted (logged as
        train/loss_<term>); `student` is the unwrapped student (its kd_projection)."""
        if self.cached is not None:
            teacher = {name: self._cached_rows(name, idx, batch["input_ids"].shape[1]) for name in self.task.kd_outputs}
        else:
            teacher = self._teacher_logits({k: v for k, v in batch.items()})
        pairs = self.task.kd_pairs(student_outputs, teacher, batch)
        distill = sum(kd_loss(s, t, self.temperature) for s, t in pairs) / len(pairs)
        task_loss = self.task.loss(student_outputs, batch).float()
        loss = self.alpha * distill + (1 - self.alpha) * task_loss
        terms = {"task": task_loss, "kd": distill}
        if self.hidden_weight:
            hidden = student_outputs.hidden_states[-1]
            projection = getattr(student, "kd_projection", None)
            if projection is not None:
                with self.policy.autocast():
                    hidden = projection(hidden)
            terms["hidden"] = hidden_mse(hidden, teacher["hidden"], batch["attention_mask"])
            loss = loss + self.hidden_weight * terms["hidden"]
        if self.attention_weight:
            student_qkv, teacher_qkv = self.student_qkv.take(), self.teacher_qkv.take()
            terms["attention"] = sum(relation_kl(student_qkv[n], teacher_qkv[n], self.relation_heads,
                                                 batch["attention_mask"]) for n in RELATIONS) / len(RELATIONS)
            loss = loss + self.attention_weight * terms["attention"]
        return StepLoss(loss, terms)
