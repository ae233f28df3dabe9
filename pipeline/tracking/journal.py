"""The journal: the records of a run, one JSON object a line in its output_dir. A record is that
object as a dict, its kind under "type"; the makers below, one per kind, are the one schema of
that file: the Tracker writes what they make and sync reads it back."""
from __future__ import annotations

import inspect
import json
import logging
import os
from pathlib import Path
from typing import Any

from pipeline import fsutil
from pipeline.layout import OutputDir

log = logging.getLogger("pipeline")

JOURNAL = OutputDir.JOURNAL

Record = dict[str, Any]


def start(uri: str, experiment: str, run_name: str, tags: dict[str, str], params: dict[str, str],
          resume_run_id: str | None = None, supersedes: str | None = None) -> Record:
    """The run as the job opened it; a resumed job appends another to its first attempt's journal.
    `uri` redacted: a URI with credentials is never stored. `supersedes`: the run of an unfinished
    job this one started over from, retired once this run exists (sink.create_run)."""
    return {"type": "start", "uri": uri, "experiment": experiment, "run_name": run_name, "tags": tags,
            "params": params, "resume_run_id": resume_run_id, "supersedes": supersedes}


def run(run_id: str | None) -> Record:
    """The MLflow run the job logs to; None when the store could not be reached at start."""
    return {"type": "run", "run_id": run_id}


def metric(key: str, value: float, step: int, ts: int) -> Record:
    """`ts`: milliseconds since the epoch, as MLflow stores it (sync compares it to find what is missing)."""
    return {"type": "metric", "key": key, "value": value, "step": step, "ts": ts}


def tags(tags: dict[str, str]) -> Record:
    return {"type": "tags", "tags": tags}


def params(params: dict[str, str]) -> Record:
    """Params beyond the start's: new keys only (MLflow keeps a param's first value)."""
    return {"type": "params", "params": params}


def datasets(datasets: list[dict[str, Any]]) -> Record:
    """Dataset inputs: one dict per split, as data.loaders.describe_datasets gives them."""
    return {"type": "datasets", "datasets": datasets}


def artifact(path: str, artifact_path: str | None = None) -> Record:
    return {"type": "artifact", "path": path, "artifact_path": artifact_path}


def model(path: str, name: str, step: int, register_as: str | None = None, description: str | None = None
          ) -> Record:
    """An MLflow model saved on disk (tracking/served_model.py), logged as a logged model of the
    run (MLflow 3: linked to the run and to its metrics at `step`); with `register_as`
    (tracking.register_as), a new version of that registered model, described by `description`
    (the run's main test score)."""
    return {"type": "model", "path": path, "name": name, "step": step, "register_as": register_as,
            "description": description}


def end(status: str) -> Record:
    """`status`: FINISHED | FAILED | KILLED."""
    return {"type": "end", "status": status}


def synced(run_id: str, uri: str) -> Record:
    """`pipeline sync` uploaded the journal into this run."""
    return {"type": "synced", "run_id": run_id, "uri": uri}


MAKERS = {maker.__name__: maker for maker in (start, run, metric, tags, params, datasets, artifact, model, end, synced)}


def to_json(record: Record) -> str:
    """One journal line (without its newline): the record's kind as "type", then its fields."""
    return json.dumps(record, ensure_ascii=False)


def from_json(line: str) -> Record | None:
    """The record on a journal line, made again by its kind's maker (fields it does not take are
    dropped); None for a kind this schema does not know. Raises ValueError for a line that is not
    a whole record."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"not a record: {line[:80]}")
    maker = MAKERS.get(obj.get("type"))
    if maker is None:
        return None
    names = inspect.signature(maker).parameters
    try:
        return maker(**{k: v for k, v in obj.items() if k in names})
    except TypeError as e:  # a field missing
        raise ValueError(str(e)) from e


def append(path: Path, *records: Record) -> None:
    """Append records to the journal at path, in one write."""
    data = "".join(to_json(record) + "\n" for record in records).encode("utf-8")
    with fsutil.writing(path), path.open("ab+") as f:
        # a kill mid-append leaves a torn last line; a resumed job starts on a fresh line so
        # that only the torn record is lost, not the next one glued onto it
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
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
