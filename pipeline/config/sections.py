"""The configuration's sections: one dataclass per nested mapping of keys (data, train, kd,
tracking, infer), each field's meaning the docstring under it, and each section's own checks
(`validate`), so a section's keys and the rules on them are read in one place. The top level and
the loading are schema.py's.

Every problem is a `UserError` naming the key and the reason (exit code 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from pipeline.config.keys import did_you_mean
from pipeline.errors import UserError

SAMPLES = "samples"
"""The data value that asks for the task's built-in synthetic sample set by name."""
HOLDOUT = "holdout:"
"""data.dev's prefix for a fraction of the training rows held out."""
DEV_SKIP = "skip"
"""data.dev's value for no dev evaluation (`none` would read as unset)."""
HUB = "hub:"
"""A data value's prefix for a Hugging Face Hub dataset (each split reads its own hub split)."""
DATA_USES = {"train": "training", "dev": "dev evaluation, best-model selection and early stopping",
             "test": "the test figures"}
COMPILE_MODES = ("auto", "off", "default", "reduce-overhead", "max-autotune")
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune"]
"""train.compile once settled: never auto."""


def check(key: str, value: Any, ok: bool, reason: str) -> None:
    """Refuse key=value for the reason unless ok."""
    if not ok:
        raise UserError(f"config: {key}={value}: {reason}")


def one_of(key: str, value: str, choices: tuple[str, ...], default: str) -> None:
    """Refuse a value outside its key's fixed choices, with the nearest one."""
    if value not in choices:
        raise UserError(f"config: {key}={value}: must be one of {' | '.join(choices)}"
                        f"{did_you_mean(value, choices, default=default)}")


@dataclass
class DataConfig:
    train: str | None = None
    """Training file, `hub:ID[:CONFIG]`, or `samples` (the task's built-in synthetic sample set).
    Unset: the sample set, when no data key is given at all. Fewer than 100 rows to train on (a
    held-out dev's taken out) draw a one-line warning as the job starts."""
    dev: str | None = None
    """Dev file (or hub:ID, or `samples`) for evaluation, best-model selection and early stopping;
    `holdout:F[:SEED]`: a fraction F of the training rows held out (the same rows on every rank,
    every resume and every job seed; SEED picks another draw, default 0; WikiQA holds out whole
    questions), trained on no more;
    `skip`: no dev evaluation (the last model is the one kept; no early stopping, no eval_every).
    Unset: the sample set when no data key is given; refused when another data key is, so a user's
    training file is never judged on synthetic rows without a word."""
    test: str | None = None
    """Test file (or hub:ID, or `samples`) evaluated once with the best model. Unset: the sample
    set when no data key is given; when another data key is, no test evaluation (no test/ figures,
    said once on screen and by the run's tag no_test). The training file itself: said once on
    screen and by the run's tag test_is_train (its test figures are of rows trained on)."""

    def source(self, split: str) -> str | None:
        """The split's file or hub id; None: the task's built-in sample set. Only for a split read
        from a source (reads)."""
        assert self.reads(split), f"data.{split}={getattr(self, split)} is not read from a file"
        value = getattr(self, split)
        return None if value in (None, SAMPLES) else value

    def rows_from(self, split: str) -> str:
        """The split whose source a split's rows come from: its own, or train for a held-out dev."""
        return "train" if split == "dev" and self.holdout() is not None else split

    def reads(self, split: str) -> bool:
        """Whether the split's rows are read from a file, the hub or the sample set (not held out of
        the training split, not absent)."""
        return self.evaluates(split) and self.rows_from(split) == split

    def evaluates(self, split: str) -> bool:
        """Whether the job has this split: dev unless `skip`; test unless unset beside a given key."""
        if split == "dev":
            return self.dev != DEV_SKIP
        if split == "test":
            return self.test is not None or not self.given()
        return True

    def given(self) -> list[str]:
        return [split for split in DATA_USES if getattr(self, split) is not None]

    def holdout(self) -> tuple[float, int] | None:
        """data.dev=holdout:F[:SEED] as (F, SEED); None for any other dev."""
        if not (self.dev or "").startswith(HOLDOUT):
            return None
        fraction, _, seed = self.dev[len(HOLDOUT):].partition(":")
        return float(fraction), int(seed or 0)

    def tests_on_train(self) -> bool:
        """Whether data.test is data.train's own file (the same path, resolved): the test figures
        are then of rows the model trained on. The sample set and a hub dataset have a test split
        of their own."""
        files = (self.train, self.test)
        if any(f is None or f == SAMPLES or f.startswith(HUB) for f in files):
            return False
        return Path(self.train).resolve() == Path(self.test).resolve()

    def holdout_name(self) -> str:
        """The held-out draw as holdout:F:SEED, its seed written out (tags, dataset names)."""
        return "{}{}:{}".format(HOLDOUT, *self.holdout())

    def validate(self) -> None:
        """A train or dev split left unset beside a given one would silently be the built-in
        synthetic set: refused. A test split left unset means no test figures."""
        given = self.given()
        if (self.dev or "").startswith(HOLDOUT):
            try:
                fraction, seed = self.holdout()
            except ValueError:
                fraction = seed = None
            check("data.dev", self.dev, fraction is not None and 0 < fraction < 1 and seed >= 0,
                  "holdout:F[:SEED] holds out a fraction 0 < F < 1 of the training rows (e.g. holdout:0.1)")
        for split, use in DATA_USES.items():
            if split == "test" or not given or getattr(self, split) is not None:
                continue
            instead = (f", data.dev={HOLDOUT}F (a fraction of the training rows) or data.dev={DEV_SKIP} "
                       "(`none` reads as unset)") if split == "dev" else ""
            raise UserError(f"config: data.{split}: unset while data.{given[0]}={getattr(self, given[0])} is "
                            f"given: {use} would run on the built-in synthetic sample set; give data.{split}=FILE "
                            f"(or hub:ID){instead}, or data.{split}={SAMPLES} to use that set knowingly")


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

    def validate(self) -> None:
        t = self
        check("train.epochs", t.epochs, t.epochs is None or t.epochs >= 1, "must be >= 1")
        check("train.max_steps", t.max_steps, t.max_steps == -1 or t.max_steps >= 1, "must be -1 or >= 1")
        check("train.batch_size", t.batch_size, t.batch_size == "auto" or t.batch_size >= 1, "must be >= 1 or auto")
        check("train.batch_size", t.batch_size, t.batch_size != "auto" or not t.batch_tokens,
              f"auto finds a number of rows; train.batch_tokens={t.batch_tokens} batches by tokens")
        check("train.memory_limit_mb", t.memory_limit_mb, t.memory_limit_mb is None or t.memory_limit_mb >= 1,
              "must be >= 1 (MiB)")
        check("train.eval_batch_size", t.eval_batch_size, t.eval_batch_size >= 1, "must be >= 1")
        check("train.grad_accum", t.grad_accum, t.grad_accum >= 1, "must be >= 1")
        check("train.lr", t.lr, t.lr is None or t.lr > 0, "must be > 0")
        check("train.warmup_ratio", t.warmup_ratio, 0 <= t.warmup_ratio < 1, "must be in [0, 1)")
        check("train.weight_decay", t.weight_decay, t.weight_decay >= 0, "must be >= 0")
        check("train.max_grad_norm", t.max_grad_norm, t.max_grad_norm >= 0, "must be >= 0 (0 = no clipping)")
        check("train.max_length", t.max_length, t.max_length >= 8, "must be >= 8")
        check("train.batch_tokens", t.batch_tokens, t.batch_tokens == 0 or t.batch_tokens >= t.max_length,
              f"must be 0 (off) or >= train.max_length ({t.max_length}), so that the longest sequence fits")
        check("train.patience", t.patience, t.patience >= 0, "must be >= 0 (0 = off)")
        check("train.eval_every", t.eval_every, t.eval_every >= 0, "must be >= 0 (0 = epoch ends only)")
        check("train.log_every", t.log_every, t.log_every >= 1, "must be >= 1")
        check("train.num_workers", t.num_workers, t.num_workers is None or t.num_workers >= 0, "must be >= 0")
        check("train.pad_to_multiple_of", t.pad_to_multiple_of, t.pad_to_multiple_of is None
              or t.pad_to_multiple_of >= 1, "must be >= 1 (1 = no extra padding)")
        one_of("train.compile", t.compile, COMPILE_MODES, default=TrainConfig.compile)
        check("train.save_every", t.save_every, t.save_every >= 0, "must be >= 0 (0 = epoch ends only)")
        check("train.keep_checkpoints", t.keep_checkpoints, t.keep_checkpoints >= 1, "must be >= 1")
        check("train.max_nonfinite", t.max_nonfinite, t.max_nonfinite >= 1, "must be >= 1")

def layer_pairs(spec: str) -> list[tuple[int, int]]:
    """kd.layer_map as (student layer, teacher layer) pairs, checked as far as it can be without the
    models (kd/terms.layer_map checks them against both): its form, layers from 1, increasing on
    both sides."""
    where = f"config: kd.layer_map={spec}"
    try:
        pairs = [tuple(int(x) for x in item.split(":")) for item in str(spec).split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise UserError(f"{where}: expected student:teacher layer pairs, e.g. 1:2,2:4,3:6")
    for s, t in pairs:
        for side, layer in (("student", s), ("teacher", t)):
            if layer < 1:
                raise UserError(f"{where}: {side} layer {layer} is out of range (layers are numbered from 1)")
    if any(a[0] >= b[0] or a[1] >= b[1] for a, b in zip(pairs, pairs[1:])):
        raise UserError(f"{where}: the layers must increase on both sides")
    return pairs


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
    """Weight of the hidden-state term (0 = off; TinyBERT): MSE between the student's and the
    teacher's hidden states of the kd.layer_map pairs and of the embedding layer (0 -> 0), over
    real tokens, averaged over those layers; through a learned linear projection per pair when the
    widths differ (trained with the student, left out of best/; refused under DeepSpeed ZeRO-3,
    which cannot gather them outside the model's forward). It needs the teacher's hidden states,
    so the teacher runs live (the cache holds logits only)."""
    attention_weight: float = 0.0
    """Weight of the attention-relation term (0 = off; MiniLMv2): KL between the teacher's and the
    student's query-query, key-key and value-value self-attention relations of the kd.layer_map
    pairs, split into kd.relation_heads relation heads (so widths and head counts may differ),
    averaged over the layers. Q, K and V are read from each mapped layer's query/key/value
    projections as the model runs (SDPA or flash attention stay on). The teacher runs live (the
    cache holds logits only)."""
    relation_heads: int = 0
    """Relation heads of the attention-relation term (0 = the student's attention heads); must
    divide both the student's and the teacher's hidden size."""
    layer_map: str | None = None
    """Student layer -> teacher layer pairs of the layer-wise terms (kd.hidden_weight,
    kd.attention_weight), numbered from 1 and increasing on both sides, e.g. 1:4,2:8,3:12 (quote
    it in YAML); unset = uniform (TinyBERT): student layer i -> teacher layer i*T/S of a T-layer
    teacher and an S-layer student, the last to the last. Its form is checked as the config loads,
    its layers against both models at set-up, whether or not a layer-wise term is on."""

    def validate(self) -> None:
        if self.layer_map:
            layer_pairs(self.layer_map)
        check("kd.alpha", self.alpha, 0 <= self.alpha <= 1, "must be in [0, 1]")
        check("kd.temperature", self.temperature, self.temperature > 0, "must be > 0")
        for name in (f.name for f in fields(self) if f.name.endswith("_weight")):  # a term's (kd/registry.py)
            check(f"kd.{name}", getattr(self, name), getattr(self, name) >= 0, "must be >= 0 (0 = off)")
        check("kd.relation_heads", self.relation_heads, self.relation_heads >= 0,
              "must be >= 0 (0 = the student's attention heads)")

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

    def validate(self) -> None:
        check("tracking.system_metrics_interval", self.system_metrics_interval, self.system_metrics_interval > 0,
              "must be > 0")
        check("tracking.register_as", self.register_as, not self.register_as or self.log_model,
              "registers the logged model: set tracking.log_model=true too")

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

    def validate(self) -> None:
        check("infer.batch_size", self.batch_size, self.batch_size >= 1, "must be >= 1")
        check("infer.budget_s", self.budget_s, self.budget_s > 0, "must be > 0 (infer.bench=false: off)")
