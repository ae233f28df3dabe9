"""The report's charts (matplotlib, file-only Agg backend): AMP speed-up, memory reduction and
retention per task x model; wall time, throughput, memory and main metric per KD procedure.
Every compared quantity carries its spread over seeds (error bars) and says, on the chart,
whether a difference is within that spread: a bar is no more honest than the table beside it.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report.compare import Comparison, difference, identical_counts


def pyplot():
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
        if r.get("fp32_stalled", 0) or r.get("amp_stalled", 0):
            label += f"\n(stalled: FP32 {r.fp32_stalled}, AMP {r.amp_stalled})"
        labels.append(label)
    return labels


AMP_CHARTS = (("speedup_pct", "speedup_pct_spread", "speedup.png", "AMP speed-up vs FP32 (samples/s), %", 0),
              ("mem_reduction_pct", "mem_reduction_pct_spread", "memory_reduction.png",
               "AMP peak-memory reduction vs FP32, %", 0),
              ("retention_pct", "retention_spread_pct", "retention.png", "AMP main metric as % of FP32", 100))
"""(delta column, its spread column, file, title, the value of no difference)."""
WITHIN = "within\nthe spread"
NO_SPREAD = "1 seed:\nno spread"


def bar_text(value: float, spread: float, beyond: str, identical: bool = False) -> str:
    """The words over an AMP bar: its value ± the seed spread, then "within the spread" (the
    difference is no larger than the verdict's threshold) or "1 seed: no spread"; a pair whose
    every seed gave identical test scores says that instead of a value."""
    if identical:
        return "identical\nscores"
    text = f"{value:.1f}" + ("" if math.isnan(spread) else f" ± {spread:.1f}")
    mark = {"no": WITHIN, "": NO_SPREAD}.get(beyond, "")
    return text + (f"\n{mark}" if mark else "")


def plot_amp(amp: pd.DataFrame, out: Path) -> list[str]:
    """Speed-up, memory reduction and retention per task x model, each with its error bar (the
    pooled std over seeds, in % of FP32) and, under the value, whether the difference is within
    the spread (the verdict of compare.difference) or has none (1 seed); a difference within the
    spread is drawn hatched and pale. Failed pairs are labelled, not drawn."""
    if amp.empty:
        return []
    plt = pyplot()

    labels = _labels(amp, ("fp32_status", "amp_status"))
    names = []
    for column, spread_column, name, title, ref in AMP_CHARTS:
        fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(amp) + 1), 3.8))
        values = amp[column].astype(float).to_numpy()
        same = (amp.same_precision.astype(bool).to_numpy() if "same_precision" in amp and column != "retention_pct"
                else np.zeros(len(values), dtype=bool))  # one precision on both sides: nothing to draw
        values = np.where(same, np.nan, values)
        confounded = (amp.speed_confounded.fillna("").astype(bool).to_numpy() if "speed_confounded" in amp
                      and column == "speedup_pct" else np.zeros(len(values), dtype=bool))
        spread = amp[spread_column].astype(float).to_numpy()
        beyond = amp[f"{column}_beyond"].fillna("").astype(str).tolist()
        x = np.arange(len(values))
        identical = _identical(amp) if column == "retention_pct" else [False] * len(values)
        for xi, v, s, b in zip(x, values, spread, beyond):
            if np.isnan(v):
                continue
            within = b != "yes"
            ax.bar(xi, v - ref, bottom=ref, yerr=None if np.isnan(s) else s, capsize=3,
                   color="lightsteelblue" if within else "tab:blue", hatch="//" if within else None,
                   edgecolor="tab:blue")
        ax.axhline(ref, color="grey", linewidth=0.8)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        for xi, v, s, b, equal, one, busy in zip(x, values, spread, beyond, identical, same, confounded):
            if one:
                ax.annotate("same precision:\nnothing to compare", (xi, ref), ha="center", va="bottom", fontsize=7)
            if np.isnan(v):
                continue
            top = max(v, ref) + (0 if np.isnan(s) else s)
            text = bar_text(v, s, b, equal) + ("\nconfounded" if busy else "")
            ax.annotate(text, (xi, top), ha="center", va="bottom", fontsize=7)
        ax.margins(y=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def _identical(amp: pd.DataFrame) -> list[bool]:
    """Pairs whose every seed run in both gave equal test scores ("k/n" with k == n > 0)."""
    return [n > 0 and k == n for k, n in map(identical_counts, amp.identical_seeds)]


KD_PANELS = (("train_time_s", "wall time (s)"), ("samples_per_s", "samples/s"), ("peak_mem_mb", "peak memory (MB)"),
             ("main", "main metric (test)"))


def kd_marks(kd: pd.DataFrame, found: list[Comparison], column: str) -> list[str]:
    """Per KD table row: each comparison it is the compared side of (a student against its
    baseline or teacher, a KD procedure's AMP run against its FP32 one), with the verdict on
    `column`: "= REF" within the seed spread, "> REF" / "< REF" beyond it, "REF: 1 seed" with no spread."""
    marks = []
    for _, r in kd.iterrows():
        words = []
        for c in found:
            if c.task != r.task or c.compared != r.procedure or c.kind not in ("teacher", "baseline", "kd_amp"):
                continue
            d = difference(c, column)
            if d["exceeds_spread"] == "no":
                words.append(f"= {c.reference}")
            elif d["exceeds_spread"] == "yes":
                words.append(f"{'>' if d['diff'] > 0 else '<'} {c.reference}")
            elif d["compared_n"] and d["reference_n"]:
                words.append(f"{c.reference}: 1 seed")
        marks.append("\n".join(words))
    return marks


def plot_kd(kd: pd.DataFrame, out: Path, found: list[Comparison] | None = None) -> list[str]:
    """Wall time, throughput, peak memory and main metric per procedure: error bars of the std
    over seeds and, over each compared bar, its verdict against what it is compared with (kd_marks;
    "=" within the seed spread, hatched)."""
    if kd.empty:
        return []
    plt = pyplot()

    several_tasks = kd.task.nunique() > 1
    labels = [(f"{r.task}\n" if several_tasks else "") + f"{r.procedure}"
              + (f"\n({r.status})" if r.status != "ok" else "")
              + (f"\n({r.stalled} stalled)" if r.get("stalled", 0) else "") for _, r in kd.iterrows()]
    fig, axes = plt.subplots(2, 2, figsize=(max(7.0, 1.8 * len(kd)), 7.0))
    x = np.arange(len(kd))
    for ax, (column, title) in zip(axes.flat, KD_PANELS):
        values = kd[column].astype(float).to_numpy()
        errors = np.nan_to_num(kd[f"{column}_std"].astype(float).to_numpy())
        marks = kd_marks(kd, found or [], column)
        within = [bool(m) and all(w.startswith("=") for w in m.split("\n")) for m in marks]
        ax.bar(x, np.nan_to_num(values), yerr=errors, capsize=3, edgecolor="tab:orange",
               color=["moccasin" if w else "tab:orange" for w in within])
        for xi, v, e, m in zip(x, values, errors, marks):
            if m and not np.isnan(v):
                ax.annotate(m, (xi, v + e), ha="center", va="bottom", fontsize=6)
        ax.set_xticks(x, labels, fontsize=7, rotation=30)
        ax.set_title(title, fontsize=9)
        ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(out / "kd.png", dpi=110)
    plt.close(fig)
    return ["kd.png"]
