"""The best model so far: its dev score and metrics, the patience count, its weights, and the one
place that knows the layout of OUTPUT_DIR/best/ (a Hugging Face model directory in fp32 with the
tokenizer: a distill stage's teacher and the final test load it).

Which evaluation is best (`beats`): the higher main metric; where it ties (an F1 of 0.0 while no
candidate is called correct yet, a flat score on a small dev set), the task's next metrics in
order (Task.tie_breakers: WikiQA's MAP then MRR), then the lower dev loss; a tie on everything
keeps the earlier model. Every new best says why (`reason`), and a reason that starts with
names.TIE_BREAK was decided by a tie-break."""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from pipeline import names
from pipeline.fsutil import atomic_dir
from pipeline.layout import OutputDir
from pipeline.models import save_pretrained_fp32
from pipeline.runtime.backend import Backend
from pipeline.tracking.model_card import write_card

log = logging.getLogger("pipeline")
LOSS = "loss"
"""The dev loss: after every ranked metric, lower is better."""


def beats(new: Mapping[str, float], best: Mapping[str, float] | None, order: Sequence[str]) -> str | None:
    """Why the evaluation `new` is better than `best` (scores by short name, as Evaluation.scores;
    None: no best yet), or None when it is not: the first metric of `order` (higher is better)
    whose values differ decides, then the lower dev loss. A metric either side lacks is skipped;
    NaN is worse than any number, and a NaN first metric is never best."""
    first = order[0]
    if _nan(new.get(first)):
        return None
    if best is None:
        return f"first evaluation ({first} {new[first]:.4f})"
    tied = []
    for name in (*order, LOSS):
        a, b = new.get(name), best.get(name)
        if a is None or b is None or a == b or (_nan(a) and _nan(b)):
            if a is not None and b is not None:
                tied.append(f"{name} {b:.4f}")
            continue
        lower = name == LOSS
        if _nan(a) or (not _nan(b) and (a > b if lower else a < b)):
            return None
        verdict = f"{name} {a:.4f} {'<' if lower else '>'} {b:.4f}"
        return f"{names.TIE_BREAK}{', '.join(tied)}: {verdict}" if tied else verdict
    return None  # a tie on everything: the earlier model stays


def _nan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


LAST = "the last model: no dev evaluation (data.dev=skip)"
"""The reason a job without dev evaluation keeps its model."""


@dataclass
class BestModel:
    """The best dev evaluation so far and the evaluations since (early stopping's patience)."""

    order: tuple[str, ...] = ("main",)
    """The dev metrics that rank evaluations, most important first, higher is better (the task's
    main metric, then Task.tie_breakers); the lower dev loss comes after them. Not saved: the task's."""
    score: float = -math.inf
    """The best evaluation's main metric."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The best evaluation's eval/ metrics, the final metrics report them (and `beats` compares with)."""
    epoch: int | None = None
    """Its epoch, from 1 (names.BEST_EPOCH)."""
    step: int | None = None
    """The optimizer step it was evaluated at."""
    reason: str = ""
    """Why it was chosen (`beats`; names.TAG_BEST_REASON)."""
    time_to_best: float | None = None
    """Training seconds when it was reached."""
    bad_evals: int = 0
    weights: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)
    """Its weights (CPU, fp32) for the final test; on disk in best/, so not in the checkpoint."""

    def consider(self, scores: dict[str, float] | None, epoch: int, train_seconds: float, backend: Backend,
                 tokenizer: PreTrainedTokenizerBase, out: OutputDir, is_main: bool, step: int | None = None) -> bool:
        """Collective under ZeRO-3: keep these weights (and write best/) if `scores` (epoch
        `epoch`, from 1) beat the best (`beats`); else count a bad evaluation. True when they did.
        No scores (a job without dev evaluation): these weights, the last ones, are kept."""
        best = {k.removeprefix(names.EVAL): v for k, v in self.metrics.items()} if self.metrics else None
        reason = LAST if scores is None else beats(scores, best, self.order)
        if reason is None:
            self.bad_evals += 1
            return False
        if is_main and scores is not None:
            log.info("best model: epoch %d%s (%s)", epoch, "" if step is None else f", step {step}", reason)
        scores = scores or {}
        self.score, self.bad_evals, self.time_to_best = scores.get(self.order[0], math.nan), 0, train_seconds
        self.epoch, self.step, self.reason = epoch, step, reason
        self.metrics = {names.eval_metric(k): v for k, v in scores.items()}
        self.weights = backend.full_state_dict()  # collective under ZeRO-3 (gathers the shards)
        if is_main:
            with atomic_dir(out.best, replace=True) as tmp:  # fp32, whatever dtype the module trains in
                save_pretrained_fp32(backend.module, self.weights, tokenizer, tmp)
                write_card(tmp, out, self.metrics)
        return True

    def restore_weights(self, saved: Path, backend: Backend) -> None:
        """Collective, on resume: the best model's weights from `saved` (Checkpoint.best_weights:
        saved without the kd_projections, if any: the model's current one fills in), if the checkpoint
        knows a best model; a file gone (removed by hand) starts the choice afresh, with a warning."""
        if not self.metrics:
            return
        if not saved.is_file():
            log.warning("%s is missing, though the checkpoint knows a best model (%s): the best model is chosen "
                        "afresh from the evaluations to come", saved, self.reason)
            self.load_state_dict(BestModel(order=self.order).state_dict())
            return
        from safetensors.torch import load_file

        self.weights = {**backend.full_state_dict(), **{k: v.float() for k, v in load_file(saved).items()}}

    def state_dict(self) -> dict:
        return {"score": self.score, "metrics": self.metrics, "epoch": self.epoch, "step": self.step,
                "reason": self.reason, "time_to_best": self.time_to_best, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict) -> None:
        """`metrics` holds every score the tie-break reads; a checkpoint saved before epoch, step and
        reason were kept loads without them."""
        self.score, self.metrics = state["score"], state["metrics"]
        self.epoch, self.step, self.reason = state.get("epoch"), state.get("step"), state.get("reason", "")
        self.time_to_best, self.bad_evals = state["time_to_best"], state["bad_evals"]
