"""How well one run's probabilities are calibrated, and the reliability diagram of two runs.

A classifier's calibration is read off its top class: the max probability (its confidence)
against whether its prediction was right; WikiQA's is binary, its P(positive) score against the
gold label. Both are cut into BINS equal-width bins, (lo, hi] as sklearn's calibration_curve and
Guo et al.'s ECE bin them (the first bin also holds 0). ECE = sum over bins of the bin's share
of rows x |accuracy - confidence|; sklearn has no ECE, so it is the few lines below. The Brier
score is sklearn's: for a classifier the sum over classes of (p - one-hot)^2, averaged over rows
(not halved, whatever the class count); binary, the mean (p - gold)^2.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BINS = 10


@dataclass
class Bin:
    lo: float
    hi: float
    count: int
    confidence: float
    """The bin's mean confidence (top-class probability, or the binary score)."""
    accuracy: float
    """The bin's share of right predictions (binary: of gold positives)."""


@dataclass
class Calibration:
    kind: str
    """"top class" (confidence = max probability vs correctness) or "binary" (P(positive) vs gold)."""
    ece: float
    brier: float
    bins: list[Bin] = field(default_factory=list)
    """The bins holding rows, lowest first."""


def top_class(gold: list[int], probs: np.ndarray, pred: list[int]) -> Calibration:
    """A classifier's calibration: `gold` and `pred` are class ids, `probs` (rows x classes) per id."""
    from sklearn.metrics import brier_score_loss

    probs = np.asarray(probs, dtype=float)
    probs = probs / probs.sum(axis=1, keepdims=True)  # the files round each to 4 decimals: sums off by 1e-4
    confidence = probs.max(axis=1)
    correct = (np.asarray(pred) == np.asarray(gold)).astype(float)
    brier = brier_score_loss(gold, probs, labels=np.arange(probs.shape[1]), scale_by_half=False)
    return _binned("top class", confidence, correct, brier)


def binary(gold: list[int], score: list[float]) -> Calibration:
    """A binary ranker's calibration: `score` is P(gold == 1)."""
    from sklearn.metrics import brier_score_loss

    score, gold = np.asarray(score, dtype=float), np.asarray(gold, dtype=int)
    # a 1-D score is the positive class's; sklearn halves the two-class sum: the mean (p - gold)^2
    brier = brier_score_loss(gold, score, pos_label=1)
    return _binned("binary", score, gold.astype(float), brier)


def _binned(kind: str, confidence: np.ndarray, hit: np.ndarray, brier: float) -> Calibration:
    edges = np.linspace(0.0, 1.0, BINS + 1)
    which = np.searchsorted(edges[1:-1], confidence, side="left")  # (lo, hi], as calibration_curve
    count = np.bincount(which, minlength=BINS)
    confidence_sum = np.bincount(which, weights=confidence, minlength=BINS)
    hit_sum = np.bincount(which, weights=hit, minlength=BINS)
    ece = float(np.abs(hit_sum - confidence_sum).sum() / max(len(confidence), 1))
    bins = [Bin(float(edges[i]), float(edges[i + 1]), int(count[i]), float(confidence_sum[i] / count[i]),
                float(hit_sum[i] / count[i])) for i in range(BINS) if count[i]]
    return Calibration(kind, ece, float(brier), bins)


def plot_reliability(sides: dict[str, Calibration], out: Path, name: str = "reliability.png") -> list[str]:
    """Each side's bins (accuracy against mean confidence, the marker's area the bin's rows) with the
    diagonal of perfect calibration, ECE and Brier in the legend; `sides` maps a run's label to its
    calibration. Written as out/name; returns [name], or [] when no side has a calibration."""
    sides = {label: c for label, c in sides.items() if c is not None and c.bins}
    if not sides:
        return []
    from pipeline.report.charts import pyplot

    plt = pyplot()
    binary_kind = all(c.kind == "binary" for c in sides.values())
    fig, ax = plt.subplots(figsize=(4.6, 4.4))
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle="--", label="perfectly calibrated")
    total = max(sum(b.count for b in c.bins) for c in sides.values())
    for (label, c), color, marker in zip(sides.items(), ("tab:blue", "tab:orange"), ("o", "s")):
        x = [b.confidence for b in c.bins]
        y = [b.accuracy for b in c.bins]
        sizes = [12 + 300 * b.count / total for b in c.bins]
        ax.plot(x, y, color=color, linewidth=1.0)
        ax.scatter(x, y, s=sizes, color=color, marker=marker, alpha=0.7,
                   label=f"{label}: ECE {c.ece:.3f}, Brier {c.brier:.3f}")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("mean P(positive)" if binary_kind else "confidence (top-class probability)", fontsize=8)
    ax.set_ylabel("fraction positive" if binary_kind else "accuracy", fontsize=8)
    ax.set_title(f"Reliability ({BINS} equal-width bins; marker area: rows)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return [name]
