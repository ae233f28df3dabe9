"""best/ as an MLflow model of the transformers flavor (tracking.log_model=true): a pipeline of the
task's serving_task with its tokenizer, an input example and a signature, so
`mlflow.transformers.load_model` gives a working transformers pipeline, `mlflow.pyfunc.load_model`
a model that serves, and the registry can take it.

Offline, nothing fetched: mlflow/transformers/__init__.py save_model fetches the model card from
the hub unless one is given (a card is given), looks up a license file in the hub repository named
by the model's name_or_path (a local path here: refused by huggingface_hub's repo-id check before any
request, so it writes its fallback LICENSE.txt), and infers pip requirements by loading the model in
a subprocess unless they are given (they are: the installed torch, transformers, tokenizers).
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.fsutil import atomic_dir

if TYPE_CHECKING:
    from pipeline.tasks.base import Task

REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")
EXAMPLE_ROWS = 2


def save_served_model(best: Path, task: Task, examples: list[dict], target: Path) -> None:
    """Write the MLflow model of best/ into `target` (replacing one a previous call wrote)."""
    import huggingface_hub
    import mlflow.transformers
    import transformers

    pipe = transformers.pipeline(task.serving_task, model=str(best), tokenizer=str(best), device="cpu")
    card = huggingface_hub.ModelCard(f"---\nlicense: other\n---\nA {task.name} model trained by the pipeline: "
                                     f"{task.serving_task}; inputs are text normalized as the task normalizes it.")
    requirements = [f"{name}=={importlib.metadata.version(name)}" for name in REQUIREMENTS]
    with atomic_dir(target, replace=True) as tmp:
        mlflow.transformers.save_model(pipe, path=str(tmp), task=task.serving_task, model_card=card,
                                       input_example=task.serving_inputs(examples[:EXAMPLE_ROWS]),
                                       pip_requirements=requirements)
