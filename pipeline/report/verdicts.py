"""The report's findings in words, with their uncertainty.

Per FP32/AMP pair: how much of the FP32 main metric AMP kept, ± the seed spread in % of the
FP32 mean, and whether the difference is larger than the spread; or that the two gave identical
test scores (then no percentage: 100% of a saturated score says nothing about AMP). Per distilled
student: its main metric against its teacher's and the baseline's, beyond the spread or within
it, and the share of the baseline-to-teacher gap that distillation recovered. A comparison with
a stalled run on either side (its predictions collapsed: pipeline/measure/collapse.py) says so: its
difference is the stall's, not the recipes'.
"""
from __future__ import annotations

import math

from pipeline.config.precision_modes import sixteen_bit
from pipeline.errors import UserError
from pipeline.report.compare import SPREAD_FACTOR, Comparison, difference, identical_scores, stalled

METRIC_NAMES = {"macro_f1": "macro-F1", "f1": "F1"}


def metric_name(task: str) -> str:
    """The task's main metric as a reader knows it ("macro-F1"), or "main metric"."""
    from pipeline.tasks import get_task

    try:
        main = get_task(task).main_metric
    except UserError:  # a task this version does not know
        return "main metric"
    return METRIC_NAMES.get(main, main)


def _where(c: Comparison) -> str:
    return c.label.rsplit(":", 1)[0]


def _mean(mean: float, std: float) -> str:
    return f"{mean:.4f}" if math.isnan(std) else f"{mean:.4f} ± {std:.4f}"


def _seeds(pairs: int) -> str:
    return "the one seed run in both" if pairs == 1 else f"each of the {pairs} seeds run in both"


def stall_note(c: Comparison) -> str:
    """" Not a real comparison: ..." when a finished run on either side stalled, else ""."""
    sides = [(side, _stalled(rows)) for side, rows in ((c.reference, c.ref), (c.compared, c.cmp))]
    counted = [f"{k} of {n} {side} run(s)" for side, (k, n) in sides if k]
    if not counted:
        return ""
    return (f" Not a real comparison: {' and '.join(counted)} stalled (predictions collapsed to fewer classes: "
            "the `stalled` tag), so the difference is the stall's, not the recipes'.")


def _stalled(rows) -> tuple[int, int]:
    """(stalled, finished) runs."""
    done = rows[rows.status == "finished"]
    return int(stalled(done).sum()), len(done)


def amp_sentence(c: Comparison) -> str:
    """One FP32/AMP pair in words, and whether a stalled run makes it no comparison."""
    return _amp_sentence(c) + stall_note(c)


def _amp_sentence(c: Comparison) -> str:
    d, name = difference(c, "main"), metric_name(c.task)
    # FP32 vs AMP of one model, or a KD procedure's AMP run vs its FP32 one
    # tf32 is compared with FP32 too, but is no AMP: named by itself
    amp, fp32 = ((f"AMP ({c.compared})" if sixteen_bit(c.compared.split(" ")[0]) else c.compared, "FP32")
                 if c.kind == "amp" else (f"{c.compared} (AMP)", c.reference))
    if not d["reference_n"] or not d["compared_n"]:
        return f"{_where(c)}: no finished {fp32 if not d['reference_n'] else amp} run: nothing to compare."
    pairs, same = identical_scores(c)
    if pairs and same == pairs:
        return (f"{_where(c)}: {amp} and {fp32} gave identical test scores in every metric ({name} "
                f"{d['reference_mean']:.4f}) for {_seeds(pairs)}: most likely the same predictions (the runs log "
                "scores, not predictions), so this pair measures no difference at all; it is no evidence that AMP "
                "keeps the score where the task is not saturated.")
    rm, cm = d["reference_mean"], d["compared_mean"]
    if pairs and identical_scores(c, main_only=True)[1] == pairs:
        return (f"{_where(c)}: {amp} matched {fp32}'s {name} exactly for {_seeds(pairs)} "
                f"({_mean(cm, d['compared_std'])}), while other test scores differ: the two differ below what "
                f"{name} resolves here.")
    kept = f"kept {100 * cm / rm:.1f}%" if rm else "scored"
    identical = f"; {same} of {pairs} seeds gave identical test scores" if same else ""
    if not d["exceeds_spread"]:
        return (f"{_where(c)}: {amp} {kept} of {fp32} {name} ({cm:.4f} vs {rm:.4f}; {d['compared_n']} and "
                f"{d['reference_n']} run(s)){identical}: with fewer than 2 seeds a side there is no spread "
                "to tell this difference from noise.")
    spread = f" ± {100 * d['pooled_std'] / rm:.1f}%" if rm else ""
    verdict = "beyond the seed spread: AMP changed the score" if d["exceeds_spread"] == "yes" else \
        "within the seed spread"
    return (f"{_where(c)}: {amp} {kept}{spread} of {fp32} {name} over {min(d['reference_n'], d['compared_n'])} seeds "
            f"({_mean(cm, d['compared_std'])} vs {_mean(rm, d['reference_std'])}){identical}: {verdict} "
            f"(|difference| {abs(cm - rm):.4f}, {SPREAD_FACTOR:g} x pooled std {SPREAD_FACTOR * d['pooled_std']:.4f}).")


def kd_sentences(found: list[Comparison]) -> list[str]:
    """Each distilled student against its teacher and the baseline, in words."""
    lines = []
    for c in found:
        if c.kind not in ("teacher", "baseline"):
            continue
        d, name = difference(c, "main"), metric_name(c.task)
        relation = "its teacher" if c.kind == "teacher" else "the baseline"
        if not d["reference_n"] or not d["compared_n"]:
            lines.append(f"{c.task}: {c.compared} vs {relation} {c.reference}: no finished run on one side.")
            continue
        diff = d["compared_mean"] - d["reference_mean"]
        verdict = {"yes": f"{'above' if diff > 0 else 'below'} {relation} beyond the seed spread",
                   "no": f"within the seed spread of {relation}",
                   "": "fewer than 2 seeds a side: no spread to tell this difference from noise"}[d["exceeds_spread"]]
        gap = _gap_recovered(c, found) if c.kind == "baseline" else ""
        lines.append(f"{c.task}: {c.compared} scored {name} {_mean(d['compared_mean'], d['compared_std'])} vs "
                     f"{_mean(d['reference_mean'], d['reference_std'])} for {relation} `{c.reference}` "
                     f"({diff:+.4f}): {verdict}{gap}.{stall_note(c)}")
    return lines


def _gap_recovered(c: Comparison, found: list[Comparison]) -> str:
    """"; distillation recovered N% of the baseline-teacher gap" where the teacher scored higher."""
    teacher = next((t for t in found if t.kind == "teacher" and t.task == c.task and t.compared == c.compared), None)
    if teacher is None:
        return ""
    top, base, student = (difference(teacher, "main")["reference_mean"], difference(c, "main")["reference_mean"],
                          difference(c, "main")["compared_mean"])
    if not top > base:
        return ""
    return f"; distillation recovered {100 * (student - base) / (top - base):.0f}% of the baseline-to-teacher gap"
