"""A stage's parts, built before anything is written: config, device, precision, backend, data,
tokenizer and model (with the teacher under distillation), and the meters. Everything that can
be the user's fault fails here, before any MLflow run or output exists."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import PreTrainedTokenizerBase

from pipeline import models
from pipeline.config import Config
from pipeline.data import features
from pipeline.kd.distill import Distiller, build_distillation
from pipeline.measure.telemetry import StageMeters
from pipeline.runtime import precision
from pipeline.runtime.backend import Backend
from pipeline.runtime.dist import Runtime
from pipeline.runtime.factory import make_backend
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.tasks import get_task
from pipeline.tasks.base import SPLITS, Task
from pipeline.tracking import resolve_uri


@dataclass(frozen=True)
class Stage:
    """What build_stage() creates, before any MLflow run or output exists."""

    cfg: Config
    rt: Runtime
    kind: str
    """train | distill."""
    policy: PrecisionPolicy
    task: Task
    examples: dict
    features: dict
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module
    """The model being trained, unwrapped (Loop.wrapped is what the backend made of it)."""
    model_spec: str
    backend: Backend
    distiller: Distiller | None
    meters: StageMeters
    """Owns the job's throughput, energy and FLOP totals."""
    uri: str

    @property
    def out(self) -> Path:
        return Path(self.cfg.output_dir)


def resolve_config(cfg: Config, stage: str, rt: Runtime) -> tuple[Config, Task]:
    """The config with every default filled in for this device, task and kind of model, before
    any data or model loads. The distill stage's default student (from_teacher:N) needs the
    teacher, but only the kind of model matters to the defaults resolve() fills."""
    cfg = cfg.resolve(device_type=rt.device.type)  # compile, batch shapes, loader workers for this device
    task = get_task(cfg.task, cfg.task_options)
    planned_spec = cfg.model or (task.default_model if stage == "train" else "from_teacher:")
    return cfg.resolve(planned_spec, task), task


def build_stage(cfg: Config, stage: str, rt: Runtime) -> Stage:
    """Everything that can be the user's fault, before a run or an output exists."""
    policy = precision.resolve(cfg.precision, rt.device)
    cfg, task = resolve_config(cfg, stage, rt)
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
    if stage == "distill":
        model_spec, tokenizer, model, distiller = build_distillation(cfg, task, policy, rt, train_texts)
    else:
        model_spec = cfg.model or task.default_model
        tokenizer, model = models.build(model_spec, task, train_texts, cfg.model_config, cfg.train.max_length)
    prepared = {split: features.prepare_features(task, split, getattr(cfg.data, split), examples[split], tokenizer,
                                                 cfg.train.max_length, rt) for split in SPLITS}
    examples["train"].release()  # the builder's rows: the features are on disk now
    return Stage(cfg, rt, stage, policy, task, examples, prepared, tokenizer, model, model_spec, backend,
                 distiller, StageMeters(rt.device, policy.name, rt.world_size, cfg.train.compile != "off"), uri)
