"""Journal records into an MLflow run: the one path by which a run's metrics, params and tags reach MLflow, live
(the Tracker applies each record it journals) and replayed (sync applies a whole journal)."""
from __future__ import annotations

import json
import logging
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.names import TAG_SUPERSEDED_BY as SUPERSEDED_BY
from pipeline.names import TAG_SUPERSEDES as SUPERSEDES
from pipeline.tracking.journal import Record

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import DatasetInput

log = logging.getLogger("pipeline")

PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000  # MLflow's limits for one log_batch
SOURCE_TAGS = ("mlflow.source.", "mlflow.user")
MODEL_VERSIONS_TAG = "mlflow.modelVersions"
"""MLflow's own tag on a logged model: the registered versions made from it."""
"""The run's tags a logged model carries too (MLflow's Models page shows its source and commit)."""


@dataclass(frozen=True)
class Present:
    """What the run already holds, so that applying records logs only the rest."""

    params: Container[str] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Mapping[str, Container[tuple[int, int, float]]] = field(default_factory=dict)
    """Metric key -> (step, timestamp, value) of each point already logged."""
    models: Container[str] = ()
    """Names of the logged models the run already outputs (a replay logs each once)."""


NOTHING = Present()


def opened(start: Record) -> Present:
    """What a run holds of its start record once open_run returns: a new run has the start's tags
    (set as it is created); a reopened run keeps its params (MLflow refuses changing a param's value)."""
    return Present(params=start["params"]) if start["resume_run_id"] else Present(tags=start["tags"])


def open_run(client: MlflowClient, experiment_id: str, start: Record) -> str:
    """The run a job logs to: the run a resumed job continues, RUNNING again, else a new one."""
    if start["resume_run_id"]:
        client.update_run(start["resume_run_id"], status="RUNNING")
        return start["resume_run_id"]
    return create_run(client, experiment_id, start)


def create_run(client: MlflowClient, experiment_id: str, start: Record) -> str:
    """A new run from the start record; the run it supersedes, if any, retired."""
    run_id = client.create_run(experiment_id, run_name=start["run_name"], tags=start["tags"]).info.run_id
    if start["supersedes"]:
        retire(client, start["supersedes"], run_id)
    return run_id


def retire(client: MlflowClient, old: str, new: str) -> None:
    """One run per job in the view the UI, the study and the report read: the run of an unfinished
    job (killed, failed) that a job started over from is tagged with its successor and deleted
    (MLflow's soft delete: out of the default view, `mlflow runs restore` brings it back); the new
    run names it. A run the store does not have is left alone."""
    from mlflow.entities import RunTag

    try:
        fresh = client.get_run(old).info.lifecycle_stage != "deleted"  # a replayed start: retired already
        if fresh:
            client.set_tag(old, SUPERSEDED_BY, new)
            client.delete_run(old)
    except Exception as e:  # noqa: BLE001 - not in this store: nothing to retire
        log.warning("tracking: run %s, which run %s supersedes, was not retired (%s)", old, new, reason(e))
        return
    client.log_batch(new, tags=[RunTag(SUPERSEDES, old)])
    if fresh:
        log.warning("tracking: run %s of the unfinished job before this one is superseded by run %s: deleted from "
                    "the default view (tagged %s; mlflow runs restore --run-id %s brings it back)", old, new,
                    SUPERSEDED_BY, old)


def present_in(client: MlflowClient, run_id: str, records: Sequence[Record]) -> Present:
    """What the run on the server holds of these records' params and metrics (tags are set again:
    the journal's last value of a tag wins)."""
    keys = {r["key"] for r in records if r["type"] == "metric"}
    run = client.get_run(run_id)
    outputs = (run.outputs.model_outputs or []) if run.outputs else []
    return Present(params=run.data.params,
                   metrics={key: {(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)}
                            for key in keys},
                   models={client.get_logged_model(o.model_id).name for o in outputs})


def apply(client: MlflowClient, run_id: str, records: Sequence[Record], present: Present = NOTHING) -> None:
    """Log the records into the run, each kind in as few calls as MLflow takes: params (the first
    start record's: a run's params are those it started with; and the new keys of params
    records), tags (of every start and tags
    record, the last value of a key winning), metrics, dataset inputs, artifacts (those still on
    disk), logged models (after the metrics they link), then the status of the last end record."""
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.entities import Param, RunTag

    start = next((r for r in records if r["type"] == "start"), None)
    later = {k: v for r in records if r["type"] == "params" for k, v in r["params"].items()}
    params = [Param(k, v) for k, v in {**(start["params"] if start else {}), **later}.items()
              if k not in present.params]
    for i in range(0, len(params), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=params[i : i + PARAMS_PER_BATCH])
    tags = {k: v for r in records if r["type"] in ("start", "tags") for k, v in r["tags"].items()}
    new_tags = [RunTag(k, v) for k, v in tags.items() if present.tags.get(k) != v]
    if new_tags:
        client.log_batch(run_id, tags=new_tags)
    metrics = [MlflowMetric(r["key"], r["value"], r["ts"], r["step"]) for r in records
               if r["type"] == "metric" and (r["step"], r["ts"], r["value"]) not in present.metrics.get(r["key"], ())]
    for i in range(0, len(metrics), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + METRICS_PER_BATCH])
    inputs = [e for r in records if r["type"] == "datasets" for e in r["datasets"]]
    if inputs:
        client.log_inputs(run_id, datasets=dataset_inputs(inputs))
    for r in records:
        if r["type"] == "artifact" and Path(r["path"]).exists():
            log_artifact = client.log_artifacts if Path(r["path"]).is_dir() else client.log_artifact
            log_artifact(run_id, r["path"], r["artifact_path"])
    for r in records:
        if r["type"] == "model" and Path(r["path"]).is_dir() and r["name"] not in present.models:
            log_saved_model(client, run_id, r)
    ends = [r for r in records if r["type"] == "end"]
    if ends:
        client.set_terminated(run_id, status=ends[-1]["status"])


def dataset_inputs(entries: list[dict[str, Any]]) -> list[DatasetInput]:
    """MLflow DatasetInputs from journal entries of describe_datasets' dicts."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    return [DatasetInput(Dataset(e["name"], e["digest"], e["source_type"], e["source"],
                                 profile=json.dumps({"num_rows": e["rows"]})),
                         tags=[InputTag("mlflow.data.context", e["split"])]) for e in entries]


def reason(e: Exception) -> str:
    """The first line of an exception's message (MLflow's can be pages of HTML), or its type."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def log_saved_model(client: MlflowClient, run_id: str, record: Record) -> None:
    """An MLflow model already saved on disk, logged through the client's public API as MLflow 3's
    Model.log logs one (mlflow/models/model.py): a LoggedModel in the run's experiment (for a study
    cell, the study's) with the run as its source and the run's params, its files uploaded as they
    were saved (the MLmodel naming the logged model and run), READY, the run's output at
    record's step, and the run's metrics at that step linked to it. With the record's register_as, a
    new version of that registered model (created on first use), described by its description."""
    import shutil
    import tempfile

    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.models import Model as MlflowModel

    run = client.get_run(run_id)
    source_tags = {k: v for k, v in run.data.tags.items() if k.startswith(SOURCE_TAGS)}
    model = client.create_logged_model(run.info.experiment_id, name=record["name"], source_run_id=run_id,
                                       params=run.data.params, tags=source_tags)
    with tempfile.TemporaryDirectory() as tmp:
        files = Path(tmp) / "model"
        shutil.copytree(record["path"], files)
        described = MlflowModel.load(files)
        described.run_id, described.model_id, described.artifact_path = run_id, model.model_id, model.artifact_location
        described.save(str(files / "MLmodel"))
        client.log_model_artifacts(model.model_id, str(files))
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=record["step"])])
    linked = [MlflowMetric(m.key, m.value, m.timestamp, m.step, model_id=model.model_id, run_id=run_id)
              for key in run.data.metrics for m in client.get_metric_history(run_id, key)
              if m.step == record["step"] and m.model_id is None]
    for i in range(0, len(linked), METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=linked[i : i + METRICS_PER_BATCH])
    log.info("model logged: %s in run %s (mlflow.pyfunc.load_model(\"models:/%s\"))", record["name"], run_id,
             model.model_id)
    if record["register_as"]:
        version = register(client, record["register_as"], model.model_id, model.artifact_location, run_id,
                           record["description"])
        log.info("model registered: %s version %d (models:/%s/%d)", record["register_as"], version,
                 record["register_as"], version)


def register(client: MlflowClient, name: str, model_id: str, location: str, run_id: str,
             description: str | None) -> int:
    """A new version of registered model `name` (created on first use) from a logged model, as
    mlflow.register_model makes one (mlflow/tracking/_model_registry/fluent.py), the logged model
    tagged with its versions (the UI links them); its number. The source is the logged model's
    artifact location: a models:/ID source is resolved by the store through the process's default
    tracking URI, not this client's."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(name, source=location, run_id=run_id, model_id=model_id,
                                          description=description)
    versions = json.loads(client.get_logged_model(model_id).tags.get(MODEL_VERSIONS_TAG, "[]"))
    client.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps(
        [*versions, {"name": name, "version": version.version}])})
    return int(version.version)
