"""`python -m pipeline report --experiment NAME [--uri URI] [--out DIR]`: compare a study's runs.

Reads the runs back from MLflow (the study's parent run says which cells were planned and how
each ended; the child runs hold the figures) and writes to reports/NAME/:
- report.md: the AMP table (FP32 vs AMP per task x model, with speed-up, memory reduction and
  metric retention, and their averages in one sentence), the KD table (per procedure), the seed
  statistics, the cells and their outcomes, the charts;
- amp_table.csv, kd_table.csv, seed_stats.csv, cells.csv (one row per cell, raw figures);
- speedup.png, memory_reduction.png, retention.png, kd.png (matplotlib, Agg).
It also logs them as artifacts (report/) of the study's parent run.

A failed or missing run shows as "failed" or "missing" in every table, never as a number;
a figure a run could not measure (energy on a CPU) shows as "n/a".
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.errors import UserError
from pipeline.names import CELL_TAG_PREFIX, PARENT_TAG

AMP_PRECISIONS = ("fp16", "bf16", "auto")
FP32_PRECISIONS = ("fp32", "tf32")
# report column -> MLflow metric (the main metric and peak memory are picked in _figures)
METRICS = {
    "samples_per_s": "perf/train_samples_per_s",
    "epoch_time_s": "perf/epoch_time_s",
    "train_time_s": "perf/train_time_s",
    "energy_j": "energy/joules",
    "test_precision": "test/precision",
    "test_recall": "test/recall",
    "test_f1": "test/f1",
    "test_map": "test/map",
    "test_mrr": "test/mrr",
}
FIGURES = ("main", "peak_mem_mb", *METRICS)
MEMORY = {"perf/peak_mem_allocated_mb": "CUDA peak allocated", "perf/peak_rss_mb": "CPU peak RSS"}
SPREAD_FACTOR = 2.0
"""A mean difference counts as larger than the seed spread when |diff| > 2 x pooled std."""


# ------------------------------------------------------------------ entry points


def main(args: list[str]) -> int:
    from pipeline.tracking import resolve_uri

    parser = argparse.ArgumentParser(prog="python -m pipeline report")
    parser.add_argument("--experiment", required=True, help="MLflow experiment (a study's name)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else the project's store)")
    parser.add_argument("--out", help="output directory (default: reports/EXPERIMENT)")
    opts = parser.parse_args(args)
    out = write_report(resolve_uri(opts.uri), opts.experiment, opts.out)
    print(f"report: {out / 'report.md'}")
    return 0


def write_report(uri: str, experiment: str, out: str | Path | None = None) -> Path:
    """Build every table and chart of `experiment`; returns the output directory."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    from pipeline.tracking import redact

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise UserError(f"report: --experiment {experiment}: no such experiment in {redact(uri)}")
    parent, cells = collect(client, exp.experiment_id)
    out = Path(out or f"reports/{experiment}")
    out.mkdir(parents=True, exist_ok=True)
    amp, kd, stats = amp_table(cells), kd_table(cells), seed_stats(cells)
    cells.to_csv(out / "cells.csv", index=False)
    amp_display(amp).to_csv(out / "amp_table.csv", index=False)
    kd_display(kd).to_csv(out / "kd_table.csv", index=False)
    stats.to_csv(out / "seed_stats.csv", index=False)
    charts = plot_amp(amp, out) + plot_kd(kd, out)
    text = markdown(experiment, redact(uri), parent.info.run_id if parent else None, cells, amp, kd, stats, charts)
    (out / "report.md").write_text(text, encoding="utf-8")
    if parent is not None:
        client.log_artifacts(parent.info.run_id, str(out), "report")
    return out


# ------------------------------------------------------------------ reading MLflow


def collect(client, experiment_id: str):
    """(parent run or None, one row per cell): the parent's plan joined with the child runs."""
    runs = _all_runs(client, experiment_id)
    parents = [r for r in runs if r.data.tags.get(PARENT_TAG) == "true"]
    parent = parents[0] if parents else None  # newest first
    plan = {}
    children = [r for r in runs if r.data.tags.get(PARENT_TAG) != "true"]
    if parent is not None:
        plan = {k[len(CELL_TAG_PREFIX):]: json.loads(v) for k, v in parent.data.tags.items()
                if k.startswith(CELL_TAG_PREFIX)}
        study = parent.data.tags.get("study")
        children = [r for r in children if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                    or (study and r.data.tags.get("study") == study)]
    by_cell = defaultdict(list)
    for r in children:
        by_cell[r.data.tags.get("cell") or r.info.run_name or r.info.run_id].append(r)
    names = list(plan) + [n for n in by_cell if n not in plan]
    rows = [_row(client, name, plan.get(name), _pick(by_cell.get(name, []))) for name in names]
    cells = pd.DataFrame(rows, columns=_ROW_COLUMNS)
    cells["exit_code"] = cells.exit_code.astype("Int64")  # blank, not NaN, where there is none
    return parent, cells


def _all_runs(client, experiment_id: str) -> list:
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], order_by=["attributes.start_time DESC"], max_results=1000,
                                  page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def _pick(runs: list):
    """A cell's run: the newest finished one, else the newest (runs come newest first)."""
    finished = [r for r in runs if r.info.status == "FINISHED"]
    return (finished or runs or [None])[0]


_ROW_COLUMNS = ["cell", "task", "model", "procedure", "stage", "seed", "precision_requested", "precision", "role",
                "tables", "launcher", "status", "exit_code", "reason", "run_id", "device_type", "energy_available",
                "main_source", "memory", *FIGURES]


def _row(client, name: str, plan: dict | None, run) -> dict:
    plan = plan or {}
    tags = run.data.tags if run else {}
    status = _status(plan, run)
    requested = str(plan.get("precision") or tags.get("precision_requested") or tags.get("precision") or "")
    procedure = plan.get("procedure") or tags.get("procedure") or tags.get("stage") or "train"
    tables = plan.get("tables")
    if tables is None:  # a run the study runner did not plan: its tag, else a guess from the procedure
        tag = tags.get("report_tables")
        tables = [t for t in tag.split(",") if t in ("amp", "kd")] if tag else (
            ["amp"] + (["kd"] if procedure not in ("train", "") else []))
    launcher = plan.get("launcher") or (f"{tags['launcher']} x{tags.get('world_size', '?')}" if "launcher" in tags
                                        else "")
    row = {
        "cell": name, "task": plan.get("task") or tags.get("task"), "model": plan.get("model") or tags.get("model"),
        "procedure": procedure, "stage": plan.get("command") or tags.get("stage"),
        "seed": plan.get("seed", tags.get("seed")), "precision_requested": requested,
        "precision": tags.get("precision") or requested,
        "role": "amp" if requested in AMP_PRECISIONS else "fp32" if requested in FP32_PRECISIONS else "",
        "tables": ",".join(tables), "launcher": launcher, "status": status,
        "exit_code": plan.get("exit_code") if status == "failed" else (0 if status == "finished" else None),
        "reason": plan.get("reason", "") if status == "failed" else "",
        "run_id": run.info.run_id if run else plan.get("run_id"),
        "device_type": tags.get("device_type"), "energy_available": tags.get("energy_available"),
        "main_source": None, "memory": None, **{f: math.nan for f in FIGURES},
    }
    if status == "finished":  # figures of failed runs are partial: never reported
        row.update(_figures(client, run))
    return row


def _status(plan: dict, run) -> str:
    if run is not None and run.info.status == "FINISHED":
        return "finished"
    if plan.get("status") == "failed" or (run is not None and run.info.status in ("FAILED", "KILLED")):
        return "failed"
    if run is not None and run.info.status in ("RUNNING", "SCHEDULED"):
        return "running"
    return "missing"  # planned and never run, or finished elsewhere (outputs without a run here)


def _figures(client, run) -> dict:
    m = run.data.metrics
    figures = {k: m.get(metric, math.nan) for k, metric in METRICS.items()}
    if "test/main" in m:
        figures.update(main=m["test/main"], main_source="test/main")
    elif "eval/main" in m:  # the latest value is the last epoch's; the best epoch is what counts
        history = client.get_metric_history(run.info.run_id, "eval/main")
        figures.update(main=max(h.value for h in history), main_source="eval/main")
    for metric, kind in MEMORY.items():
        if metric in m:
            figures.update(peak_mem_mb=m[metric], memory=kind)
            break
    if run.data.tags.get("energy_available") == "false":
        figures["energy_j"] = math.nan
    return figures


# ------------------------------------------------------------------ tables


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
            for fig in ("main", "peak_mem_mb", "samples_per_s", "epoch_time_s", "energy_j"):
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
        for fig in ("train_time_s", "samples_per_s", "peak_mem_mb", "energy_j", "test_precision", "test_recall",
                    "test_f1", "test_map", "test_mrr", "main"):
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
        pairs.append((f"{task} / {model}" + (f" / {procedure}" if procedure != "train" else "") + f": {variant} vs fp32",
                      fp32, amp))
    kd = cells[cells.tables.str.contains("kd") & (cells.role != "")]
    for (task, stage), g in kd.groupby(["task", "stage"], sort=False, dropna=False):
        fp32_procs = list(dict.fromkeys(g[g.role == "fp32"].procedure))
        amp_procs = list(dict.fromkeys(g[g.role == "amp"].procedure))
        for fp, ap in ((fp, ap) for fp in fp32_procs for ap in amp_procs):
            pairs.append((f"{task}: {ap} vs {fp}", g[g.procedure == fp], g[g.procedure == ap]))
    rows = []
    for label, f_rows, a_rows in pairs:
        f, a = _aggregate(f_rows), _aggregate(a_rows)
        if f["n"] < 2 or a["n"] < 2:
            continue
        for fig in ("main", "samples_per_s", "peak_mem_mb"):
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


def headline(amp: pd.DataFrame) -> str:
    """The averages over the matrix in one sentence."""
    if amp.empty:
        return "No FP32/AMP pairs in this study."
    ok = amp.dropna(subset=["speedup_pct", "mem_reduction_pct", "retention_pct"])
    if ok.empty:
        return f"No task x model cell has both an FP32 and an AMP run that finished ({len(amp)} planned)."
    s, m, r = ok.speedup_pct.mean(), ok.mem_reduction_pct.mean(), ok.retention_pct.mean()
    precisions = "/".join(sorted(set("/".join(ok.amp_precision).split("/"))))
    memory = "/".join(sorted(set(ok.memory) - {""})) or "peak memory"
    left_out = f" ({len(amp) - len(ok)} more failed or are missing)" if len(ok) < len(amp) else ""
    return (f"Averaged over {len(ok)} task x model cell{'s' if len(ok) != 1 else ''}{left_out}, AMP ({precisions}) "
            f"trained {abs(s):.1f}% {'faster' if s >= 0 else 'slower'} than FP32 (samples/s), used {abs(m):.1f}% "
            f"{'less' if m >= 0 else 'more'} peak memory ({memory}) and kept {r:.1f}% of the FP32 main metric.")


# ------------------------------------------------------------------ display (marks instead of numbers)


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
    for fig in ("main", "peak_mem_mb", "samples_per_s", "epoch_time_s", "energy_j"):
        for p in ("fp32", "amp"):
            out[f"{p}_{fig}"] = [_value(r[f"{p}_status"], r[f"{p}_{fig}"], r[f"{p}_energy_na"], fig == "energy_j")
                                 for _, r in amp.iterrows()]
            out[f"{p}_{fig}_std"] = [r[f"{p}_{fig}_std"] if r[f"{p}_status"] == "ok" else None
                                     for _, r in amp.iterrows()]
    for d in ("speedup_pct", "mem_reduction_pct", "retention_pct"):
        out[d] = [r[d] if not math.isnan(r[d]) else _pair_mark(r) for _, r in amp.iterrows()]
    return out


def _pair_mark(r) -> str:
    marks = {r["fp32_status"], r["amp_status"]} - {"ok"}
    return "failed" if "failed" in marks else "missing" if "missing" in marks else next(iter(marks), "n/a")


def kd_display(kd: pd.DataFrame) -> pd.DataFrame:
    if kd.empty:
        return kd
    out = kd[["task", "procedure", "stage", "model", "precision", "launcher", "memory", "status", "seeds"]].copy()
    for fig in ("train_time_s", "samples_per_s", "peak_mem_mb", "energy_j", "test_precision", "test_recall",
                "test_f1", "test_map", "test_mrr"):
        out[fig] = [_value(r.status, r[fig], r.energy_na, fig == "energy_j") for _, r in kd.iterrows()]
        out[f"{fig}_std"] = [r[f"{fig}_std"] if r.status == "ok" else None for _, r in kd.iterrows()]
    return out


def _fmt(value, std=math.nan, digits: int = 2) -> str:
    if isinstance(value, str):
        return value
    text = f"{value:.{digits}f}"
    return text if std is None or math.isnan(std) else f"{text} ± {std:.{digits}f}"


def _pct(value) -> str:
    return value if isinstance(value, str) else f"{value:+.1f}%"


def md_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table (pandas' to_markdown needs tabulate, which is not a dependency)."""
    blank = lambda v: v is None or (isinstance(v, float) and math.isnan(v))
    cells = [[str(c).replace("|", "\\|") for c in df.columns]] + [
        ["" if blank(v) else str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in df.values]
    lines = ["| " + " | ".join(r) + " |" for r in cells]
    lines.insert(1, "|" + "---|" * len(df.columns))
    return "\n".join(lines)


def markdown(experiment: str, uri: str, parent_id: str | None, cells: pd.DataFrame, amp: pd.DataFrame,
             kd: pd.DataFrame, stats: pd.DataFrame, charts: list[str]) -> str:
    counts = cells.status.value_counts().to_dict() if not cells.empty else {}
    lines = [f"# Study report: {experiment}", "",
             f"Experiment `{experiment}` in `{uri}`" + (f", parent run `{parent_id}`" if parent_id else "")
             + f"; generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
             f"Cells: {len(cells)} ({', '.join(f'{v} {k}' for k, v in counts.items()) or 'none'}).", ""]
    if not amp.empty:
        shown = amp_display(amp)
        table = pd.DataFrame({
            "task": shown.task, "model": shown.model,
            "FP32 main": [_fmt(v, s, 4) for v, s in zip(shown.fp32_main, shown.fp32_main_std)],
            "AMP main": [_fmt(v, s, 4) for v, s in zip(shown.amp_main, shown.amp_main_std)],
            "AMP precision": shown.amp_precision,
            "FP32 peak MB": [_fmt(v, s, 1) for v, s in zip(shown.fp32_peak_mem_mb, shown.fp32_peak_mem_mb_std)],
            "AMP peak MB": [_fmt(v, s, 1) for v, s in zip(shown.amp_peak_mem_mb, shown.amp_peak_mem_mb_std)],
            "memory": shown.memory,
            "FP32 samples/s": [_fmt(v, s, 1) for v, s in zip(shown.fp32_samples_per_s, shown.fp32_samples_per_s_std)],
            "AMP samples/s": [_fmt(v, s, 1) for v, s in zip(shown.amp_samples_per_s, shown.amp_samples_per_s_std)],
            "FP32 epoch s": [_fmt(v, s, 2) for v, s in zip(shown.fp32_epoch_time_s, shown.fp32_epoch_time_s_std)],
            "AMP epoch s": [_fmt(v, s, 2) for v, s in zip(shown.amp_epoch_time_s, shown.amp_epoch_time_s_std)],
            "FP32 energy J": [_fmt(v, s, 1) for v, s in zip(shown.fp32_energy_j, shown.fp32_energy_j_std)],
            "AMP energy J": [_fmt(v, s, 1) for v, s in zip(shown.amp_energy_j, shown.amp_energy_j_std)],
            "speed-up": [_pct(v) for v in shown.speedup_pct],
            "memory reduction": [_pct(v) for v in shown.mem_reduction_pct],
            "retention": [v if isinstance(v, str) else f"{v:.1f}%" for v in shown.retention_pct],
            "FP32 runs": shown.fp32_seeds, "AMP runs": shown.amp_seeds,
        })
        if (shown.procedure != "train").any():
            table.insert(2, "procedure", shown.procedure)
        lines += ["## AMP vs FP32", "", f"**{headline(amp)}**", "", md_table(table), "",
                  "- main: the task's main metric on the test split with the best dev checkpoint (`test/main`; "
                  "`eval/main`, the best dev epoch, where a run has no test figures).",
                  "- peak memory: `perf/peak_mem_allocated_mb` on CUDA, `perf/peak_rss_mb` (process peak RSS) on CPU; "
                  "the memory column says which.",
                  "- speed-up = AMP samples/s / FP32 samples/s - 1; memory reduction = 1 - AMP peak / FP32 peak; "
                  "retention = AMP main / FP32 main. With several seeds: means, ± the sample std; runs: "
                  "finished / planned.",
                  "- energy: `energy/joules` (NVML); n/a where the run is tagged energy_available=false.", ""]
        lines += [f"![{c}]({c})" for c in charts if c != "kd.png"] + [""]
    if not kd.empty:
        shown = kd_display(kd)
        table = pd.DataFrame({
            "task": shown.task, "procedure": shown.procedure, "stage": shown.stage, "model": shown.model,
            "precision": shown.precision, "launcher": shown.launcher,
            "wall time s": [_fmt(v, s, 2) for v, s in zip(shown.train_time_s, shown.train_time_s_std)],
            "samples/s": [_fmt(v, s, 1) for v, s in zip(shown.samples_per_s, shown.samples_per_s_std)],
            "peak MB": [_fmt(v, s, 1) for v, s in zip(shown.peak_mem_mb, shown.peak_mem_mb_std)],
            "memory": shown.memory,
            "energy J": [_fmt(v, s, 1) for v, s in zip(shown.energy_j, shown.energy_j_std)],
            **{label: [_fmt(v, s, 4) for v, s in zip(shown[f"test_{k}"], shown[f"test_{k}_std"])]
               for label, k in (("P", "precision"), ("R", "recall"), ("F1", "f1"), ("MAP", "map"), ("MRR", "mrr"))},
            "runs": shown.seeds,
        })
        lines += ["## Knowledge distillation procedures", "", md_table(table), "",
                  "- wall time: `perf/train_time_s` (training steps only); P/R/F1: `test/precision`, `test/recall`, "
                  "`test/f1` (the positive class for WikiQA); MAP/MRR: `test/map`, `test/mrr`; n/a where the task "
                  "has no such metric.", ""]
        if "kd.png" in charts:
            lines += ["![kd.png](kd.png)", ""]
    lines += ["## Seeds: is the difference larger than the spread?", "",
              f"Rule: an AMP-vs-FP32 difference counts as real when |mean(AMP) - mean(FP32)| > {SPREAD_FACTOR:g} x "
              "pooled std, pooled std = sqrt((std_FP32² + std_AMP²) / 2), sample std over the seeds (2+ per side).", ""]
    if stats.empty:
        lines += ["No comparison has two or more finished seeds on each side.", ""]
    else:
        shown = stats.copy()
        for c in ("fp32_mean", "fp32_std", "amp_mean", "amp_std", "diff", "pooled_std"):
            shown[c] = [f"{v:.4g}" for v in shown[c]]
        lines += [md_table(shown), ""]
    listing = cells[["cell", "procedure", "task", "model", "precision", "seed", "launcher", "status", "exit_code",
                     "reason", "run_id"]].copy()
    listing["exit_code"] = ["" if pd.isna(v) else int(v) for v in listing.exit_code]
    lines += ["## Cells", "", md_table(listing), ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ charts


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
        ax.bar(x, np.nan_to_num(values, nan=0.0) * ~np.isnan(values), color="tab:blue")
        ax.axhline(ref, color="grey", linewidth=0.8)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(title, fontsize=9)
        for xi, v in zip(x, values):
            if not np.isnan(v):
                ax.annotate(f"{v:.1f}", (xi, v), ha="center", va="bottom", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def plot_kd(kd: pd.DataFrame, out: Path) -> list[str]:
    """Wall time, throughput, peak memory and main metric per procedure (error bars: seed std)."""
    if kd.empty:
        return []
    plt = _pyplot()

    several_tasks = kd.task.nunique() > 1
    labels = [(f"{r.task}\n" if several_tasks else "") + f"{r.procedure}" + (f"\n({r.status})" if r.status != "ok" else "")
              for _, r in kd.iterrows()]
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
