"""Bangla text error classification in the BaTEClaCor CSV format (Comment, Error, Category).

Error is 0/1; Category is one of Grammatical, Spelling, Code Switching, Multiple Errors (any
case), and empty for a correct comment. Default: a 5-class task (Correct + the four categories).
`task_options.binary=true`: the 0/1 task from the Error column (labels Correct, Error).
Comments go through `normalizer.normalize` before tokenization. Metrics: accuracy, macro-F1
(the main metric), weighted-F1.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pipeline.errors import UserError
from pipeline.tasks.samples import error_cls as sample_set
from pipeline.tasks.text_classification import TextClassificationTask

if TYPE_CHECKING:
    import datasets

LABELS = ["Correct", "Grammatical", "Spelling", "Code Switching", "Multiple Errors"]
BINARY_LABELS = ["Correct", "Error"]
COLUMNS = ("Comment", "Error", "Category")
OPTIONS = ("binary",)
_CATEGORIES = {c.lower(): c for c in LABELS[1:]}
EPOCHS = 5  # 3 left 4 seeds in 10 of the default config with a common class never predicted


def task(options: dict | None = None) -> TextClassificationTask:
    for key in options or {}:
        if key not in OPTIONS:
            raise UserError(f"config: task_options.{key}: unknown option for task error_cls "
                            f"(available: {', '.join(OPTIONS)})")
    binary = (options or {}).get("binary", False)
    if not isinstance(binary, bool):
        raise UserError(f"config: task_options.binary={binary}: must be true or false")
    return TextClassificationTask("error_cls", BINARY_LABELS if binary else LABELS, columns=COLUMNS, delimiter=",",
                                  example=functools.partial(example, binary=binary), hub_rows=hub_rows,
                                  samples=functools.partial(sample_set.write, columns=COLUMNS, labels=LABELS),
                                  extra_average="weighted", epochs=EPOCHS, options=options)


def example(r: dict, line: int, binary: bool) -> dict:
    comment = r["Comment"].strip()
    if not comment:
        raise UserError("empty comment")
    error = r["Error"].strip()
    if error not in ("0", "1"):
        raise UserError(f"Error must be 0 or 1 (got {r['Error']!r})")
    raw = " ".join(r["Category"].split())
    category = _CATEGORIES.get(raw.lower()) if raw else "Correct"
    if category is None:
        raise UserError(f"unknown category {raw!r} (expected {', '.join(LABELS[1:])}, or empty for Correct)")
    if (error == "1") != (category != "Correct"):
        raise UserError(f"Error={error} but Category={raw!r}" + (" (a correct comment has an empty Category)"
                                                                 if error == "0" else " (an error needs a Category)"))
    return {"text": comment, "label": int(error) if binary else LABELS.index(category)}


def hub_rows(rows: datasets.Dataset, source: str) -> Iterator[tuple[int, dict]]:
    """A hub dataset's rows with the CSV's columns, as text."""
    missing = [c for c in COLUMNS if c not in rows.features]
    if missing:
        raise UserError(f"{source}: missing column(s) {', '.join(missing)} (found: {', '.join(rows.features)})")
    return ((i + 1, {c: "" if r[c] is None else str(r[c]) for c in COLUMNS}) for i, r in enumerate(rows))
