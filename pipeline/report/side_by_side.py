"""The KD payoff's inference speed, measured side by side: the teacher's and every student's and
baseline's best/ loaded in one process on one device and timed in turns over repetitions
(measure/inference.bench_side_by_side, the measurement `infer-bench` makes), so a shared machine
slows every model alike and the speed-ups are ratios of turns taken close together.

A student whose stage was exported and checked (`pipeline export --check`: OUTPUT_DIR/export/check.json)
has its graphs timed in the same turns on a CPU, as cells CELL@int8 and CELL@fp32 (ONNX Runtime).

Each stage's own infer/* figures were timed at its own end, minutes apart and under whatever else
the machine ran then; dividing them gives the machine's drift as much as the models'. They stay
in each run; the payoff reads only this record. Where it cannot be made (best/ not on this
machine, no infer/length/median to time at), the record says why and the payoff prints no speed-up.

The record (side_by_side.json beside report.md, and with it an artifact of the study's parent
run): where and when it ran (host, device, threads, UTC start and end), the load from other work
meanwhile (measure/load.py), and per task the length and batch timed and per cell its model's
figures, each repetition's kept.
"""
from __future__ import annotations

import json
import math
import socket
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from pipeline.report.columns import PAYOFF_PRECISION

FILE = "side_by_side.json"
REPS = 20
"""Turns each model takes."""
BUDGET_S = 4.0
"""Timed seconds per model, over its turns."""


def candidates(cells: pd.DataFrame) -> pd.DataFrame:
    """The finished cells of the KD section (their models are the payoff's)."""
    if cells.empty:
        return cells
    kd = cells[cells.tables.fillna("").str.contains("kd") & (cells.status == "finished")]
    return kd[kd.task.isin(_teachers(cells))]


def _teachers(cells: pd.DataFrame) -> dict[str, set[str]]:
    """task -> the procedures its students are distilled from."""
    from pipeline.report.compare import comparisons

    found: dict[str, set[str]] = {}
    for c in comparisons(cells):
        if c.kind == "teacher":
            found.setdefault(c.task, set()).add(c.reference)
    return found


def measure(cells: pd.DataFrame, device: str | None = None, reps: int = REPS, budget_s: float = BUDGET_S) -> dict:
    """Time the KD section's models side by side; the record (`reason` says why nothing ran, if so)."""
    chosen = candidates(cells)
    record = {"precision": PAYOFF_PRECISION, "reps": reps, "budget_s": budget_s, "tasks": {}, "not_measured": {},
              "reason": ""}
    if chosen.empty:
        return {**record, "reason": "no finished teacher and student runs"}
    groups: dict[str, dict] = {}
    teachers = _teachers(cells)
    for task, g in chosen.groupby("task", sort=False):
        found = {r.cell: _best_dir(r.output_dir) for r in g.itertuples()}
        missing = [c for c, path in found.items() if path is None]
        for c in missing:
            where = g.set_index("cell").output_dir.get(c)
            record["not_measured"][c] = (f"best/ of {where} is not on this machine" if isinstance(where, str) and where
                                         else "its run logged no output_dir")
        length, batch = _first(g.infer_length), _first(g.infer_batch)
        if math.isnan(length):
            for c in found:
                record["not_measured"].setdefault(c, "no infer/length/median logged (infer.bench=false): the test "
                                                     "split's median length is unknown")
            continue
        present = {c: p for c, p in found.items() if p is not None}
        if not g[g.cell.isin(present) & g.procedure.isin(teachers[task])].empty:  # no teacher here: no payoff
            groups[task] = {"length": int(length), "batch_size": int(batch) if not math.isnan(batch) else 32,
                            "cells": present, "rows": g.set_index("cell"),
                            "students": set(g[~g.procedure.isin(teachers[task])].cell)}
    if not groups:
        reasons = sorted(set(record["not_measured"].values()))
        return {**record, "reason": "; ".join(reasons) or "no model to measure"}
    return _run(record, groups, device)


def _best_dir(output_dir) -> str | None:
    if not isinstance(output_dir, str) or not output_dir:
        return None
    from pipeline.layout import OutputDir

    path = Path(output_dir)
    best = OutputDir(path).trained_model() if path.is_dir() else None
    return str(best) if best is not None else None


def _exported(best: str) -> list[tuple[str, Path]]:
    """The checked graphs a stage exported (pipeline export --check: OUTPUT_DIR/export/), by variant."""
    from pipeline.export.stage_export import VARIANTS
    from pipeline.layout import OutputDir

    out = OutputDir(Path(best).parent)
    if not out.export_check.is_file():
        return []
    return [(v, out.export / name) for v, name in VARIANTS.items() if (out.export / name).is_file()]


def _first(values: pd.Series) -> float:
    found = values.astype(float).dropna()
    return float(found.iloc[0]) if len(found) else math.nan


def _run(record: dict, groups: dict, device_name: str | None) -> dict:
    import torch

    from pipeline.export.onnx_model import served_graph
    from pipeline.measure import inference
    from pipeline.measure.load import LoadSampler
    from pipeline.measure.telemetry import device_name as describe
    from pipeline.models import SavedModel

    device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = datetime.now(timezone.utc)
    with inference.serving_threads(device) as threads, LoadSampler(device) as load:
        for task, group in groups.items():
            saved = {cell: SavedModel(path) for cell, path in group["cells"].items()}
            served = {cell: m.served() for cell, m in saved.items()}
            if device.type == "cpu":  # a student's exported graphs, beside its model: CELL@int8, CELL@fp32
                graphs = {f"{cell}@{v}": p for cell, path in group["cells"].items() if cell in group["students"]
                          for v, p in _exported(path)}
                served.update({name: served_graph(str(p)) for name, p in graphs.items()})
                group["cells"].update({name: str(p) for name, p in graphs.items()})
            results = inference.bench_side_by_side(
                served, device, lengths={"median": group["length"]}, precisions=[PAYOFF_PRECISION],
                batch_size=group["batch_size"], budget_s=record["budget_s"], reps=record["reps"])
            rows = group["rows"]
            record["tasks"][task] = {"length": group["length"], "batch_size": group["batch_size"], "models": {
                cell: {"procedure": rows.procedure.get(cell.partition("@")[0]),
                       "run_id": rows.run_id.get(cell.partition("@")[0]),
                       "path": group["cells"][cell], "params": r.params, "params_no_embed": r.params_no_embed,
                       "size_mb": r.size_mb, "latency_ms_p50": r.measurements[0].latency_ms_p50,
                       "samples_per_s": r.measurements[0].samples_per_s,
                       "latency_ms_p50_by_rep": r.measurements[0].latency_ms_p50_by_rep,
                       "samples_per_s_by_rep": r.measurements[0].samples_per_s_by_rep}
                for cell, r in results.items()}}
    record.update(host=socket.gethostname(), device=str(device), device_name=describe(device), threads=threads,
                  started_utc=started.isoformat(timespec="seconds"),
                  finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  load=load.last.figures())
    return record


def write(record: dict, out: Path) -> None:
    (out / FILE).write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")


def stored(out: Path, cells: pd.DataFrame) -> dict | None:
    """The record an earlier report left beside this one, if it measured these runs (by run id)."""
    path = out / FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    runs = {m.get("run_id") for t in record.get("tasks", {}).values() for m in t.get("models", {}).values()}
    current = set(candidates(cells).run_id.dropna()) if not cells.empty else set()
    return record if runs and runs <= current else None


def where_and_when(record: dict) -> str:
    """One sentence: how, where and when the side-by-side ran, and how busy the machine was."""
    lengths = ", ".join(f"{task} {t['length']} tokens" for task, t in record["tasks"].items())
    batch = "/".join(sorted({str(t["batch_size"]) for t in record["tasks"].values()}))
    load = record.get("load", {})
    busy = load.get("perf/others_cpu_frac")
    meanwhile = ("" if busy is None else f"; meanwhile other processes kept {100 * busy:.0f}% of the machine's cores "
                 "busy (the turns spread it over every model alike)")
    return (f"Inference measured side by side on `{record['host']}`, {record['device_name']} (`{record['device']}`, "
            f"{record['threads']} threads), {record['started_utc']} to {record['finished_utc']}: every model's best/ "
            f"loaded in one process, then timed in turns over {record['reps']} repetitions (order rotated each "
            f"repetition), {record['precision']} at the test split's median length ({lengths}), batch-1 latency "
            f"(p50) and throughput at batch {batch}{meanwhile}.")
