"""A study's report (`python -m pipeline report --experiment NAME`, pipeline/commands/report.py).

Reads the runs back from MLflow (the study's parent run says which cells were planned and how
each ended; the child runs hold the metrics) and writes to reports/NAME/:
- report.md: the AMP table (FP32 vs AMP per task x model, with speed-up, memory reduction and
  metric retention ± the seed spread, speed and memory averaged in one sentence), the KD table
  (per procedure), each finding in words with its uncertainty (compare, verdicts), the seed
  statistics, the cells and their outcomes, the charts; each section only where the cells' tables
  (their plan's, study/matrix.py) call for it;
- amp_step.json: each FP32/AMP pair's training step timed side by side in this process (amp_step.py),
  the AMP speed-up a busy machine cannot make; `--no-timing` leaves it out;
- ceiling_table.csv: the memory ceiling (ceiling.py: per precision, each batch size's rung fits or
  runs out of memory under the cap, and the batch finder's largest micro-batch), where a study has one;
- amp_table.csv, kd_table.csv, payoff.csv (each student and the baseline against the teacher at
  inference: payoff.py), seed_stats.csv, cells.csv (one row per cell, raw metrics);
- side_by_side.json: where a study has a KD section, its models' best/ timed side by side in this
  process (side_by_side.py), which the payoff's speed-ups come from; `--no-timing` reuses the one
  beside the report if it measured the same runs;
- prediction_pairs.csv, agreement.json, reliability_*.png: what AMP and KD change in the test
  predictions, run by run against the seed noise (prediction_pairs.py, agreement.py), each compared
  run's agreement also logged on it as `agreement/vs_*` metrics;
- speedup.png, memory_reduction.png, retention.png, kd.png, payoff.png (matplotlib, Agg).
It also logs them as artifacts (report/) of the study's parent run.

A failed or missing run shows as "failed" or "missing" in every table, never as a number;
a metric a run could not measure (energy on a CPU) shows as "n/a".

May import: everything below the report layer except the job (it reads what jobs left: MLflow, the
search's Optuna storage, finished stages' best models, never a running job).

Inside, lowest first: columns compare confound search | amp_step ceiling cells charts reliability side_by_side tables
training_speed verdicts | agreement payoff | prediction_pairs | markdown
"""
from __future__ import annotations

import logging
from pathlib import Path

from pipeline.errors import UserError
from pipeline.report import amp_step, prediction_pairs, side_by_side
from pipeline.report.ceiling import ceiling_table
from pipeline.report.cells import read_cells
from pipeline.report.charts import plot_amp, plot_kd
from pipeline.report.compare import comparisons
from pipeline.report.markdown import render
from pipeline.report.payoff import payoff_table, plot_payoff
from pipeline.report.tables import amp_display, amp_table, kd_display, kd_table, seed_stats

__all__ = ["write_report"]


def write_report(uri: str, experiment: str, out: str | Path | None = None, timing: bool = True,
                 device: str | None = None) -> Path:
    """Build every table and chart of `experiment`; returns the output directory. With `timing`,
    a KD section's models are first timed side by side on `device` (side_by_side.py)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    from pipeline.config.secrets import redact

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise UserError(f"report: --experiment {experiment}: no such experiment in {redact(uri)}")
    parent, cells = read_cells(client, exp.experiment_id)
    out = Path(out or f"reports/{experiment}")
    out.mkdir(parents=True, exist_ok=True)
    side = _side_by_side(cells, out, timing, device)
    step = _amp_step(cells, out, timing, device)
    amp, kd, stats, payoff = amp_table(cells), kd_table(cells), seed_stats(cells), payoff_table(cells, side)
    ceiling = ceiling_table(cells)
    cells.to_csv(out / "cells.csv", index=False)
    if not ceiling.empty:
        ceiling.to_csv(out / "ceiling_table.csv", index=False)
    amp_display(amp).to_csv(out / "amp_table.csv", index=False)
    kd_display(kd).to_csv(out / "kd_table.csv", index=False)
    stats.to_csv(out / "seed_stats.csv", index=False)
    payoff.to_csv(out / "payoff.csv", index=False)
    paired = prediction_pairs.prediction_pairs(client, cells)
    charts = (plot_amp(amp, out) + plot_kd(kd, out, comparisons(cells) if not cells.empty else [])
              + plot_payoff(payoff, out) + prediction_pairs.write(paired, out))
    prediction_pairs.log_metrics(client, cells, paired)
    text = render(experiment, redact(uri), parent.info.run_id if parent else None, cells, amp, kd, stats, charts,
                  payoff, side, ceiling, step, paired)
    (out / "report.md").write_text(text, encoding="utf-8")
    if parent is not None:
        client.log_artifacts(parent.info.run_id, str(out), "report")
    return out


def _amp_step(cells, out: Path, timing: bool, device: str | None) -> dict | None:
    """The AMP pairs' training step timed side by side (amp_step.py) and written beside the report;
    None without timing (an older record is removed: it would read as this report's)."""
    (out / amp_step.FILE).unlink(missing_ok=True)
    if not timing:
        return None
    record = amp_step.measure(cells, device)
    if record.get("pairs"):
        amp_step.write(record, out)
    return record


def _side_by_side(cells, out: Path, timing: bool, device: str | None) -> dict | None:
    """The KD section's side-by-side record: measured now (and written beside the report), or the
    one an earlier report left for the same runs; None where there is no KD section."""
    if side_by_side.candidates(cells).empty:
        return None
    if not timing:
        return side_by_side.stored(out, cells) or {"reason": "not timed (--no-timing) and no record of these runs "
                                                             f"beside the report ({side_by_side.FILE})"}
    log = logging.getLogger("pipeline")
    log.info("report: timing the KD section's models side by side")
    record = side_by_side.measure(cells, device)
    if record.get("tasks"):
        side_by_side.write(record, out)
    else:  # an older record beside the report would read as this report's
        (out / side_by_side.FILE).unlink(missing_ok=True)
        log.warning("report: models not timed side by side: %s", record["reason"])
    return record
