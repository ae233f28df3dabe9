"""What AMP and distillation change in the predictions, read against the noise of a seed.

Each comparison the report makes (compare.comparisons: FP32 against an AMP precision per task x
model, a teacher against its student, a student against the baseline) is paired run by run on the
test split: its reference and compared runs of one seed, and the noise floor, the reference side
against itself at another seed (and the compared side against itself). agreement.compare does the
row-by-row statistics; here the runs are found, their prediction files read from their MLflow
artifacts (predictions/test.jsonl, job/records/stage_outputs.py), and the results written:
prediction_pairs.csv (a row per pair), agreement.json (each pair whole), a reliability diagram per
comparison, and on each compared run its agreement with its counterpart as metrics
(names.agreement_metric). Runs whose files are missing (a run of a version that kept none) are
named, never guessed at.
"""
from __future__ import annotations

import json
import logging
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from pipeline import predictions
from pipeline.names import agreement_metric
from pipeline.report.agreement import PairComparison, compare, headline
from pipeline.report.compare import Comparison, comparisons
from pipeline.report.reliability import plot_reliability

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("pipeline")

SPLIT = "test"
COUNTERPART = {"amp": "fp32", "kd_amp": "fp32", "teacher": "teacher", "baseline": "baseline"}
"""What a comparison's reference is to its compared run, as its metrics name it."""
CSV = "prediction_pairs.csv"
JSON = "agreement.json"


@dataclass
class Pair:
    """Two runs compared row by row: `a` the reference side's cell, `b` the compared one's."""

    a: str
    b: str
    seed: str
    """The seed both ran ("s42"), or both seeds of a noise pair ("s42 vs s43")."""
    result: PairComparison
    noise: str = ""
    """A noise pair's side, reference or compared: one setup at two seeds; "" for a pair of one seed."""


@dataclass
class Paired:
    """A comparison's pairs: one per seed both sides ran, then its noise pairs."""

    comparison: Comparison
    pairs: list[Pair] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Cells whose runs keep no prediction file on the split (or whose files do not line up), with why."""

    @property
    def seeded(self) -> list[Pair]:
        return [p for p in self.pairs if not p.noise]

    @property
    def noise(self) -> Pair | None:
        """The reference side against itself at another seed: what a reseed alone changes."""
        return next((p for p in self.pairs if p.noise == "reference"), None)

    def headline(self) -> str:
        """The first seed's pair in one sentence, against the reference side's seed noise; a student's
        sides named by their roles (its teacher, the baseline)."""
        c, first = self.comparison, self.seeded[0]
        roles = {"teacher": (f"its teacher `{c.reference}`", f"the student `{c.compared}`"),
                 "baseline": (f"the baseline `{c.reference}`", f"the student `{c.compared}`")}
        return headline(first.result, self.noise.result if self.noise else None, *roles.get(c.kind, (None, None)))

    def mean_agreement(self) -> float:
        values = [p.result.agreement for p in self.seeded if not math.isnan(p.result.agreement)]
        return sum(values) / len(values) if values else math.nan


def prediction_pairs(client: MlflowClient, cells: pd.DataFrame) -> list[Paired]:
    """Every comparison's pairs on the test split, where both runs kept their predictions."""
    if cells.empty:
        return []
    files = _Files(client)
    found = []
    for c in comparisons(cells):
        paired = Paired(c)
        ref, cmp = _finished(c.ref), _finished(c.cmp)
        for seed in [s for s in ref if s in cmp]:
            _add(paired, files, ref[seed], cmp[seed], _seed(seed))
        for side, rows in (("reference", ref), ("compared", cmp)):
            seeds = list(rows)
            if len(seeds) >= 2:
                _add(paired, files, rows[seeds[0]], rows[seeds[1]], f"{_seed(seeds[0])} vs {_seed(seeds[1])}",
                     noise=side)
        if paired.seeded:
            found.append(paired)
        elif paired.missing:
            log.info("report: %s: no pair of runs with predictions to compare (%s)", c.label, "; ".join(paired.missing))
    return found


def write(found: list[Paired], out: Path) -> list[str]:
    """prediction_pairs.csv and agreement.json beside the report; the reliability diagrams' file
    names (a comparison whose first pair has probabilities: one)."""
    rows, whole, charts = [], [], []
    for paired in found:
        for pair in paired.pairs:
            r = pair.result
            rows.append({"comparison": paired.comparison.label, "pair": pair_name(paired, pair), "seed": pair.seed,
                         "noise": bool(pair.noise), "unit": r.unit, "units": r.units, "agreement_pct": r.agreement,
                         "only_reference_right": r.mcnemar.only_a, "only_compared_right": r.mcnemar.only_b,
                         "mcnemar_p": r.mcnemar.p, **calibration(r)})
            whole.append({"comparison": paired.comparison.label, "pair": pair_name(paired, pair), "seed": pair.seed,
                          "noise": bool(pair.noise), **pair.result.to_dict()})
        first = paired.seeded[0].result
        sides = {f"{paired.comparison.reference}": (first.calibration or {}).get("a"),
                 f"{paired.comparison.compared}": (first.calibration or {}).get("b")}
        sides = {k: v for k, v in sides.items() if v is not None}
        if sides:
            charts += plot_reliability(sides, out, f"reliability_{_slug(paired.comparison.label)}.png")
    pd.DataFrame(rows).to_csv(out / CSV, index=False)
    (out / JSON).write_text(json.dumps(whole, indent=1, allow_nan=False), encoding="utf-8")
    return charts


def log_metrics(client: MlflowClient, cells: pd.DataFrame, found: list[Paired]) -> None:
    """Each compared run's agreement with its counterpart of the same seed (and the seed noise the
    comparison reads it against) as metrics on that run, logged once: a report written again logs
    only what changed."""
    from mlflow.entities import Metric

    run_of = dict(zip(cells.cell, cells.run_id))
    for paired in found:
        role = COUNTERPART[paired.comparison.kind]
        noise = paired.noise.result.agreement if paired.noise else math.nan
        for pair in paired.seeded:
            run_id, r = run_of.get(pair.b), pair.result
            if not isinstance(run_id, str):
                continue
            values = {agreement_metric(role): r.agreement, agreement_metric(role, "mcnemar_p"): r.mcnemar.p,
                      agreement_metric(role, "only_reference_right"): r.mcnemar.only_a,
                      agreement_metric(role, "only_this_right"): r.mcnemar.only_b,
                      agreement_metric(role, "seed_noise"): noise}
            have = client.get_run(run_id).data.metrics
            new = [Metric(k, float(v), 0, 0) for k, v in values.items()
                   if not math.isnan(float(v)) and have.get(k) != float(v)]
            if new:
                client.log_batch(run_id, metrics=new)


def agreement_by_table_row(found: list[Paired]) -> dict[tuple, float]:
    """The AMP table's rows (task, model, procedure, AMP precisions requested) -> the mean agreement
    of their FP32/AMP pairs over seeds, the paper table's column beside retention."""
    out = {}
    for paired in found:
        c = paired.comparison
        if c.kind != "amp":
            continue
        procedure = next(iter(dict.fromkeys(c.ref.procedure)), "train")
        requested = "/".join(dict.fromkeys(c.cmp.precision_requested.map(str)))
        out[(c.task, c.model, procedure, requested)] = paired.mean_agreement()
    return out


class _Files:
    """Each run's predictions on the split, read from its artifacts once (None: it keeps none)."""

    def __init__(self, client: MlflowClient):
        self.client, self.read = client, {}

    def __call__(self, run_id: str) -> predictions.Predictions | None:
        if run_id not in self.read:
            self.read[run_id] = self._download(run_id)
        return self.read[run_id]

    def _download(self, run_id: str) -> predictions.Predictions | None:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = self.client.download_artifacts(run_id, f"predictions/{SPLIT}.jsonl", tmp)
            except Exception:  # noqa: BLE001 - no such artifact: a run that kept no predictions
                return None
            return predictions.read(Path(path))


def _finished(rows: pd.DataFrame) -> dict:
    """Seed -> (cell, run id) of the side's finished runs, in seed order."""
    done = rows[(rows.status == "finished") & rows.run_id.map(lambda v: isinstance(v, str) and v != "")]
    return {seed: (cell, run_id) for seed, cell, run_id in
            sorted(zip(done.seed, done.cell, done.run_id), key=lambda t: str(t[0]))}


def _add(paired: Paired, files: _Files, a: tuple[str, str], b: tuple[str, str], seed: str, noise: str = "") -> None:
    """The pair of runs `a` and `b` ((cell, run id) each), compared; or why not, in `paired.missing`."""
    pa, pb = files(a[1]), files(b[1])
    lacking = [cell for (cell, _), p in ((a, pa), (b, pb)) if p is None]
    if lacking:
        paired.missing += [f"{cell}: no predictions/{SPLIT}.jsonl among its run's artifacts" for cell in lacking]
        return
    try:
        result = compare((pa.header, pa.rows), (pb.header, pb.rows))
    except ValueError as e:  # runs on other data: nothing to line up
        paired.missing.append(str(e))
        return
    paired.pairs.append(Pair(a[0], b[0], seed, result, noise))


def pair_name(paired: Paired, pair: Pair) -> str:
    c = paired.comparison
    if not pair.noise:
        return f"{c.reference} vs {c.compared}"
    side = c.reference if pair.noise == "reference" else c.compared
    return f"{side} vs {side} (seed noise)"


def calibration(r: PairComparison) -> dict:
    """Each side's ECE and Brier score, NaN where its rows carry no probabilities (NER, QA)."""
    a, b = (r.calibration or {}).get("a"), (r.calibration or {}).get("b")
    return {"ece_reference": a.ece if a else math.nan, "ece_compared": b.ece if b else math.nan,
            "brier_reference": a.brier if a else math.nan, "brier_compared": b.brier if b else math.nan}


def _seed(seed) -> str:
    text = str(seed)
    return text if text.startswith("s") else f"s{text}"


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower()

