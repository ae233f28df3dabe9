"""Bangla text error classification in the BaTEClaCor CSV format (Comment, Error, Category).

Error is 0/1; Category is one of Grammatical, Spelling, Code Switching, Multiple Errors (any
case), and empty for a correct comment. Default: a 5-class task (Correct + the four categories).
`task_options.binary=true`: the 0/1 task from the Error column (labels Correct, Error).
Comments go through `normalizer.normalize` before tokenization. Metrics: accuracy, macro-F1
(the main metric), weighted-F1.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pipeline.errors import UserError
from pipeline.tasks.readers import read_table
from pipeline.tasks.samples import error_cls as sample_set
from pipeline.tasks.text_classification import TextClassificationTask
from pipeline.tasks.workers import normalize_texts

if TYPE_CHECKING:
    import datasets

LABELS = ["Correct", "Grammatical", "Spelling", "Code Switching", "Multiple Errors"]
BINARY_LABELS = ["Correct", "Error"]
COLUMNS = ("Comment", "Error", "Category")
OPTIONS = ("binary",)


class ErrorClsTask(TextClassificationTask):
    name = "error_cls"
    extra_average = "weighted"
    epochs = 5  # 3 left 4 seeds in 10 of the default config with a common class never predicted

    def __init__(self, options: dict | None = None):
        super().__init__(options)
        for key in self.options:
            if key not in OPTIONS:
                raise UserError(f"config: task_options.{key}: unknown option for task error_cls "
                                f"(available: {', '.join(OPTIONS)})")
        self.binary = self.options.get("binary", False)
        if not isinstance(self.binary, bool):
            raise UserError(f"config: task_options.binary={self.binary}: must be true or false")
        self.labels = BINARY_LABELS if self.binary else LABELS

    # ------------------------------------------------------------------ data
    def write_samples(self, directory: Path) -> dict[str, Path]:
        return sample_set.write(directory, COLUMNS, LABELS)

    def table_rows(self, path: Path) -> Iterator[tuple[int, dict]]:
        return read_table(path, COLUMNS, delimiter=",")

    def from_hub_rows(self, rows: datasets.Dataset, source: str) -> list[dict]:
        missing = [c for c in COLUMNS if c not in rows.features]
        if missing:
            raise UserError(f"{source}: missing column(s) {', '.join(missing)} (found: {', '.join(rows.features)})")
        numbered = ((i + 1, {c: "" if r[c] is None else str(r[c]) for c in COLUMNS}) for i, r in enumerate(rows))
        return self._validate(numbered, f"{source}: row")

    def _validate(self, rows: Iterable[tuple[int, dict]], where: str) -> list[dict]:
        categories = {c.lower(): c for c in LABELS[1:]}
        examples, line = [], 0

        def fail(reason: str) -> NoReturn:
            raise UserError(f"{where} {line}: {reason}")

        for line, r in rows:  # noqa: B007 - fail() reads `line`
            comment = r["Comment"].strip()
            if not comment:
                fail("empty comment")
            error = r["Error"].strip()
            if error not in ("0", "1"):
                fail(f"Error must be 0 or 1 (got {r['Error']!r})")
            raw = " ".join(r["Category"].split())
            category = categories.get(raw.lower()) if raw else "Correct"
            if category is None:
                fail(f"unknown category {raw!r} (expected {', '.join(LABELS[1:])}, or empty for Correct)")
            if (error == "1") != (category != "Correct"):
                fail(f"Error={error} but Category={raw!r}" + (" (a correct comment has an empty Category)"
                                                                if error == "0" else " (an error needs a Category)"))
            label = int(error) if self.binary else LABELS.index(category)
            examples.append({"text": comment, "label": label})
        for example, text in zip(examples, normalize_texts([e["text"] for e in examples])):
            example["text"] = text
        return examples
