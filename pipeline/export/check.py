"""An export checked against the model it came from, not trusted: on the dev split's batches (as the
stage batched them for evaluation, each padded to its own longest row, so the dynamic axes are
exercised) the largest absolute difference of every output and the share of predictions (argmax)
that agree; then the task's test metrics computed with the exported graph through the task's own
scorer (evaluation.evaluate), beside the PyTorch model's.

An fp32 graph is the same function as the PyTorch model up to float rounding: one whose predictions
or logits differ beyond FP32_AGREEMENT / FP32_MAX_ABS_DIFF is a broken export and fails in one line.
An int8 graph differs by design: its figures are reported, and its test scores say what it costs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from pipeline.errors import UserError
from pipeline.layout import OutputDir

FP32_MAX_ABS_DIFF = 1e-3
"""Relative to the largest |logit| of the PyTorch model (at least 1): float rounding stays far below."""
FP32_AGREEMENT = 0.99
"""The share of predictions an fp32 graph must share with PyTorch (a tie between two logits may
flip one of a hundred by rounding)."""


@dataclass
class Split:
    """A split of the stage's task as its evaluation read it: examples, features, batches."""

    examples: list[dict]
    features: object
    loader: torch.utils.data.DataLoader


@dataclass
class StageData:
    task: object
    dev: Split
    test: Split


@dataclass
class Agreement:
    max_abs_diff: float = 0.0
    scale: float = 0.0
    """The largest |output| of the PyTorch model."""
    agree: int = 0
    compared: int = 0
    rows: int = 0

    @property
    def agreement(self) -> float:
        return self.agree / self.compared if self.compared else 1.0

    def as_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "logit_scale": self.scale, "agreement": self.agreement,
                "predictions": self.compared, "rows": self.rows}


@dataclass
class Checked:
    dev: Agreement
    test: dict[str, float] = field(default_factory=dict)


def stage_data(out: OutputDir, tokenizer) -> StageData:
    """The dev and test splits of the stage whose output_dir is `out`, from its config.yaml, batched
    as its evaluation batched them (train.eval_batch_size, the task's collator)."""
    from pipeline.data import features
    from pipeline.runtime.dist import Runtime
    from pipeline.tasks import get_task

    if not out.config.is_file():
        raise UserError(f"export --check: {out}: no {OutputDir.CONFIG}: not a stage's output_dir (the check needs "
                        "its task and data)")
    settings = yaml.safe_load(out.config.read_text(encoding="utf-8"))  # as written: secrets masked, task keys whole
    task = get_task(settings["task"], settings.get("task_options") or {})
    train, data = settings.get("train", {}), settings.get("data", {})
    max_length, batch = int(train.get("max_length", 128)), int(train.get("eval_batch_size", 64))
    rt = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
    collate = task.collator(tokenizer)
    splits = {}
    for split in ("dev", "test"):
        examples = task.load(data.get(split), split)
        prepared = features.prepare_features(task, split, data.get(split), examples, tokenizer, max_length, rt)
        splits[split] = Split(examples, prepared, torch.utils.data.DataLoader(prepared, batch_size=batch,
                                                                              collate_fn=collate))
    return StageData(task, splits["dev"], splits["test"])


@torch.inference_mode()
def compare(reference: torch.nn.Module, exported, loader) -> Agreement:
    """`exported` against `reference` on every batch of `loader`: every output both give."""
    seen = Agreement()
    for batch in loader:
        inputs = {k: v for k, v in batch.items() if k in exported.input_names}
        ours, theirs = reference(**inputs), exported(**inputs)
        mask = inputs.get("attention_mask")
        seen.rows += len(next(iter(inputs.values())))
        for name in exported.output_names:
            a, b = ours[name].float(), theirs[name].float()
            seen.max_abs_diff = max(seen.max_abs_diff, float((a - b).abs().max()))
            seen.scale = max(seen.scale, float(a.abs().max()))
            same = a.argmax(-1) == b.argmax(-1)
            if same.dim() == 2 and mask is not None and mask.shape == same.shape and name == "logits":
                same = same[mask.bool()]  # per token: the real tokens only
            seen.agree += int(same.sum())
            seen.compared += same.numel()
    return seen


def test_scores(model, data: StageData) -> dict[str, float]:
    """The task's test metrics with `model` (PyTorch or exported), through the stage's scorer."""
    from pipeline.evaluation import evaluate
    from pipeline.runtime.dist import Runtime
    from pipeline.runtime.precision import resolve

    rt = Runtime("none", "single", 0, 0, 1, 1, torch.device("cpu"))
    scores = evaluate(model, data.test.loader, data.task, resolve("fp32", rt.device), rt, data.test.examples,
                      data.test.features).scores
    return {k: float(v) for k, v in scores.items() if k != "loss" and np.isfinite(v)}


def verdict(path: Path, dev: Agreement) -> None:
    """An fp32 graph that disagrees with its PyTorch model beyond tolerance: the one-line refusal."""
    limit = FP32_MAX_ABS_DIFF * max(1.0, dev.scale)
    if dev.agreement < FP32_AGREEMENT or dev.max_abs_diff > limit:
        raise UserError(f"export --check: {path.name} disagrees with the PyTorch model on the dev split: "
                        f"{100 * dev.agreement:.1f}% of predictions agree (at least {100 * FP32_AGREEMENT:.0f}% "
                        f"expected), largest logit difference {dev.max_abs_diff:.3g} (at most {limit:.3g}); "
                        "the export is not written")
