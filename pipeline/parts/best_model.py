"""The best model so far: its dev score and metrics, the patience count, its weights, and the one
place that knows the layout of OUTPUT_DIR/best/ (a Hugging Face model directory in fp32 with the
tokenizer: a distill stage's teacher and the final test load it)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline import names
from pipeline.fsutil import atomic_dir
from pipeline.layout import OutputDir
from pipeline.parts.model_card import write_card
from pipeline.runtime.backend import Backend


def save_pretrained_fp32(module: PreTrainedModel, state_dict: dict, tokenizer: PreTrainedTokenizerBase,
                         target: Path) -> None:
    """A model directory that loads as fp32: the weights of `state_dict` in fp32 and a
    config.json whose dtype says float32, whatever dtype the module itself trained in
    (DeepSpeed's fp16 mode keeps it in 16 bit, and save_pretrained writes the module's dtype)."""
    weights = {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}
    module.save_pretrained(target, state_dict=weights)  # safetensors: transformers' only format
    config = copy.deepcopy(module.config)
    config.dtype = "float32"
    config.save_pretrained(target)
    tokenizer.save_pretrained(target)


@dataclass
class BestModel:
    """The best dev evaluation so far and the evaluations since (early stopping's patience)."""

    score: float = -math.inf
    metrics: dict[str, float] = field(default_factory=dict)
    """The best evaluation's eval/ metrics, the final metrics report them."""
    time_to_best: float | None = None
    """Training seconds when it was reached."""
    bad_evals: int = 0
    weights: dict[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)
    """Its weights (CPU, fp32) for the final test; on disk in best/, so not in the checkpoint."""

    def consider(self, scores: dict[str, float], train_seconds: float, backend: Backend,
                 tokenizer: PreTrainedTokenizerBase, out: OutputDir, is_main: bool) -> bool:
        """Collective under ZeRO-3: keep these weights (and write best/) if `scores` beat the best
        main score; else count a bad evaluation. True when they did."""
        if not scores["main"] > self.score:
            self.bad_evals += 1
            return False
        self.score, self.bad_evals, self.time_to_best = scores["main"], 0, train_seconds
        self.metrics = {names.eval_metric(k): v for k, v in scores.items()}
        self.weights = backend.full_state_dict()  # collective under ZeRO-3 (gathers the shards)
        if is_main:
            with atomic_dir(out.best, replace=True) as tmp:  # fp32, whatever dtype the module trains in
                save_pretrained_fp32(backend.module, self.weights, tokenizer, tmp)
                write_card(tmp, out, self.metrics)
        return True

    def restore_weights(self, out: OutputDir, backend: Backend) -> None:
        """Collective: the weights of best/, if a resumed job has written one (saved without the
        kd_projection, if any: the model's current one fills in)."""
        saved = out.best / "model.safetensors"
        if not saved.is_file():
            return
        from safetensors.torch import load_file

        self.weights = {**backend.full_state_dict(), **{k: v.float() for k, v in load_file(saved).items()}}

    def state_dict(self) -> dict:
        return {"score": self.score, "metrics": self.metrics, "time_to_best": self.time_to_best,
                "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict) -> None:
        self.score, self.metrics = state["score"], state["metrics"]
        self.time_to_best, self.bad_evals = state["time_to_best"], state["bad_evals"]
