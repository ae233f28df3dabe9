"""The report's charts (matplotlib, file-only Agg backend): AMP speed-up, memory reduction and
retention per task x model; wall time, throughput, memory and main metric per KD procedure.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display on servers), imported on use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _labels(df: pd.DataFrame, status_cols: tuple[str, ...]) -> list[str]:
    labels = []
    for _, r in df.iterrows():
        label = f"{r.task}\n{str(r.model).rstrip('/').split('/')[-1]}"
        if r.get("procedure", "train") not in ("train", None):
            label += f"\n{r.procedure}"
        marks = {r[c] for c in status_cols} - {"ok"}
        if marks:
            label += f"\n({'failed' if 'failed' in marks else sorted(marks)[0]})"
        labels.append(label)
    return labels


def plot_amp(amp: pd.DataFrame, out: Path) -> list[str]:
    """Speed-up, memory reduction and retention per task x model; failed pairs are labelled, not drawn."""
    if amp.empty:
        return []
    plt = _pyplot()

    labels = _labels(amp, ("fp32_status", "amp_status"))
    names = []
    for column, name, title, ref in (("speedup_pct", "speedup.png", "AMP speed-up vs FP32 (samples/s), %", 0),
                                     ("mem_reduction_pct", "memory_reduction.png",
                                      "AMP peak-memory reduction vs FP32, %", 0),
                                     ("retention_pct", "retention.png", "AMP main metric as % of FP32", 100)):
        fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(amp) + 1), 3.6))
        values = amp[column].astype(float).to_numpy()
        x = np.arange(len(values))
        # retention: error bars of the seed spread, and "identical" where FP32 and AMP scored the same
        spread = amp.retention_spread_pct.astype(float).to_numpy() if column == "retention_pct" else None
        ax.bar(x, np.nan_to_num(values, nan=0.0) * ~np.isnan(values), color="tab:blue",
               yerr=None if spread is None else np.nan_to_num(spread), capsize=3)
        ax.axhline(ref, color="grey", linewidth=0.8)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        for xi, v, same in zip(x, values, _identical(amp) if spread is not None else [False] * len(values)):
            if not np.isnan(v):
                ax.annotate("identical\nscores" if same else f"{v:.1f}", (xi, v), ha="center", va="bottom", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def _identical(amp: pd.DataFrame) -> list[bool]:
    """Pairs whose every seed run in both gave equal test scores ("k/n" with k == n > 0)."""
    return [n not in ("", "0") and k == n for k, _, n in (str(v).partition("/") for v in amp.identical_seeds)]


def plot_kd(kd: pd.DataFrame, out: Path) -> list[str]:
    """Wall time, throughput, peak memory and main metric per procedure (error bars: seed std)."""
    if kd.empty:
        return []
    plt = _pyplot()

    several_tasks = kd.task.nunique() > 1
    labels = [(f"{r.task}\n" if several_tasks else "") + f"{r.procedure}"
              + (f"\n({r.status})" if r.status != "ok" else "") for _, r in kd.iterrows()]
    fig, axes = plt.subplots(2, 2, figsize=(max(7.0, 1.8 * len(kd)), 6.4))
    x = np.arange(len(kd))
    for ax, (column, title) in zip(axes.flat, (("train_time_s", "wall time (s)"), ("samples_per_s", "samples/s"),
                                          ("peak_mem_mb", "peak memory (MB)"), ("main", "main metric (test)"))):
        values = kd[column].astype(float).to_numpy()
        errors = np.nan_to_num(kd[f"{column}_std"].astype(float).to_numpy())
        ax.bar(x, np.nan_to_num(values), yerr=errors, color="tab:orange", capsize=3)
        ax.set_xticks(x, labels, fontsize=7, rotation=30)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "kd.png", dpi=110)
    plt.close(fig)
    return ["kd.png"]
