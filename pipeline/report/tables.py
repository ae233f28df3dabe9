"""The report's tables: AMP (FP32 vs AMP per task x model), KD (per procedure) and the seed
statistics, aggregated over seeds from the cell rows; and the tables as written, where a
failed, missing or unmeasured metric is a mark (failed, missing, n/a) instead of a number.
"""
from __future__ import annotations

import math

import pandas as pd

from pipeline.report.columns import (
    AMP_COLUMNS,
    AMP_DELTAS,
    COLUMNS,
    ENERGY_FIGURES,
    KD_COLUMNS,
    KD_SHOWN,
    SPREAD_COLUMNS,
)
from pipeline.report.compare import Comparison, amp_pairs, comparisons, difference, identical_scores, ratio, stalled
from pipeline.report.confound import confounded


def _aggregate(rows: pd.DataFrame) -> dict:
    """Mean and std over a group's seeds (finished runs only), its status and counts."""
    ok = rows[rows.status == "finished"]
    agg = {"n": len(ok), "of": len(rows),
           "status": "ok" if len(ok) else ("failed" if (rows.status == "failed").any()
                                           else "running" if (rows.status == "running").any() else "missing"),
           "precision": "/".join(sorted(set(ok.precision.dropna()))) or "/".join(sorted(set(rows.precision_requested))),
           "memory": "/".join(sorted(set(ok.memory.dropna()))),
           "energy_na": bool(len(ok)) and (ok.energy_available == "false").all(),
           "stalled": stalled_runs(ok)}
    for f in COLUMNS:
        values = ok[f].astype(float).dropna()
        agg[f] = values.mean() if len(values) else math.nan
        agg[f"{f}_std"] = values.std(ddof=1) if len(values) >= 2 else math.nan
    return agg


def stalled_runs(rows: pd.DataFrame) -> int:
    """Runs tagged stalled (their predictions collapsed: pipeline/measure/collapse.py)."""
    return int(stalled(rows).sum())


DELTA_SOURCES = {"speedup_pct": "samples_per_s", "mem_reduction_pct": "peak_mem_mb", "retention_pct": "main"}
"""Each AMP delta and the column it compares: its spread and verdict come from that column's seeds."""


def amp_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per task x model (x procedure): FP32 and AMP columns (means over seeds) and deltas.
    Per delta D (speed-up, memory reduction, retention), D_spread is the pooled std of the column
    it compares in % of the FP32 mean (2+ seeds a side; retention_spread_pct for retention) and
    D_beyond the verdict: yes / no (the difference is within SPREAD_FACTOR x the pooled std) / ""
    (fewer than 2 seeds a side). identical_seeds "k/n": n seeds run on both sides, k of them with
    equal test scores; fp32_stalled, amp_stalled: runs whose predictions collapsed; same_precision:
    both sides resolved to one precision (AMP fell back to fp32: no speed-up or memory saving to
    compare); speed_confounded: why the speed-up measures the machine as much as AMP, or ""
    (confound.py)."""
    rows = []
    for (task, model, procedure), fp32, amp in amp_pairs(cells):
        f, a = _aggregate(fp32), _aggregate(amp)
        row = {"task": task, "model": model, "procedure": procedure, "memory": f["memory"] or a["memory"],
               "amp_requested": "/".join(dict.fromkeys(amp.precision_requested.map(str))),
               "cpu_bf16": "/".join(sorted(set(pd.concat([fp32, amp]).cpu_bf16.dropna().map(str)) - {""}))}
        for prefix, agg in (("fp32", f), ("amp", a)):
            row.update({f"{prefix}_status": agg["status"], f"{prefix}_precision": agg["precision"],
                        f"{prefix}_seeds": f"{agg['n']}/{agg['of']}", f"{prefix}_energy_na": agg["energy_na"]})
            for col in AMP_COLUMNS:
                row[f"{prefix}_{col}"] = agg[col]
                row[f"{prefix}_{col}_std"] = agg[f"{col}_std"]
        row["speedup_pct"] = (ratio(a["samples_per_s"], f["samples_per_s"]) - 1) * 100
        row["mem_reduction_pct"] = (1 - ratio(a["peak_mem_mb"], f["peak_mem_mb"])) * 100
        row["retention_pct"] = ratio(a["main"], f["main"]) * 100
        pair = Comparison(task, "", "amp", "fp32", a["precision"], fp32, amp, model=model)
        for delta, column in DELTA_SOURCES.items():
            d = difference(pair, column)
            spread = "retention_spread_pct" if delta == "retention_pct" else f"{delta}_spread"
            row[spread] = ratio(d["pooled_std"], f[column]) * 100
            row[f"{delta}_beyond"] = d["exceeds_spread"]
        row["fp32_stalled"], row["amp_stalled"] = f["stalled"], a["stalled"]
        row["same_precision"] = bool(f["n"] and a["n"]) and f["precision"] == a["precision"]
        row["speed_confounded"] = confounded(("FP32", fp32), ("AMP", amp))
        row["identical_seeds"] = "{1}/{0}".format(*identical_scores(pair))
        rows.append(row)
    return pd.DataFrame(rows)


def kd_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per procedure and precision (per task), as the KD thesis compares its procedures:
    the cell's wall time from start to finish (its stage and export) and its export's, training time,
    throughput, memory, GPU utilisation,
    average power, energy, P/R/F1, MAP/MRR. A procedure run in several precisions is one row each."""
    rows = []
    sub = cells[cells.tables.str.contains("kd")]
    groups = sub.groupby(["task", "procedure", "precision_requested"], sort=False, dropna=False)
    for (task, procedure, _requested), g in groups:
        agg = _aggregate(g)
        row = {"task": task, "procedure": procedure, "stage": "/".join(sorted(set(g.stage.dropna()))),
               "model": "/".join(dict.fromkeys(g.model.dropna())), "precision": agg["precision"],
               "role": "/".join(sorted(set(g.role) - {""})), "launcher": "/".join(dict.fromkeys(g.launcher.dropna())),
               "memory": agg["memory"], "status": agg["status"], "seeds": f"{agg['n']}/{agg['of']}",
               "energy_na": agg["energy_na"], "stalled": agg["stalled"]}
        for col in KD_COLUMNS:
            row[col], row[f"{col}_std"] = agg[col], agg[f"{col}_std"]
        rows.append(row)
    return pd.DataFrame(rows)


def seed_stats(cells: pd.DataFrame) -> pd.DataFrame:
    """Every comparison (compare.comparisons) with 2+ finished seeds on each side: per column,
    both sides' mean and std, compared - reference, the pooled std, and whether the difference
    exceeds the seed spread; identical_seeds as in amp_table (FP32/AMP pairs only)."""
    rows = []
    for c in comparisons(cells):
        pairs, same = identical_scores(c)
        for col in SPREAD_COLUMNS:
            d = difference(c, col)
            if d["exceeds_spread"]:
                rows.append({"comparison": c.label, "metric": col, **d,
                             "identical_seeds": f"{same}/{pairs}" if pairs else ""})
    return pd.DataFrame(rows, columns=SEED_COLUMNS)


SEED_COLUMNS = ["comparison", "metric", "reference_n", "reference_mean", "reference_std", "compared_n",
                "compared_mean", "compared_std", "diff", "pooled_std", "exceeds_spread", "identical_seeds"]
"""seed_stats.csv: reference = FP32, the teacher or the baseline; compared = AMP or the student."""


# ------------------------------------------------------------------ as written (marks instead of numbers)


def _value(agg_status: str, value: float, energy_na: bool = False, energy: bool = False):
    """A figure as written: the status where the runs did not finish, n/a where nothing measured it."""
    if agg_status != "ok":
        return agg_status  # failed | missing | running
    if energy and energy_na:
        return "n/a"
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def amp_display(amp: pd.DataFrame) -> pd.DataFrame:
    """The AMP table as written to CSV: numbers where measured, else failed / missing / n/a."""
    if amp.empty:
        return amp
    out = amp[["task", "model", "procedure", "memory", "cpu_bf16", "fp32_precision", "amp_requested", "amp_precision",
               "fp32_seeds", "amp_seeds"]].copy()
    for col in AMP_COLUMNS:
        for p in ("fp32", "amp"):
            out[f"{p}_{col}"] = [_value(r[f"{p}_status"], r[f"{p}_{col}"], r[f"{p}_energy_na"],
                                       col in ENERGY_FIGURES)
                                 for _, r in amp.iterrows()]
            out[f"{p}_{col}_std"] = [r[f"{p}_{col}_std"] if r[f"{p}_status"] == "ok" else None
                                     for _, r in amp.iterrows()]
    for d in AMP_DELTAS:
        out[d] = [SAME_PRECISION if d != "retention_pct" and bool(r.get("same_precision", False)) else
                  r[d] if not math.isnan(r[d]) else _pair_mark(r) for _, r in amp.iterrows()]
    out["speed_confounded"] = amp.speed_confounded if "speed_confounded" in amp else ""
    out["retention_spread_pct"] = amp.retention_spread_pct
    out["identical_seeds"] = amp.identical_seeds
    return out


SAME_PRECISION = "same precision: nothing to compare"
"""The speed-up and memory reduction of a pair whose sides resolved to one precision."""


def _pair_mark(r: pd.Series) -> str:
    marks = {r["fp32_status"], r["amp_status"]} - {"ok"}
    return "failed" if "failed" in marks else "missing" if "missing" in marks else next(iter(marks), "n/a")


def kd_display(kd: pd.DataFrame) -> pd.DataFrame:
    if kd.empty:
        return kd
    out = kd[["task", "procedure", "stage", "model", "precision", "launcher", "memory", "status", "seeds"]].copy()
    for col in KD_SHOWN:
        out[col] = [_value(r.status, r[col], r.energy_na, col in ENERGY_FIGURES) for _, r in kd.iterrows()]
        out[f"{col}_std"] = [r[f"{col}_std"] if r.status == "ok" else None for _, r in kd.iterrows()]
    return out

