"""Bangla sentiment classification in the BLP-2023 TSV format (id, text, label)."""
from __future__ import annotations

import random
from pathlib import Path

from pipeline.errors import UserError
from pipeline.tasks import samples
from pipeline.tasks.base import normalize_texts, read_table
from pipeline.tasks.text_classification import TextClassificationTask

LABELS = ["Positive", "Negative", "Neutral"]
SAMPLE_SIZES = {"train": 2400, "dev": 400, "test": 400}
LABEL_NOISE = 0.05


class SentimentTask(TextClassificationTask):
    name = "sentiment"
    labels = LABELS
    extra_average = "micro"

    def write_samples(self, directory: Path) -> dict[str, Path]:
        return {split: samples.write_table(directory / f"{split}.tsv", ["id", "text", "label"],
                                           _sample_rows(random.Random(1000 + offset), split, n), **samples.TSV)
                for offset, (split, n) in enumerate(SAMPLE_SIZES.items())}

    def table_rows(self, path: Path):
        return read_table(path, ("id", "text", "label"), delimiter="\t")

    def from_hub_rows(self, rows, source: str) -> list[dict]:
        names = rows.features["label"].names if hasattr(rows.features.get("label"), "names") else None
        numbered = []
        for i, r in enumerate(rows):
            label = names[r["label"]] if names else r.get("label")
            numbered.append((i + 1, {"id": r.get("id", i), "text": r.get("text", ""), "label": label}))
        return self._validate(numbered, f"{source}: row")

    def _validate(self, rows: list[tuple[int, dict]], where: str) -> list[dict]:
        lookup = {l.lower(): l for l in LABELS}
        examples = []
        for line, r in rows:
            text = (r.get("text") or "").strip()
            if not text:
                raise UserError(f"{where} {line}: empty text")
            label = lookup.get(str(r.get("label", "")).strip().lower())
            if label is None:
                raise UserError(f"{where} {line}: unknown label {r.get('label')!r} (expected {', '.join(LABELS)})")
            examples.append({"id": str(r.get("id", line)), "text": text, "label": LABELS.index(label)})
        for example, text in zip(examples, normalize_texts([e["text"] for e in examples])):
            example["text"] = text
        return examples


def _sample_rows(rng: random.Random, split: str, n: int):
    for i in range(n):
        label = rng.choice(LABELS)
        text = samples.sentiment_sentence(rng, label)
        yield [f"{split}-{i:05d}", text, samples.noisy(rng, label, LABELS, LABEL_NOISE)]
