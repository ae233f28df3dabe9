"""Typed configuration: the top-level keys (the sections are sections.py's), loaded from YAML plus
dotted `key=value` overrides, validated before anything else runs.

Every problem is a `UserError` naming the key and the reason (exit code 2).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.config.coerce import coerce
from pipeline.config.deepspeed_files import ds_config_file, shipped
from pipeline.config.documents import read_document
from pipeline.config.keys import did_you_mean, dotted_keys, unknown_key_hint
from pipeline.config.precision_modes import DEFAULT as DEFAULT_PRECISION
from pipeline.config.precision_modes import names as precision_names
from pipeline.config.secrets import redact_config
from pipeline.config.sections import (
    COMPILE_MODES,
    CompileMode,
    DataConfig,
    InferConfig,
    KDConfig,
    TrackingConfig,
    TrainConfig,
)
from pipeline.config.sections import check as _check
from pipeline.errors import UserError
from pipeline.tasks import REGISTRY

TASKS = tuple(REGISTRY)  # the task registry is the one list of task names
BACKENDS = ("auto", "single", "ddp", "deepspeed")


def choices() -> dict[str, tuple[str, ...]]:
    """The keys with a fixed set of values: validate() and the reference (the precisions as the
    registry holds them when asked)."""
    return {"task": TASKS, "precision": precision_names(), "backend": BACKENDS, "train.compile": COMPILE_MODES}


RESUME_WORDS = ("never", "auto")
"""resume's values other than a checkpoint's path."""
VALUE_FORMS = {"resume": f"{' | '.join(RESUME_WORDS)} | PATH"}
"""The type the reference shows for a key that takes some words or a value of its own."""


RECORD_PARTS = ("global_batch", "tokenizer")
"""Parts of a job's record (job_record.py) that are not config keys, as accept_changes names them."""
MAPPINGS = ("model_config", "task_options", "tracking.tags")


@dataclass
class Config:
    task: str = "sentiment"
    """One of sentiment, ner, error_cls, qa, wikiqa."""
    model: str | None = None
    """Hub id, local directory, `preset:NAME` or `from_teacher:N`; unset = the task's default
    (distill: from_teacher: half the teacher's layers). `from_teacher:N` (distill) is N of the
    teacher's layers, evenly spaced, with its embeddings and head; model_config.hidden_size,
    num_attention_heads and intermediate_size make it narrower (unset: the teacher's width; heads
    unset keep the teacher's head size, the feed-forward its ratio to the width), each weight then
    the teacher's evenly spaced slice with attention heads whole (weight selection; the run's
    student.init tag says which init ran). A width the teacher cannot be sliced to (wider than
    the teacher's, heads not dividing it or wider than the teacher's heads; a hidden size with
    heads unset not a multiple of the teacher's head size) is refused, naming the key given and
    nearby values that would fit."""
    model_config: dict = field(default_factory=dict)
    """Overrides applied to the model's config, e.g. model_config.hidden_dropout_prob=0 (with
    model=from_teacher:N the width keys shape the student only, the others both models). A
    hidden_size or num_attention_heads that leaves the heads not dividing the hidden size is
    refused in one line naming the key given and nearby values that would fit."""
    task_options: dict = field(default_factory=dict)
    """Task-specific switches, e.g. task_options.binary=true for error_cls."""
    precision: str = DEFAULT_PRECISION
    """fp32 (strict, TF32 off) | tf32 | fp16 (autocast + dynamic loss scaling) | bf16 (autocast) |
    bf16-pure (the module in bf16, fp32 master weights and moments in the optimizer; torch backend) |
    auto."""
    backend: str = "auto"
    """auto (from the launcher's environment) | single | ddp | deepspeed."""
    deepspeed: str | None = None
    """A DeepSpeed JSON config: a path, or a shipped config by name (zero0 ... zero3, zero2_offload;
    unset = zero2); "auto" values are filled from this config."""
    requested_world_size: int = 0
    """The number of processes the job's global batch was planned for; 0 = as many as run. When
    fewer run (fewer devices than asked for), grad_accum is multiplied to keep the global batch."""
    fallback: bool = True
    """Run on the devices there are when a job asks for more (fewer processes, same global batch,
    a warning and tag fallback=true); false refuses such a job instead (exit 2)."""
    dist_timeout: int = 1800
    """Seconds a collective may wait for the other ranks (the process group's timeout), e.g. while
    one rank prepares data; as the Hugging Face Trainer's ddp_timeout."""
    seed: int = 42
    """Seed for model init, data order and (plus the rank) dropout."""
    resume: str = "never"
    """never | auto (continue from the newest complete checkpoint in output_dir, if any, when it
    is the same job: the same settings, data, global batch and precision; docs/faults.md) | PATH
    (continue from that checkpoint, OUTPUT_DIR/checkpoints/step-N, of this same job; the checkpoints
    after it are removed, best/ holds its best model again)."""
    accept_changes: str | None = None
    """Comma-separated keys a resumed job may continue with although they differ from its
    checkpoint's (e.g. train.lr, data.train, global_batch, tokenizer): the run then mixes two
    settings, and says so (tag resumed_with_changes, a param per change)."""
    output_dir: str | None = None
    """Where config.yaml, metrics.json, best/ and the journal go; unset = outputs/TASK-MODEL-PRECISION
    (a distill stage's ends -kd-TEACHER; settled when the job starts). A job that starts over there
    is refused while it holds another job's outputs, unless overwrite=true."""
    overwrite: bool = False
    """Let a job start over in an output_dir that holds finished outputs or another job's
    checkpoints, removing them. Without it the same finished job asked for again keeps its outputs
    and says so (exit 0); the same job's checkpoints with resume=never are replaced."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data files: one per split, each a file in the dataset's format or a hub dataset."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The loop: batches, optimizer and schedule, compilation, evaluation, checkpoints."""
    kd: KDConfig = field(default_factory=KDConfig)
    """Knowledge distillation (the distill stage): the teacher and the loss terms."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """MLflow: where runs are logged, their names and tags, system metrics."""
    infer: InferConfig = field(default_factory=InferConfig)
    """The inference benchmark of the best model at the end of a stage (docs/outputs.md)."""

    def validate(self) -> Config:
        """Check every key (a UserError naming the first bad one); changes nothing."""
        _one_of("task", self.task)
        _one_of("precision", self.precision)
        _one_of("backend", self.backend)
        for section in (self.data, self.train, self.kd, self.tracking, self.infer):
            section.validate()
        if not self.data.evaluates("dev"):
            for key in ("patience", "eval_every"):
                _check(f"train.{key}", getattr(self.train, key), not getattr(self.train, key),
                       f"evaluates dev, and data.dev={self.data.dev}: set data.dev or train.{key}=0")
        _check("resume", self.resume, self.resume in RESUME_WORDS or _path_like(self.resume),
               f"must be never | auto | a checkpoint's directory{did_you_mean(self.resume, RESUME_WORDS)}")
        for name in self.accepted_changes:
            _check("accept_changes", name, _acceptable(name), f"no such key{did_you_mean(name, ACCEPTABLE)}")
        _check("requested_world_size", self.requested_world_size, self.requested_world_size >= 0,
               "must be >= 0 (0 = as many processes as run)")
        _check("dist_timeout", self.dist_timeout, self.dist_timeout >= 1, "must be >= 1 (seconds)")
        if self.deepspeed is not None and ds_config_file(self.deepspeed) is None:
            raise UserError(f"config: deepspeed={self.deepspeed}: no such file, nor a shipped config "
                            f"({', '.join(shipped())})")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def accepted_changes(self) -> list[str]:
        return [name.strip() for name in (self.accept_changes or "").split(",") if name.strip()]


@dataclass(kw_only=True)
class SettledTrain(TrainConfig):
    """TrainConfig with every derived default filled in (pipeline.job.plan makes it, once per
    job): what an unset key or `auto` turned into on this device, for this task and model."""

    epochs: int
    batch_size: int
    lr: float
    pad_to_multiple_of: int
    compile: CompileMode
    group_by_length: bool
    num_workers: int

    def __post_init__(self) -> None:
        unsettled = [k for k in ("epochs", "lr", "pad_to_multiple_of", "group_by_length", "num_workers")
                     if getattr(self, k) is None] + [k for k in ("compile", "batch_size") if getattr(self, k) == "auto"]
        if unsettled:
            raise ValueError(f"SettledTrain: {', '.join(unsettled)} not settled")


@dataclass(kw_only=True)
class SettledConfig(Config):
    """Config with its train section settled and output_dir known: what config.yaml and the run's
    params show, and what every part of a job reads (pipeline.job.plan.Plan.cfg)."""

    train: SettledTrain
    output_dir: str


ACCEPTABLE = (*dotted_keys(Config), *RECORD_PARTS)


def load_config(path: str | None = None, overrides: list[str] = ()) -> Config:
    """YAML file (optional) then `a.b=value` overrides, coerced to the fields' types."""
    raw: dict = {}
    if path is not None:
        raw = read_document(Path(path), f"config: {path}") or {}
        if not isinstance(raw, dict):
            raise UserError(f"config: {path}: the top level must be a mapping of keys")
    cfg = _build(Config, raw, prefix="")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"config: override {item!r}: expected key=value")
        _set_dotted(cfg, key.strip(), value)
    return cfg.validate()


def to_record(settled: SettledConfig) -> dict[str, Any]:
    """The settled config as a job's record holds it (JobRecord.config): flattened to dotted keys,
    secrets masked as config.yaml masks them (no secrets in output_dir), an empty mapping
    (model_config={}) no key, and every value as JSON reads it back."""
    flat = {k: v for k, v in flatten(redact_config(settled.to_dict())).items() if v != {}}
    return json.loads(json.dumps(flat, default=str))


def from_record(config: dict[str, Any]) -> SettledConfig:
    """The settled config a job's record holds (to_record) as the SettledConfig the job ran with.
    Not validated again: it is what ran (a DeepSpeed file it named may be gone since); a key this
    version does not know, or a value of the wrong type, is a UserError naming it."""
    nested: dict[str, Any] = {}
    for key, value in config.items():
        *parts, last = key.split(".")  # under a mapping too, as a dotted override nests its keys
        node = nested
        for part in parts:
            node = node.setdefault(part, {})
        node[last] = value
    cfg = _build(Config, nested, prefix="")
    return SettledConfig(**{**shallow_fields(cfg), "train": SettledTrain(**shallow_fields(cfg.train))})


def shallow_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, shallow (nested sections stay the same objects): a section rebuilt as
    its settled kind."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} -> {'train.lr': 1}; used for MLflow params."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# ---------------------------------------------------------------- internals


def _one_of(key: str, value: str) -> None:
    allowed = choices()[key]
    if value not in allowed:
        near = did_you_mean(value, allowed, default=functools.reduce(getattr, key.split("."), Config()))
        raise UserError(f"config: {key}={value}: must be one of {' | '.join(allowed)}{near}")


def _path_like(value: str) -> bool:
    """A resume value meant as a checkpoint's path (checked when the job starts), not a misspelt word."""
    return bool(value.strip()) and ("/" in value or Path(value).exists())


def _acceptable(name: str) -> bool:
    """A key accept_changes can name: a config key (one under a mapping such as model_config too)
    or a part of the job's record that is not a key (same_job.py)."""
    return name in ACCEPTABLE or any(name.startswith(f"{m}.") and len(name) > len(m) + 1 for m in MAPPINGS)


def _build(cls, raw: dict, prefix: str):
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            hint = unknown_key_hint(f"{prefix}{key}", dotted_keys(Config))
            raise UserError(f"config: unknown key '{prefix}{key}'{hint}")
    kwargs = {}
    for name in known:
        if name not in raw:
            continue
        kind = hints[name]
        value = raw[name]
        if dataclasses.is_dataclass(kind):
            if not isinstance(value, dict):
                raise UserError(f"config: {prefix}{name}: expected a mapping of keys")
            kwargs[name] = _build(kind, value, prefix=f"{prefix}{name}.")
        else:
            kwargs[name] = coerce(f"{prefix}{name}", value, kind, from_text=False)
    return cls(**kwargs)


def _set_dotted(cfg: Config, key: str, text: str) -> None:
    obj: Any = cfg
    parts = key.split(".")
    for i, part in enumerate(parts):
        path = ".".join(parts[: i + 1])
        if isinstance(obj, dict):  # free-form dicts (model_config, task_options) take any sub-key
            if i == len(parts) - 1:
                obj[part] = yaml.safe_load(text) if text.strip() else text
            else:
                obj = obj.setdefault(part, {})
            continue
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            raise UserError(f"config: unknown key '{path}'{unknown_key_hint(path, dotted_keys(Config))}")
        if i == len(parts) - 1:
            kind = typing.get_type_hints(type(obj))[part]
            if dataclasses.is_dataclass(kind):
                raise UserError(f"config: {path}: is a section; set one of its keys ({path}.KEY=VALUE)")
            setattr(obj, part, coerce(path, text, kind, from_text=True))
        else:
            obj = getattr(obj, part)
