"""The KD section's training-speed comparisons in words: a procedure's AMP run against its FP32
one, and a distilled student against the baseline (the same architecture trained without a
teacher: what distillation costs per sample). Each says where there is nothing to compare (both
sides resolved to one precision) and, in the sentence, where the machine confounds it (confound.py).
"""
from __future__ import annotations

import math

from pipeline.report.compare import Comparison, stats
from pipeline.report.confound import confounded


def _rate(mean: float, std: float) -> str:
    return f"{mean:.1f}" if math.isnan(std) else f"{mean:.1f} ± {std:.1f}"


def _precisions(c: Comparison) -> tuple[str, str]:
    def ran(rows) -> str:
        return "/".join(sorted(set(rows[rows.status == "finished"].precision.dropna().map(str))))

    return ran(c.ref), ran(c.cmp)


def speed_sentences(found: list[Comparison]) -> list[str]:
    """One sentence per kd_amp and student-vs-baseline comparison with both sides' samples/s."""
    lines = []
    for c in found:
        if c.kind not in ("kd_amp", "baseline"):
            continue
        rn, rm, rs = stats(c.ref, "samples_per_s")
        cn, cm, cs = stats(c.cmp, "samples_per_s")
        if not rn or not cn:
            continue
        ref_precision, cmp_precision = _precisions(c)
        if c.kind == "kd_amp" and ref_precision == cmp_precision:
            lines.append(f"{c.task}: {c.compared} and {c.reference} both ran {cmp_precision}: no AMP training "
                         "speed-up to compare.")
            continue
        what = "AMP against FP32" if c.kind == "kd_amp" else "with its teacher's targets against the baseline"
        clause = confounded((c.reference, c.ref), (c.compared, c.cmp))
        lines.append(f"{c.task}: {c.compared} trained at {_rate(cm, cs)} samples/s against {_rate(rm, rs)} for "
                     f"{c.reference} ({what}: {100 * (cm / rm - 1):+.1f}%)"
                     + (f"; {clause}" if clause else "") + ".")
    return lines
