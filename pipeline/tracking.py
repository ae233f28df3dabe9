"""One MLflow run per job, created by global rank 0 only, plus a local journal of every
figure in the run's output directory, written as it is produced.

If the tracking server cannot be reached (at start or mid-run) training goes on: the journal
keeps everything, and `python -m pipeline sync RUN_DIR` uploads it later. A job that fails,
even because the journal itself cannot be written, ends its run FAILED (or KILLED).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

from pipeline import fsutil, names, telemetry
from pipeline.config import Config, flatten
from pipeline.errors import UserError
from pipeline.runtime import dist
from pipeline.runtime.dist import Runtime

log = logging.getLogger("pipeline")

JOURNAL = "journal.jsonl"
# MLflow 3's UI opens an experiment on its GenAI overview unless this tag says it trains models
EXPERIMENT_KIND, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
MAX_PARAM_LEN = 6000  # MLflow's limit for a param value
DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
KNOWN_SCHEMES = ("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks")
SECRET_NAME = re.compile(r"(TOKEN|KEY|PASSWORD|SECRET|CREDENTIAL)S?$", re.IGNORECASE)


def resolve_uri(configured: str | None) -> str:
    """tracking.uri, else $MLFLOW_TRACKING_URI, else the project's sqlite store under mlruns/."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    scheme = uri.split(":", 1)[0].split("+", 1)[0] if "://" in uri else ""
    if scheme not in KNOWN_SCHEMES:
        raise UserError(f"config: tracking.uri={redact(uri)}: not a tracking URI "
                        f"(expected one of {', '.join(s + '://' for s in KNOWN_SCHEMES)})")
    if scheme == "file":
        raise UserError(f"config: tracking.uri={uri}: MLflow 3 refuses the plain file store; use {DEFAULT_URI}")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):]
        if not path.startswith("/"):  # relative to the working directory, as MLflow reads it
            path = str(Path(path).resolve())
            uri = f"sqlite:///{path}"
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return uri


def redact(value: str) -> str:
    """Drop credentials from a URI-looking string (user:password@host)."""
    if "://" not in value or "@" not in value:
        return value
    parts = urlsplit(value)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def redact_config(value, key: str = ""):
    """A copy of a (nested) config with secret-looking keys masked and URI credentials dropped."""
    if isinstance(value, dict):
        return {k: redact_config(v, k) for k, v in value.items()}
    if SECRET_NAME.search(key) and value is not None:
        return "***"
    return redact(value) if isinstance(value, str) else value


def safe_params(params: dict) -> dict[str, str]:
    """Params or tags for MLflow: secrets masked, over-long values shortened."""
    out = {}
    for key, value in params.items():
        text = "***" if SECRET_NAME.search(key.split(".")[-1]) else redact(str(value))
        out[key] = text if len(text) <= MAX_PARAM_LEN else text[: MAX_PARAM_LEN - 3] + "..."
    return out


class Tracker:
    """MLflow client on rank 0 (a no-op elsewhere) that never stops training on a tracking error."""

    def __init__(self, output_dir: Path, active: bool, resume: bool = False):
        self.active = active
        self.journal_path = Path(output_dir) / JOURNAL
        self.client = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.uri: str | None = None
        self._warned = False
        self._monitor = None
        if active:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            if not resume:  # a resumed job appends to the journal of its first attempt
                fsutil.write_text(self.journal_path, "")

    # -------------------------------------------------------------- lifecycle
    def start(self, uri: str, experiment: str, run_name: str, tags: dict, params: dict,
              resume_run_id: str | None = None) -> None:
        """Create the run (rank 0), or reopen `resume_run_id` when a job resumes."""
        if not self.active:
            return
        self.uri = uri
        _few_retries()
        # MLflow prints run links with the URI as given, credentials included; we log our own
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        params = safe_params(params)
        tags = safe_params(tags)
        self._journal({"type": "start", "uri": redact(uri), "experiment": experiment, "run_name": run_name,
                       "tags": tags, "params": params, "resume_run_id": resume_run_id})
        try:
            self.client, self.experiment_id = open_experiment(uri, experiment)
            if resume_run_id:
                self.client.update_run(resume_run_id, status="RUNNING")
                self.run_id = resume_run_id
                self.client.log_batch(self.run_id, tags=[_tag(k, v) for k, v in tags.items()])
            else:
                self.run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags).info.run_id
                self._upload_params(params)
        except Exception as e:  # noqa: BLE001 - any tracking failure degrades to journal-only
            self._degrade(e)
        self._journal({"type": "run", "run_id": self.run_id})

    def end(self, status: str = "FINISHED") -> None:
        """End the run; MLflow hears of it even when the journal cannot be written (a full
        disk), so a failure never leaves the run RUNNING."""
        self.stop_system_metrics()
        if not self.active:
            return
        try:
            self._journal({"type": "end", "status": status})
        except OSError as e:
            log.warning("tracking: cannot record the end of the run in %s (%s)", self.journal_path, e)
        finally:
            self._call(lambda: self.client.set_terminated(self.run_id, status=status))

    def announce(self, config) -> None:
        """Log where the finished run is and the command that opens it (config: TrackingConfig)."""
        if not self.active or not self.run_id:
            return
        ui = "python -m pipeline ui" + (f" --uri {redact(self.uri)}" if config.uri else "")
        log.info("MLflow run %s (experiment '%s') in %s\n    open it: %s --experiment %s",
                 self.run_id, config.experiment, redact(self.uri), ui, config.experiment)

    def start_system_metrics(self, run_id: str | None, uri: str, node_id: str, interval: float) -> None:
        """MLflow's CPU/memory/GPU sampler into the job's run; one per node (local rank 0)."""
        if run_id is None:
            return
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, node_id=node_id,
                                                 tracking_uri=uri)
            self._monitor.start()
        except Exception as e:  # noqa: BLE001 - optional: psutil missing, server down
            log.warning("tracking: system metrics unavailable (%s)", _reason(e))
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
        for key, value in metrics.items():
            self._journal({"type": "metric", "key": key, "value": float(value), "step": step, "ts": now})

        def upload():
            from mlflow.entities import Metric

            self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

        self._call(upload)

    def set_tags(self, tags: dict) -> None:
        if not self.active:
            return
        tags = {k: str(v) for k, v in tags.items()}
        self._journal({"type": "tags", "tags": tags})

        self._call(lambda: self.client.log_batch(self.run_id, tags=[_tag(k, v) for k, v in tags.items()]))

    def log_datasets(self, records) -> None:
        """The run's data as MLflow dataset inputs (data.DatasetRecord: name, source, digest,
        rows, split as the input's context), so the UI's Dataset column says what it trained on."""
        if not self.active:
            return
        entries = [dataclasses.asdict(r) for r in records]
        self._journal({"type": "datasets", "datasets": entries})
        self._call(lambda: self.client.log_inputs(self.run_id, datasets=dataset_inputs(entries)))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if not self.active or not Path(path).exists():
            return
        self._journal({"type": "artifact", "path": str(path), "artifact_path": artifact_path})
        if Path(path).is_dir():
            self._call(lambda: self.client.log_artifacts(self.run_id, str(path), artifact_path))
        else:
            self._call(lambda: self.client.log_artifact(self.run_id, str(path), artifact_path))

    # -------------------------------------------------------------- internals
    def _upload_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def _call(self, fn) -> None:
        if self.client is None or self.run_id is None:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            self._degrade(e)

    def _degrade(self, error: Exception) -> None:
        if not self._warned:
            log.warning("tracking: MLflow unavailable (%s); figures go to %s only; upload later with "
                        "`python -m pipeline sync %s`", _reason(error), self.journal_path, self.journal_path.parent)
            self._warned = True
        self.client = None

    def _journal(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with fsutil.writing(self.journal_path), self.journal_path.open("ab+") as f:
            # a kill mid-append leaves a torn last line; a resumed job starts on a fresh line so
            # that only the torn record is lost, not the next one glued onto it
            end = f.seek(0, os.SEEK_END)
            if end:
                f.seek(end - 1)
                if f.read(1) != b"\n":
                    line = b"\n" + line
            f.write(line)


def what_ran(cfg: Config, rt: Runtime, policy, backend, model_spec: str, stage: str) -> dict:
    """What actually runs, beside the config as requested (precision=auto, backend=auto): MLflow
    params `resolved.*` and the backend's tags, so the compare view needs no click-through."""
    t = cfg.train
    batch = f"<= {t.batch_tokens} tokens" if t.batch_tokens else t.batch_size
    params = {"precision": policy.name, "compute_dtype": str(policy.compute_dtype).removeprefix("torch."),
              "backend": rt.backend, "world_size": rt.world_size, "grad_accum": t.grad_accum,
              "global_batch": f"{batch} x {t.grad_accum} x {rt.world_size}" if t.batch_tokens
              else t.batch_size * t.grad_accum * rt.world_size,
              "deepspeed_stage": getattr(backend, "stage", None), "model": model_spec, "lr": t.lr,
              "teacher": cfg.kd.teacher if stage == "distill" else None,
              "requested_world_size": rt.requested_world_size or rt.world_size}
    return {"params": {f"resolved.{k}": v for k, v in params.items()}, "tags": backend.extra_tags}


def dataset_inputs(entries: list[dict]):
    """MLflow DatasetInputs from journal entries of DatasetRecords."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    return [DatasetInput(Dataset(e["name"], e["digest"], e["source_type"], e["source"],
                                 profile=json.dumps({"num_rows": e["rows"]})),
                         tags=[InputTag("mlflow.data.context", e["split"])]) for e in entries]


def start_stage_run(cfg: Config, rt: Runtime, stage: str, model_spec: str, precision_name: str, uri: str,
                    energy_available: bool, resumed: bool, resume_run_id: str | None,
                    ran: dict | None = None) -> tuple[Tracker, str | None]:
    """Collective: write the resolved config.yaml, open the stage's MLflow run on rank 0 with its
    tags and params (a resumed job reopens its run and appends to its journal), and start system
    metrics on every node. Params are the config as requested plus `ran` (what actually ran:
    `resolved.*` params and backend tags such as precision_mode). Returns the tracker and the run
    id (the same on every rank; None without tracking)."""
    out = Path(cfg.output_dir)
    resolved = redact_config({**cfg.to_dict(), "tracking": {**cfg.to_dict()["tracking"], "uri": uri}})
    if rt.is_main:  # redacted: no secrets in the file
        fsutil.write_text(out / "config.yaml", yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True))
    tracker = Tracker(out, active=rt.is_main, resume=resumed)
    tags = {
        "task": cfg.task, "model": model_spec, "precision": precision_name, "precision_requested": cfg.precision,
        "backend": rt.backend, "launcher": rt.launcher, "world_size": rt.world_size,
        names.TAG_FALLBACK: "true" if rt.fallback else "false",
        names.TAG_REQUESTED_WORLD_SIZE: rt.requested_world_size or rt.world_size,
        "num_nodes": rt.num_nodes, "stage": stage, names.TAG_PROCEDURE: stage,
        "device": telemetry.device_name(rt.device), "device_type": rt.device.type, "seed": cfg.seed,
        names.TAG_STUDY: "", "energy_available": "true" if energy_available else "false",
        **telemetry.environment_tags(), **(ran or {}).get("tags", {}), **cfg.tracking.tags,
    }
    if cfg.tracking.parent_run_id:
        tags["mlflow.parentRunId"] = cfg.tracking.parent_run_id
    run_name = cfg.tracking.run_name or f"{cfg.task}-{model_spec.split('/')[-1]}-{precision_name}"
    try:
        params = {**flatten(resolved), **{k: v for k, v in (ran or {}).get("params", {}).items() if v is not None}}
        tracker.start(uri, cfg.tracking.experiment, run_name, tags, params, resume_run_id=resume_run_id)
        tracker.log_artifact(out / "config.yaml")
        run_id = dist.broadcast_object(tracker.run_id)
        if cfg.tracking.system_metrics and rt.local_rank == 0:
            node = rt.rank // max(1, rt.world_size // rt.num_nodes)
            tracker.start_system_metrics(run_id, uri, f"node{node}-{socket.gethostname()}",
                                         cfg.tracking.system_metrics_interval)
    except BaseException:  # e.g. the journal on a full disk: the run must not stay RUNNING
        tracker.end("FAILED")
        raise
    return tracker, run_id


def _few_retries() -> None:
    """A dead server must not stall a job for minutes of retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


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
    if not any(r.get("type") == "start" for r in records) or any(r.get("type") == "end" for r in records):
        return None
    _few_retries()
    try:
        return sync(output_dir, uri)
    except Exception as e:  # noqa: BLE001 - a dead server must not stop the new job
        kept = path.with_name(f"journal.abandoned-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        os.replace(path, kept)
        log.warning("tracking: could not upload the previous job's journal (%s); kept as %s: "
                    "python -m pipeline sync %s --uri URI", _reason(e), kept, kept)
        return None


def read_journal(path: Path) -> list[dict]:
    """The journal's records, one JSON object per line. A line that does not parse was torn by a
    kill in the middle of an append: it is skipped (with a warning) and the whole lines are kept."""
    records, torn = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            torn += 1
    if torn:
        log.warning("tracking: %s: skipped %d torn line(s) (a kill during a write)", path, torn)
    return records


def _reason(e: Exception) -> str:
    """The first line of an exception's message (MLflow's can be pages of HTML), or its type."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _tag(key: str, value: str):
    from mlflow.entities import RunTag

    return RunTag(key, value)


def open_client(uri: str):
    """MlflowClient for uri. A sqlite store is created (tables and schema migrations) under a
    file lock beside the db: MLflow's own creation is not safe for jobs that start together
    (`table ... already exists`, `duplicate column name`)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # schema migrations are noisy
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        return MlflowClient(tracking_uri=uri)  # creates (or checks) the store


@contextlib.contextmanager
def _store_lock(uri: str):
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(db.with_name(f".{db.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)  # waits for the job that is creating the store
        yield
    finally:
        os.close(fd)  # releases the lock


def open_experiment(uri: str, name: str):
    """(MlflowClient, experiment id); for the sqlite store, artifacts live beside the db."""
    from mlflow.exceptions import MlflowException

    client = open_client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND) != TRAINING_KIND:  # e.g. made by an older version
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, TRAINING_KIND)
        return client, exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):  # mlruns/<experiment>/<run id>/artifacts, beside the db
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"
        location = (Path(uri[len("sqlite:///"):]).parent.resolve() / slug).as_uri()
    try:
        return client, client.create_experiment(name, artifact_location=location,
                                                tags={EXPERIMENT_KIND: TRAINING_KIND})
    except MlflowException:  # created meanwhile by another job
        return client, client.get_experiment_by_name(name).experiment_id


def sync(run_dir: Path, uri: str | None = None) -> str:
    """Upload a run directory's journal into one MLflow run; returns the run id.

    The run the job created is completed if the server has it (only what is missing is
    logged, so a sync after a partial upload does not duplicate history); otherwise a new run
    is created from the journal's params and tags.
    """
    if Path(run_dir).suffix == ".jsonl":  # a journal kept aside: journal.abandoned-STAMP.jsonl
        path = Path(run_dir)
        if not path.is_file():
            raise UserError(f"sync: {run_dir}: no such file")
    else:
        path = Path(run_dir) / JOURNAL
        if not path.is_file():
            raise UserError(f"sync: {run_dir}: no {JOURNAL} (is it a stage's output_dir?)")
    from mlflow.entities import Metric, Param

    records = read_journal(path)
    start = next((r for r in records if r["type"] == "start"), None)
    if start is None:
        raise UserError(f"sync: {path}: the journal has no start record")
    target = uri or os.environ.get("MLFLOW_TRACKING_URI") or start["uri"]
    if "***" in target:
        raise UserError("sync: the journal's tracking URI had credentials, which are never stored; pass --uri")
    target = resolve_uri(target)
    client, experiment_id = open_experiment(target, start["experiment"])

    run_id = next((r["run_id"] for r in reversed(records) if r["type"] == "run" and r["run_id"]), None)
    if run_id is not None:
        try:
            client.get_run(run_id)
        except Exception:  # noqa: BLE001 - not on this server: upload as a new run
            run_id = None
    if run_id is None:
        run_id = client.create_run(experiment_id, run_name=start["run_name"], tags=start["tags"]).info.run_id
    run = client.get_run(run_id)

    params = [Param(k, v) for k, v in start["params"].items() if k not in run.data.params]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i : i + 100])
    tags = {k: v for r in records if r["type"] in ("start", "tags") for k, v in r["tags"].items()}
    client.log_batch(run_id, tags=[_tag(k, v) for k, v in tags.items()])

    metrics = [r for r in records if r["type"] == "metric"]
    have = {key: {(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)}
            for key in {r["key"] for r in metrics}}
    missing = [Metric(r["key"], r["value"], r["ts"], r["step"]) for r in metrics
               if (r["step"], r["ts"], r["value"]) not in have[r["key"]]]
    for i in range(0, len(missing), 1000):
        client.log_batch(run_id, metrics=missing[i : i + 1000])

    inputs = [e for r in records if r["type"] == "datasets" for e in r["datasets"]]
    if inputs:
        client.log_inputs(run_id, datasets=dataset_inputs(inputs))
    for r in records:
        if r["type"] == "artifact" and Path(r["path"]).exists():
            if Path(r["path"]).is_dir():
                client.log_artifacts(run_id, r["path"], r.get("artifact_path"))
            else:
                client.log_artifact(run_id, r["path"], r.get("artifact_path"))
    end = next((r for r in reversed(records) if r["type"] == "end"), None)
    client.set_terminated(run_id, status=end["status"] if end else "FAILED")  # no end record: it died
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"type": "synced", "run_id": run_id, "uri": redact(target)}) + "\n")
    return run_id
