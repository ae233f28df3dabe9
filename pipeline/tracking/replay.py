"""Replaying a journal into MLflow: `python -m pipeline sync` after a job ran with its server
down, and the settling of a run whose job stopped without ending it."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import UserError
from pipeline.layout import OutputDir
from pipeline.tracking import sink
from pipeline.tracking.journal import JOURNAL, End, Record, RunId, Start, Synced, append, read_journal
from pipeline.tracking.store import few_retries, open_experiment, redact, resolve_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("pipeline")


def sync(run_dir: Path | str, uri: str | None = None) -> str:
    """Upload a run directory's journal into one MLflow run; returns the run id.

    The run the job created is completed if the server has it (only what is missing is
    logged, so a sync after a partial upload does not duplicate history); otherwise a new run
    is created from the journal's params and tags.
    """
    path = _journal_file(run_dir)
    records = read_journal(path)
    start = next((r for r in records if isinstance(r, Start)), None)
    if start is None:
        raise UserError(f"sync: {path}: the journal has no start record")
    target = uri or os.environ.get("MLFLOW_TRACKING_URI") or start.uri
    if "***" in target:
        raise UserError("sync: the journal's tracking URI had credentials, which are never stored; pass --uri")
    target = resolve_uri(target)
    client, experiment_id = open_experiment(target, start.experiment)
    run_id = _run_on_server(client, records) or sink.create_run(client, experiment_id, start)
    if not any(isinstance(r, End) for r in records):  # the job died
        records.append(End("FAILED"))
    sink.apply(client, run_id, records, sink.present_in(client, run_id, records))
    append(path, Synced(run_id, redact(target)))
    return run_id


def _journal_file(run_dir: Path | str) -> Path:
    """The journal of a stage's output_dir, or a journal kept aside (journal.abandoned-STAMP.jsonl)."""
    if Path(run_dir).suffix == ".jsonl":
        if not Path(run_dir).is_file():
            raise UserError(f"sync: {run_dir}: no such file")
        return Path(run_dir)
    path = Path(run_dir) / JOURNAL
    if not path.is_file():
        raise UserError(f"sync: {run_dir}: no {JOURNAL} (is it a stage's output_dir?)")
    return path


def _run_on_server(client: MlflowClient, records: list[Record]) -> str | None:
    """The last run the journal's job logged to, if this server has it."""
    run_id = next((r.run_id for r in reversed(records) if isinstance(r, RunId) and r.run_id), None)
    if run_id is None:
        return None
    try:
        client.get_run(run_id)
    except Exception:  # noqa: BLE001 - not on this server: upload as a new run
        return None
    return run_id


def settle_abandoned_run(output_dir: Path, uri: str) -> str | None:
    """A previous job in output_dir that stopped without ending (killed, its checkpoints
    unusable) is synced as `pipeline sync` would: what its journal holds and MLflow lacks is
    uploaded (a job that ran with the server down has its whole run created) and the run is
    marked FAILED. Returns the run id. If the store cannot take it, the journal is kept beside
    as journal.abandoned-STAMP.jsonl (`pipeline sync FILE` uploads it later) rather than lost
    when the new job starts its own journal."""
    path = Path(output_dir) / JOURNAL
    try:
        records = read_journal(path)
    except OSError:  # no journal (read_journal skips torn lines rather than raise)
        return None
    if not any(isinstance(r, Start) for r in records) or any(isinstance(r, End) for r in records):
        return None
    few_retries()
    try:
        return sync(output_dir, uri)
    except Exception as e:  # noqa: BLE001 - a dead server must not stop the new job
        kept = OutputDir(output_dir).abandoned_journal()
        os.replace(path, kept)
        log.warning("tracking: could not upload the previous job's journal (%s); kept as %s: "
                    "python -m pipeline sync %s --uri URI", sink.reason(e), kept, kept)
        return None
