"""Bangla sentiment classification in the BLP-2023 TSV format (id, text, label)."""
from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pipeline.errors import UserError
from pipeline.tasks.samples import sentiment as sample_set
from pipeline.tasks.text_classification import TextClassificationTask

if TYPE_CHECKING:
    import datasets

LABELS = ["Positive", "Negative", "Neutral"]
COLUMNS = ("id", "text", "label")
_LOOKUP = {label.lower(): label for label in LABELS}


def task(options: dict | None = None) -> TextClassificationTask:
    return TextClassificationTask("sentiment", LABELS, columns=COLUMNS, delimiter="\t", example=example,
                                  hub_rows=hub_rows, samples=functools.partial(sample_set.write, columns=COLUMNS,
                                                                               labels=LABELS),
                                  extra_average="micro", options=options)


def example(r: dict, line: int) -> dict:
    text = (r.get("text") or "").strip()
    if not text:
        raise UserError("empty text")
    label = _LOOKUP.get(str(r.get("label", "")).strip().lower())
    if label is None:
        raise UserError(f"unknown label {r.get('label')!r} (expected {', '.join(LABELS)})")
    return {"id": str(r.get("id", line)), "text": text, "label": LABELS.index(label)}


def hub_rows(rows: datasets.Dataset, source: str) -> Iterator[tuple[int, dict]]:
    """A hub dataset's id/text/label rows; a ClassLabel label is given as its name."""
    names = rows.features["label"].names if hasattr(rows.features.get("label"), "names") else None
    for i, r in enumerate(rows):
        label = names[r["label"]] if names else r.get("label")
        yield i + 1, {"id": r.get("id", i), "text": r.get("text", ""), "label": label}
