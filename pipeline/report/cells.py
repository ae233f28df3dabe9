"""Reading a study back from MLflow: one row per cell, the parent run's plan joined with the child runs."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import TYPE_CHECKING

import pandas as pd

from pipeline.config.precision_modes import PURE16, report_side
from pipeline.names import (
    BEST_EPOCH,
    CELL_TAG_PREFIX,
    EVAL_MAIN,
    PARENT_TAG,
    TAG_BATCH_FIT,
    TAG_BEST_REASON,
    TAG_CELL,
    TAG_CPU_BF16,
    TAG_DEVICE_TYPE,
    TAG_ENERGY_AVAILABLE,
    TAG_FALLBACK,
    TAG_LAUNCHER,
    TAG_MODEL,
    TAG_PARENT_RUN,
    TAG_PRECISION,
    TAG_PRECISION_MODE,
    TAG_PRECISION_REQUESTED,
    TAG_PROCEDURE,
    TAG_REPORT_TABLES,
    TAG_REQUESTED_WORLD_SIZE,
    TAG_SEED,
    TAG_STAGE,
    TAG_STALL_REASON,
    TAG_STALLED,
    TAG_STUDY,
    TAG_TASK,
    TAG_TRIAL_FATE,
    TAG_TRIAL_REASON,
    TAG_WORLD_SIZE,
    TEST,
    TEST_MAIN,
)
from pipeline.report.columns import COLUMNS, ENERGY_FIGURES, MEMORY, METRICS

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

ROW_COLUMNS = ["cell", "task", "model", "procedure", "stage", "seed", "precision_requested", "precision",
               "precision_mode", "role", "tables", "needs", "launcher", "status", "exit_code", "reason", "run_id",
               "device_type", "cpu_bf16", "energy_available", "main_source", "memory", "test_scores", "stalled",
               "best_epoch", "best_reason", "output_dir", "shared_with", "batch_size", "grad_accum", "memory_limit_mb",
               "batch_fit", *COLUMNS]
"""The columns of a cell row (cells.csv); stalled: why the run's predictions collapsed (its
stall_reason tag), "" for a run that learned or was not checked; best_epoch, best_reason: the epoch
whose model is the run's best/ (its test scores are that model's) and why it was chosen (the
best/epoch metric and best/reason tag; job/parts/best_model.py); output_dir: the run's (its best/
is what the side-by-side measurement loads); shared_with: the cells that ran at the same time on
the same device (a study's --jobs), comma-separated; cpu_bf16: a CPU run's bf16 hardware (its tag);
batch_size, grad_accum, memory_limit_mb: as planned (the run's params for a run the study did not
plan); batch_fit: the split the batch finder chose and the peak it measured (its tag)."""


def read_cells(client: MlflowClient, experiment_id: str):
    """(parent run or None, one row per cell): the parent's plan joined with the child runs."""
    runs = _all_runs(client, experiment_id)
    parents = [r for r in runs if r.data.tags.get(PARENT_TAG) == "true"]
    parent = parents[0] if parents else None  # newest first
    plan = {}
    children = [r for r in runs if r.data.tags.get(PARENT_TAG) != "true"]
    if parent is not None:
        plan = {k[len(CELL_TAG_PREFIX):]: json.loads(v) for k, v in parent.data.tags.items()
                if k.startswith(CELL_TAG_PREFIX)}
        study = parent.data.tags.get(TAG_STUDY)
        children = [r for r in children if r.data.tags.get(TAG_PARENT_RUN) == parent.info.run_id
                    or (study and r.data.tags.get(TAG_STUDY) == study)]
    by_cell = defaultdict(list)
    for r in children:
        by_cell[r.data.tags.get(TAG_CELL) or r.info.run_name or r.info.run_id].append(r)
    names = list(plan) + [n for n in by_cell if n not in plan]
    rows = [_row(client, name, plan.get(name), _pick(by_cell.get(name, []))) for name in names]
    cells = pd.DataFrame(rows, columns=ROW_COLUMNS)
    cells["exit_code"] = cells.exit_code.astype("Int64")  # blank, not NaN, where there is none
    return parent, cells


def _all_runs(client: MlflowClient, experiment_id: str) -> list:
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


def _row(client: MlflowClient, name: str, plan: dict | None, run: Run | None) -> dict:
    plan = plan or {}
    tags = run.data.tags if run else {}
    status = _status(plan, run)
    trial_failed = tags.get(TAG_TRIAL_FATE) == "failed"  # a search trial whose job ended without a value
    if trial_failed:
        status = "failed"
    requested = str(plan.get("precision") or tags.get(TAG_PRECISION_REQUESTED) or tags.get(TAG_PRECISION) or "")
    procedure = plan.get("procedure") or tags.get(TAG_PROCEDURE) or tags.get(TAG_STAGE) or "train"
    tables = plan.get("tables")
    if tables is None:  # a run the study runner did not plan: its tag, else a guess from the procedure
        tag = tags.get(TAG_REPORT_TABLES)
        tables = [t for t in tag.split(",") if t in ("amp", "kd", "ceiling")] if tag else (
            ["amp"] + (["kd"] if procedure not in ("train", "") else []))
    capped = plan.get("memory_limit_mb", _param(run, "train.memory_limit_mb"))
    if capped not in (None, "") and tables:  # a memory ceiling's rung (ceiling.py), planned so or not
        tables = ["ceiling"]
    launcher = plan.get("launcher") or (f"{tags[TAG_LAUNCHER]} x{tags.get(TAG_WORLD_SIZE, '?')}" if TAG_LAUNCHER in tags
                                        else "")
    if tags.get(TAG_FALLBACK) == "true" and "fallback" not in launcher:  # torchrun's surplus ranks left
        launcher += f" (fallback: {tags.get(TAG_WORLD_SIZE)} of {tags.get(TAG_REQUESTED_WORLD_SIZE)} processes)"
    # DeepSpeed's fp16 casts the whole model (pure16): never in one column with autocast fp16
    mode = tags.get(TAG_PRECISION_MODE, "")
    ran = tags.get(TAG_PRECISION) or requested
    row = {
        "cell": name, "task": plan.get("task") or tags.get(TAG_TASK), "model": plan.get("model") or tags.get(TAG_MODEL),
        "procedure": procedure, "stage": plan.get("command") or tags.get(TAG_STAGE),
        "seed": plan.get("seed", tags.get(TAG_SEED)), "precision_requested": requested,
        "precision": f"{ran} ({PURE16})" if mode == PURE16 else ran, "precision_mode": mode,
        "role": report_side(requested),  # each AMP precision in its own pair (tf32 too, never fp32's side)
        "tables": ",".join(tables), "needs": ",".join(plan.get("needs") or []), "launcher": launcher,
        "status": status,
        "exit_code": plan.get("exit_code") if status == "failed" else (0 if status == "finished" else None),
        "reason": "" if status != "failed" else tags.get(TAG_TRIAL_REASON, "") if trial_failed
        else plan.get("reason", ""),
        "run_id": run.info.run_id if run else plan.get("run_id"),
        "device_type": tags.get(TAG_DEVICE_TYPE), "cpu_bf16": tags.get(TAG_CPU_BF16, ""),
        "energy_available": tags.get(TAG_ENERGY_AVAILABLE),
        "main_source": None, "memory": None, "test_scores": "",
        "stalled": (tags.get(TAG_STALL_REASON) or "stalled") if tags.get(TAG_STALLED) == "true" else "",
        "best_epoch": math.nan, "best_reason": tags.get(TAG_BEST_REASON, ""),
        "output_dir": _param(run, "output_dir") or plan.get("output_dir"),
        "shared_with": ",".join(plan.get("shared_device_with") or []),
        **{key: plan.get(key, _param(run, f"train.{key}")) for key in ("batch_size", "grad_accum", "memory_limit_mb")},
        "batch_fit": tags.get(TAG_BATCH_FIT, ""),
        **{f: math.nan for f in COLUMNS},
    }
    if status == "finished":  # metrics of failed runs are partial: never reported
        row.update(_metrics(client, run))
        # the runner's clock: absent for a run it did not start
        row["cell_wall_s"], row["cell_export_s"] = plan.get("wall_s", math.nan), plan.get("export_s", math.nan)
    return row


def _param(run: Run | None, key: str) -> str | None:
    """A run's param as logged, None where there is no run or no such param (or it was unset)."""
    value = getattr(run.data, "params", {}).get(key) if run else None
    return None if value in (None, "None", "") else value


def _status(plan: dict, run: Run | None) -> str:
    if run is not None and run.info.status == "FINISHED":
        return "finished"
    if plan.get("status") == "failed" or (run is not None and run.info.status in ("FAILED", "KILLED")):
        return "failed"
    if run is not None and run.info.status in ("RUNNING", "SCHEDULED"):
        return "running"
    return "missing"  # planned and never run, or finished elsewhere (outputs without a run here)


def _metrics(client: MlflowClient, run: Run) -> dict:
    m = run.data.metrics
    values = {k: m.get(metric, math.nan) for k, metric in METRICS.items()}
    if TEST_MAIN in m:
        values.update(main=m[TEST_MAIN], main_source=TEST_MAIN)
    elif EVAL_MAIN in m:  # the latest value is the last epoch's; the best epoch is what counts
        # the best model ranks the main metric first (tie-breaks only choose among equal ones): its max
        history = client.get_metric_history(run.info.run_id, EVAL_MAIN)
        values.update(main=max(h.value for h in history), main_source=EVAL_MAIN)
    if BEST_EPOCH in m:
        values["best_epoch"] = int(m[BEST_EPOCH])
    for metric, kind in MEMORY.items():
        if metric in m:
            values.update(peak_mem_mb=m[metric], memory=kind)
            break
    if run.data.tags.get(TAG_ENERGY_AVAILABLE) == "false":  # not measurable: n/a, never the 0 a counter read
        values.update({figure: math.nan for figure in ENERGY_FIGURES})
    # every test score but the loss, to tell two runs that predicted the same from two that differ
    scores = {k: v for k, v in sorted(m.items()) if k.startswith(TEST) and k not in (TEST_MAIN, f"{TEST}loss")}
    values["test_scores"] = json.dumps(scores) if scores else ""
    return values
