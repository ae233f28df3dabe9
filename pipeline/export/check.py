"""An export checked against the model it came from, not trusted: on the dev split's batches (the
test split's, or a draw of the training rows, in a stage without dev; as the stage batched them
for evaluation, each padded to its own longest row, so the dynamic axes are exercised) the largest
absolute difference of every output and the share of predictions (argmax) that agree; then the
task's test metrics computed with the exported graph through the task's own scorer
(evaluation.evaluate), beside the PyTorch model's.

An fp32 graph is the same function as the PyTorch model up to float rounding: one whose predictions
or logits differ beyond FP32_AGREEMENT / FP32_MAX_ABS_DIFF is a broken export and fails in one line.
An int8 graph differs by design: its figures are reported, and its test scores say what it costs.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from pipeline.config.sections import HOLDOUT
from pipeline.errors import UserError
from pipeline.tracking.finished_stage import FinishedStage

FP32_MAX_ABS_DIFF = 1e-3
"""Relative to the largest |logit| of the PyTorch model (at least 1): float rounding stays far below."""
FP32_AGREEMENT = 0.99
"""The share of predictions an fp32 graph must share with PyTorch (a tie between two logits may
flip one of a hundred by rounding)."""


@dataclass(frozen=True)
class CheckData:
    """The batches an export is checked on, as the stage's evaluation batched them."""

    compared: DataLoader
    """The rows predictions are compared on: dev; test, or a draw of the training rows, in a stage without dev."""
    rows: str
    """What those rows are, as the check's lines and check.json name them."""
    test: DataLoader | None
    """The test split; None in a stage without one."""
    test_scores: Callable[..., dict[str, float]]
    """The task's test metrics of a model (PyTorch or exported) through the stage's own scorer
    (evaluation.evaluate; no figures without a test split)."""


def stage_data(stage: FinishedStage, tokenizer) -> CheckData:
    """The batches an export of `stage` is checked on (train.eval_batch_size, the task's collator)."""
    from pipeline.evaluation import evaluate
    from pipeline.runtime.precision import resolve

    splits = stage.splits(("dev", "test"))
    if not splits.examples:  # no dev and no test: a draw of at most 512 training rows to compare predictions on
        train_rows = len(stage.splits(("train",)).examples["train"])
        draw = dataclasses.replace(stage.cfg.data, dev=f"{HOLDOUT}{min(0.5, 512 / train_rows)}:0")
        splits = stage.splits(("dev",), data=draw)
        what = f"training rows ({len(splits.examples['dev'])} drawn: the stage has no dev or test split)"
    else:
        what = "dev split" if "dev" in splits.examples else "test split (the stage has no dev split)"
    prepared = splits.features(tokenizer, stage.cfg.train.max_length)
    collate = stage.task.collator(tokenizer)
    loaders = {split: DataLoader(rows, batch_size=stage.cfg.train.eval_batch_size, collate_fn=collate)
               for split, rows in prepared.items()}

    def test_scores(model) -> dict[str, float]:
        if "test" not in loaders:
            return {}
        scores = evaluate(model, loaders["test"], stage.task, resolve("fp32", splits.rt.device), splits.rt,
                          splits.examples["test"], prepared["test"]).scores
        return {k: float(v) for k, v in scores.items() if k != "loss" and np.isfinite(v)}

    return CheckData(loaders.get("dev", loaders.get("test")), what, loaders.get("test"), test_scores)


def training_texts(stage: FinishedStage):
    """The training texts of `stage` (its prepared entry: a cache hit)."""
    return stage.splits(("train",)).examples["train"].texts


@torch.inference_mode()
def compare(reference: torch.nn.Module, exported, loader) -> dict[str, float]:
    """`exported` against `reference` on every batch of `loader`, every output both give, as
    check.json records it: the largest absolute difference, the largest |output| of the PyTorch
    model (logit_scale), the share of predictions that agree, the predictions and rows compared."""
    max_abs_diff = scale = 0.0
    agree = compared = rows = 0
    for batch in loader:
        inputs = {k: v for k, v in batch.items() if k in exported.input_names}
        ours, theirs = reference(**inputs), exported(**inputs)
        mask = inputs.get("attention_mask")
        rows += len(next(iter(inputs.values())))
        for name in exported.output_names:
            a, b = ours[name].float(), theirs[name].float()
            max_abs_diff = max(max_abs_diff, float((a - b).abs().max()))
            scale = max(scale, float(a.abs().max()))
            same = a.argmax(-1) == b.argmax(-1)
            if same.dim() == 2 and mask is not None and mask.shape == same.shape and name == "logits":
                same = same[mask.bool()]  # per token: the real tokens only
            agree += int(same.sum())
            compared += same.numel()
    return {"max_abs_diff": max_abs_diff, "logit_scale": scale, "agreement": agree / compared if compared else 1.0,
            "predictions": compared, "rows": rows}


def verdict(path: Path, dev: dict[str, float], rows: str) -> None:
    """An fp32 graph that disagrees with its PyTorch model beyond tolerance (`dev`: compare's
    figures on `rows`, CheckData.rows): the one-line refusal."""
    limit = FP32_MAX_ABS_DIFF * max(1.0, dev["logit_scale"])
    if dev["agreement"] < FP32_AGREEMENT or dev["max_abs_diff"] > limit:
        raise UserError(f"export --check: {path.name} disagrees with the PyTorch model on the {rows}: "
                        f"{100 * dev['agreement']:.1f}% of predictions agree (at least {100 * FP32_AGREEMENT:.0f}% "
                        f"expected), largest logit difference {dev['max_abs_diff']:.3g} (at most {limit:.3g}); "
                        "the export is not written")
