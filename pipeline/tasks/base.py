"""The Task interface: everything that differs between tasks lives behind it.

read (file in the dataset's own format, or hub:ID[:CONFIG]) -> validate -> normalize ->
featurize (tokenize) -> collate (dynamic padding) -> model head -> predictions -> metrics.
A data problem is a UserError naming file, row and reason, raised before training starts.
The readers the tasks share are in readers.py, the worker processes in workers.py and the
built-in sample sets in samples/.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

from pipeline.errors import UserError
from pipeline.tasks.readers import load_hub_split
from pipeline.tasks.samples import ensure_samples
from pipeline.tasks.workers import worker_count

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import ModelOutput

SPLITS = ("train", "dev", "test")

Collate = Callable[[list[dict]], dict[str, torch.Tensor]]
"""Batches of features -> dict of tensors (Task.collator)."""


class Task(ABC):
    name: ClassVar[str]
    main_metric: ClassVar[str]
    """The key of metrics() that early stopping and eval/main use."""
    tie_breakers: ClassVar[tuple[str, ...]] = ()
    """Keys of metrics() that choose the best epoch where the main metric ties, in order, higher
    being better; after them the lower dev loss (job/parts/best_model.py)."""
    default_model: ClassVar[str] = "preset:bangla-small"
    model_class: ClassVar[Any] = AutoModelForSequenceClassification
    serving_task: ClassVar[str | None] = "text-classification"
    """The transformers pipeline that serves the model: tracking.log_model logs best/ as one
    (MLflow's transformers flavor); None where transformers has no such pipeline (best/ is then
    logged as plain files)."""
    featurize_reads_datasets: ClassVar[bool] = False
    """featurize() also takes the prepared training examples as the memory-mapped datasets.Dataset
    they are saved as (and maps over it on disk), so the builder drops their Python rows first."""
    holdout_group: ClassVar[str | None] = None
    """The example field whose rows data.dev=holdout:F keeps on one side (data/holdout.py); None:
    each row on its own."""
    group_by_length: ClassVar[bool] = False
    """train.group_by_length when the config leaves it unset: True only where grouped batches kept
    the dev score within the seed spread (benchmarks/results/train-bucketing-TASK-*.json)."""
    epochs: ClassVar[int] = 3
    """train.epochs when the config leaves it unset: 3 unless the task's default config stalled on
    some seeds of 10 within 3 (benchmarks/studies/results/recipes-TASK-*-seeds1-10-*.json)."""
    pretrained_lr: ClassVar[float] = 5e-5
    """train.lr for a pretrained model (hub id or local directory) when the config leaves it unset:
    the BERT fine-tuning recipe's 5e-5 unless the task's runs showed it too small
    (benchmarks/studies/results/recipes-TASK-*.json). Presets trained from scratch take 3e-4."""

    state_attributes: ClassVar[tuple[str, ...]] = ()
    """Attributes that load() or featurize() set and later steps read (NER's tag set, the
    predictions' width): kept with prepared features, so a cache hit restores them."""

    def __init__(self, options: dict | None = None):
        self.options = dict(options or {})

    def state(self) -> dict:
        return {name: getattr(self, name) for name in self.state_attributes}

    def restore_state(self, state: dict) -> None:
        for name in self.state_attributes:
            if name in state:
                setattr(self, name, state[name])

    # ------------------------------------------------------------------ data
    @abstractmethod
    def write_samples(self, directory: Path) -> dict[str, Path]:
        """Write the built-in deterministic sample set in the dataset's own format."""

    @abstractmethod
    def read_file(self, path: Path) -> list[dict]:
        """Parse and validate one file; UserError names file, row and reason."""

    @abstractmethod
    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        """Validate rows of a hub dataset (same checks as files)."""

    def read_chunks(self, path: Path) -> Iterator[list[dict]]:
        """read_file in consecutive pieces: one piece here; a task whose rows are independent
        reads, validates and normalizes a large file piece by piece instead (text classification),
        so the training split's builder never holds it whole."""
        yield self.read_file(path)

    def load_chunks(self, source: str | None, split: str) -> Iterator[list[dict]]:
        """Examples of one split in consecutive pieces; `source` None means the built-in sample set."""
        source = self.resolve_source(source, split)
        if source.startswith("hub:"):
            yield self.from_hub_rows(load_hub_split(source, split), source)
        else:
            yield from self.read_chunks(Path(source))

    def load(self, source: str | None, split: str) -> list[dict]:
        """Examples of one split, all of them."""
        return [example for chunk in self.load_chunks(source, split) for example in chunk]

    def resolve_source(self, source: str | None, split: str) -> str:
        """`hub:ID[:CONFIG]`, or the path of a data file that exists (the sample set's for None)."""
        if source is None:
            return str(ensure_samples(self.name, self.write_samples)[split])
        if source.startswith("hub:"):
            return source
        path = Path(source)
        if path.is_dir():
            raise UserError(f"data.{split}={source}: is a directory, expected a data file")
        if not path.exists():
            raise UserError(f"data.{split}={source}: no such file")
        if not path.is_file():
            raise UserError(f"data.{split}={source}: not a regular file")
        return source

    @abstractmethod
    def texts(self, examples: list[dict]) -> list[str]:
        """Normalized text of the examples, for training a preset's tokenizer."""

    def serving_inputs(self, examples: list[dict]) -> list:
        """The examples as the serving pipeline (serving_task) takes them, one input each, their
        text normalized as the task normalizes it: the logged model's input example."""
        return self.texts(examples)

    # ------------------------------------------------------------------ model side
    def model_kwargs(self) -> dict:
        """Head configuration for AutoConfig (num_labels, id2label, label2id)."""
        return {}

    @abstractmethod
    def featurize(self, examples: list[dict] | datasets.Dataset, tokenizer: PreTrainedTokenizerBase,
                  max_length: int, split: str) -> datasets.Dataset:
        """A datasets.Dataset of features: model inputs, the training target(s) the HF head
        takes (`labels`, or `start_positions`/`end_positions`) and `idx` (the feature's row
        number, 0..n-1). One example may give several features (QA windows). The examples are
        a Dataset only where featurize_reads_datasets says so."""

    def map_batched(self, dataset: datasets.Dataset, function: Callable[[dict], dict],
                    **kwargs: Any) -> datasets.Dataset:
        """dataset.map(function, batched=True), in worker processes when the rows are many."""
        workers = worker_count(len(dataset))
        return dataset.map(function, batched=True, num_proc=workers if workers > 1 else None, **kwargs)

    def collator(self, tokenizer: PreTrainedTokenizerBase) -> Collate:
        """Batches of features -> dict of tensors: model inputs, targets and `idx`, padded to
        the longest sequence in the batch. Anything else must be dropped here."""
        return DataCollatorWithPadding(tokenizer)

    def loss(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of a batch; the model's own (from the targets in the batch) unless
        a task needs another."""
        return outputs.loss

    @abstractmethod
    def predictions(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """Numpy arrays with one row per feature of an eval batch. Shapes beyond the first
        dimension must not depend on the batch (pad per-token outputs to max_length): the
        loop concatenates batches, gathers ranks and orders the rows by `idx`."""

    @abstractmethod
    def metrics(self, predictions: dict[str, np.ndarray], examples: list[dict],
                features: datasets.Dataset) -> dict[str, float]:
        """Task metrics from all predictions of a split (row i = feature i of `features`, the
        Dataset featurize returned); must include `main_metric`."""

    def metric_names(self) -> tuple[str, ...]:
        """The keys metrics() returns, without running it (a search's objective is checked against
        them before any trial starts); a key ending in `*` stands for any suffix (NER's f1_TYPE)."""
        return (self.main_metric,)

    scores_loss: ClassVar[bool] = True
    """Its dev and test batches carry targets, so an evaluation has a loss (eval/loss, test/loss)."""

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features: datasets.Dataset) -> str:
        """A human-readable per-class report (logged as an artifact)."""
        return ""

    def prediction_labels(self) -> list[str]:
        """The labels a predictions file's header names (pipeline/predictions.py): the class names or
        tags in id order; none where a row names no class (QA)."""
        return []

    @abstractmethod
    def prediction_rows(self, predictions: dict[str, np.ndarray], examples: list[dict],
                        features: datasets.Dataset) -> list[dict]:
        """One JSON-ready row per example, in the split's order, keyed by "id" (example_ids): the
        task's row of pipeline/predictions.py, what two runs on the same data are compared by."""

    def stall(self, predictions: dict[str, np.ndarray], examples: list[dict],
              features: datasets.Dataset) -> str | None:
        """Why these predictions are a collapsed solution rather than a trained one (one class
        for every row, a common class never predicted, no entity), in a few words; None when
        they are not, or when the task has no such test. A stalled run's scores compare no recipe."""
        return None

    # ------------------------------------------------------------------ distillation
    kd_outputs: ClassVar[dict[str, bool]] = {"logits": False}
    """Model outputs the KD loss compares, and whether each is per token ([B, L, ...])."""

    def kd_pairs(self, student_outputs: ModelOutput, teacher: dict[str, torch.Tensor],
                 batch: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(student logits, teacher logits) pairs, rows = the distributions to match."""
        return [(student_outputs["logits"], teacher["logits"])]


def missing_classes(predicted: np.ndarray, gold: np.ndarray, n_classes: int) -> list[int]:
    """The classes the predictions never name although the gold labels hold them: all of them
    but the one predicted when every row got one class; else those with at least half a uniform
    share of the gold rows (1 / (2 * n_classes)): a rare class a model misses is a weak model,
    a common one it never predicts is a collapsed one."""
    seen = set(np.unique(gold).tolist())
    named = set(np.unique(predicted).tolist())
    if len(named) == 1 and len(seen) > 1:
        return sorted(seen - named)
    counts = np.bincount(np.asarray(gold, dtype=np.int64), minlength=n_classes)
    common = {c for c in seen if counts[c] * 2 * n_classes >= len(gold)}
    return sorted(common - named)


def example_ids(examples: list[dict]) -> list[str]:
    """The examples' own ids where every one has a distinct one, else their row numbers (from 0):
    either way a key that lines up two runs' rows on the same data."""
    ids = [str(e["id"]) for e in examples if "id" in e]
    if len(ids) == len(examples) and len(set(ids)) == len(ids):
        return ids
    return [str(i) for i in range(len(examples))]


def logits_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A model output as the float32 numpy array predictions() return."""
    return t.detach().float().cpu().numpy()
