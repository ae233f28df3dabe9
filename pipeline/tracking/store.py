"""The tracking store: which URI a job tracks to (checked, with credentials kept out of logs and
params), and the MLflow client and experiment it opens there."""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config.secrets import SECRET_NAME, redact
from pipeline.errors import UserError

if TYPE_CHECKING:
    from mlflow import MlflowClient

# MLflow 3's UI opens an experiment on its GenAI overview unless this tag says it trains models
EXPERIMENT_KIND, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
MAX_PARAM_LEN = 6000  # MLflow's limit for a param value
DEFAULT_URI = "sqlite:///mlruns/mlflow.db"
KNOWN_SCHEMES = ("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks")


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


DEFAULT_EXPERIMENT = "pipeline"


def source_of(configured: str | None, variable: str) -> str:
    """Where a tracking setting came from, for the run's tags: config | env:VARIABLE | default."""
    return "config" if configured else f"env:{variable}" if os.environ.get(variable) else "default"


def resolve_experiment(configured: str | None) -> str:
    """tracking.experiment, else $MLFLOW_EXPERIMENT_NAME (MLflow's own convention), else pipeline."""
    return configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT


def safe_params(params: dict[str, object]) -> dict[str, str]:
    """Params or tags for MLflow: secrets masked, over-long values shortened."""
    out = {}
    for key, value in params.items():
        text = "***" if SECRET_NAME.search(key.split(".")[-1]) else redact(str(value))
        out[key] = text if len(text) <= MAX_PARAM_LEN else text[: MAX_PARAM_LEN - 3] + "..."
    return out


def few_retries() -> None:
    """A dead server must not stall a job for minutes of retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


def open_client(uri: str) -> MlflowClient:
    """MlflowClient for uri. A sqlite store is created (tables and schema migrations) under a
    file lock beside the db: MLflow's own creation is not safe for jobs that start together
    (`table ... already exists`, `duplicate column name`)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # schema migrations are noisy
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        client = MlflowClient(tracking_uri=uri)  # creates (or checks) the store
    client.log_inputs = _retry_dataset_race(client.log_inputs)
    return client


DATASET_RACE = ("UNIQUE constraint failed: datasets", "duplicate key value violates unique constraint")


def _retry_dataset_race(log_inputs: Any) -> Any:
    """MLflow's log_inputs looks a dataset up, then inserts it if absent: two runs logging the same
    dataset at once (a study's cells side by side) both insert, and the second fails on the unique
    key, its transaction rolled back. Again, the dataset is found and only linked to the run."""
    import time

    from mlflow.exceptions import MlflowException

    def logged(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(3):
            try:
                return log_inputs(*args, **kwargs)
            except MlflowException as e:
                if attempt == 2 or not any(text in str(e) for text in DATASET_RACE):
                    raise
                time.sleep(0.2 * (attempt + 1))

    return logged


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
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


def open_experiment(uri: str, name: str) -> tuple[MlflowClient, str]:
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
