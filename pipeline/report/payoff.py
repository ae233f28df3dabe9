"""What a student buys against its teacher: parameters and size (% of the teacher's), inference
latency and throughput speed-up (x), score retained (% of the teacher's, ± the seed spread), in a
table, one sentence per procedure and a chart of score retained against speed-up. The baseline
(the student's architecture trained without distillation) is set against the same teacher, so the
gain of distillation shows at equal speed.

The inference figures are the stages' own infer/* metrics (measure/inference.py) in fp32 at the
test split's median length (columns.PAYOFF_PRECISION, PAYOFF_LENGTH).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report.columns import PAYOFF_LENGTH, PAYOFF_PRECISION
from pipeline.report.compare import Comparison, comparisons, difference, stats
from pipeline.report.verdicts import metric_name

PAYOFF_CHART = "payoff.png"


def payoff_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per task: its teacher (the reference, 100% and 1.0x), each distilled student and each
    baseline against that teacher. *_pct: the model's mean in % of the teacher's; *_x: speed-ups
    (teacher latency / model latency; model samples/s / teacher samples/s), *_x_spread their seed
    spread (relative stds added in quadrature, NaN below 2 seeds a side); retained_pct: main in %
    of the teacher's, retained_spread_pct the pooled std in % of the teacher's mean (as the AMP
    table's retention), retained_beyond the verdict on the difference (compare.difference)."""
    if cells.empty:
        return pd.DataFrame()
    found = comparisons(cells)
    rows = []
    for task in dict.fromkeys(c.task for c in found if c.kind == "teacher"):
        students = [c for c in found if c.task == task and c.kind == "teacher"]
        teacher = students[0]
        baselines = dict.fromkeys(c.reference for c in found if c.task == task and c.kind == "baseline")
        against = [Comparison(task, f"{task}: {teacher.reference} vs itself", "teacher", teacher.reference,
                              teacher.reference, teacher.ref, teacher.ref)]
        against += [c for c in students if c.reference == teacher.reference]
        g = cells[cells.task == task]
        against += [Comparison(task, f"{task}: {b} vs {teacher.reference}", "baseline_vs_teacher", teacher.reference,
                               b, teacher.ref, g[g.procedure == b]) for b in baselines]
        for c in against:
            rows.append(_row(c, "teacher" if c.compared == c.reference else
                             "baseline" if c.kind == "baseline_vs_teacher" else "student"))
    return pd.DataFrame(rows)


def _row(c: Comparison, role: str) -> dict:
    n, main, main_std = stats(c.cmp, "main")
    row = {"task": c.task, "procedure": c.compared, "role": role, "teacher": c.reference,
           "model": "/".join(dict.fromkeys(c.cmp.model.dropna().map(str))), "seeds": n, "main": main,
           "main_std": main_std, "metric": metric_name(c.task)}
    for column in ("infer_params", "infer_params_no_embed", "infer_size_mb", "infer_latency_ms", "infer_samples_per_s"):
        row[column] = stats(c.cmp, column)[1]
    for column, name in (("infer_params", "params_pct"), ("infer_params_no_embed", "params_no_embed_pct"),
                         ("infer_size_mb", "size_pct")):
        row[name] = _ratio(stats(c.cmp, column)[1], stats(c.ref, column)[1]) * 100
    row["latency_x"], row["latency_x_spread"] = _speedup(c.ref, c.cmp, "infer_latency_ms")
    row["throughput_x"], row["throughput_x_spread"] = _speedup(c.cmp, c.ref, "infer_samples_per_s")
    d = difference(c, "main")
    row["retained_pct"] = _ratio(d["compared_mean"], d["reference_mean"]) * 100
    row["retained_spread_pct"] = _ratio(d["pooled_std"], d["reference_mean"]) * 100
    row["retained_beyond"] = d["exceeds_spread"]
    if role == "teacher":  # the reference itself: no spread against itself
        row.update(latency_x_spread=math.nan, throughput_x_spread=math.nan, retained_spread_pct=math.nan,
                   retained_beyond="")
    return row


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def _speedup(top: pd.DataFrame, bottom: pd.DataFrame, column: str) -> tuple[float, float]:
    """mean(top) / mean(bottom) and its spread: relative sample stds added in quadrature."""
    tn, tm, ts = stats(top, column)
    bn, bm, bs = stats(bottom, column)
    ratio = _ratio(tm, bm)
    spread = ratio * math.hypot(ts / tm, bs / bm) if tn >= 2 and bn >= 2 and tm and bm else math.nan
    return ratio, spread


def _pm(value: float, spread: float, fmt: str, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    text = f"{value:{fmt}}{unit}"
    return text if math.isnan(spread) else f"{text} ± {spread:{fmt}}{unit}"


def sentences(payoff: pd.DataFrame) -> list[str]:
    """One sentence per student and baseline, as DistilBERT's paper puts it ("keeps 97% of BERT's
    score at 60% more speed with 40% fewer parameters"), with the seed spread where there is one."""
    out = []
    for r in payoff[payoff.role != "teacher"].itertuples() if not payoff.empty else []:
        if math.isnan(r.throughput_x):
            out.append(f"{r.task}: {r.procedure} keeps {_pm(r.retained_pct, r.retained_spread_pct, '.0f', '%')} of "
                       f"the teacher's {r.metric}; no inference figures (its runs or the teacher's have no infer/* "
                       "metrics: infer.bench=false?).")
            continue
        within = " (within the seed spread)" if r.retained_beyond == "no" else ""
        kind = " (no distillation)" if r.role == "baseline" else ""
        out.append(f"{r.task}: {r.procedure}{kind} keeps {_pm(r.retained_pct, r.retained_spread_pct, '.0f', '%')} "
                   f"of the teacher's {r.metric}{within} at {_pm(r.throughput_x, r.throughput_x_spread, '.1f', 'x')} "
                   f"its throughput ({_pm(r.latency_x, r.latency_x_spread, '.1f', 'x')} faster at batch 1) "
                   f"with {r.params_pct:.0f}% of its parameters ({r.params_no_embed_pct:.0f}% of those outside "
                   f"the embeddings) and {r.size_pct:.0f}% of its size on disk.")
    return out


def payoff_display(payoff: pd.DataFrame) -> pd.DataFrame:
    """The table as report.md shows it."""
    def num(v: float, fmt: str) -> str:
        return "n/a" if math.isnan(v) else f"{v:{fmt}}"

    return pd.DataFrame({
        "task": payoff.task, "procedure": payoff.procedure, "role": payoff.role,
        "params (M)": [num(v / 1e6, ".1f") for v in payoff.infer_params],
        "% of teacher's params": [num(v, ".0f") for v in payoff.params_pct],
        "% outside embeddings": [num(v, ".0f") for v in payoff.params_no_embed_pct],
        "size MB": [num(v, ".1f") for v in payoff.infer_size_mb],
        "latency ms": [num(v, ".1f") for v in payoff.infer_latency_ms],
        "latency speed-up": [_pm(v, s, ".2f", "x") for v, s in zip(payoff.latency_x, payoff.latency_x_spread)],
        "samples/s": [num(v, ".1f") for v in payoff.infer_samples_per_s],
        "throughput speed-up": [_pm(v, s, ".2f", "x") for v, s in zip(payoff.throughput_x,
                                                                       payoff.throughput_x_spread)],
        "main": [_pm(v, s, ".4f", "") for v, s in zip(payoff.main, payoff.main_std)],
        "retained": ["reference" if role == "teacher" else _pm(v, s, ".1f", "%")
                     for v, s, role in zip(payoff.retained_pct, payoff.retained_spread_pct, payoff.role)],
        "runs": payoff.seeds,
    })


NOTE = (f"- inference: each stage's best model measured at its end (`infer/*`, measure/inference.py) in "
        f"{PAYOFF_PRECISION} at the test split's {PAYOFF_LENGTH} length, on token tensors already on the device; "
        "latency at batch 1 (p50), throughput at the serving batch (infer.batch_size), on the device the stage ran "
        "on (a study's cells share a machine: a busy machine slows every model alike only if they ran alike). "
        "Speed-ups: teacher latency / model latency and model samples/s / teacher samples/s, ± the seed spread "
        "(relative stds in quadrature); retained: main / the teacher's main ± the pooled std in % of the "
        "teacher's.")


def plot_payoff(payoff: pd.DataFrame, out: Path) -> list[str]:
    """Score retained (% of the teacher's) against throughput speed-up (x), one point per model
    with its seed spread as error bars; the teacher sits at (1x, 100%)."""
    shown = payoff.dropna(subset=["throughput_x", "retained_pct"]) if not payoff.empty else payoff
    if shown.empty:
        return []
    from pipeline.report.charts import pyplot

    plt = pyplot()
    several = shown.task.nunique() > 1
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    colours = {"teacher": "tab:grey", "student": "tab:orange", "baseline": "tab:blue"}
    placed: list[tuple[float, float]] = []
    for r in shown.itertuples():
        ax.errorbar(r.throughput_x, r.retained_pct, xerr=np.nan_to_num(r.throughput_x_spread),
                    yerr=np.nan_to_num(r.retained_spread_pct), fmt="o", capsize=3, color=colours[r.role])
        near = sum(abs(x - r.throughput_x) < 0.1 and abs(y - r.retained_pct) < 1.0 for x, y in placed)
        placed.append((r.throughput_x, r.retained_pct))
        ax.annotate(f"{r.task}: {r.procedure}" if several else r.procedure, (r.throughput_x, r.retained_pct),
                    textcoords="offset points", xytext=(6, 5 - 10 * near), fontsize=7)  # coinciding points: stacked
    ax.axhline(100, color="grey", linewidth=0.6)
    ax.axvline(1, color="grey", linewidth=0.6)
    ax.set_xlabel(f"inference throughput vs the teacher (x; {PAYOFF_PRECISION}, {PAYOFF_LENGTH} length)", fontsize=8)
    ax.set_ylabel("main metric, % of the teacher's", fontsize=8)
    ax.set_title("What the student buys: score retained vs speed-up (± seed spread)", fontsize=9)
    ax.margins(0.2)
    fig.tight_layout()
    fig.savefig(out / PAYOFF_CHART, dpi=110)
    plt.close(fig)
    return [PAYOFF_CHART]
