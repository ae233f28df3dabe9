"""What a student buys against its teacher: parameters and size (% of the teacher's), inference
latency and throughput speed-up (x), score retained (% of the teacher's, ± the seed spread), in a
table, one sentence per procedure and a chart of score retained against speed-up. The baseline
(the student's architecture trained without distillation) is set against the same teacher, so the
gain of distillation shows at equal speed. A student exported for serving (`pipeline export --check`)
has a row per graph (int8, ONNX fp32): the score it kept, its speed against the teacher and against
the PyTorch student it came from, its size on disk.

The inference speed comes from one side-by-side measurement of every model (side_by_side.py: one
process, one device, the models taking turns), in fp32 at the test split's median length
(columns.PAYOFF_PRECISION, PAYOFF_LENGTH): per repetition, the mean over a procedure's seeds
against the teacher's, then the median over repetitions with its range. The stages' own infer/*
figures, each timed at its own end, are never divided: without the side-by-side record the
speed-up is n/a and the sentence says why.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report.columns import EXPORT_VARIANTS, PAYOFF_LENGTH, PAYOFF_PRECISION
from pipeline.report.compare import Comparison, comparisons, difference, ratio, stats
from pipeline.report.side_by_side import FILE
from pipeline.report.verdicts import metric_name

PAYOFF_CHART = "payoff.png"


def payoff_table(cells: pd.DataFrame, side: dict | None = None) -> pd.DataFrame:
    """Per task: its teacher (the reference, 100% and 1.0x), each distilled student and each
    baseline against that teacher. *_pct: the model's mean in % of the teacher's; *_x: speed-ups
    from the side-by-side record `side` (teacher latency / model latency; model samples/s /
    teacher samples/s, per repetition, then the median), *_x_min/_max their range over repetitions,
    speed_note why there is none; retained_pct: main in % of the teacher's, retained_spread_pct the
    pooled std in % of the teacher's mean (as the AMP table's retention), retained_beyond the
    verdict on the difference (compare.difference)."""
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
            row = _row(c, "teacher" if c.compared == c.reference else
                       "baseline" if c.kind == "baseline_vs_teacher" else "student")
            row.update(_speed(side, task, c))
            rows.append(row)
            if c.kind == "teacher" and c.compared != c.reference:
                rows += _exported_rows(side, task, c)
    return pd.DataFrame(rows)


EXPORTED_LABEL = {"int8": "int8", "fp32": "onnx fp32"}


def _exported_rows(side: dict | None, task: str, c: Comparison) -> list[dict]:
    """A student's exported graphs (`pipeline export --check`: int8, ONNX fp32), each a row against
    the teacher as the student is: its test score from its export/VARIANT/test/main, its size on
    disk, its side-by-side speed (cells CELL@VARIANT), and its throughput against the PyTorch
    student it came from (vs_student_x)."""
    rows = []
    for variant in EXPORT_VARIANTS:
        main, size = f"export_{variant}_main", f"export_{variant}_size_mb"
        if main not in c.cmp or c.cmp[main].dropna().empty:
            continue
        graph = c.cmp.assign(main=c.cmp[main], infer_size_mb=c.cmp[size], cell=c.cmp.cell + f"@{variant}")
        exported = Comparison(task, f"{c.label} {variant}", c.kind, c.reference,
                              f"{c.compared} {EXPORTED_LABEL[variant]}", c.ref, graph)
        row = {**_row(exported, "exported"), **_speed(side, task, exported)}
        vs_student = _speed(side, task, Comparison(task, "", c.kind, c.compared, exported.compared, c.cmp, graph))
        row.update({f"vs_student_{k}": vs_student[k] for k in ("throughput_x", "throughput_x_min",
                                                                "throughput_x_max")})
        rows.append(row)
    if "export_trim_size_mb" in c.cmp and not c.cmp.export_trim_size_mb.dropna().empty:
        rows.append(_trimmed_row(task, c))
    return rows


def _trimmed_row(task: str, c: Comparison) -> dict:
    """The student with its vocabulary cut to the training data's tokens (`pipeline export
    --trim-vocab`): its parameters and size on disk after the cut, its test score (its fp32 graph's,
    the same function); its speed is its fp32 graph's row above."""
    trimmed = c.cmp.assign(main=c.cmp["export_fp32_main"], infer_size_mb=c.cmp.export_trim_size_mb,
                           infer_params=c.cmp.export_trim_params,
                           infer_params_no_embed=c.cmp.export_trim_params_no_embed,
                           cell=c.cmp.cell + "@trimmed")
    vocab = stats(c.cmp, "export_trim_vocab_size")[1], stats(c.cmp, "export_trim_vocab_size_before")[1]
    label = f"{c.compared}, vocabulary trimmed ({vocab[1]:.0f} -> {vocab[0]:.0f} tokens)"
    return {**_row(Comparison(task, f"{c.label} trimmed", c.kind, c.reference, label, c.ref, trimmed), "trimmed"),
            **dict.fromkeys(SPEED_COLUMNS, math.nan), "speed_note": "its fp32 graph's row", "speed_reps": 0}


SPEED_COLUMNS = ("infer_latency_ms", "infer_samples_per_s", "latency_x", "latency_x_min", "latency_x_max",
                 "throughput_x", "throughput_x_min", "throughput_x_max")


def _speed(side: dict | None, task: str, c: Comparison) -> dict:
    """The row's inference speed from the side-by-side record, or NaN and speed_note saying why not."""
    out = dict.fromkeys(SPEED_COLUMNS, math.nan)
    models = (side or {}).get("tasks", {}).get(task, {}).get("models", {})
    mine = [models[n] for n in c.cmp[c.cmp.status == "finished"].cell if n in models]
    ref = [models[n] for n in c.ref[c.ref.status == "finished"].cell if n in models]
    if not mine or not ref:
        missing = [n for n in (*c.ref.cell, *c.cmp.cell) if n not in models]
        why = ((side or {}).get("reason") or "; ".join(sorted({(side or {}).get("not_measured", {}).get(n, "")
                                                               for n in missing} - {""}))
               or "no side-by-side record") if side is not None else "not measured side by side"
        return {**out, "speed_note": why, "speed_reps": 0}
    reps = min(len(m["samples_per_s_by_rep"]) for m in (*mine, *ref))

    def at(group: list[dict], key: str, rep: int) -> float:  # the seeds' mean in one repetition
        return statistics.mean(m[key][rep] for m in group)

    tput = [at(mine, "samples_per_s_by_rep", r) / at(ref, "samples_per_s_by_rep", r) for r in range(reps)]
    lat = [at(ref, "latency_ms_p50_by_rep", r) / at(mine, "latency_ms_p50_by_rep", r) for r in range(reps)]
    return {"infer_latency_ms": statistics.median(at(mine, "latency_ms_p50_by_rep", r) for r in range(reps)),
            "infer_samples_per_s": statistics.median(at(mine, "samples_per_s_by_rep", r) for r in range(reps)),
            "latency_x": statistics.median(lat), "latency_x_min": min(lat), "latency_x_max": max(lat),
            "throughput_x": statistics.median(tput), "throughput_x_min": min(tput), "throughput_x_max": max(tput),
            "speed_note": "", "speed_reps": reps}


def _row(c: Comparison, role: str) -> dict:
    n, main, main_std = stats(c.cmp, "main")
    row = {"task": c.task, "procedure": c.compared, "role": role, "teacher": c.reference,
           "model": "/".join(dict.fromkeys(c.cmp.model.dropna().map(str))), "seeds": n, "main": main,
           "main_std": main_std, "metric": metric_name(c.task)}
    for column in ("infer_params", "infer_params_no_embed", "infer_size_mb"):  # the same on any machine
        row[column] = stats(c.cmp, column)[1]
    for column, name in (("infer_params", "params_pct"), ("infer_params_no_embed", "params_no_embed_pct"),
                         ("infer_size_mb", "size_pct")):
        row[name] = ratio(stats(c.cmp, column)[1], stats(c.ref, column)[1]) * 100
    d = difference(c, "main")
    row["retained_pct"] = ratio(d["compared_mean"], d["reference_mean"]) * 100
    row["retained_spread_pct"] = ratio(d["pooled_std"], d["reference_mean"]) * 100
    row["retained_beyond"] = d["exceeds_spread"]
    if role == "teacher":  # the reference itself: no spread against itself
        row.update(retained_spread_pct=math.nan, retained_beyond="")
    return row


def _pm(value: float, spread: float, fmt: str, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    text = f"{value:{fmt}}{unit}"
    return text if math.isnan(spread) else f"{text} ± {spread:{fmt}}{unit}"


def _x(value: float, low: float, high: float, reps: int) -> str:
    """"2.9x (2.7-3.1x over 20 repetitions)", or "2.9x" from one repetition."""
    if math.isnan(value):
        return "n/a"
    return f"{value:.1f}x" + (f" ({low:.1f}-{high:.1f}x over {reps} repetitions)" if reps > 1 else "")


def sentences(payoff: pd.DataFrame) -> list[str]:
    """One sentence per student and baseline, as DistilBERT's paper puts it ("keeps 97% of BERT's
    score at 60% more speed with 40% fewer parameters"), with the seed spread of the score and the
    range over repetitions of the side-by-side speed-up; where no side-by-side ran, why not, and
    no speed-up."""
    out = []
    for r in payoff[payoff.role != "teacher"].itertuples() if not payoff.empty else []:
        within = " (within the seed spread)" if r.retained_beyond == "no" else ""
        kind = {"baseline": " (no distillation)", "exported": " (exported, ONNX Runtime)",
                "trimmed": " (its test score: its fp32 graph's)"}.get(r.role, "")
        size = (f"{r.params_pct:.0f}% of its parameters ({r.params_no_embed_pct:.0f}% of those outside the "
                f"embeddings) and {r.size_pct:.0f}% of its size on disk")
        kept = (f"{r.task}: {r.procedure}{kind} keeps {_pm(r.retained_pct, r.retained_spread_pct, '.0f', '%')} of the "
                f"teacher's {r.metric}{within}")
        if math.isnan(r.throughput_x):
            out.append(f"{kept} with {size}; its inference speed was not measured side by side ({r.speed_note}), "
                       "and the runs' own infer/* figures, each timed at its stage's end under whatever else the "
                       "machine ran then, are not divided.")
            continue
        student = ""
        if r.role == "exported" and not math.isnan(getattr(r, "vs_student_throughput_x", math.nan)):
            vs = _x(r.vs_student_throughput_x, r.vs_student_throughput_x_min, r.vs_student_throughput_x_max,
                    r.speed_reps)
            student = f", {vs} the throughput of the PyTorch student it came from,"
        out.append(f"{kept} at {_x(r.throughput_x, r.throughput_x_min, r.throughput_x_max, r.speed_reps)} its "
                   f"throughput ({_x(r.latency_x, r.latency_x_min, r.latency_x_max, r.speed_reps)} faster at batch 1)"
                   f"{student} with {size}.")
    return out


def _range(value: float, low: float, high: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}x" if low == high else f"{value:.2f}x ({low:.2f}-{high:.2f}x)"


def payoff_display(payoff: pd.DataFrame) -> pd.DataFrame:
    """The table as report.md shows it."""
    def num(v: float, fmt: str) -> str:
        return "n/a" if math.isnan(v) else f"{v:{fmt}}"

    nan = pd.Series(math.nan, index=payoff.index)  # no exported row: the column is all n/a

    return pd.DataFrame({
        "task": payoff.task, "procedure": payoff.procedure, "role": payoff.role,
        "params (M)": [num(v / 1e6, ".1f") for v in payoff.infer_params],
        "% of teacher's params": [num(v, ".0f") for v in payoff.params_pct],
        "non-embedding params (M)": [num(v / 1e6, ".1f") for v in payoff.infer_params_no_embed],
        "% of teacher's non-embedding": [num(v, ".0f") for v in payoff.params_no_embed_pct],
        "size MB": [num(v, ".1f") for v in payoff.infer_size_mb],
        "latency ms": [num(v, ".1f") for v in payoff.infer_latency_ms],
        "latency speed-up": [_range(v, lo, hi) for v, lo, hi in zip(payoff.latency_x, payoff.latency_x_min,
                                                                    payoff.latency_x_max)],
        "samples/s": [num(v, ".1f") for v in payoff.infer_samples_per_s],
        "throughput speed-up": [_range(v, lo, hi) for v, lo, hi in zip(payoff.throughput_x, payoff.throughput_x_min,
                                                                       payoff.throughput_x_max)],
        "throughput vs its PyTorch student": [
            _range(v, lo, hi) for v, lo, hi in zip(*(payoff.get(f"vs_student_throughput_x{k}", nan) for k in
                                                      ("", "_min", "_max")))],
        "main": [_pm(v, s, ".4f", "") for v, s in zip(payoff.main, payoff.main_std)],
        "retained": ["reference" if role == "teacher" else _pm(v, s, ".1f", "%")
                     for v, s, role in zip(payoff.retained_pct, payoff.retained_spread_pct, payoff.role)],
        "runs": payoff.seeds,
    })


NOTE = (f"- inference: every model's best/ timed side by side in one process on one device "
        f"(`{FILE}`, `pipeline/measure/inference.py`'s bench_side_by_side, as `infer-bench`), in {PAYOFF_PRECISION} "
        f"at the test split's {PAYOFF_LENGTH} length, on token tensors already on the device, the models taking "
        "turns over the repetitions; latency at batch 1 (p50), throughput at the serving batch. Latency ms and "
        "samples/s: the median over repetitions of the mean over seeds; speed-ups: teacher latency / model latency "
        "and model samples/s / teacher samples/s in each repetition, their median and (range). Each run keeps its "
        "own `infer/*` figures, timed at its stage's end, which are not divided here. Retained: main / the teacher's "
        "main ± the pooled std in % of the teacher's.")


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
    colours = {"teacher": "tab:grey", "student": "tab:orange", "baseline": "tab:blue", "exported": "tab:green"}
    placed: list[tuple[float, float]] = []
    for r in shown.itertuples():
        xerr = [[max(0.0, r.throughput_x - r.throughput_x_min)], [max(0.0, r.throughput_x_max - r.throughput_x)]]
        ax.errorbar(r.throughput_x, r.retained_pct, xerr=np.nan_to_num(xerr),
                    yerr=np.nan_to_num(r.retained_spread_pct), fmt="o", capsize=3, color=colours[r.role])
        near = sum(abs(x - r.throughput_x) < 0.1 and abs(y - r.retained_pct) < 1.0 for x, y in placed)
        placed.append((r.throughput_x, r.retained_pct))
        ax.annotate(f"{r.task}: {r.procedure}" if several else r.procedure, (r.throughput_x, r.retained_pct),
                    textcoords="offset points", xytext=(6, 5 - 10 * near), fontsize=7)  # coinciding points: stacked
    ax.axhline(100, color="grey", linewidth=0.6)
    ax.axvline(1, color="grey", linewidth=0.6)
    ax.set_xlabel(f"inference throughput vs the teacher, measured side by side (x; {PAYOFF_PRECISION}, "
                  f"{PAYOFF_LENGTH} length; range over repetitions)", fontsize=8)
    ax.set_ylabel("main metric, % of the teacher's (± seed spread)", fontsize=8)
    ax.set_title("What the student buys: score retained vs speed-up", fontsize=9)
    ax.margins(0.2)
    fig.tight_layout()
    fig.savefig(out / PAYOFF_CHART, dpi=110)
    plt.close(fig)
    return [PAYOFF_CHART]
