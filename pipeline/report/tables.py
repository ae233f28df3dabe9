"""The report's tables: AMP (FP32 vs AMP per task x model), KD (per procedure) and the seed
statistics, aggregated over seeds from the cell rows; and the tables as written, where a
failed, missing or unmeasured figure is a mark (failed, missing, n/a) instead of a number.
"""
from __future__ import annotations

import math

import pandas as pd

from pipeline.report.figures import AMP_DELTAS, AMP_FIGURES, FIGURES, KD_FIGURES, KD_SHOWN, SEED_FIGURES

SPREAD_FACTOR = 2.0
"""A mean difference counts as larger than the seed spread when |diff| > 2 x pooled std."""


def _aggregate(rows: pd.DataFrame) -> dict:
    """Mean and std over a group's seeds (finished runs only), its status and counts."""
    ok = rows[rows.status == "finished"]
    agg = {"n": len(ok), "of": len(rows),
           "status": "ok" if len(ok) else ("failed" if (rows.status == "failed").any()
                                           else "running" if (rows.status == "running").any() else "missing"),
           "precision": "/".join(sorted(set(ok.precision.dropna()))) or "/".join(sorted(set(rows.precision_requested))),
           "memory": "/".join(sorted(set(ok.memory.dropna()))),
           "energy_na": bool(len(ok)) and (ok.energy_available == "false").all()}
    for f in FIGURES:
        values = ok[f].astype(float).dropna()
        agg[f] = values.mean() if len(values) else math.nan
        agg[f"{f}_std"] = values.std(ddof=1) if len(values) >= 2 else math.nan
    return agg


def amp_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per task x model (x procedure): FP32 and AMP figures (means over seeds) and deltas."""
    rows = []
    for (task, model, procedure), fp32, amp in _amp_pairs(cells):
        f, a = _aggregate(fp32), _aggregate(amp)
        row = {"task": task, "model": model, "procedure": procedure, "memory": f["memory"] or a["memory"]}
        for prefix, agg in (("fp32", f), ("amp", a)):
            row.update({f"{prefix}_status": agg["status"], f"{prefix}_precision": agg["precision"],
                        f"{prefix}_seeds": f"{agg['n']}/{agg['of']}", f"{prefix}_energy_na": agg["energy_na"]})
            for fig in AMP_FIGURES:
                row[f"{prefix}_{fig}"] = agg[fig]
                row[f"{prefix}_{fig}_std"] = agg[f"{fig}_std"]
        row["speedup_pct"] = (_ratio(a["samples_per_s"], f["samples_per_s"]) - 1) * 100
        row["mem_reduction_pct"] = (1 - _ratio(a["peak_mem_mb"], f["peak_mem_mb"])) * 100
        row["retention_pct"] = _ratio(a["main"], f["main"]) * 100
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio(a: float, b: float) -> float:
    """a / b, NaN (shown as n/a) where b is zero or either is unknown."""
    return float(a) / float(b) if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def _amp_pairs(cells: pd.DataFrame):
    """((task, model, procedure), FP32 rows, AMP rows): one pair per AMP precision requested
    (fp16 and bf16 in one study are two comparisons against the same FP32 runs)."""
    sub = cells[cells.tables.str.contains("amp") & (cells.role != "")]
    for key, g in sub.groupby(["task", "model", "procedure"], sort=False, dropna=False):
        amp = g[g.role == "amp"]
        for variant in list(dict.fromkeys(amp.precision_requested)) or [None]:
            yield key, g[g.role == "fp32"], amp if variant is None else amp[amp.precision_requested == variant]


def kd_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per procedure (per task): time, throughput, memory, energy, P/R/F1, MAP/MRR."""
    rows = []
    sub = cells[cells.tables.str.contains("kd")]
    for (task, procedure), g in sub.groupby(["task", "procedure"], sort=False, dropna=False):
        agg = _aggregate(g)
        row = {"task": task, "procedure": procedure, "stage": "/".join(sorted(set(g.stage.dropna()))),
               "model": "/".join(dict.fromkeys(g.model.dropna())), "precision": agg["precision"],
               "role": "/".join(sorted(set(g.role) - {""})), "launcher": "/".join(dict.fromkeys(g.launcher.dropna())),
               "memory": agg["memory"], "status": agg["status"], "seeds": f"{agg['n']}/{agg['of']}",
               "energy_na": agg["energy_na"]}
        for fig in KD_FIGURES:
            row[fig], row[f"{fig}_std"] = agg[fig], agg[f"{fig}_std"]
        rows.append(row)
    return pd.DataFrame(rows)


def seed_stats(cells: pd.DataFrame) -> pd.DataFrame:
    """AMP vs FP32 with 2+ seeds on each side: is |mean difference| > 2 x pooled std?

    Pairs: FP32 and AMP cells of one task x model in the AMP table, and in the KD table an
    FP32 and an AMP procedure of the same task and stage (kd_fp32 vs kd_amp).
    """
    pairs = []
    for (task, model, procedure), fp32, amp in _amp_pairs(cells):
        variant = "/".join(dict.fromkeys(amp.precision_requested)) or "amp"
        label = f"{task} / {model}" + (f" / {procedure}" if procedure != "train" else "") + f": {variant} vs fp32"
        pairs.append((label, fp32, amp))
    kd = cells[cells.tables.str.contains("kd") & (cells.role != "")]
    for (task, _stage), g in kd.groupby(["task", "stage"], sort=False, dropna=False):
        fp32_procs = list(dict.fromkeys(g[g.role == "fp32"].procedure))
        amp_procs = list(dict.fromkeys(g[g.role == "amp"].procedure))
        for fp, ap in ((fp, ap) for fp in fp32_procs for ap in amp_procs):
            pairs.append((f"{task}: {ap} vs {fp}", g[g.procedure == fp], g[g.procedure == ap]))
    rows = []
    for label, f_rows, a_rows in pairs:
        f, a = _aggregate(f_rows), _aggregate(a_rows)
        if f["n"] < 2 or a["n"] < 2:
            continue
        for fig in SEED_FIGURES:
            if math.isnan(f[fig]) or math.isnan(a[fig]):
                continue
            diff = a[fig] - f[fig]
            pooled = math.sqrt((f[f"{fig}_std"] ** 2 + a[f"{fig}_std"] ** 2) / 2)
            rows.append({"comparison": label, "metric": fig, "fp32_n": f["n"], "fp32_mean": f[fig],
                         "fp32_std": f[f"{fig}_std"], "amp_n": a["n"], "amp_mean": a[fig], "amp_std": a[f"{fig}_std"],
                         "diff": diff, "pooled_std": pooled,
                         "exceeds_spread": "yes" if abs(diff) > SPREAD_FACTOR * pooled else "no"})
    return pd.DataFrame(rows, columns=["comparison", "metric", "fp32_n", "fp32_mean", "fp32_std", "amp_n", "amp_mean",
                                       "amp_std", "diff", "pooled_std", "exceeds_spread"])


# ------------------------------------------------------------------ as written (marks instead of numbers)


def _value(agg_status: str, value: float, energy_na: bool = False, energy: bool = False):
    if agg_status != "ok":
        return agg_status  # failed | missing | running
    if energy and energy_na:
        return "n/a"
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def amp_display(amp: pd.DataFrame) -> pd.DataFrame:
    """The AMP table as written to CSV: numbers where measured, else failed / missing / n/a."""
    if amp.empty:
        return amp
    out = amp[["task", "model", "procedure", "memory", "fp32_precision", "amp_precision", "fp32_seeds",
               "amp_seeds"]].copy()
    for fig in AMP_FIGURES:
        for p in ("fp32", "amp"):
            out[f"{p}_{fig}"] = [_value(r[f"{p}_status"], r[f"{p}_{fig}"], r[f"{p}_energy_na"], fig == "energy_j")
                                 for _, r in amp.iterrows()]
            out[f"{p}_{fig}_std"] = [r[f"{p}_{fig}_std"] if r[f"{p}_status"] == "ok" else None
                                     for _, r in amp.iterrows()]
    for d in AMP_DELTAS:
        out[d] = [r[d] if not math.isnan(r[d]) else _pair_mark(r) for _, r in amp.iterrows()]
    return out


def _pair_mark(r) -> str:
    marks = {r["fp32_status"], r["amp_status"]} - {"ok"}
    return "failed" if "failed" in marks else "missing" if "missing" in marks else next(iter(marks), "n/a")


def kd_display(kd: pd.DataFrame) -> pd.DataFrame:
    if kd.empty:
        return kd
    out = kd[["task", "procedure", "stage", "model", "precision", "launcher", "memory", "status", "seeds"]].copy()
    for fig in KD_SHOWN:
        out[fig] = [_value(r.status, r[fig], r.energy_na, fig == "energy_j") for _, r in kd.iterrows()]
        out[f"{fig}_std"] = [r[f"{fig}_std"] if r.status == "ok" else None for _, r in kd.iterrows()]
    return out

