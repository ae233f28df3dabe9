"""What the report compares, and whether a difference is larger than the spread between seeds.

Comparisons: FP32 vs AMP per task x model (and per KD procedure), and in the KD table each
distilled student against its teacher (the procedure its cells need) and against the baseline
(a train procedure no student needs). A difference of means counts as real when it is larger
than SPREAD_FACTOR x the pooled std of the two sides (2+ finished seeds each). Paired FP32/AMP
runs of one seed whose test scores are all equal are reported as such: they most likely made
the same predictions, which says nothing about AMP beyond that one saturated case.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

SPREAD_FACTOR = 2.0
"""A mean difference counts as larger than the seed spread when |diff| > 2 x pooled std."""


@dataclass
class Comparison:
    task: str
    label: str
    """As the seed table names it, e.g. "sentiment / M: auto vs fp32", "wikiqa: kd_fp32 vs baseline"."""
    kind: str
    """amp (FP32 vs AMP), kd_amp (a KD procedure in FP32 vs AMP), teacher or baseline (a student vs it)."""
    reference: str
    """The reference side: fp32, or the teacher's or the baseline's procedure."""
    compared: str
    """The compared side: the AMP precision(s), or the student's procedure."""
    ref: pd.DataFrame
    cmp: pd.DataFrame
    model: str = ""


def amp_pairs(cells: pd.DataFrame):
    """((task, model, procedure), FP32 rows, AMP rows): one pair per AMP precision requested and
    the way it ran (fp16 and bf16 in one study, or autocast fp16 and DeepSpeed's pure fp16, are
    separate comparisons against the same FP32 runs)."""
    sub = cells[cells.tables.str.contains("amp") & (cells.role != "")]
    for key, g in sub.groupby(["task", "model", "procedure"], sort=False, dropna=False):
        amp = g[g.role == "amp"]
        variants = amp.precision_requested.map(str) + _pure16(amp)
        for variant in list(dict.fromkeys(variants)) or [None]:
            yield key, g[g.role == "fp32"], amp if variant is None else amp[variants == variant]


def _pure16(rows: pd.DataFrame) -> pd.Series:
    """' pure16' for the rows DeepSpeed ran in pure 16 bit, '' for autocast (rows without the column: '')."""
    mode = rows["precision_mode"] if "precision_mode" in rows else pd.Series("", index=rows.index)
    return mode.map(lambda m: " pure16" if m == "pure16" else "")  # NaN (no tag) is autocast


def comparisons(cells: pd.DataFrame) -> list[Comparison]:
    """Every comparison the study's cells allow, AMP pairs first, then per task the KD ones."""
    found = []
    for (task, model, procedure), fp32, amp in amp_pairs(cells):
        variant = "/".join(dict.fromkeys(amp.precision_requested.map(str) + _pure16(amp))) or "amp"
        label = f"{task} / {model}" + (f" / {procedure}" if procedure != "train" else "") + f": {variant} vs fp32"
        found.append(Comparison(task, label, "amp", "fp32", variant, fp32, amp, model=model))
    kd = cells[cells.tables.str.contains("kd")]
    for task, g in kd.groupby("task", sort=False, dropna=False):
        found += _kd_comparisons(task, g)
    return found


def _kd_comparisons(task: str, g: pd.DataFrame) -> list[Comparison]:
    found = []
    with_role = g[g.role != ""]
    for _stage, s in with_role.groupby("stage", sort=False, dropna=False):  # kd_fp32 vs kd_amp
        for fp in dict.fromkeys(s[s.role == "fp32"].procedure):
            for ap in dict.fromkeys(s[s.role == "amp"].procedure):
                found.append(Comparison(task, f"{task}: {ap} vs {fp}", "kd_amp", fp, ap, s[s.procedure == fp],
                                        s[s.procedure == ap]))
    procedure_of = dict(zip(g.cell, g.procedure))
    students = list(dict.fromkeys(g[g.stage == "distill"].procedure))
    trained = list(dict.fromkeys(g[g.stage == "train"].procedure))
    teachers = {p: [t for t in trained if t in _needed(g[g.procedure == p], procedure_of)] for p in students}
    baselines = [t for t in trained if not any(t in ts for ts in teachers.values())]
    for student in students:
        for kind, references in (("teacher", teachers[student]), ("baseline", baselines)):
            for ref in references:
                found.append(Comparison(task, f"{task}: {student} vs {ref}", kind, ref, student,
                                        g[g.procedure == ref], g[g.procedure == student]))
    return found


def _needed(rows: pd.DataFrame, procedure_of: dict) -> set[str]:
    """The procedures of the cells these rows need (a student's teacher)."""
    return {procedure_of.get(name) for needs in rows.needs.dropna() for name in str(needs).split(",") if name}


def stalled(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether its run was tagged stalled (the column holds the stall reason; blank, None
    or NaN for a run that learned or was never checked)."""
    if "stalled" not in rows:
        return pd.Series(False, index=rows.index)
    return rows["stalled"].map(lambda v: isinstance(v, str) and v != "").astype(bool)  # an empty map is object


def stats(rows: pd.DataFrame, column: str) -> tuple[int, float, float]:
    """(finished runs with a value in the column, mean, sample std; std NaN below 2 runs)."""
    values = rows[rows.status == "finished"][column].astype(float).dropna()
    return (len(values), values.mean() if len(values) else math.nan,
            values.std(ddof=1) if len(values) >= 2 else math.nan)


def difference(c: Comparison, column: str) -> dict:
    """Both sides' n, mean and std, compared - reference, the pooled std and the verdict
    (exceeds_spread: yes / no, or "" where a side has fewer than 2 seeds)."""
    rn, rm, rs = stats(c.ref, column)
    cn, cm, cs = stats(c.cmp, column)
    pooled = math.sqrt((rs ** 2 + cs ** 2) / 2) if rn >= 2 and cn >= 2 else math.nan
    verdict = "" if math.isnan(pooled) or math.isnan(cm - rm) else (
        "yes" if abs(cm - rm) > SPREAD_FACTOR * pooled else "no")
    return {"reference_n": rn, "reference_mean": rm, "reference_std": rs, "compared_n": cn, "compared_mean": cm,
            "compared_std": cs, "diff": cm - rm, "pooled_std": pooled, "exceeds_spread": verdict}


def identical_scores(c: Comparison, main_only: bool = False) -> tuple[int, int]:
    """(seeds run on both sides, seeds whose two runs have equal test scores in every metric, or
    with main_only in the main metric); only FP32/AMP comparisons pair runs (a student and its
    teacher are different models)."""
    if c.kind not in ("amp", "kd_amp"):
        return 0, 0
    pairs = same = 0
    others = _by_seed(c.cmp)
    for seed, (ref, ref_main) in _by_seed(c.ref).items():
        if seed in others:
            pairs += 1
            same += others[seed][1] == ref_main if main_only else others[seed][0] == ref
    return pairs, same


def _by_seed(rows: pd.DataFrame) -> dict:
    """seed -> (test scores, main metric) of the finished runs that logged test scores."""
    done = rows[(rows.status == "finished") & (rows.test_scores.fillna("") != "")]
    return {str(r.seed): (json.loads(r.test_scores), r.main) for r in done.itertuples()}


def ratio(a: float, b: float) -> float:
    """a / b, NaN (shown as n/a) where b is zero or either is unknown."""
    return float(a) / float(b) if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def identical_counts(seeds: object) -> tuple[int, int]:
    """A table's identical_seeds "k/n" read back: (seeds with equal test scores, seeds run on both
    sides); (0, 0) where nothing was compared."""
    same, _, pairs = str(seeds).partition("/")
    return (int(same), int(pairs)) if pairs not in ("", "0") else (0, 0)
