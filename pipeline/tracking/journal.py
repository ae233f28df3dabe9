"""The journal: the records of a run, one JSON object a line in its output_dir. The record types
below are the one schema of that file: the Tracker writes them and sync reads them back."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pipeline import fsutil
from pipeline.layout import OutputDir

log = logging.getLogger("pipeline")

JOURNAL = OutputDir.JOURNAL


@dataclass(frozen=True)
class Start:
    """The run as the job opened it; a resumed job appends another to its first attempt's journal."""

    kind: ClassVar[str] = "start"
    uri: str
    """Redacted: a URI with credentials is never stored."""
    experiment: str
    run_name: str
    tags: dict[str, str]
    params: dict[str, str]
    resume_run_id: str | None = None


@dataclass(frozen=True)
class RunId:
    """The MLflow run the job logs to; None when the store could not be reached at start."""

    kind: ClassVar[str] = "run"
    run_id: str | None


@dataclass(frozen=True)
class Metric:
    kind: ClassVar[str] = "metric"
    key: str
    value: float
    step: int
    ts: int
    """Milliseconds since the epoch, as MLflow stores it (sync compares it to find what is missing)."""


@dataclass(frozen=True)
class Tags:
    kind: ClassVar[str] = "tags"
    tags: dict[str, str]


@dataclass(frozen=True)
class Params:
    """Params beyond the start's: new keys only (MLflow keeps a param's first value)."""

    kind: ClassVar[str] = "params"
    params: dict[str, str]


@dataclass(frozen=True)
class Datasets:
    """Dataset inputs: one dict per split, as data.loaders.describe_datasets gives them."""

    kind: ClassVar[str] = "datasets"
    datasets: list[dict[str, Any]]


@dataclass(frozen=True)
class Artifact:
    kind: ClassVar[str] = "artifact"
    path: str
    artifact_path: str | None = None


@dataclass(frozen=True)
class Model:
    """An MLflow model saved on disk (tracking/served_model.py), logged as a logged model of the
    run (MLflow 3: linked to the run and to its metrics at `step`)."""

    kind: ClassVar[str] = "model"
    path: str
    name: str
    step: int
    register_as: str | None = None
    """tracking.register_as: the registered model it becomes a new version of."""
    description: str | None = None
    """That version's description (the run's main test score)."""


@dataclass(frozen=True)
class End:
    kind: ClassVar[str] = "end"
    status: str
    """FINISHED | FAILED | KILLED."""


@dataclass(frozen=True)
class Synced:
    """`pipeline sync` uploaded the journal into this run."""

    kind: ClassVar[str] = "synced"
    run_id: str
    uri: str


Record = Start | RunId | Metric | Tags | Params | Datasets | Artifact | Model | End | Synced
RECORD_TYPES: dict[str, type[Record]] = {
    cls.kind: cls for cls in (Start, RunId, Metric, Tags, Params, Datasets, Artifact, Model, End, Synced)}


def to_json(record: Record) -> str:
    """One journal line (without its newline): the record's kind as "type", then its fields."""
    return json.dumps({"type": record.kind, **dataclasses.asdict(record)}, ensure_ascii=False)


def from_json(line: str) -> Record | None:
    """The record on a journal line; None for a kind this schema does not know. Raises ValueError
    for a line that is not a whole record."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"not a record: {line[:80]}")
    cls = RECORD_TYPES.get(obj.get("type"))
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in obj.items() if k in names})
    except TypeError as e:  # a field missing
        raise ValueError(str(e)) from e


def append(path: Path, *records: Record) -> None:
    """Append records to the journal at path, in one write."""
    data = "".join(to_json(record) + "\n" for record in records).encode("utf-8")
    with fsutil.writing(path), path.open("ab+") as f:
        # a kill mid-append leaves a torn last line; a resumed job starts on a fresh line so
        # that only the torn record is lost, not the next one glued onto it
        end = f.seek(0, os.SEEK_END)
        if end:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)


def read_journal(path: Path) -> list[Record]:
    """The journal's records, in the order written. A line that does not parse was torn by a kill
    in the middle of an append: it is skipped (with a warning) and the whole lines are kept."""
    records, torn = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            record = from_json(line)
        except ValueError:
            torn += 1
            continue
        if record is not None:
            records.append(record)
    if torn:
        log.warning("tracking: %s: skipped %d torn line(s) (a kill during a write)", path, torn)
    return records
