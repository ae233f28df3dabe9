"""Bangla health NER (Bangla-HealthNER JSON) as token classification.

File format: a JSON list of rows {"text": "space separated words", "labels": ["O", "B-Symptom", ...]},
one IOB tag per whitespace-separated word of `text` (errors name "row N", the N-th element of
the list, from 1). Seven entity types: Symptom, Health Condition, Age, Medicine, Dosage, Medical
Procedure, Specialist. Metrics: seqeval entity-level micro precision/recall/F1 (F1 is the main
metric), F1 per type, and the words' tag accuracy (`accuracy`: the tie-break where F1 ties).

Tag encoding: the canonical tags write the type as the dataset names it, with a space
("B-Health Condition", "I-Medical Procedure"); that is what the model's id2label, the report and
seqeval see, and what the sample set writes. On input the underscore form ("B-Health_Condition")
and any letter case are accepted and mapped to the canonical tag. Per-type metric keys are
`f1_<type>` lower-cased with spaces as underscores (`f1_health_condition`).

Words are split with str.split() (the data has non-breaking spaces) and normalized one by one,
so words and tags stay aligned; a word the normalizer empties keeps its original form.

Hub data (`hub:ID[:CONFIG]`) may use the same schema or the wikiann one (tokens, ner_tags as a
ClassLabel sequence); the label set is then the dataset's ClassLabel names.
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np
from seqeval.metrics import accuracy_score, classification_report, f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from pipeline.errors import UserError
from pipeline.tasks.base import Collate, Task, example_ids
from pipeline.tasks.readers import read_text
from pipeline.tasks.samples import ner as sample_set
from pipeline.tasks.workers import normalize_texts

if TYPE_CHECKING:
    import datasets
    import torch
    from transformers import BatchEncoding, PreTrainedTokenizerBase
    from transformers.utils import ModelOutput

TYPES = ["Symptom", "Health Condition", "Age", "Medicine", "Dosage", "Medical Procedure", "Specialist"]
LABELS = ["O"] + [f"{prefix}-{t}" for t in TYPES for prefix in "BI"]
IGNORE = -100  # the label/prediction value of positions that are not a word's first sub-word
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
              bool: "a boolean", type(None): "null"}


class NerTask(Task):
    name = "ner"
    main_metric = "f1"
    tie_breakers = ("accuracy",)
    model_class = AutoModelForTokenClassification
    serving_task = "token-classification"
    group_by_length = False
    """Grouped batches lowered the dev entity F1 beyond the seed spread (0.75 vs 0.86, 3 seeds) by
    what they put together, not by the loss or the order: on the sample set a sentence's length
    names its template, so a grouped batch held 7.6 tag patterns against 20.3 shuffled, and F1 fell
    as the sorted chunk grew (benchmarks/results/train-bucketing-ner-*.json); real NER data,
    whose lengths say less, was not measured."""

    state_attributes = ("labels", "max_length", "_loaded")

    def __init__(self, options: dict | None = None):
        super().__init__(options)
        for key in self.options:
            raise UserError(f"config: task_options.{key}: unknown option (task ner takes none)")
        self.labels = list(LABELS)
        self.max_length: int | None = None  # set by featurize: the fixed width of predictions
        self._loaded = False  # once a split is read, the label set is fixed

    # ------------------------------------------------------------------ data
    def write_samples(self, directory: Path) -> dict[str, Path]:
        return sample_set.write(directory, TYPES)

    def resolve_source(self, source: str | None, split: str) -> str:
        if source is None and self.labels != LABELS:  # the sample set's tags cannot mix with a hub tag set
            raise UserError(f"data.{split}: unset, so the built-in sample set, whose tags differ from the other "
                            f"splits' ({', '.join(self.labels)}): set data.{split} too")
        return super().resolve_source(source, split)

    def read_file(self, path: Path) -> list[dict]:
        try:
            rows = json.loads(read_text(path))
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(rows, list):
            raise UserError(f"{path}: top level is {JSON_TYPES.get(type(rows), 'a value')}, expected a list of rows")
        if not rows:
            raise UserError(f"{path}: no rows")
        return self._validate(enumerate(rows, 1), str(path))

    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        columns = set(rows.features)
        if {"tokens", "ner_tags"} <= columns:  # wikiann schema: tag ids named by the ClassLabel
            names = getattr(getattr(rows.features["ner_tags"], "feature", None), "names", None)
            if names:
                self._set_labels(list(names), source)
            numbered = ((i + 1, {"tokens": r["tokens"],
                                 "labels": [names[t] for t in r["ner_tags"]] if names else r["ner_tags"]})
                        for i, r in enumerate(rows))
        elif {"text", "labels"} <= columns:
            numbered = ((i + 1, {"text": r["text"], "labels": r["labels"]}) for i, r in enumerate(rows))
        else:
            raise UserError(f"{source}: columns {', '.join(sorted(columns))}: expected text + labels "
                            "(Bangla-HealthNER) or tokens + ner_tags (wikiann)")
        return self._validate(numbered, source)

    def _set_labels(self, names: list[str], source: str) -> None:
        bad = [n for n in names if n != "O" and not re.match(r"^[BI]-.", n)]
        if bad:
            raise UserError(f"{source}: ner_tags names {bad[:3]} are not IOB tags (O, B-TYPE, I-TYPE)")
        if self._loaded and names != self.labels:
            raise UserError(f"{source}: tag names ({', '.join(names)}) differ from the other splits' "
                            f"({', '.join(self.labels)})")
        self.labels = names

    def _validate(self, rows: Iterable[tuple[int, object]], where: str) -> list[dict]:
        lookup = {form.lower(): tag for tag in self.labels
                  for form in (tag, tag.replace(" ", "_"), tag.replace("_", " "))}
        types = sorted({tag[2:] for tag in self.labels if tag != "O"})
        examples, n = [], 0

        def fail(reason: str) -> NoReturn:
            raise UserError(f"{where}: row {n}: {reason}")

        for n, row in rows:  # noqa: B007 - fail() reads `n`
            if not isinstance(row, dict):
                fail(f"expected an object with text and labels, got {JSON_TYPES.get(type(row), 'a value')}")
            if "tokens" in row:
                words = [str(w) for w in row["tokens"] or []]
            else:
                text = row.get("text")
                if not isinstance(text, str):
                    fail("missing text" if text is None else f"text is {JSON_TYPES.get(type(text), 'a value')}, "
                                                             "expected a string")
                words = text.split()
            if not words:
                fail("empty text")
            labels = row.get("labels")
            if not isinstance(labels, list):
                fail("missing labels" if labels is None else f"labels is {JSON_TYPES.get(type(labels), 'a value')}, "
                                                             "expected a list of tags")
            if len(words) != len(labels):
                fail(f"{len(words)} words but {len(labels)} labels")
            tags = []
            for j, (word, tag) in enumerate(zip(words, labels), 1):
                canonical = lookup.get(tag.strip().lower()) if isinstance(tag, str) else None
                if canonical is None:
                    fail(f"word {j} ({word!r}): unknown tag {tag!r} (expected O, or B-/I- with one of "
                         f"{', '.join(types)})")
                tags.append(canonical)
            examples.append({"words": words, "tags": tags})
        self._loaded = True
        # word by word keeps the alignment; a word the normalizer empties keeps its label
        normalized = iter(normalize_texts([w for e in examples for w in e["words"]]))
        for e in examples:
            e["words"] = [next(normalized).strip() or w for w in e["words"]]
        return examples

    def texts(self, examples: list[dict]) -> list[str]:
        return [" ".join(e["words"]) for e in examples]

    def serving_inputs(self, examples: list[dict]) -> list:
        return self.texts(examples)  # the pipeline splits text into words itself

    # ------------------------------------------------------------------ model side
    def model_kwargs(self) -> dict:
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                "label2id": {l: i for i, l in enumerate(self.labels)}}

    def featurize(self, examples: list[dict], tokenizer: PreTrainedTokenizerBase, max_length: int,
                  split: str) -> datasets.Dataset:
        import datasets

        self.max_length = max_length
        label_id = {l: i for i, l in enumerate(self.labels)}
        ds = datasets.Dataset.from_dict({
            "words": [e["words"] for e in examples],
            "tags": [[label_id[t] for t in e["tags"]] for e in examples],
            "idx": list(range(len(examples))),
        })

        def tokenize(batch: dict[str, list]) -> BatchEncoding:
            enc = tokenizer(batch["words"], is_split_into_words=True, truncation=True, max_length=max_length)
            enc["labels"], enc["word_starts"] = [], []
            for i, tags in enumerate(batch["tags"]):
                # only a word's first sub-word carries its label; word_starts maps each word to that
                # position (-1: the word was cut off by truncation or has no tokens)
                labels, starts, previous = [], [-1] * len(tags), None
                for pos, w in enumerate(enc.word_ids(i)):
                    first = w is not None and w != previous
                    labels.append(tags[w] if first else IGNORE)
                    if first:
                        starts[w] = pos
                    previous = w
                enc["labels"].append(labels)
                enc["word_starts"].append(starts)
            return enc

        return self.map_batched(ds, tokenize, remove_columns=["words", "tags"])

    def collator(self, tokenizer: PreTrainedTokenizerBase) -> Collate:
        return functools.partial(_collate, DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE))

    def predictions(self, outputs: ModelOutput, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        pred = outputs.logits.argmax(-1).cpu().numpy()
        # a fixed width, so batches (and ranks) of different lengths concatenate
        out = np.full((len(pred), max(self.max_length or 0, pred.shape[1])), IGNORE, dtype=np.int64)
        out[:, : pred.shape[1]] = pred
        return {"token_labels": out}

    kd_outputs = {"logits": True}  # per token

    def kd_pairs(self, student_outputs: ModelOutput, teacher: dict[str, torch.Tensor],
                 batch: dict[str, torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Distil on labelled tokens only (first sub-words), not on padding or continuations."""
        mask = batch["labels"] != IGNORE
        return [(student_outputs["logits"][mask], teacher["logits"][mask])]

    def word_tags(self, predictions: dict[str, np.ndarray], features: datasets.Dataset) -> list[list[str]]:
        """Predicted tag of every word: its first sub-word's; a word cut off by truncation is "O"."""
        return [[self.labels[row[s]] if s >= 0 else "O" for s in starts]
                for row, starts in zip(predictions["token_labels"], features["word_starts"])]

    def metric_names(self) -> tuple[str, ...]:
        return ("precision", "recall", "f1", "accuracy", "f1_*")  # f1_TYPE per entity type of the data

    def metrics(self, predictions: dict[str, np.ndarray], examples: list[dict],
                features: datasets.Dataset) -> dict[str, float]:
        y_true = [e["tags"] for e in examples]
        y_pred = self.word_tags(predictions, features)
        # mode=None: seqeval's default, conlleval-compatible scoring. An I- tag that does not
        # continue an entity of its type starts one, as the CoNLL script (and the published
        # Bangla NER scores) count it; strict IOB2 mode would silently drop such entities.
        scores = {
            "precision": float(precision_score(y_true, y_pred, zero_division=0)),
            "recall": float(recall_score(y_true, y_pred, zero_division=0)),
            "f1": float(f1_score(y_true, y_pred, zero_division=0)),
            "accuracy": float(accuracy_score(y_true, y_pred)),
        }
        per_type = classification_report(y_true, y_pred, output_dict=True, zero_division=0) \
            if has_entities(y_true, y_pred) else {}  # seqeval's report fails on no entities at all
        for t in sorted({tag[2:] for tag in self.labels if tag != "O"}):
            # every type gets a key (0 when never seen nor predicted), so MLflow series stay aligned
            scores[f"f1_{t.lower().replace(' ', '_')}"] = float(per_type.get(t, {}).get("f1-score", 0.0))
        return scores

    def stall(self, predictions: dict[str, np.ndarray], examples: list[dict],
              features: datasets.Dataset) -> str | None:
        """Every word tagged O although the gold tags hold entities: the majority-tag solution."""
        y_true = [e["tags"] for e in examples]
        if has_entities(y_true) and not has_entities(self.word_tags(predictions, features)):
            return "no entity predicted"
        return None

    def prediction_labels(self) -> list[str]:
        return list(self.labels)

    def prediction_rows(self, predictions: dict[str, np.ndarray], examples: list[dict],
                        features: datasets.Dataset) -> list[dict]:
        """Gold and predicted tag per word, and the predicted entities as the metrics count them
        (seqeval's default reading: an I- tag that continues no entity of its type starts one)."""
        return [{"id": i, "gold": e["tags"], "pred": tags, "entities": [list(span) for span in get_entities(tags)]}
                for i, e, tags in zip(example_ids(examples), examples, self.word_tags(predictions, features))]

    def report(self, predictions: dict[str, np.ndarray], examples: list[dict], features: datasets.Dataset) -> str:
        y_true, y_pred = [e["tags"] for e in examples], self.word_tags(predictions, features)
        if not has_entities(y_true, y_pred):
            return "no entities in the gold tags or the predictions\n"
        return classification_report(y_true, y_pred, digits=4, zero_division=0)


def has_entities(*sequences: list[list[str]]) -> bool:
    return any(tag != "O" for tags in sequences for seq in tags for tag in seq)


def _collate(pad: DataCollatorForTokenClassification, features: list[dict]) -> dict[str, torch.Tensor]:
    # word_starts is for metrics only: the model must not see it
    return pad([{k: v for k, v in f.items() if k != "word_starts"} for f in features])
