"""report.md: the headline sentence, the AMP, KD and seed tables, the cells and the charts, as Markdown."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import pandas as pd

from pipeline.config.precision_modes import sixteen_bit
from pipeline.names import (
    AVG_POWER,
    BEST_EPOCH,
    ENERGY_JOULES,
    EVAL_MAIN,
    GPU_UTIL,
    LOAD_OTHERS_CPU,
    LOAD_OTHERS_GPU_UTIL,
    PEAK_MEM_ALLOCATED,
    PEAK_RSS,
    TAG_BEST_REASON,
    TAG_STALL_REASON,
    TAG_STALLED,
    TEST_MAIN,
    TIE_BREAK,
    TRAIN_TIME,
    load_metric,
    test_metric,
)
from pipeline.report import amp_step
from pipeline.report.agreement import RARE_BELOW
from pipeline.report.columns import TEST_COLUMNS
from pipeline.report.compare import SPREAD_FACTOR, comparisons, identical_counts
from pipeline.report.confound import BUSY_CPU, BUSY_GPU_PCT
from pipeline.report.payoff import NOTE, PAYOFF_CHART, payoff_display, sentences
from pipeline.report.prediction_pairs import Paired, agreement_by_table_row, calibration, pair_name
from pipeline.report.side_by_side import where_and_when
from pipeline.report.tables import amp_display, kd_display
from pipeline.report.training_speed import speed_sentences
from pipeline.report.verdicts import amp_sentence, kd_sentences

STALLED_NOTE = (f"- stalled runs: runs tagged `{TAG_STALLED}=true`, whose best model's test predictions collapsed "
                "(one class for every row, a common class never predicted, no entity, no candidate called correct, "
                "no question answered; "
                f"`{TAG_STALL_REASON}` says which): a mean with one in it is no comparison of recipes.")
CONFOUND_NOTE = (f"- confounded: a speed comparison whose side ran while other processes kept more than "
                 f"{100 * BUSY_CPU:.0f}% of the machine's cores (`{load_metric(LOAD_OTHERS_CPU)}`) or "
                 f"{BUSY_GPU_PCT:.0f}% of its GPU (`{load_metric(LOAD_OTHERS_GPU_UTIL)}`) busy, whose sides differ "
                 "in that load by more, or that ran beside other cells on one device (`--jobs`): its difference "
                 "is partly the machine's.")
PAPER_METRICS = {"main": "F1", "test_accuracy": "accuracy", "test_exact": "EM"}
"""The AMP paper's metrics, each task's main metric being its F1: AMP table column -> header."""
TEST_LABELS = ("P", "R", "F1", "MAP", "MRR")
"""The KD table's column headers of TEST_COLUMNS, in their order."""


PAPER = {"source": "the paper (arXiv 2512.00829): RTX 4070, fp16 AMP with dynamic loss scaling, 4 tasks x 4 models",
         "cells": 16, "speedup_pct": 44.5, "mem_reduction_pct": 17.6, "retention_pct": 99.7, "where": "RTX 4070 12 GB"}
"""The Bangla AMP paper's headline, averaged over its task x model cells as the headline here is;
shown beside this study's averages, labelled as the paper's (GPU figures: a CPU study is no reproduction)."""
CPU_BF16_WORDS = {"AMX": "a CPU with AMX (bf16 matrix tiles) and AVX512-BF16",
                  "AVX512-BF16": "a CPU with AVX512-BF16 (bf16 dot products; no AMX)",
                  "none": "a CPU without bf16 hardware (bf16 emulated: slower than fp32 by construction)"}
"""A CPU run's cpu_bf16 tag in words: what the AMP speed-up on that machine can be."""
CPU_MEMORY_NOTE = ("CPU peak RSS is the whole process's and counts the bf16 copies of the weights that autocast keeps "
                   "beside the fp32 ones; the activation memory AMP saves shows on a GPU, where the paper measured")


def _where(rows: pd.DataFrame) -> str:
    """" on a CPU with ..." from the rows' cpu_bf16 tags, "" on a GPU or where no run says."""
    tags = sorted({t for v in rows.get("cpu_bf16", pd.Series(dtype=object)).dropna() for t in str(v).split("/") if t})
    return "".join(f" on {CPU_BF16_WORDS.get(t, t)}" for t in tags[:1]) + (
        f" (and {', '.join(tags[1:])})" if len(tags) > 1 else "")


def averages(amp: pd.DataFrame) -> pd.DataFrame:
    """Speed-up, memory reduction and retention averaged over the task x model cells per AMP
    precision requested (pairs whose sides resolved to one precision left out of speed and memory),
    and the paper's row beside them."""
    rows = []
    for requested, g in _per_precision(amp):
        _, compared = _same_and_compared(g)
        rows.append({"": f"this study: {requested} vs fp32", "cells": len(g),
                     "speed-up": _pct(compared.speedup_pct.mean()) if len(compared) else SAME,
                     "memory reduction": _pct(compared.mem_reduction_pct.mean()) if len(compared) else SAME,
                     "F1 retention": f"{g.retention_pct.mean():.1f}%",
                     "memory": "/".join(sorted(set(g.memory) - {""})) or "peak memory",
                     "where": _where(g).removeprefix(" on ") or "GPU"})
    rows.append({"": PAPER["source"], "cells": PAPER["cells"], "speed-up": f"{PAPER['speedup_pct']:+.1f}%",
                 "memory reduction": f"{PAPER['mem_reduction_pct']:+.1f}%",
                 "F1 retention": f"{PAPER['retention_pct']:.1f}%", "memory": "GPU memory", "where": PAPER["where"]})
    return pd.DataFrame(rows)


def _per_precision(amp: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The pairs whose both sides finished (they have a retention), per AMP precision requested."""
    ok = amp.dropna(subset=["retention_pct"]) if not amp.empty else amp
    if ok.empty:
        return []
    return list(ok.groupby("amp_requested", sort=False)) if "amp_requested" in ok else [("amp", ok)]


def _same_and_compared(pairs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs whose sides resolved to one precision: no speed or memory to compare, the others)."""
    same = pairs[pairs.same_precision.astype(bool)] if "same_precision" in pairs else pairs.iloc[:0]
    return same, pairs.drop(same.index)


SAME = "same precision: nothing to compare"


def headline(amp: pd.DataFrame) -> str:
    """Speed, memory and retention averaged over the matrix, one sentence per precision compared
    with FP32 (the scores are compared pair by pair, against the seed spread: amp_sentence). Pairs
    whose sides resolved to one precision have nothing to compare and are left out of the speed and
    memory averages; a pair with a side that did not finish is named with that side's precision; a
    speed-up measured on a machine busy with other work (confound.py) is called confounded in the
    sentence itself; a CPU run names its bf16 hardware and what its memory measures."""
    if amp.empty:
        return "No FP32/AMP pairs in this study."
    done = dict(_per_precision(amp))
    sentences = []
    for requested, pairs in _by_requested(amp):
        unfinished = pairs.drop(done[requested].index) if requested in done else pairs
        left_out = "" if unfinished.empty else (
            f" ({len(unfinished)} more failed or are missing: " + "; ".join(_unfinished(r) for r in
                                                                            unfinished.itertuples()) + ")")
        if requested in done:
            sentences.append(_headline(done[requested], left_out, requested))
        else:
            sentences.append(f"No task x model cell has both an FP32 and a {requested} run that finished"
                             f"{left_out.replace(' more', '', 1)}.")
    return " ".join(sentences)


def _by_requested(amp: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Every pair, finished or not, per precision requested on the compared side."""
    return list(amp.groupby("amp_requested", sort=False)) if "amp_requested" in amp else [("amp", amp)]


def _unfinished(r) -> str:
    """"ner / m1: bf16 failed": a pair's sides that did not finish, each by its precision."""
    sides = [f"{precision} {status}" for precision, status in (("fp32", r.fp32_status), (r.amp_requested, r.amp_status))
             if status != "ok"]
    return f"{r.task} / {r.model}: {', '.join(sides)}"


def _headline(ok: pd.DataFrame, left_out: str, requested: str = "amp") -> str:
    """One precision's sentence; its compared side is "AMP (bf16)" for a 16-bit mode, "tf32" for tf32."""
    same, compared = _same_and_compared(ok)
    where = _where(ok)
    if compared.empty:  # precision=auto on a device with neither bf16 nor fp16: no AMP ran
        ran = "/".join(sorted(set(same.amp_precision)))
        return (f"AMP resolved to {ran} in every cell{left_out}{where} (precision=auto on a device without bf16 or "
                f"fp16): both sides ran {ran}, so there is nothing to compare: no AMP speed-up, no memory saving.")
    s, m, kept = compared.speedup_pct.mean(), compared.mem_reduction_pct.mean(), ok.retention_pct.mean()
    precisions = "/".join(sorted(set("/".join(compared.amp_precision).split("/"))))
    amp16 = requested == "amp" or sixteen_bit(requested)
    side = f"AMP ({precisions})" if amp16 else precisions
    memories = sorted(set(compared.memory) - {""})
    memory = "/".join(memories) or "peak memory"
    n = len(compared)
    busy = compared[compared.speed_confounded.fillna("") != ""] if "speed_confounded" in compared else compared.iloc[:0]
    confound = "" if busy.empty else (
        f" (confounded in {len(busy)} of the {n} cell{'s' if n != 1 else ''}: "
        + "; ".join(f"{r.task} / {r.model}: {r.speed_confounded.removeprefix('confounded: ')}"
                   for r in busy.itertuples()) + ")")
    same_note = "" if same.empty else (
        f"; {len(same)} more ran one precision on both sides ("
        + ", ".join(f"{r.task} / {r.model}: {r.amp_precision}" for r in same.itertuples())
        + "): nothing to compare there")
    cpu_memory = f" ({CPU_MEMORY_NOTE})" if "CPU peak RSS" in memories and amp16 else ""
    return (f"Averaged over {n} task x model cell{'s' if n != 1 else ''}{left_out}{where}, {side} "
            f"trained {abs(s):.1f}% {'faster' if s >= 0 else 'slower'} than FP32 (samples/s){confound}, used "
            f"{abs(m):.1f}% {'less' if m >= 0 else 'more'} peak memory ({memory}){cpu_memory} and kept {kept:.1f}% of "
            f"FP32's F1{same_note}; the scores, pair by pair, are below the table.")


def _fmt(value: float | str, std: float | None = math.nan, digits: int = 2) -> str:
    if isinstance(value, str):
        return value
    text = f"{value:.{digits}f}"
    return text if std is None or math.isnan(std) else f"{text} ± {std:.{digits}f}"


def _retention(value: float | str, spread: float | None, identical: str) -> str:
    """AMP main / FP32 main ± the seed spread; "identical scores" where every seed run in both gave
    the same test scores (a ratio of 100% would read as a finding)."""
    if _identical(identical) == "all":
        return "identical scores"
    if isinstance(value, str):
        return value
    return f"{value:.1f}%" if spread is None or math.isnan(spread) else f"{value:.1f}% ± {spread:.1f}%"


def _identical(seeds: str) -> str:
    """"k/n" (seeds with equal test scores / seeds run in both) as words."""
    same, pairs = identical_counts(seeds)
    return "" if not pairs else "all" if same == pairs else "none" if not same else f"{same} of {pairs}"


def _pct(value: float | str, spread: float = math.nan, beyond: str = "") -> str:
    """A delta in %, ± its seed spread, and "within the spread" where the verdict says so."""
    if isinstance(value, str):
        return value
    text = f"{value:+.1f}%" if math.isnan(spread) else f"{value:+.1f}% ± {spread:.1f}%"
    return text + (" (within the spread)" if beyond == "no" else "")


def _stalled_runs(fp32: int, amp: int) -> str:
    """"FP32 1, AMP 0": stalled runs per side, or "" where none stalled."""
    return f"FP32 {fp32}, AMP {amp}" if fp32 or amp else ""


def _measured(shown: pd.DataFrame, column: str) -> bool:
    """Some row of either side has a number in the column (a study without QA shows no EM)."""
    return any(not isinstance(v, str) for side in ("fp32", "amp") for v in shown[f"{side}_{column}"])


def md_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table (pandas' to_markdown needs tabulate, which is not a dependency)."""
    def blank(v: object) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    cells = [[str(c).replace("|", "\\|") for c in df.columns]] + [
        ["" if blank(v) else str(v).replace("|", "\\|").replace("\n", " ") for v in row] for row in df.values]
    lines = ["| " + " | ".join(r) + " |" for r in cells]
    lines.insert(1, "|" + "---|" * len(df.columns))
    return "\n".join(lines)


def render(experiment: str, uri: str, parent_id: str | None, cells: pd.DataFrame, amp: pd.DataFrame,
           kd: pd.DataFrame, stats: pd.DataFrame, charts: list[str], payoff: pd.DataFrame | None = None,
           side: dict | None = None, ceiling: pd.DataFrame | None = None, step: dict | None = None,
           paired: list[Paired] | None = None) -> str:
    """report.md: the header, the AMP and KD sections (where the study has them; KD opens with what
    the student buys at inference), what they change in the predictions, seeds, cells."""
    found = comparisons(cells) if not cells.empty else []
    counts = cells.status.value_counts().to_dict() if not cells.empty else {}
    lines = [f"# Study report: {experiment}", "",
             f"Experiment `{experiment}` in `{uri}`" + (f", parent run `{parent_id}`" if parent_id else "")
             + f"; generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
             f"Cells: {len(cells)} ({', '.join(f'{v} {k}' for k, v in counts.items()) or 'none'}).", ""]
    paired = paired or []
    if not amp.empty:
        lines += _amp_section(amp, charts, [amp_sentence(c) for c in found if c.kind == "amp"], step,
                              agreement_by_table_row(paired))
    if not kd.empty:
        lines += _kd_section(kd, charts, [amp_sentence(c) for c in found if c.kind == "kd_amp"] + kd_sentences(found)
                             + speed_sentences(found),
                             payoff if payoff is not None else pd.DataFrame(), side)
    if paired:
        lines += _predictions_section(paired, charts)
    if ceiling is not None and not ceiling.empty:
        lines += _ceiling_section(ceiling)
    if found:  # a study of no comparison (a memory ceiling, a search's re-runs alone) has no seed statistics
        lines += _seed_section(stats)
    lines += _cells_section(cells)
    return "\n".join(lines)


def _amp_section(amp: pd.DataFrame, charts: list[str], findings: list[str], step: dict | None = None,
                 agreement: dict[tuple, float] | None = None) -> list[str]:
    shown = amp_display(amp)
    agreed = [(agreement or {}).get(key, math.nan) for key in zip(shown.task, shown.model, shown.procedure,
                                                                   shown.amp_requested)]
    table = pd.DataFrame({
        "task": shown.task, "model": shown.model,
        "AMP precision": shown.amp_precision,
        **{f"{side} {label}": [_fmt(v, s, 4) for v, s in zip(shown[f"{p}_{col}"], shown[f"{p}_{col}_std"])]
           for col, label in PAPER_METRICS.items() if col == "main" or _measured(shown, col)
           for side, p in (("FP32", "fp32"), ("AMP", "amp"))},
        "FP32 peak MB": [_fmt(v, s, 1) for v, s in zip(shown.fp32_peak_mem_mb, shown.fp32_peak_mem_mb_std)],
        "AMP peak MB": [_fmt(v, s, 1) for v, s in zip(shown.amp_peak_mem_mb, shown.amp_peak_mem_mb_std)],
        "memory": shown.memory,
        "FP32 samples/s": [_fmt(v, s, 1) for v, s in zip(shown.fp32_samples_per_s, shown.fp32_samples_per_s_std)],
        "AMP samples/s": [_fmt(v, s, 1) for v, s in zip(shown.amp_samples_per_s, shown.amp_samples_per_s_std)],
        "FP32 epoch s": [_fmt(v, s, 2) for v, s in zip(shown.fp32_epoch_time_s, shown.fp32_epoch_time_s_std)],
        "AMP epoch s": [_fmt(v, s, 2) for v, s in zip(shown.amp_epoch_time_s, shown.amp_epoch_time_s_std)],
        "FP32 energy J": [_fmt(v, s, 1) for v, s in zip(shown.fp32_energy_j, shown.fp32_energy_j_std)],
        "AMP energy J": [_fmt(v, s, 1) for v, s in zip(shown.amp_energy_j, shown.amp_energy_j_std)],
        "speed-up": [_pct(v, s, b) + (f" ({c})" if c and not isinstance(v, str) else "")
                     for v, s, b, c in zip(shown.speedup_pct, amp.speedup_pct_spread, amp.speedup_pct_beyond,
                                           shown.speed_confounded)],
        "memory reduction": [_pct(v, s, b) for v, s, b in zip(shown.mem_reduction_pct, amp.mem_reduction_pct_spread,
                                                              amp.mem_reduction_pct_beyond)],
        "retention": [_retention(v, s, i) for v, s, i in zip(shown.retention_pct, shown.retention_spread_pct,
                                                            shown.identical_seeds)],
        "agreement": ["n/a" if math.isnan(v) else f"{v:.1f}%" for v in agreed],
        "identical test scores": [_identical(v) for v in shown.identical_seeds],
        "stalled runs": [_stalled_runs(f, a) for f, a in zip(amp.fp32_stalled, amp.amp_stalled)],
        "FP32 runs": shown.fp32_seeds, "AMP runs": shown.amp_seeds,
    })
    if (shown.procedure != "train").any():
        table.insert(2, "procedure", shown.procedure)
    side = amp_step.sentences(step)
    lines = ["## AMP vs FP32", "", f"**{headline(amp)}**", "", *[f"- {line}" for line in side],
             *([""] if side else []), md_table(averages(amp)), "",
             "Averages over the task x model cells (a cell: one task and model, its seeds' means), as the paper "
             "averages; the last row is the paper's own figures, not measured here.", "", md_table(table), "",
             *[f"- {line}" for line in findings], "",
             f"- F1: the task's main metric on the test split with the best dev checkpoint (`{TEST_MAIN}`: macro-F1 "
             f"for sentiment and error classification, entity F1 for NER, token F1 for QA; `{EVAL_MAIN}`, the best dev "
             f"epoch, where a run has no test metrics); accuracy: `{test_metric('accuracy')}`; EM: exact match, "
             f"`{test_metric('exact')}` (QA); a column shows where some task has the metric, n/a where a task has not.",
             f"- peak memory: `{PEAK_MEM_ALLOCATED}` on CUDA, `{PEAK_RSS}` (process peak RSS) on CPU; "
             "the memory column says which.",
             "- speed-up = AMP samples/s / FP32 samples/s - 1; memory reduction = 1 - AMP peak / FP32 peak "
             "(\"same precision: nothing to compare\" where both sides resolved to one precision); "
             "retention = AMP main / FP32 main; each ± the pooled std of the two sides in % of the FP32 mean, "
             f"\"within the spread\" where the difference is at most {SPREAD_FACTOR:g} x that std. With "
             "several seeds: means, ± the sample std; runs: finished / planned; identical test scores: seeds "
             "whose FP32 and AMP runs have equal test scores in every metric, of those run in both; agreement: "
             "the share of test predictions FP32 and AMP runs of one seed make alike, the mean over seeds (below: "
             "What the predictions say; n/a where the runs kept no predictions).",
             f"- energy: `{ENERGY_JOULES}` (NVML); n/a where the run is tagged energy_available=false.",
             CONFOUND_NOTE, STALLED_NOTE, ""]
    lines += [f"![{c}]({c})" for c in charts if c not in ("kd.png", PAYOFF_CHART)] + [""]
    return lines


def _payoff_lines(payoff: pd.DataFrame, charts: list[str], side: dict | None) -> list[str]:
    if payoff.empty:
        return []
    if side is not None and side.get("tasks"):
        where = where_and_when(side)
    else:
        why = (side or {}).get("reason") or "the report was written without timing (`--no-timing`) and found no record"
        where = (f"Inference not measured side by side: {why}. No speed-up is stated: dividing the runs' own "
                 "`infer/*` figures, each timed at its stage's end, would divide the machine's load as much as "
                 "the models' speed.")
    return ["### What the student buys: inference against the teacher", "", where, "",
            *[f"- **{line}**" for line in sentences(payoff)], "", md_table(payoff_display(payoff)), "", NOTE, "",
            *([f"![{PAYOFF_CHART}]({PAYOFF_CHART})", ""] if PAYOFF_CHART in charts else []),
            "### Training", ""]


def _kd_section(kd: pd.DataFrame, charts: list[str], findings: list[str], payoff: pd.DataFrame,
                side: dict | None = None) -> list[str]:
    shown = kd_display(kd)
    table = pd.DataFrame({
        "task": shown.task, "procedure": shown.procedure, "stage": shown.stage, "model": shown.model,
        "precision": shown.precision, "launcher": shown.launcher,
        **{label: [_fmt(v, s, digits) for v, s in zip(shown[col], shown[f"{col}_std"])]
           for col, label, digits in (("cell_wall_s", "total time s", 1), ("cell_export_s", "export s", 1),
                                      ("train_time_s", "training s", 2),
                                      ("samples_per_s", "samples/s", 1), ("peak_mem_mb", "peak MB", 1))},
        "memory": shown.memory,
        **{label: [_fmt(v, s, 1) for v, s in zip(shown[col], shown[f"{col}_std"])]
           for col, label in (("gpu_util_pct", "GPU util %"), ("avg_power_w", "avg power W"),
                              ("energy_j", "energy J"))},
        **{label: [_fmt(v, s, 4) for v, s in zip(shown[f"test_{k}"], shown[f"test_{k}_std"])]
           for label, k in zip(TEST_LABELS, TEST_COLUMNS)},
        "stalled runs": [str(n) if n else "" for n in kd.stalled],
        "runs": shown.seeds,
    })
    lines = ["## Knowledge distillation procedures", "", *_payoff_lines(payoff, charts, side), md_table(table), "",
             *[f"- {line}" for line in findings], "",
             "- total time: the cell from start to finish as the study runner timed it, its stage (set-up, "
             "training, evaluation, inference bench, saving) and its export where it has one: the thesis's total "
             f"time; export: the export alone (n/a where the cell has none); training: `{TRAIN_TIME}` "
             f"(training steps only); GPU util, avg power, energy: `{GPU_UTIL}`, `{AVG_POWER}`, `{ENERGY_JOULES}` "
             f"(NVML; n/a on a CPU or where NVML has no counter, never 0); P/R/F1: `{test_metric('precision')}`, "
             f"`{test_metric('recall')}`, `{test_metric('f1')}` (the positive class for WikiQA); MAP/MRR: "
             f"`{test_metric('map')}`, `{test_metric('mrr')}`; n/a where the task has no such metric.", CONFOUND_NOTE,
             STALLED_NOTE, ""]
    if "kd.png" in charts:
        lines += ["![kd.png](kd.png)", ""]
    return lines


def _predictions_section(found: list[Paired], charts: list[str]) -> list[str]:
    """What AMP and KD change in the test predictions: a headline per comparison, then its pairs
    (each seed, then the seed noise), the classes that moved most, NER's per-type F1, QA's flips."""
    lines = ["## What the predictions say", ""]
    lines += [f"- **{p.comparison.label}**: {p.headline()}" for p in found] + [""]
    rows = []
    for paired in found:
        for pair in paired.pairs:
            r = pair.result
            cal = calibration(r)
            rows.append({"comparison": paired.comparison.label, "pair": pair_name(paired, pair), "seed": pair.seed,
                         "compared": f"{r.units} {r.unit}", "agreement": _fmt(r.agreement, digits=2) + "%",
                         "only reference right": r.mcnemar.only_a, "only compared right": r.mcnemar.only_b,
                         "McNemar p": _fmt(r.mcnemar.p, digits=3),
                         "ECE": _change(cal["ece_reference"], cal["ece_compared"]),
                         "Brier": _change(cal["brier_reference"], cal["brier_compared"]),
                         "moved most": _moved(r)})
    lines += [md_table(pd.DataFrame(rows)), ""]
    for paired in found:
        first = paired.seeded[0].result
        if first.entity_f1:
            lines += [f"Entity F1 per type, {paired.comparison.label} ({paired.seeded[0].seed}; 95% bootstrap "
                      f"interval over sentences; rare: fewer than {RARE_BELOW} gold entities):", "",
                      md_table(pd.DataFrame([{
                          "type": t.type + (" (rare)" if t.rare else ""), "gold entities": t.gold,
                          paired.comparison.reference: _interval(t.a), paired.comparison.compared: _interval(t.b),
                          "difference": _interval(t.diff)} for t in first.entity_f1])), ""]
        if first.null_flips:
            lines += [f"- {paired.comparison.label}: answered by {paired.comparison.reference} and left unanswered "
                      f"by {paired.comparison.compared}: {first.null_flips['a_answered_b_null']} questions; the other "
                      f"way: {first.null_flips['a_null_b_answered']}.", ""]
    lines += ["- agreement: the share of test rows (NER: of predicted entities; QA: of questions) both runs "
              "predicted alike, on the rows both predicted; only reference / compared right: the units exactly one "
              "side got right, which McNemar's exact test weighs (p: the chance of a split at least as uneven if "
              "neither side were better); seed noise: one setup at two seeds, what a reseed alone changes. A change "
              "is beyond the seed noise when it changes more than the noise pair differs on and McNemar's p < 0.05. "
              "ECE: expected calibration error of the top class (10 equal-width bins); Brier: the mean squared "
              "error of the class probabilities; each reference -> compared. prediction_pairs.csv and "
              "agreement.json hold every figure; each compared run carries its own as `agreement/vs_*` metrics.",
              ""]
    lines += [f"![{c}]({c})" for c in charts if c.startswith("reliability_")] + [""]
    return lines


def _change(reference: float, compared: float) -> str:
    """A calibration figure on both sides, "n/a" where a side's rows carry no probabilities."""
    return "n/a" if math.isnan(reference) or math.isnan(compared) else f"{reference:.3f} -> {compared:.3f}"


def _moved(r) -> str:
    """The classes the compared side lost and gained most on (net units only it got right)."""
    parts = [f"{name} {r.flips[name].net:+d}" for name in [*r.losing, *r.gaining] if r.flips[name].net]
    return ", ".join(parts)


def _interval(e) -> str:
    return "n/a" if e.value is None or (isinstance(e.value, float) and math.isnan(e.value)) else (
        f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]")


def _ceiling_section(ceiling: pd.DataFrame) -> list[str]:
    return ["## Memory ceiling: which batch fits under the cap", "", md_table(ceiling), "",
            "- batch N: one cell at micro-batch N without accumulation under the cap (`train.memory_limit_mb`): "
            "\"fits\" with its peak, or \"out of memory\" (a GPU's allocator held to the cap; on a CPU the cap "
            "emulated: one step's tensors counted before the job starts). The paper raised its batch 16 -> 32 -> 64 "
            "-> 128 on a 12 GB RTX 4070: 128 fit with AMP and ran out of memory in FP32.",
            "- largest micro-batch: what `train.batch_size=auto` found under the same cap (the global batch kept "
            "with accumulation), with the peak its trial measured.", ""]


def _seed_section(stats: pd.DataFrame) -> list[str]:
    lines = ["## Seeds: is the difference larger than the spread?", "",
             f"Rule: a difference counts as real when |mean(compared) - mean(reference)| > {SPREAD_FACTOR:g} x "
             "pooled std, pooled std = sqrt((std_reference² + std_compared²) / 2), sample std over the seeds (2+ "
             "per side). Reference: FP32, the teacher or the baseline; compared: AMP or the distilled student. "
             "test_map: MAP, where the task has it.", ""]
    if stats.empty:
        lines += ["No comparison has two or more finished seeds on each side.", ""]
    else:
        shown = stats.copy()
        for c in ("reference_mean", "reference_std", "compared_mean", "compared_std", "diff", "pooled_std"):
            shown[c] = [f"{v:.4g}" for v in shown[c]]
        lines += [md_table(shown), ""]
    return lines


def _cells_section(cells: pd.DataFrame) -> list[str]:
    listing = cells[["cell", "procedure", "task", "model", "precision", "seed", "launcher", "status", "exit_code",
                     "reason", "stalled", "run_id"]].copy()
    listing["exit_code"] = ["" if pd.isna(v) else int(v) for v in listing.exit_code]
    listing.insert(listing.columns.get_loc("stalled"), "best epoch",
                   [best_epoch(e, r) for e, r in zip(cells.best_epoch, cells.best_reason)])
    return ["## Cells", "", md_table(listing), "", BEST_EPOCH_NOTE, ""]


BEST_EPOCH_NOTE = (f"- best epoch: the epoch whose model is the run's best/ and gave its test scores (`{BEST_EPOCH}`); "
                   "\"tie-break\" where its main metric tied with another epoch's and the task's next metric or the "
                   f"dev loss chose (`{TAG_BEST_REASON}` says which).")


def best_epoch(epoch: float, reason: object) -> str:
    """A cell's best epoch as the listing shows it: "2", "2 (tie-break: map 0.7840 > 0.7000)", or ""."""
    if pd.isna(epoch):
        return ""
    if isinstance(reason, str) and reason.startswith(TIE_BREAK):
        return f"{int(epoch)} (tie-break: {reason.split(': ', 1)[-1]})"
    return str(int(epoch))
