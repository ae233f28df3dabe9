"""The Tracker: a job's live logging. Rank 0 journals every record, then applies it to its MLflow
run; a tracking error never stops training, it leaves the records to the journal (and sync)."""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import compat, fsutil
from pipeline.config.secrets import redact
from pipeline.tracking import journal, sink
from pipeline.tracking.journal import JOURNAL, Record, append
from pipeline.tracking.store import few_retries, open_experiment, resolve_experiment, safe_params

if TYPE_CHECKING:
    from pipeline.config import TrackingConfig

log = logging.getLogger("pipeline")


class Tracker:
    """MLflow client on rank 0 (a no-op elsewhere) that never stops training on a tracking error."""

    def __init__(self, output_dir: Path, active: bool, resume: bool = False) -> None:
        self.active = active
        self.journal_path = Path(output_dir) / JOURNAL
        self.client = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.uri: str | None = None
        self._warned = False
        self._monitor = None
        self.register_as: str | None = None
        """tracking.register_as: the registered model a logged model becomes a new version of."""
        if active:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            if not resume:  # a resumed job appends to the journal of its first attempt
                fsutil.write_text(self.journal_path, "")

    # -------------------------------------------------------------- lifecycle
    def start(self, uri: str, experiment: str, run_name: str, tags: dict[str, object], params: dict[str, object],
              resume_run_id: str | None = None, supersedes: str | None = None) -> None:
        """Create the run (rank 0), or reopen `resume_run_id` when a job resumes; a new run retires
        `supersedes` (sink.retire)."""
        if not self.active:
            return
        self.uri = uri
        few_retries()
        # MLflow prints run links with the URI as given, credentials included; we log our own
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        start = journal.start(redact(uri), experiment, run_name, safe_params(tags), safe_params(params), resume_run_id,
                              supersedes)
        append(self.journal_path, start)
        try:
            self.client, self.experiment_id = open_experiment(uri, experiment)
            self.run_id = sink.open_run(self.client, self.experiment_id, start)
            sink.apply(self.client, self.run_id, [start], sink.opened(start))
        except Exception as e:  # noqa: BLE001 - any tracking failure degrades to journal-only
            self._degrade(e)
        append(self.journal_path, journal.run(self.run_id))

    def end(self, status: str = "FINISHED") -> None:
        """End the run; MLflow hears of it even when the journal cannot be written (a full
        disk), so a failure never leaves the run RUNNING."""
        self.stop_system_metrics()
        if not self.active:
            return
        record = journal.end(status)
        try:
            append(self.journal_path, record)
        except OSError as e:
            log.warning("tracking: cannot record the end of the run in %s (%s)", self.journal_path, e)
        finally:
            self._apply([record])

    def announce(self, config: TrackingConfig) -> None:
        """Log where the finished run is and the command that opens it."""
        if not self.active or not self.run_id:
            return
        ui = "python -m pipeline ui" + (f" --uri {redact(self.uri)}" if config.uri else "")
        experiment = resolve_experiment(config.experiment)
        log.info("MLflow run %s (experiment '%s') in %s\n    open it: %s --experiment %s",
                 self.run_id, experiment, redact(self.uri), ui, experiment)

    def start_system_metrics(self, run_id: str | None, uri: str, node_id: str, interval: float) -> None:
        """MLflow's CPU/memory/GPU sampler into the job's run; one per node (local rank 0)."""
        if run_id is None:
            return
        try:
            self._monitor = compat.system_metrics_monitor(run_id, interval, node_id, uri)
            self._monitor.start()
        except Exception as e:  # noqa: BLE001 - optional: psutil missing, server down
            log.warning("tracking: system metrics unavailable (%s)", sink.reason(e))
            self._monitor = None

    def stop_system_metrics(self) -> None:
        if self._monitor is not None:
            try:
                self._monitor.finish()
            except Exception:  # noqa: BLE001
                pass
            self._monitor = None

    # -------------------------------------------------------------- logging
    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.active or not metrics:
            return
        now = int(time.time() * 1000)
        self._record([journal.metric(key, float(value), step, now) for key, value in metrics.items()])

    def set_tags(self, tags: dict[str, object]) -> None:
        if not self.active:
            return
        self._record([journal.tags({k: str(v) for k, v in tags.items()})])

    def log_params(self, params: dict[str, object]) -> None:
        """Params with new keys (those a run started with keep their values)."""
        if not self.active or not params:
            return
        self._record([journal.params(safe_params(params))])

    def log_datasets(self, records: Iterable[dict]) -> None:
        """The run's data as MLflow dataset inputs (name, source, digest, rows, split as the
        input's context), so the UI's Dataset column says what it trained on."""
        if not self.active:
            return
        self._record([journal.datasets(list(records))])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if not self.active or not Path(path).exists():
            return
        self._record([journal.artifact(str(path), artifact_path)])

    def log_model(self, path: Path, name: str, step: int, description: str | None = None) -> None:
        """An MLflow model saved at `path` (tracking/served_model.py), as a logged model of the run,
        registered as a new version of `register_as` if set (`description`: that version's)."""
        if not self.active or not Path(path).is_dir():
            return
        self._record([journal.model(str(path), name, step, self.register_as, description)])

    # -------------------------------------------------------------- internals
    def _record(self, records: list[Record]) -> None:
        """Journal the records, then apply them to the run (those of one call in one batch)."""
        append(self.journal_path, *records)
        self._apply(records)

    def _apply(self, records: list[Record]) -> None:
        if self.client is None or self.run_id is None:
            return
        try:
            sink.apply(self.client, self.run_id, records)
        except Exception as e:  # noqa: BLE001 - any tracking failure degrades to journal-only
            self._degrade(e)

    def _degrade(self, error: Exception) -> None:
        if not self._warned:
            log.warning("tracking: MLflow unavailable (%s); records go to %s only; upload later with "
                        "`python -m pipeline sync %s`", sink.reason(error), self.journal_path,
                        self.journal_path.parent)
            self._warned = True
        self.client = None
