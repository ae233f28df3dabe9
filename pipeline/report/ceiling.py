"""The memory ceiling as the AMP paper found it: per precision, a ladder of batch sizes (each rung
one cell at that micro-batch, no accumulation, under the study's memory cap) and whether each rung
fit, with its peak, or ran out of memory; beside it the largest micro-batch the batch finder
reached (train.batch_size=auto) under the same cap.

A cell is on the ladder when its plan (or run) has train.memory_limit_mb set: a fixed batch with
grad_accum 1 is a rung, batch_size=auto a finder cell. A rung fits when its cell finished; it ran
out of memory when its cell failed on the CLI's out-of-memory line (a capped GPU's allocator, or
the cap emulated on a CPU: batch_finder.check_batch). The peak is the one the batch finder's
counting measured (the batch_fit tag: the cap's own measure on a CPU), else the run's peak memory.
"""
from __future__ import annotations

import math
import re

import pandas as pd

OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)
FIT_PEAK = re.compile(r"micro-batch (\d+) x grad_accum (\d+) \(peak (\d+) MiB\)")


def ceiling_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per task x model x precision requested: a column per rung (`batch N`) and per finder
    procedure (`PROCEDURE: largest micro-batch`), each cell's outcome in words; memory_limit_mb."""
    capped = cells[cells.memory_limit_mb.map(_number).notna()] if "memory_limit_mb" in cells else cells.iloc[:0]
    if capped.empty:
        return pd.DataFrame()
    rungs = sorted({int(_number(b)) for b, a in zip(capped.batch_size, capped.grad_accum)
                    if _number(b) is not None and _number(a) == 1})
    rows = []
    for (task, model, precision), g in capped.groupby(["task", "model", "precision_requested"], sort=False,
                                                      dropna=False):
        row = {"task": task, "model": model, "precision": precision,
               "cap MiB": "/".join(sorted({f"{_number(v):.0f}" for v in g.memory_limit_mb}))}
        for n in rungs:
            on = g[(g.batch_size.map(_number) == n) & (g.grad_accum.map(_number) == 1)]
            row[f"batch {n}"] = _outcome(on, rung=True) if len(on) else ""
        for procedure, finder in g[g.batch_size.map(str) == "auto"].groupby("procedure", sort=False):
            row[f"{procedure}: largest micro-batch"] = _outcome(finder, rung=False)
        rows.append(row)
    return pd.DataFrame(rows).fillna("")


def _outcome(rows: pd.DataFrame, rung: bool) -> str:
    """A rung: "fits (peak N MiB)", "out of memory", or the cell's status; a finder cell: "N (peak
    M MiB)"; several seeds: their outcomes joined with " / "."""
    said = []
    for r in rows.itertuples():
        if r.status == "finished":
            found = FIT_PEAK.search(str(r.batch_fit or ""))
            peak = float(found.group(3)) if found else r.peak_mem_mb
            where = "" if isinstance(peak, float) and math.isnan(peak) else f" (peak {peak:.0f} MiB)"
            said.append(f"fits{where}" if rung else (f"{found.group(1)}{where}" if found else "n/a"))
        elif r.status == "failed" and OUT_OF_MEMORY.search(str(r.reason or "")):
            said.append("out of memory")
        else:
            said.append(r.status)
    return " / ".join(dict.fromkeys(said))


def _number(value: object) -> float | None:
    """A plan's or param's number, None where it is unset, auto or not a number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
