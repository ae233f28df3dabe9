"""An export on the stage's MLflow run: the export/* metrics and the served graph as an MLflow model
of the onnx flavor (loadable through mlflow.pyfunc: a dict of int64 token arrays in, the outputs
out). Both are appended to the stage's journal as the stage's own figures are, then replayed into
its run (tracking.catch_up), so a store that is down now takes them with `python -m pipeline sync`.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np

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
    says how to replay it later)."""
    from pipeline.tracking import catch_up, journal, read_journal

    if not out.journal.is_file():
        log.warning("export: %s has no journal: the export/* metrics are in export/check.json only", out)
        return None
    records = read_journal(out.journal)
    start = next((r for r in records if r["type"] == "start"), None)
    if start is None:
        return None
    step = max((r["step"] for r in records if r["type"] == "metric"), default=0)
    now = int(time.time() * 1000)
    journal.append(out.journal, *[journal.metric(k, float(v), step, now) for k, v in metrics.items()],
                   *([journal.model(str(model), name, step)] if model is not None else []))
    target = uri or os.environ.get("MLFLOW_TRACKING_URI") or start["uri"]
    return catch_up(out.root, target, say=False)  # the export's own line names the run


def example_rows(loader, input_names: list[str], rows: int = 2) -> dict[str, np.ndarray]:
    """The first `rows` of a split's first batch, as the logged model's input example."""
    batch = next(iter(loader))
    return {k: batch[k][:rows].numpy().astype(np.int64) for k in input_names}
