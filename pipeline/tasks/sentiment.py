"""Bangla sentiment classification in the BLP-2023 TSV format (id, text, label)."""
from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np
from normalizer import normalize
from sklearn.metrics import accuracy_score, classification_report, f1_score

from pipeline.errors import UserError
from pipeline.tasks import samples
from pipeline.tasks.base import Task, logits_to_numpy, read_table

LABELS = ["Positive", "Negative", "Neutral"]
SAMPLE_SIZES = {"train": 2400, "dev": 400, "test": 400}
LABEL_NOISE = 0.08


class SentimentTask(Task):
    name = "sentiment"
    main_metric = "macro_f1"

    def write_samples(self, directory: Path) -> dict[str, Path]:
        out = {}
        for offset, (split, n) in enumerate(SAMPLE_SIZES.items()):
            rng = random.Random(1000 + offset)
            path = directory / f"{split}.tsv"
            with path.open("w", encoding="utf-8", newline="") as f:
                w = csv.writer(f, delimiter="\t", lineterminator="\n")
                w.writerow(["id", "text", "label"])
                for i in range(n):
                    label = rng.choice(LABELS)
                    text = samples.sentiment_sentence(rng, label)
                    w.writerow([f"{split}-{i:05d}", text, samples.noisy(rng, label, LABELS, LABEL_NOISE)])
            out[split] = path
        return out

    def read_file(self, path: Path) -> list[dict]:
        return self._validate(read_table(path, ("id", "text", "label"), delimiter="\t"), str(path))

    def from_hub_rows(self, rows, source: str) -> list[dict]:
        names = rows.features["label"].names if hasattr(rows.features.get("label"), "names") else None
        numbered = []
        for i, r in enumerate(rows):
            label = names[r["label"]] if names else r.get("label")
            numbered.append((i + 1, {"id": r.get("id", i), "text": r.get("text", ""), "label": label}))
        return self._validate(numbered, source)

    def _validate(self, rows: list[tuple[int, dict]], where: str) -> list[dict]:
        lookup = {l.lower(): l for l in LABELS}
        examples = []
        for line, r in rows:
            text = (r.get("text") or "").strip()
            if not text:
                raise UserError(f"{where}: row {line}: empty text")
            label = lookup.get(str(r.get("label", "")).strip().lower())
            if label is None:
                raise UserError(f"{where}: row {line}: unknown label {r.get('label')!r} (expected {', '.join(LABELS)})")
            examples.append({"id": str(r.get("id", line)), "text": normalize(text), "label": LABELS.index(label)})
        return examples

    def texts(self, examples):
        return [e["text"] for e in examples]

    def model_kwargs(self) -> dict:
        return {"num_labels": len(LABELS), "id2label": dict(enumerate(LABELS)),
                "label2id": {l: i for i, l in enumerate(LABELS)}}

    def featurize(self, examples, tokenizer, max_length, split):
        import datasets

        ds = datasets.Dataset.from_dict({
            "text": [e["text"] for e in examples],
            "labels": [e["label"] for e in examples],
            "idx": list(range(len(examples))),
        })
        return ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=max_length),
                      batched=True, remove_columns=["text"])

    def predictions(self, outputs, batch):
        return {"logits": logits_to_numpy(outputs.logits)}

    def metrics(self, predictions, examples, features):
        y_true = np.array([e["label"] for e in examples])
        y_pred = predictions["logits"].argmax(-1)
        return {
            "accuracy": float(accuracy_score(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro", labels=range(len(LABELS)), zero_division=0)),
            "micro_f1": float(f1_score(y_true, y_pred, average="micro", labels=range(len(LABELS)), zero_division=0)),
        }

    def report(self, predictions, examples, features):
        y_true = [e["label"] for e in examples]
        return classification_report(y_true, predictions["logits"].argmax(-1), labels=range(len(LABELS)),
                                     target_names=LABELS, digits=4, zero_division=0)
