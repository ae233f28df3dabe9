"""Knowledge distillation: the frozen teacher, the KD loss, the teacher-logit cache, and the
DistilBERT-style student initialisation (`model=from_teacher:N`).

loss = alpha * T^2 * KL(teacher || student at temperature T) + (1 - alpha) * task loss,
computed in fp32 from log-probabilities (log_target=True), so 16-bit logits never produce
inf or NaN. Per row for sentence tasks, per labelled token for NER, over start and end
positions for QA (Task.kd_pairs says which logits pair up). With kd.hidden_weight > 0 the loss
adds hidden_weight * MSE(last hidden states) over real tokens (TinyBERT-style), through a
learned projection when the student is narrower than the teacher.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from pipeline import models
from pipeline.config import Config, KDConfig
from pipeline.errors import UserError
from pipeline.fsutil import atomic_dir, cache_root
from pipeline.runtime import dist

log = logging.getLogger("pipeline")
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


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


def attach_projection(student, teacher) -> bool:
    """A learned student-width -> teacher-width map for the hidden-state term, as a submodule of
    the student: it trains, syncs and checkpoints with it, and save_pretrained leaves it out."""
    width, teacher_width = student.config.hidden_size, teacher.config.hidden_size
    if width == teacher_width:
        return False
    student.kd_projection = torch.nn.Linear(width, teacher_width)
    student._keys_to_ignore_on_save = set(student._keys_to_ignore_on_save or ()) | {
        "kd_projection.weight", "kd_projection.bias"}
    return True


def load_teacher(spec: str, task, overrides: dict):
    """(tokenizer, model) of the teacher: a train stage's output dir (its best/), hub id or local model."""
    path = Path(spec).expanduser()
    if (path / "best" / "config.json").is_file():
        spec = str(path / "best")
    try:
        return models.build(spec, task, [], overrides, max_length=512, teacher=True)
    except UserError as e:
        raise UserError(str(e).replace("config: model=", "config: kd.teacher=", 1)) from None


def student_from_teacher(n_layers: int, teacher, task):
    """The teacher's embeddings, head and N of its layers, evenly spaced (DistilBERT took
    every other layer of BERT-base: 0, 2, ..., 10 for N=6)."""
    total = teacher.config.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise UserError(f"config: model=from_teacher:{n_layers}: the teacher has {total} layers")
    chosen = [i * total // n_layers for i in range(n_layers)]
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


def build_distillation(cfg: Config, task, policy, rt, train_texts: list[str]):
    """(student spec, tokenizer, student, Distiller) of a `distill` stage; every check that can
    be the user's fault happens here, before any run exists."""
    if not cfg.kd.teacher:
        raise UserError("config: kd.teacher: required by distill (a train stage's output_dir, hub id or local model)")
    teacher_tokenizer, teacher = load_teacher(cfg.kd.teacher, task, cfg.model_config)
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
    distiller = Distiller(cfg.kd, cfg.train.eval_batch_size, task, policy, rt, teacher)
    if cfg.kd.hidden_weight and attach_projection(student, teacher) and rt.is_main:
        log.info("hidden-state term: a learned projection %d -> %d", student.config.hidden_size,
                 teacher.config.hidden_size)
    return spec, tokenizer, student, distiller


class Distiller:
    """Frozen teacher outside DDP/DeepSpeed; logits from its cache. With the cache the teacher
    goes to the device only for rank 0's pass on a cache miss and is dropped once the cache is
    loaded, so its memory is never charged to the student's peak; a live teacher (no cache, or
    the hidden-state term) sits on this rank's device."""

    def __init__(self, kd: KDConfig, eval_batch_size: int, task, policy, rt, teacher):
        self.alpha, self.temperature, self.hidden_weight = kd.alpha, kd.temperature, kd.hidden_weight
        self.task, self.policy, self.rt = task, policy, rt
        self.use_cache = kd.cache and not self.hidden_weight  # the cache holds logits, not hidden states
        if kd.cache and self.hidden_weight and rt.is_main:
            log.info("kd.hidden_weight > 0: the teacher runs live every step (the cache holds logits only)")
        # asked of both forwards (student and teacher): the hidden-state term needs their hidden states
        self.forward_kwargs = {"output_hidden_states": True} if self.hidden_weight else {}
        self.eval_batch_size = eval_batch_size
        # eval mode (no dropout), no gradients; on the device in the policy's compute dtype when it runs
        self.teacher = teacher.eval().requires_grad_(False)
        if not self.use_cache:
            self._teacher_to_device()
        self.cached: dict[str, torch.Tensor] | None = None
        self.cache_hit: bool | None = None

    # ------------------------------------------------------------------ cache
    def prepare(self, features, collate, max_length: int, tokenizer) -> None:
        """Compute (or load) the teacher's outputs for every training feature, once."""
        if not self.use_cache:
            return
        key = self.fingerprint(features, tokenizer, max_length)
        path = cache_root() / "teacher_logits" / key / "logits.safetensors"
        self.cache_hit = path.is_file()
        if not self.cache_hit and self.rt.is_main:
            log.info("teacher-logit cache miss: running the teacher over %d training features", len(features))
            self._teacher_to_device()
            logits = self._teacher_pass(features, collate, max_length)
            with atomic_dir(path.parent) as tmp:
                save_file({k: v.to(torch.float16).contiguous() for k, v in logits.items()}, tmp / path.name)
        dist.barrier()  # the other ranks wait for rank 0's file
        self.cached = load_file(path)
        self.teacher = None  # the cache answers from here on: free the teacher's memory
        if self.rt.device.type == "cuda":
            torch.cuda.empty_cache()  # give its blocks back, out of the reserved-memory figure too

    def _teacher_to_device(self) -> None:
        self.teacher = self.teacher.to(self.rt.device, dtype=self.policy.compute_dtype)

    def fingerprint(self, features, tokenizer, max_length: int) -> str:
        h = hashlib.sha256()
        # the policy: a bf16 teacher's logits differ from an fp32 teacher's
        h.update(f"{self.task.name}|{max_length}|{sorted(self.task.options.items())}|{self.policy.name}".encode())
        for name, tensor in sorted(self.teacher.state_dict().items()):
            h.update(name.encode())
            h.update(tensor.detach().float().cpu().numpy().tobytes())
        h.update(str(sorted(tokenizer.get_vocab().items())).encode())
        h.update(features._fingerprint.encode() if getattr(features, "_fingerprint", None) else b"")
        for column in ("input_ids", "labels", "start_positions", "end_positions"):
            if column in features.column_names:
                h.update(str(features[column]).encode())
        return h.hexdigest()[:32]

    @torch.inference_mode()
    def _teacher_pass(self, features, collate, max_length: int) -> dict[str, torch.Tensor]:
        out: dict[str, list] = {}
        for start in range(0, len(features), self.eval_batch_size):
            batch = collate([features[i] for i in range(start, min(start + self.eval_batch_size, len(features)))])
            batch.pop("idx")
            for name, value in self._teacher_logits(batch).items():
                value = value.float().cpu()
                if self.task.kd_outputs[name]:  # per-token: pad [B, L, ...] to max_length, masked out
                    pad = [0, 0] * (value.dim() - 2) + [0, max_length - value.shape[1]]
                    value = F.pad(value, pad, value=-1e4)
                out.setdefault(name, []).append(value)
        return {name: torch.cat(parts) for name, parts in out.items()}

    def _teacher_logits(self, batch) -> dict[str, torch.Tensor]:
        inputs = {k: v.to(self.rt.device) for k, v in batch.items() if k in MODEL_INPUTS}
        with torch.inference_mode(), self.policy.autocast():
            outputs = self.teacher(**inputs, **self.forward_kwargs)
        wanted = {name: outputs[name] for name in self.task.kd_outputs}
        if self.hidden_weight:
            wanted["hidden"] = outputs.hidden_states[-1]
        return wanted

    # ------------------------------------------------------------------ loss
    def loss(self, student_outputs, batch: dict, idx: torch.Tensor, student=None) -> torch.Tensor:
        """The KD loss of a micro-batch; `student` is the unwrapped student (its kd_projection)."""
        if self.cached is not None:
            length = batch["input_ids"].shape[1]
            teacher = {name: (rows[:, :length] if self.task.kd_outputs[name] else rows).to(self.rt.device)
                       for name in self.task.kd_outputs for rows in [self.cached[name][idx]]}
        else:
            teacher = self._teacher_logits({k: v for k, v in batch.items()})
        pairs = self.task.kd_pairs(student_outputs, teacher, batch)
        distill = sum(kd_loss(s, t, self.temperature) for s, t in pairs) / len(pairs)
        loss = self.alpha * distill + (1 - self.alpha) * student_outputs.loss.float()
        if self.hidden_weight:
            hidden = student_outputs.hidden_states[-1]
            projection = getattr(student, "kd_projection", None)
            if projection is not None:
                with self.policy.autocast():
                    hidden = projection(hidden)
            loss = loss + self.hidden_weight * hidden_mse(hidden, teacher["hidden"], batch["attention_mask"])
        return loss
