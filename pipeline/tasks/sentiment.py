"""Bangla sentiment classification in the BLP-2023 TSV format (id, text, label)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import UserError
from pipeline.tasks.readers import read_table
from pipeline.tasks.samples import sentiment as sample_set
from pipeline.tasks.text_classification import TextClassificationTask
from pipeline.tasks.workers import normalize_texts

if TYPE_CHECKING:
    import datasets

LABELS = ["Positive", "Negative", "Neutral"]
COLUMNS = ("id", "text", "label")


class SentimentTask(TextClassificationTask):
    name = "sentiment"
    labels = LABELS
    extra_average = "micro"

    def write_samples(self, directory: Path) -> dict[str, Path]:
        return sample_set.write(directory, COLUMNS, LABELS)

    def table_rows(self, path: Path) -> Iterator[tuple[int, dict]]:
        return read_table(path, COLUMNS, delimiter="\t")

    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        names = rows.features["label"].names if hasattr(rows.features.get("label"), "names") else None
        numbered = []
        for i, r in enumerate(rows):
            label = names[r["label"]] if names else r.get("label")
            numbered.append((i + 1, {"id": r.get("id", i), "text": r.get("text", ""), "label": label}))
        return self._validate(numbered, f"{source}: row")

    def _validate(self, rows: Iterable[tuple[int, dict]], where: str) -> list[dict]:
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
