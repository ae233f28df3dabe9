"""One text -> one of `labels`: the task class sentiment and error classification are instances of."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import softmax
from sklearn.metrics import accuracy_score, classification_report, f1_score

from pipeline.errors import UserError
from pipeline.tasks.base import Task, example_ids, logits_to_numpy, missing_classes
from pipeline.tasks.readers import read_table
from pipeline.tasks.workers import normalize_texts

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import PreTrainedTokenizerBase
    from transformers.utils import ModelOutput


class TextClassificationTask(Task):
    """Examples are {"text" (normalized), "label" (index into `labels`)} and what else `example`
    keeps. A task (tasks/sentiment.py, tasks/error_cls.py) is an instance: its name and labels,
    its files' columns and delimiter, how one row becomes an example, how a hub dataset's rows
    become rows of its files, and its built-in sample set."""

    main_metric = "macro_f1"
    tie_breakers = ("accuracy",)
    group_by_length = True
    """Grouped batches kept the dev macro-F1 within the seed spread on both tasks (sentiment 10
    seeds, error_cls 8) at 2-2.5x the samples/s on long-tailed comments."""

    CHUNK_ROWS = 50_000
    """Rows a file is read, validated and normalized in at a time: enough for the normalizer's
    worker processes (PARALLEL_ROWS) to pay; it sets the builder's heap peak (239 MiB at 100k rows
    of long comments, 285 MiB at 1M: benchmarks/results/data_prep-*.json)."""

    def __init__(self, name: str, labels: list[str], *, columns: tuple[str, ...], delimiter: str,
                 example: Callable[[dict, int], dict],
                 hub_rows: Callable[[datasets.Dataset, str], Iterable[tuple[int, dict]]],
                 samples: Callable[[Path], dict[str, Path]], extra_average: str, epochs: int = Task.epochs,
                 options: dict | None = None):
        super().__init__(options)
        self.name, self.labels, self.columns, self.delimiter = name, labels, columns, delimiter
        self.example = example
        """(row, its line number) -> the example, its text not yet normalized; UserError(reason) for a bad row."""
        self.hub_rows = hub_rows
        """(a hub split, its source) -> numbered rows with the files' columns."""
        self.samples = samples
        self.extra_average = extra_average
        """The F1 average reported beside macro-F1 (sentiment: micro, error_cls: weighted)."""
        self.epochs = epochs

    def write_samples(self, directory: Path) -> dict[str, Path]:
        return self.samples(directory)

    def table_rows(self, path: Path) -> Iterator[tuple[int, dict]]:
        """(line number, row) of a data file, parsed as it is read (readers.read_table)."""
        return read_table(path, self.columns, delimiter=self.delimiter)

    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        return self._validate(self.hub_rows(rows, source), f"{source}: row")

    def _validate(self, rows: Iterable[tuple[int, dict]], where: str) -> list[dict]:
        """Examples of numbered rows, normalized; `where` names the source and its unit:
        "FILE: line" or "hub:ID: row"."""
        examples = []
        for line, row in rows:
            try:
                examples.append(self.example(row, line))
            except UserError as e:
                raise UserError(f"{where} {line}: {e}") from None
        for example, text in zip(examples, normalize_texts([e["text"] for e in examples])):
            example["text"] = text
        return examples

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

    def metric_names(self) -> tuple[str, ...]:
        return ("accuracy", "macro_f1", f"{self.extra_average}_f1")

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

    def prediction_labels(self) -> list[str]:
        return list(self.labels)

    def prediction_rows(self, predictions: dict[str, np.ndarray], examples: list[dict],
                        features: datasets.Dataset) -> list[dict]:
        logits = predictions["logits"]
        probs = np.round(softmax(logits.astype(np.float64), axis=-1), 4)  # float64: 0.1234 stays 0.1234
        return [{"id": i, "gold": self.labels[e["label"]], "pred": self.labels[p], "probs": row}
                for i, e, p, row in zip(example_ids(examples), examples, logits.argmax(-1).tolist(), probs.tolist())]

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features: datasets.Dataset) -> str:
        return classification_report([e["label"] for e in examples], predictions["logits"].argmax(-1),
                                     labels=range(len(self.labels)), target_names=self.labels, digits=4,
                                     zero_division=0)
