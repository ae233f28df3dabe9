"""Typed configuration: dataclasses whose fields carry their meaning, loaded from YAML plus
dotted `key=value` overrides, validated before anything else runs.

Every problem is a `UserError` naming the key and the reason (exit code 2).
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.config.coerce import coerce
from pipeline.config.deepspeed_files import ds_config_file, shipped
from pipeline.config.documents import read_document
from pipeline.config.keys import did_you_mean, dotted_keys, unknown_key_hint
from pipeline.errors import UserError
from pipeline.tasks import REGISTRY

TASKS = tuple(REGISTRY)  # the task registry is the one list of task names
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "bf16-pure", "auto")
BACKENDS = ("auto", "single", "ddp", "deepspeed")
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead", "max-autotune")
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune"]
"""train.compile once settled: never auto."""
CHOICES = {"task": TASKS, "precision": PRECISIONS, "backend": BACKENDS, "train.compile": COMPILE_MODES}
"""The keys with a fixed set of values: validate() and the reference."""
RESUME_WORDS = ("never", "auto")
"""resume's values other than a checkpoint's path."""
KINDS = {"resume": f"{' | '.join(RESUME_WORDS)} | PATH"}
"""The type the reference shows for a key that takes some words or a value of its own."""


RECORD_PARTS = ("global_batch", "tokenizer")
"""Parts of a job's record (job_record.py) that are not config keys, as accept_changes names them."""
MAPPINGS = ("model_config", "task_options", "tracking.tags")


@dataclass
class DataConfig:
    train: str | None = None
    """Training file, `hub:ID[:CONFIG]`, or `samples` (the task's built-in synthetic sample set).
    Unset: the sample set, when no data key is given at all."""
    dev: str | None = None
    """Dev file (or hub:ID, or `samples`) for evaluation, best-model selection and early stopping.
    Unset: the sample set when no data key is given; refused when another data key is, so a user's
    training file is never judged on synthetic rows without a word."""
    test: str | None = None
    """Test file (or hub:ID, or `samples`) evaluated once with the best model. Unset: the sample
    set when no data key is given; refused when another data key is."""

    def source(self, split: str) -> str | None:
        """The split's file or hub id; None: the task's built-in sample set."""
        value = getattr(self, split)
        return None if value in (None, SAMPLES) else value


@dataclass
class TrainConfig:
    epochs: int | None = None
    """Passes over the training set; unset: the task's (3; error_cls 5, qa 8), settled when the job starts."""
    max_steps: int = -1
    """Stop after this many optimizer steps; -1 runs all epochs."""
    batch_size: int | Literal["auto"] = 16
    """Micro-batch per device (the global batch is batch_size * grad_accum * world_size). auto:
    the global batch of the default (16 * grad_accum * world_size) split into the largest
    micro-batch that fits this device at the job's longest rows (forward, backward and optimizer
    step, 10% margin), grad_accum raised to keep it, every rank agreeing; eval_batch_size found too
    (docs/small-gpus.md)."""
    eval_batch_size: int = 64
    """Batch per device for evaluation (found on its own under batch_size=auto)."""
    memory_limit_mb: int | None = None
    """Treat the device as having this many MiB: on a GPU the allocator refuses more for the whole
    job (torch.cuda.set_per_process_memory_fraction), so a large card behaves as a small one; on a
    CPU the limit batch_size=auto's trials count tensors against, and with a fixed batch_size one
    training step at the longest rows is counted before the job starts (out of memory past it, as
    a capped GPU). Unset: the device's own."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients are all-reduced only on the last one."""
    lr: float | None = None
    """Peak learning rate of AdamW; unset: 3e-4 for presets (trained from scratch), else the task's
    (5e-5; WikiQA 1e-4) (settled when the job starts)."""
    warmup_ratio: float = 0.1
    """Fraction of optimizer steps with linear warm-up; then linear decay to zero."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still logged)."""
    max_length: int = 128
    """Truncate inputs to this many tokens; batches are padded to their longest sequence, rounded
    up to a multiple of train.pad_to_multiple_of."""
    pad_to_multiple_of: int | None = None
    """Pad each batch's length up to a multiple of this (capped at max_length), so a job meets a
    few shapes: what compiled graphs and CUDA graphs need, and tensor-core friendly sizes. Unset:
    max_length / 8 (at least 8) when compiling, else 1 (no extra padding)."""
    compile: str = "auto"
    """torch.compile the trained module, the frozen teacher and evaluation: off | default |
    reduce-overhead (CUDA graphs) | max-autotune | auto (reduce-overhead on a GPU in one process, off on
    a CPU, under DeepSpeed and under DDP until its CUDA graphs pass the GPU check, as measured in
    benchmarks/README.md; the run's resolved.compile_reason says why). Compile time and the energy drawn
    meanwhile are logged apart (perf/compile_s) and left out of the rates; checkpoints are the same
    compiled or not."""
    gradient_checkpointing: bool = False
    """Recompute each encoder layer's activations in the backward pass instead of keeping them
    (non-reentrant activation checkpointing through transformers' own switch): far
    less activation memory for about one more forward pass of compute; the same losses (the RNG is
    restored for the recompute, so dropout draws the same masks). docs/small-gpus.md has the numbers."""
    group_by_length: bool | None = None
    """Batch sequences of similar length together (each mega-batch of 50 global batches sorted by
    length, cut into batches, the batches shuffled, the longest first): less padding computed,
    same epoch contents; 2-2.5x the samples/s on long-tailed comments. Unset: the task's default
    (Task.group_by_length), on where grouping kept the dev score within the seed spread and off
    where it did not (WikiQA's question-answer pairs: test MAP 0.79 vs 0.86) or was not measured
    - benchmarks/studies/README.md."""
    batch_tokens: int = 0
    """Batches by tokens instead of rows (fairseq's max_tokens): similar lengths together, each
    batch's padded size (longest x rows) within this budget; 0 = train.batch_size rows per batch.
    The global batch then varies; the LR schedule counts the epoch's actual batches."""
    eval_every: int = 0
    """Also evaluate on dev every this many optimizer steps (the Trainer's eval_steps), for the best
    model and early stopping as an epoch's end does: for a training set whose epoch is long. 0 = at
    each epoch's end only."""
    patience: int = 0
    """Stop after this many evaluations without a better one (the main metric, then the task's
    tie-breakers: docs/outputs.md); 0 = never stop early."""
    log_every: int = 10
    """Log train/loss, train/lr, train/grad_norm and the throughput since the last logged step
    every this many optimizer steps; without a terminal (a batch job's log), rank 0 also prints
    them in a line with the ETA."""
    num_workers: int | None = None
    """DataLoader worker processes per rank (persistent, pinned memory on a GPU). Unset: 2 on a
    GPU, where collating beside the device's work keeps it fed; 0 on a CPU, whose cores compute."""
    save_every: int = 0
    """Also checkpoint every this many optimizer steps (0 = only at each epoch end)."""
    keep_checkpoints: int = 2
    """Keep the newest K checkpoints."""
    max_nonfinite: int = 5
    """Stop with an error after this many consecutive non-finite losses."""


@dataclass
class KDConfig:
    teacher: str | None = None
    """Teacher model: a train stage's output directory (its best/), a hub id or a local model."""
    alpha: float = 0.5
    """Weight of the distillation term; (1 - alpha) weighs the task loss."""
    temperature: float = 2.0
    """Softmax temperature of the KD term (the term is scaled by T^2)."""
    cache: bool = True
    """Cache the teacher's logits on disk, keyed by teacher, data, tokenizer and max_length."""
    hidden_weight: float = 0.0
    """Weight of the hidden-state term (0 = off): MSE between the student's and the teacher's last
    hidden states over real tokens, through a learned linear projection when the widths differ.
    It needs the teacher's hidden states, so the teacher runs live (the cache holds logits only)."""
    attention_weight: float = 0.0
    """Weight of the attention-relation term (0 = off; MiniLMv2): KL between the teacher's and the
    student's query-query, key-key and value-value self-attention relations of their last layers,
    split into kd.relation_heads relation heads, so widths and head counts may differ. Q, K and V
    are read from the query/key/value projections as the model runs (SDPA or flash attention stay
    on). The teacher runs live (the cache holds logits only)."""
    relation_heads: int = 0
    """Relation heads of the attention-relation term (0 = the student's attention heads); must
    divide both the student's and the teacher's hidden size."""


@dataclass
class TrackingConfig:
    uri: str | None = None
    """MLflow tracking URI; unset = $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment name (one per study); unset = $MLFLOW_EXPERIMENT_NAME, else pipeline. The run's
    tags tracking.uri_from and tracking.experiment_from say which (config | env:VARIABLE | default)."""
    run_name: str | None = None
    """MLflow run name; unset = task-model-precision."""
    log_model: bool = False
    """Also log the best model as an MLflow model of the run (transformers flavor: a pipeline with its
    tokenizer, task and an input example, for mlflow.transformers.load_model and the registry)."""
    register_as: str | None = None
    """Register the logged model (tracking.log_model=true) in MLflow's Model Registry under this
    name: a new version per run, its description the run's main test score; load it with
    mlflow.pyfunc.load_model("models:/NAME/VERSION")."""
    tags: dict = field(default_factory=dict)
    """Extra run tags, e.g. tracking.tags.study=NAME (the study runner sets study and procedure)."""
    parent_run_id: str | None = None
    """Nest this stage's run under a parent run (the study runner's), as MLflow's UI shows it."""
    system_metrics: bool = True
    """MLflow system metrics (CPU, memory, GPU) on every node, tagged with a node id."""
    system_metrics_interval: float = 10.0
    """Seconds between system-metric samples."""


@dataclass
class InferConfig:
    bench: bool = True
    """At the end of a stage, measure what the best model costs to serve (rank 0, on the stage's
    device, a few seconds): parameters, size, latency, throughput, memory; the infer/* metrics."""
    batch_size: int = 32
    """The serving batch of the inference throughput figure (latency is at batch 1)."""
    budget_s: float = 5.0
    """Seconds of timed forward passes the inference benchmark may spend, over every precision and
    length (each still runs at least 10 batch-1 and 3 serving-batch passes). 5 gave the figures of
    20 within their run-to-run spread at half the stage's seconds (benchmarks/README.md, "Where a
    WikiQA job's time goes")."""


@dataclass
class Config:
    task: str = "sentiment"
    """One of sentiment, ner, error_cls, qa, wikiqa."""
    model: str | None = None
    """Hub id, local directory, `preset:NAME` or `from_teacher:N`; unset = the task's default."""
    model_config: dict = field(default_factory=dict)
    """Overrides applied to the model's config, e.g. model_config.hidden_dropout_prob=0."""
    task_options: dict = field(default_factory=dict)
    """Task-specific switches, e.g. task_options.binary=true for error_cls."""
    precision: str = "fp32"
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
        _check_data(self.data)
        t = self.train
        _check("train.epochs", t.epochs, t.epochs is None or t.epochs >= 1, "must be >= 1")
        _check("train.max_steps", t.max_steps, t.max_steps == -1 or t.max_steps >= 1, "must be -1 or >= 1")
        _check("train.batch_size", t.batch_size, t.batch_size == "auto" or t.batch_size >= 1, "must be >= 1 or auto")
        _check("train.batch_size", t.batch_size, t.batch_size != "auto" or not t.batch_tokens,
               f"auto finds a number of rows; train.batch_tokens={t.batch_tokens} batches by tokens")
        _check("train.memory_limit_mb", t.memory_limit_mb, t.memory_limit_mb is None or t.memory_limit_mb >= 1,
               "must be >= 1 (MiB)")
        _check("train.eval_batch_size", t.eval_batch_size, t.eval_batch_size >= 1, "must be >= 1")
        _check("train.grad_accum", t.grad_accum, t.grad_accum >= 1, "must be >= 1")
        _check("train.lr", t.lr, t.lr is None or t.lr > 0, "must be > 0")
        _check("train.warmup_ratio", t.warmup_ratio, 0 <= t.warmup_ratio < 1, "must be in [0, 1)")
        _check("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "must be >= 0")
        _check("train.max_grad_norm", t.max_grad_norm, t.max_grad_norm >= 0, "must be >= 0 (0 = no clipping)")
        _check("train.max_length", t.max_length, t.max_length >= 8, "must be >= 8")
        _check("train.batch_tokens", t.batch_tokens, t.batch_tokens == 0 or t.batch_tokens >= t.max_length,
               f"must be 0 (off) or >= train.max_length ({t.max_length}), so that the longest sequence fits")
        _check("train.patience", t.patience, t.patience >= 0, "must be >= 0 (0 = off)")
        _check("train.eval_every", t.eval_every, t.eval_every >= 0, "must be >= 0 (0 = epoch ends only)")
        _check("train.log_every", t.log_every, t.log_every >= 1, "must be >= 1")
        _check("train.num_workers", t.num_workers, t.num_workers is None or t.num_workers >= 0, "must be >= 0")
        _check("train.pad_to_multiple_of", t.pad_to_multiple_of, t.pad_to_multiple_of is None
               or t.pad_to_multiple_of >= 1, "must be >= 1 (1 = no extra padding)")
        _one_of("train.compile", t.compile)
        _check("train.save_every", t.save_every, t.save_every >= 0, "must be >= 0 (0 = epoch ends only)")
        _check("train.keep_checkpoints", t.keep_checkpoints, t.keep_checkpoints >= 1, "must be >= 1")
        _check("train.max_nonfinite", t.max_nonfinite, t.max_nonfinite >= 1, "must be >= 1")
        _check("resume", self.resume, self.resume in RESUME_WORDS or _path_like(self.resume),
               f"must be never | auto | a checkpoint's directory{did_you_mean(self.resume, RESUME_WORDS)}")
        for name in self.accepted_changes:
            _check("accept_changes", name, _acceptable(name), f"no such key{did_you_mean(name, ACCEPTABLE)}")
        _check("requested_world_size", self.requested_world_size, self.requested_world_size >= 0,
               "must be >= 0 (0 = as many processes as run)")
        _check("dist_timeout", self.dist_timeout, self.dist_timeout >= 1, "must be >= 1 (seconds)")
        _check("tracking.system_metrics_interval", self.tracking.system_metrics_interval,
               self.tracking.system_metrics_interval > 0, "must be > 0")
        _check("tracking.register_as", self.tracking.register_as, not self.tracking.register_as
               or self.tracking.log_model, "registers the logged model: set tracking.log_model=true too")
        _check("infer.batch_size", self.infer.batch_size, self.infer.batch_size >= 1, "must be >= 1")
        _check("infer.budget_s", self.infer.budget_s, self.infer.budget_s > 0, "must be > 0 (infer.bench=false: off)")
        _check("kd.alpha", self.kd.alpha, 0 <= self.kd.alpha <= 1, "must be in [0, 1]")
        _check("kd.temperature", self.kd.temperature, self.kd.temperature > 0, "must be > 0")
        _check("kd.hidden_weight", self.kd.hidden_weight, self.kd.hidden_weight >= 0, "must be >= 0 (0 = off)")
        _check("kd.attention_weight", self.kd.attention_weight, self.kd.attention_weight >= 0,
               "must be >= 0 (0 = off)")
        _check("kd.relation_heads", self.kd.relation_heads, self.kd.relation_heads >= 0,
               "must be >= 0 (0 = the student's attention heads)")
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
    """TrainConfig with every derived default filled in (pipeline.plan.settle makes it, once per
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
    params show, and what every part of a job reads (pipeline.plan.settle.Plan.cfg)."""

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
    if value not in CHOICES[key]:
        near = did_you_mean(value, CHOICES[key], default=functools.reduce(getattr, key.split("."), Config()))
        raise UserError(f"config: {key}={value}: must be one of {' | '.join(CHOICES[key])}{near}")


def _path_like(value: str) -> bool:
    """A resume value meant as a checkpoint's path (checked when the job starts), not a misspelt word."""
    return bool(value.strip()) and ("/" in value or Path(value).exists())


def _acceptable(name: str) -> bool:
    """A key accept_changes can name: a config key (one under a mapping such as model_config too)
    or a part of the job's record that is not a key (same_job.py)."""
    return name in ACCEPTABLE or any(name.startswith(f"{m}.") and len(name) > len(m) + 1 for m in MAPPINGS)


SAMPLES = "samples"
"""The data value that asks for the task's built-in synthetic sample set by name."""
DATA_USES = {"train": "training", "dev": "dev evaluation, best-model selection and early stopping",
             "test": "the test figures"}


def _check_data(data: DataConfig) -> None:
    """A split left unset beside a given one would silently be the built-in synthetic set: refused."""
    given = [split for split in DATA_USES if getattr(data, split) is not None]
    for split, use in DATA_USES.items():
        if given and getattr(data, split) is None:
            raise UserError(f"config: data.{split}: unset while data.{given[0]}={getattr(data, given[0])} is given: "
                            f"{use} would run on the built-in synthetic sample set; give data.{split}=FILE (or "
                            f"hub:ID), or data.{split}={SAMPLES} to use that set knowingly")


def _check(key: str, value: Any, ok: bool, reason: str) -> None:
    if not ok:
        raise UserError(f"config: {key}={value}: {reason}")


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
