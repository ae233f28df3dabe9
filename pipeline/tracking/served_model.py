"""best/ as an MLflow model of the transformers flavor (tracking.log_model=true): a pipeline of the
task's serving_task with its tokenizer, an input example and a signature, so
`mlflow.transformers.load_model` gives a working transformers pipeline, `mlflow.pyfunc.load_model`
a model that serves, and the registry can take it.

Offline, nothing fetched: mlflow/transformers/__init__.py save_model fetches the model card from
the hub unless one is given (best/'s card is given), looks up a license file in the hub repository named
by the model's name_or_path (an absolute local path here: refused by huggingface_hub's repo-id check
before any request, so it writes its fallback LICENSE.txt), and infers pip requirements by loading the model in
a subprocess unless they are given (they are: the installed torch, transformers, tokenizers).
"""
from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.fsutil import atomic_dir
from pipeline.layout import OutputDir
from pipeline.tracking import finished_stage
from pipeline.tracking.model_card import CARD

if TYPE_CHECKING:
    from pipeline.tasks.base import Task

log = logging.getLogger("pipeline")
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")
EXAMPLE_ROWS = 2
MODEL_NAME = "model"
"""The logged model's name in the run (models:/MODEL_ID, or registered from the run's outputs)."""


def save_for_logging(out: OutputDir, task: Task, examples: list[dict]) -> bool:
    """best/ as an MLflow model in output_dir (True), or why not in a line (False): the task's serving
    pipeline, its input example the first of `examples` (the test rows). A failure is a warning, as
    any tracking failure: the job's results stand (best/ is there to log by hand)."""
    if out.trained_model() is None:
        return False
    if task.serving_task is None:
        log.info("tracking.log_model: no transformers pipeline serves task %s; best/ uploaded as files", task.name)
        return False
    max_length = finished_stage.read(out, "tracking.log_model").cfg.train.max_length  # truncated as trained
    try:
        save_served_model(out.best, task, examples, out.mlflow_model, max_length)
    except Exception as e:  # noqa: BLE001 - a library's failure to build the pipeline must not fail the job
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        log.warning("tracking.log_model: best/ could not be saved as an MLflow model (%s); not logged", reason)
        return False
    return True


def save_served_model(best: Path, task: Task, examples: list[dict], target: Path, max_length: int | None = None
                      ) -> None:
    """Write the MLflow model of best/ into `target` (replacing one a previous call wrote). The served
    model truncates its inputs as training did: a text-classification pipeline at `max_length`
    (its inference config); a token-classification one at the saved tokenizer's model_max_length
    (the model's positions), as that pipeline always does."""
    import huggingface_hub
    import mlflow.transformers
    import transformers

    # absolute: a relative path such as out/best is also a valid hub repo id, which the license look-up
    # would try over the network; an absolute path is refused by the repo-id check before any request
    local = str(Path(best).resolve())
    pipe = transformers.pipeline(task.serving_task, model=local, tokenizer=local, device="cpu")
    written = Path(best) / CARD  # best/'s own card (tracking/model_card.py), else a line
    card = huggingface_hub.ModelCard(written.read_text(encoding="utf-8") if written.is_file() else
                                     f"---\nlicense: other\n---\nA {task.name} model trained by the pipeline: "
                                     f"{task.serving_task}; inputs are text normalized as the task normalizes it.")
    requirements = [f"{name}=={importlib.metadata.version(name)}" for name in REQUIREMENTS]
    longest = min(max_length or pipe.tokenizer.model_max_length, pipe.tokenizer.model_max_length)
    truncate = {"truncation": True, "max_length": longest} if task.serving_task == "text-classification" else None
    with atomic_dir(target, replace=True) as tmp:
        mlflow.transformers.save_model(pipe, path=str(tmp), task=task.serving_task, model_card=card,
                                       input_example=task.serving_inputs(examples[:EXAMPLE_ROWS]),
                                       pip_requirements=requirements, model_config=truncate)
