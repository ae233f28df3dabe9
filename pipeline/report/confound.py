"""Whether a speed comparison measured the recipes or the machine.

Two training runs compared on speed (AMP against FP32, a distilled student against the baseline)
ran at different times, perhaps beside other work. Each run logs how busy its machine was with
other processes while it trained (perf/others_cpu_frac, perf/others_gpu_util_pct:
pipeline/measure/load.py), and a study records which cells ran at the same time on one device
(--jobs). A comparison is confounded when a side ran on a machine busy with other work beyond
BUSY_CPU (or BUSY_GPU_PCT on its GPU), when its sides differ in that load by more than the same
threshold, or when a side shared its device with other cells; the sentence that states the
comparison says so itself.
"""
from __future__ import annotations

import pandas as pd

BUSY_CPU = 0.10
"""A tenth of the machine's cores busy with other processes (on 2 cores: a fifth of one core)."""
BUSY_GPU_PCT = 10.0
"""Other processes' SM utilization on the run's GPU, % of the GPU."""


def confounded(*sides: tuple[str, pd.DataFrame]) -> str:
    """"" where the comparison of the sides (name, rows) stands, else "confounded: ..." naming each
    side's load (the mean over its finished runs that logged it) and the threshold."""
    done = [(name, rows[rows.status == "finished"]) for name, rows in sides]
    reasons = []
    shared = [(name, sorted({n for v in _column(rows, "shared_with") for n in str(v).split(",") if n and v == v}))
              for name, rows in done]
    if any(cells for _, cells in shared):
        reasons.append("; ".join(f"the {name} run(s) ran beside other cells on one device (--jobs): "
                                 f"{', '.join(cells)}" for name, cells in shared if cells))
    for label, column, limit, unit in (("the machine's cores", "others_cpu", BUSY_CPU, "frac"),
                                       ("the GPU", "others_gpu", BUSY_GPU_PCT, "pct")):
        loads = [(name, _column(rows, column).astype(float).dropna()) for name, rows in done]
        values = [(name, float(load.mean())) for name, load in loads if len(load)]
        if not values:
            continue
        busy = max(v for _, v in values) > limit
        differ = len(values) == len(sides) and max(v for _, v in values) - min(v for _, v in values) > limit
        if busy or differ:
            each = ", ".join(f"{name} {_pct(v, unit)}" for name, v in values)
            reasons.append(f"other processes used {label} ({each}; threshold {_pct(limit, unit)}"
                           f"{', and the sides differ by more' if differ else ''})")
    return "confounded: " + "; ".join(reasons) if reasons else ""


def _column(rows: pd.DataFrame, column: str) -> pd.Series:
    return rows[column] if column in rows else pd.Series(dtype=object)


def _pct(value: float, unit: str) -> str:
    return f"{100 * value:.0f}%" if unit == "frac" else f"{value:.0f}%"

