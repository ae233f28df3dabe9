"""A stage's predictions on its dev and test splits: the format's one definition, its writer and
its reader. The job writes them with its best model (job/records/stage_outputs.py); whoever
compares two runs reads them (the report), row by row: a row is keyed by its example's id, so two
runs on the same data line up.

OUTPUT_DIR/predictions/{split}.jsonl, split dev or test (a split the job does not have: no file),
UTF-8 JSON lines, written whole or not at all; the run's MLflow artifacts hold them under
predictions/.

Line 1, the header: {"format": "pipeline.predictions/1", "task", "split", "rows" (the lines after
it), "labels" (the class names or NER tags in id order; WikiQA ["0", "1"]; QA []), "data" (the
split's digest, the one its MLflow dataset input records: equal rows, equal digest), "model" (the
model spec), "precision" (the resolved precision policy), "seed"}.

Then one line per example of the split, in its order (each task's Task.prediction_rows):
- sentiment, error_cls: {"id", "gold", "pred" (class names), "probs" (one per label in the header's
  order, 4 decimals)}
- ner: {"id", "gold", "pred" (a tag per word), "entities" ([TYPE, first word, last word inclusive]
  of pred's entities, seqeval's reading)}
- qa: {"id" (the question's), "pred" (the answer text, "" for no answer), "score" (the best span's
  start + end logit), "null_score" (the no-answer score: pred is "" where it is higher), "gold"
  (the gold answers), "has_answer"}
- wikiqa: {"id" ("QID:K", the K-th candidate of question QID in the split), "question" (QID),
  "score" (the positive class's probability), "pred", "gold" (0 or 1)}

"id" is the example's own id where every example of the split has a distinct one (squad_bn's
question ids, BLP-2023's comment ids), else its row number in the split (from 0) as a string. A
number that is not finite (a diverged model's NaN; QA's score where no span is valid) is written
null, so every line is strict JSON.

Imports errors and fsutil only, beside them in the lowest layer: the job writes it, the report reads it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UserError
from pipeline.fsutil import write_text

FORMAT = "pipeline.predictions/1"
SPLITS = ("dev", "test")
"""The splits a stage keeps its predictions on."""


@dataclass(frozen=True)
class Predictions:
    """One file read back: its header and its rows, in the split's order."""

    header: dict
    rows: list[dict]


def write(path: Path, rows: list[dict], *, task: str, split: str, labels: list[str], data: str, model: str,
          precision: str, seed: int) -> None:
    """`rows` (a task's prediction_rows) under their header, atomically (write-then-rename)."""
    header = {"format": FORMAT, "task": task, "split": split, "rows": len(rows), "labels": list(labels),
              "data": data, "model": model, "precision": precision, "seed": seed}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, "".join(_line(record) for record in (header, *rows)))


def read(path: Path) -> Predictions:
    """A predictions file; UserError for another format or a row count its header does not state."""
    path = Path(path)
    # "\n" alone ends a line: a text may hold U+2028 and the like, which JSON leaves as they are
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    header = json.loads(lines[0]) if lines else {}
    if header.get("format") != FORMAT:
        raise UserError(f"{path}: format {header.get('format')!r}: not a predictions file this version reads "
                        f"({FORMAT})")
    rows = [json.loads(line) for line in lines[1:]]
    if len(rows) != header["rows"]:
        raise UserError(f"{path}: {len(rows)} rows, its header says {header['rows']}")
    return Predictions(header, rows)


def _line(record: dict) -> str:
    return json.dumps(_finite(record), ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def _finite(value: object) -> object:
    """`value` with every float that is not finite replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
