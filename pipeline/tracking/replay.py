"""Replaying a journal into MLflow: `python -m pipeline sync` after a job ran with its server
down, the catching up of a finished job's run with what its journal holds and the store lacks
(catch_up: a study's cells and a job asked again after it finished), and the settling of a run
whose job stopped without ending it."""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config.secrets import redact
from pipeline.errors import UserError
from pipeline.layout import OutputDir
from pipeline.tracking import journal, sink
from pipeline.tracking.journal import JOURNAL, Record, append, read_journal
from pipeline.tracking.store import few_retries, open_client, open_experiment, resolve_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("pipeline")


def sync(run_dir: Path | str, uri: str | None = None, tags: dict[str, str] | None = None) -> str:
    """Upload a run directory's journal into one MLflow run; returns the run id.

    The run the job created (or a sync before created) is completed if the server has it (only
    what is missing is logged, so a sync after a partial upload does not duplicate history);
    otherwise a new run is created from the journal's params and tags. `tags` are set last (a
    study's parent run, where the journal's differs).
    """
    path = _journal_file(run_dir)
    records = read_journal(path)
    start = next((r for r in records if r["type"] == "start"), None)
    if start is None:
        raise UserError(f"sync: {path}: the journal has no start record")
    target = uri or os.environ.get("MLFLOW_TRACKING_URI") or start["uri"]
    if "***" in target:
        raise UserError("sync: the journal's tracking URI had credentials, which are never stored; pass --uri")
    target = resolve_uri(target)
    client, experiment_id = open_experiment(target, start["experiment"])
    run_id = _run_on_server(client, records) or sink.create_run(client, experiment_id, start)
    records = _as_replayed(records, tags)
    sink.apply(client, run_id, records, sink.present_in(client, run_id, records))
    append(path, journal.synced(run_id, redact(target)))
    return run_id


def catch_up(run_dir: Path | str, uri: str | None, tags: dict[str, str] | None = None,
             active: bool = True, say: bool = True) -> str | None:
    """A job's run in the store `uri`, made to hold everything its journal in run_dir holds:
    the journal is replayed (as `pipeline sync` does, into the run the job or a sync before
    created, else a new run) only where the store lacks some of it (the run, its end status,
    params, tags, metric points, logged models), so a second call replays nothing. For a job
    that finished while its tracking server was down (a study's cells after their runner was
    killed) and a job asked again once finished. Returns the id of the run that holds it; None
    when run_dir has no journal of a job, or the store cannot take it: a warning naming the
    command that will, never an error (the job's results stand on disk). Only global rank 0 talks
    to the store: elsewhere (active=False) it does nothing. `say`: a line on what was replayed
    (False: a caller that journaled records only to have them replayed here, and says so its own
    way)."""
    if not active:
        return None
    try:
        records = read_journal(Path(run_dir) / JOURNAL)
    except OSError:  # no journal (read_journal skips torn lines rather than raise)
        return None
    if not any(r["type"] == "start" for r in records):
        return None
    few_retries()
    target = resolve_uri(uri)
    try:
        client = open_client(target)
        run_id = _run_on_server(client, records)
        lacking = _lacking(client, run_id, _as_replayed(records, tags))
        if not lacking:
            return run_id
        run_id = sync(run_dir, target, tags)
    except Exception as e:  # noqa: BLE001 - the job's outputs are whole; its run waits for a sync
        log.warning("tracking: %s: its journal could not be replayed into %s (%s); to replay it: "
                    "python -m pipeline sync %s --uri %s", run_dir, redact(target), sink.reason(e), run_dir,
                    redact(target))
        return None
    if say:
        log.info("tracking: %s: the store lacked %s of its journal; replayed into run %s", run_dir,
                 ", ".join(lacking), run_id)
    return run_id


def _as_replayed(records: list[Record], tags: dict[str, str] | None) -> list[Record]:
    """The records a replay applies: the journal's, then `tags`, and the end of a job that died
    without one (FAILED)."""
    records = [*records, *([journal.tags(tags)] if tags else [])]
    if not any(r["type"] == "end" for r in records):  # the job died
        records.append(journal.end("FAILED"))
    return records


def _lacking(client: MlflowClient, run_id: str | None, records: list[Record]) -> list[str]:
    """What of the records the run lacks, in words ([] if nothing)."""
    if run_id is None:
        return ["its run"]
    run = client.get_run(run_id)
    present = sink.present_in(client, run_id, records)
    lacking = []
    status = [r for r in records if r["type"] == "end"][-1]["status"]
    if run.info.status != status:
        lacking.append(f"its end ({status}; the store has {run.info.status})")
    start = next(r for r in records if r["type"] == "start")
    params = {*start["params"], *(k for r in records if r["type"] == "params" for k in r["params"])}
    if any(k not in present.params for k in params):
        lacking.append("params")
    tags = {k: v for r in records if r["type"] in ("start", "tags") for k, v in r["tags"].items()}
    if any(run.data.tags.get(k) != v for k, v in tags.items()):
        lacking.append("tags")
    logged = {key: {_point(*p) for p in points} for key, points in present.metrics.items()}
    points = sum(1 for r in records
                 if r["type"] == "metric" and _point(r["step"], r["ts"], r["value"]) not in logged[r["key"]])
    if points:
        lacking.append(f"{points} metric point(s)")
    if any(r["type"] == "model" and Path(r["path"]).is_dir() and r["name"] not in present.models for r in records):
        lacking.append("its model")
    return lacking


def _point(step: int, ts: int, value: float) -> tuple[int, int, float | None]:
    """A metric point as compared: NaN (which equals nothing, itself included) as None."""
    return step, ts, None if math.isnan(value) else value


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
    """The newest run the journal went to that this server has: the job's own, or the run a
    sync created for a job that never reached MLflow (so that a second sync completes it)."""
    for record in reversed(records):
        run_id = record["run_id"] if record["type"] in ("run", "synced") else None
        if not run_id:
            continue
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - not on this server: an older one, else a new run
            continue
        return run_id
    return None


def unfinished_run(output_dir: Path) -> str | None:
    """The MLflow run of the previous job in output_dir if that job did not finish (it failed, was
    killed, or never ended): the run a job starting over there supersedes. None when it finished,
    never reached a store, or there is no journal."""
    try:
        records = read_journal(Path(output_dir) / JOURNAL)
    except OSError:
        return None
    starts = [i for i, r in enumerate(records) if r["type"] == "start"]
    if not starts:
        return None
    last = records[starts[-1]:]  # the journal's last attempt: a resumed job appends one per attempt
    if [r["status"] for r in last if r["type"] == "end"][-1:] == ["FINISHED"]:
        return None
    return next((r["run_id"] for r in reversed(records) if r["type"] in ("run", "synced") and r["run_id"]), None)


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
    if not any(r["type"] == "start" for r in records) or any(r["type"] == "end" for r in records):
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
