"""`python -m pipeline ui`: the MLflow UI on the project's tracking store, on 127.0.0.1 by default.

It prints the page a user came for: `--experiment NAME` the experiment's runs table (in MLflow's
"Model training" view, not the GenAI overview), `--study NAME` the compare view of the study's
finished cells (their params, metrics and plots side by side); and, where the experiment's runs
logged models (tracking.log_model=true), its Models page: each model with the run it came from.
"""
from __future__ import annotations

import json
import os
import socket
from typing import TYPE_CHECKING
from urllib.parse import quote

from pipeline import names
from pipeline.config.secrets import redact
from pipeline.errors import UserError
from pipeline.tracking import open_experiment

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# MLflow 3's UI picks its GenAI or classic-ML navigation from this query parameter
TRAINING_VIEW = "workflowType=machine_learning"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def runs_page(experiment_id: str) -> str:
    """The URL fragment of an experiment's runs table."""
    return f"#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"


def compare_page(experiment_id: str, run_ids: list[str]) -> str:
    """The URL fragment of MLflow's compare view of these runs (the format its own links use)."""
    return (f"#/compare-runs?runs={quote(json.dumps(run_ids))}"
            f"&experiments={quote(json.dumps([experiment_id]))}&{TRAINING_VIEW}")


def models_page(experiment_id: str) -> str:
    """The URL fragment of an experiment's Models page (its logged models, each linked to its run)."""
    return f"#/experiments/{experiment_id}/models?{TRAINING_VIEW}"


def study_runs(client: MlflowClient, experiment_id: str, study: str) -> list[str]:
    """Run ids of the study's finished cells (the parent run left out), oldest first."""
    runs = client.search_runs([experiment_id], f"tags.{names.TAG_STUDY} = '{study}' and "
                              "attributes.status = 'FINISHED'", order_by=["attributes.start_time ASC"])
    return [r.info.run_id for r in runs if r.data.tags.get(names.PARENT_TAG) != "true"]


def pages_for(uri: str, experiment: str | None, study: str | None) -> tuple[str, str | None]:
    """The URL fragment to open (a study's comparison, an experiment's runs, or the home page), and
    the experiment's Models page if its runs logged models (else None)."""
    if study:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(experiment or study)  # a study's experiment is its name
        if found is None:
            raise UserError(f"ui: --study {study}: no experiment '{experiment or study}' in {uri}")
        experiment_id = found.experiment_id
        run_ids = study_runs(client, experiment_id, study)
        if not run_ids:
            raise UserError(f"ui: --study {study}: no finished cell runs in experiment '{experiment or study}'")
        return compare_page(experiment_id, run_ids), _models_page_if_any(client, experiment_id)
    if experiment:
        client, experiment_id = open_experiment(uri, experiment)
        return runs_page(experiment_id), _models_page_if_any(client, experiment_id)
    return "", None


def _models_page_if_any(client: MlflowClient, experiment_id: str) -> str | None:
    return models_page(experiment_id) if client.search_logged_models([experiment_id], max_results=1) else None


def command(uri: str | None = None, experiment: str | None = None, study: str | None = None) -> str:
    """The command line that opens a page (printed at the end of a stage and of a study)."""
    return "python -m pipeline ui" + (f" --uri {redact(uri)}" if uri else "") + (
        f" --experiment {experiment}" if experiment else "") + (f" --study {study}" if study else "")


def server_env() -> dict[str, str]:
    """The server's environment without MLflow's job runner unless the user asks for it: the runner
    (GenAI scorers, trace roll-ups) is eight more Python processes that this UI of training runs
    never uses, and they double the server's start-up (on a busy 2-core machine: 27-44 s to
    answer /health with them, 12-21 s without)."""
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
