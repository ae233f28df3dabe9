"""One text -> one of `labels`: the part sentiment and error classification share."""
from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from sklearn.metrics import accuracy_score, classification_report, f1_score

from pipeline.tasks.base import Task, logits_to_numpy, missing_classes

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import ModelOutput


class TextClassificationTask(Task):
    """Examples are {"id", "text" (normalized), "label" (index into `labels`)}."""

    main_metric = "macro_f1"
    tie_breakers = ("accuracy",)
    labels: list[str]
    extra_average = "micro"
    """The F1 average reported beside macro-F1 (sentiment: micro, error_cls: weighted)."""
    group_by_length = True
    """Grouped batches kept the dev macro-F1 within the seed spread on both tasks (sentiment 10
    seeds, error_cls 8) at 2-2.5x the samples/s on long-tailed comments."""

    CHUNK_ROWS = 50_000
    """Rows a file is read, validated and normalized in at a time: enough for the normalizer's
    worker processes (PARALLEL_ROWS) to pay; it sets the builder's heap peak (239 MiB at 100k rows
    of long comments, 285 MiB at 1M: benchmarks/results/data_prep-*.json)."""

    @abstractmethod
    def table_rows(self, path: Path) -> Iterator[tuple[int, dict]]:
        """(line number, row) of a data file, parsed as it is read (readers.read_table)."""

    @abstractmethod
    def _validate(self, rows: Iterable[tuple[int, dict]], where: str) -> list[dict]:
        """Examples of numbered rows, normalized; `where` names the source and its unit:
        "FILE: line" or "hub:ID: row"."""

    def read_file(self, path: Path) -> list[dict]:
        return [example for chunk in self.read_chunks(path) for example in chunk]

    def read_chunks(self, path: Path) -> Iterator[list[dict]]:
        rows = self.table_rows(path)
        while chunk := list(itertools.islice(rows, self.CHUNK_ROWS)):
            yield self._validate(chunk, f"{path}: line")

    def texts(self, examples: list[dict]) -> list[str]:
        return [e["text"] for e in examples]

    def model_kwargs(self) -> dict:
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                "label2id": {l: i for i, l in enumerate(self.labels)}}

    featurize_reads_datasets = True

    def featurize(self, examples: list[dict] | datasets.Dataset, tokenizer: PreTrainedTokenizerBase,
                  max_length: int, split: str) -> datasets.Dataset:
        import datasets

        if isinstance(examples, datasets.Dataset):  # the prepared training examples, memory-mapped
            ds = examples.select_columns(["text", "label"]).rename_column("label", "labels")
            ds = ds.add_column("idx", np.arange(len(ds), dtype=np.int64))
        else:
            ds = datasets.Dataset.from_dict({
                "text": [e["text"] for e in examples],
                "labels": [e["label"] for e in examples],
                "idx": list(range(len(examples))),
            })
        return self.map_batched(ds, lambda b: tokenizer(b["text"], truncation=True, max_length=max_length),
                                remove_columns=["text"])

    def predictions(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        return {"logits": logits_to_numpy(outputs.logits)}

    def metrics(self, predictions: dict[str, np.ndarray], examples: list[dict],
                features: datasets.Dataset) -> dict[str, float]:
        y_true = np.array([e["label"] for e in examples])
        y_pred = predictions["logits"].argmax(-1)
        labels = range(len(self.labels))
        return {
            "accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro", labels=labels, zero_division=0)),
            f"{self.extra_average}_f1": float(f1_score(y_true, y_pred, average=self.extra_average, labels=labels,
                                                       zero_division=0)),
        }

    def stall(self, predictions: dict[str, np.ndarray], examples: list[dict],
              features: datasets.Dataset) -> str | None:
        predicted = predictions["logits"].argmax(-1)
        missing = missing_classes(predicted, np.array([e["label"] for e in examples]), len(self.labels))
        return (f"predicts only {', '.join(self.labels[c] for c in np.unique(predicted))}, never "
                f"{', '.join(self.labels[c] for c in missing)}") if missing else None

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features: datasets.Dataset) -> str:
        return classification_report([e["label"] for e in examples], predictions["logits"].argmax(-1),
                                     labels=range(len(self.labels)), target_names=self.labels, digits=4,
                                     zero_division=0)
