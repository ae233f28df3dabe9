"""An export on the stage's MLflow run: the export/* metrics and the served graph as an MLflow model
of the onnx flavor (loadable through mlflow.pyfunc: a dict of int64 token arrays in, the outputs
out). Both are appended to the stage's journal as the stage's own figures are, then replayed into
its run (tracking.catch_up), so a store that is down now takes them with `python -m pipeline sync`.
The run is the output_dir's own: a copy of another stage's output_dir (its output_dir tag names
the other, which is still there) gets a new run, the copied journal replayed into it, rather than
the original's.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

from pipeline import names
from pipeline.layout import OutputDir

log = logging.getLogger("pipeline")


def model_name(graph: Path, variant: str) -> str:
    """The logged model's name in the run: onnx-VARIANT-DIGEST (the stage's transformers-flavor model
    is `model`). The graph's digest in it: a replay logs a name once, and an export whose graph
    changed is another model."""
    import hashlib

    return f"onnx-{variant}-{hashlib.sha256(graph.read_bytes()).hexdigest()[:8]}"


def save_mlflow_onnx(graph: Path, target: Path, example: dict[str, np.ndarray], variant: str) -> None:
    """The graph as an MLflow model (onnx flavor) in `target`, with its signature and input example."""
    import mlflow.onnx
    import onnx
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    from pipeline.export.onnx_model import OnnxModel

    outputs = OnnxModel(graph)
    predicted = {k: v.numpy() for k, v in outputs(**{k: _tensor(v) for k, v in example.items()}).items()}

    def any_length(arrays: dict[str, np.ndarray]) -> Schema:  # batch and sequence axes free, as in the graph
        return Schema([TensorSpec(a.dtype, (-1, -1, *a.shape[2:]), k) for k, a in arrays.items()])

    signature = ModelSignature(any_length(example), any_length(predicted))
    mlflow.onnx.save_model(onnx.load(str(graph)), str(target), signature=signature,
                           input_example=example, metadata={"variant": variant},
                           onnx_execution_providers=["CPUExecutionProvider"],
                           pip_requirements=_requirements())


def _tensor(array: np.ndarray):
    import torch

    return torch.from_numpy(array)


def _requirements() -> list[str]:
    import importlib.metadata

    return [f"{name}=={importlib.metadata.version(name)}" for name in ("onnx", "onnxruntime", "numpy")]


def log_to_run(out: OutputDir, metrics: dict[str, float], model: Path | None, name: str, uri: str | None
               ) -> str | None:
    """Journal the metrics (and the MLflow model saved at `model`) as the stage's records, then
    replay what its run lacks; the run id, or None where the store could not take it (a warning
    says how to replay it later). A copy of another output_dir that is still there (its journal
    names that one's run) gets a run of its own first (own_run); a moved one keeps its run."""
    from pipeline.tracking import catch_up, journal, read_journal

    if not out.journal.is_file():
        log.warning("export: %s has no journal: the export/* metrics are in export/check.json only", out)
        return None
    records = read_journal(out.journal)
    start = next((r for r in records if r["type"] == "start"), None)
    if start is None:
        return None
    target = uri or os.environ.get("MLFLOW_TRACKING_URI") or start["uri"]
    tags = {k: v for r in records if r["type"] in ("start", "tags") for k, v in r["tags"].items()}
    recorded = tags.get(names.TAG_OUTPUT_DIR)  # absent from the runs of older jobs: theirs, as before
    # the directory the run is of still there: this is a copy (a moved one keeps the run)
    copied = recorded is not None and Path(recorded) != out.root.resolve() and Path(recorded).is_dir()
    if copied and own_run(out, start, target, recorded) is None:
        return None
    step = max((r["step"] for r in records if r["type"] == "metric"), default=0)
    now = int(time.time() * 1000)
    journal.append(out.journal, *[journal.metric(k, float(v), step, now) for k, v in metrics.items()],
                   *([journal.model(str(model), name, step)] if model is not None else []))
    return catch_up(out.root, target, say=False)  # the export's own line names the run


def own_run(out: OutputDir, start: dict, uri: str, recorded: str) -> str | None:
    """A new run for `out`, a copy of the output_dir `recorded` whose run its journal names (so
    that the export lands beside the copy's model, not on the original's run): created from the
    journal's start (this directory in its output_dir tag) and named in the journal, which catch_up
    then replays into it whole. Its id, or None with a warning where the store cannot be reached."""
    from pipeline.tracking import journal, open_experiment, resolve_uri
    from pipeline.tracking.sink import create_run, reason

    here = str(out.root.resolve())
    try:
        client, experiment_id = open_experiment(resolve_uri(uri), start["experiment"])
        run_id = create_run(client, experiment_id, {**start, "tags": {**start["tags"], names.TAG_OUTPUT_DIR: here}})
    except Exception as e:  # noqa: BLE001 - the export stands on disk; its figures are in check.json
        log.warning("export: %s is a copy of %s, whose run is not this one's, and no run of its own could be "
                    "opened (%s): the export/* metrics are in export/check.json only", out, recorded, reason(e))
        return None
    journal.append(out.journal, journal.run(run_id), journal.tags({names.TAG_OUTPUT_DIR: here}))
    log.info("export: %s is a copy of %s: its records and the export go onto a new run %s, not that one's",
             out, recorded, run_id)
    return run_id


def example_rows(loader, input_names: list[str], rows: int = 2) -> dict[str, np.ndarray]:
    """The first `rows` of a split's first batch, as the logged model's input example."""
    batch = next(iter(loader))
    return {k: batch[k][:rows].numpy().astype(np.int64) for k in input_names}
