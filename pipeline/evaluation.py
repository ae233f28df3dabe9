"""Scoring a split: each rank predicts its shard, predictions are gathered by row index, and
the task turns them into its metrics (plus `main`, the task's main metric)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline.data.loaders import real_rows
from pipeline.runtime import collectives
from pipeline.runtime.compiler import OFF, CompilePolicy

if TYPE_CHECKING:
    import datasets
    from torch.utils.data import DataLoader

    from pipeline.data.prepared import PreparedFeatures
    from pipeline.runtime.precision import PrecisionPolicy
    from pipeline.runtime.world import Runtime
    from pipeline.tasks.base import Task


@dataclass
class Evaluation:
    """The scores of a split, and its predictions when they were asked for."""

    scores: dict[str, float]
    """The task's metrics by short name, including "main" (and "loss" where the model gives one)."""
    predictions: object | None = None
    """The gathered predictions (row i = feature i), only with keep=True (for Task.report)."""
    stall: str | None = None
    """With keep=True: why the predictions are a collapsed solution (Task.stall: one class for
    every row, no entity, ...), or None; pipeline/measure/collapse.py tags the run with it."""

    @property
    def main(self) -> float:
        return self.scores["main"]

    def figures(self, name: Callable[[str], str]) -> dict[str, float]:
        """The scores as figures, each named by `name` (names.eval_metric, names.test_metric)."""
        return {name(k): v for k, v in self.scores.items()}


@torch.no_grad()
def evaluate(module: torch.nn.Module, loader: DataLoader, task: Task, policy: PrecisionPolicy, rt: Runtime,
             examples: list[dict], features: datasets.Dataset | PreparedFeatures, keep: bool = False,
             compile: CompilePolicy = OFF) -> Evaluation:
    """Task metrics on a split; with keep=True also the gathered predictions and Task.stall's verdict.
    `compile`: the stage's policy (a CUDA graph step marked per batch where it uses them).

    no_grad, not inference_mode: tensors a module caches while evaluating (ZeRO-3's gathered
    parameters, lazily built buffers) must stay usable by the training step that follows."""
    module.eval()
    indices, parts, loss_sum = [], [], torch.zeros((), dtype=torch.float64, device=rt.device)
    for batch in loader:
        idx = batch.pop("idx")
        rows = real_rows(idx)  # a compiled job's last batch is filled with rows that are not data
        indices.append(idx[:rows].numpy())
        inputs = {k: v.to(rt.device, non_blocking=True) for k, v in batch.items()}
        compile.begin_step()
        with policy.autocast():
            outputs = module(**inputs)
        if outputs.get("loss") is not None:  # heads without targets in eval (QA windows) have none
            loss_sum += outputs.loss.detach().double() * rows  # a mean over the real rows; summed on the device
        parts.append({k: v[:rows] for k, v in task.predictions(outputs, batch).items()})
    local = (np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64),
             {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}, float(loss_sum))
    gathered = collectives.all_gather_objects(local)
    # rows ordered by idx; a row two ranks both predicted (shard padding) is kept once
    _, first = np.unique(np.concatenate([g[0] for g in gathered]), return_index=True)
    keys = next(g[1].keys() for g in gathered if g[1])
    predictions = {k: np.concatenate([g[1][k] for g in gathered if g[1]])[first] for k in keys}
    scores = task.metrics(predictions, examples, features)
    scores["main"] = scores[task.main_metric]
    if any(g[2] for g in gathered):
        scores["loss"] = sum(g[2] for g in gathered) / sum(len(g[0]) for g in gathered)
    if not keep:
        return Evaluation(scores)
    return Evaluation(scores, predictions, task.stall(predictions, examples, features))
