"""The report's findings in words (issue 16), on hand-built cell rows (no MLflow): retention with
its seed spread and verdict, identical test scores called so (never a bare 100.0%), a main
metric matched exactly while other scores differ, one seed saying there is no spread, and a
student against its teacher and the baseline."""
import json
import math

import pandas as pd

from pipeline.report.cells import ROW_COLUMNS
from pipeline.report.compare import comparisons, identical_scores
from pipeline.report.verdicts import amp_sentence, kd_sentences


def row(cell, task, precision, seed, main, scores=None, procedure="train", stage="train", tables="amp", needs=""):
    r = {c: math.nan for c in ROW_COLUMNS}
    r.update(cell=cell, task=task, model="m", procedure=procedure, stage=stage, seed=seed,
             precision_requested=precision, precision=precision, role="amp" if precision == "bf16" else "fp32",
             tables=tables, needs=needs, status="finished", main=main,
             test_scores=json.dumps(scores if scores is not None else {"test/macro_f1": main}))
    return r


def amp_cells(fp32, bf16):
    """Two seeds a side: fp32/bf16 = [(main, other test scores), per seed]."""
    rows = []
    for precision, runs in (("fp32", fp32), ("bf16", bf16)):
        for seed, (main, other) in enumerate(runs, 1):
            rows.append(row(f"{precision}-s{seed}", "sentiment", precision, seed, main,
                            {"test/macro_f1": main, "test/accuracy": other}))
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def only_amp(cells):
    (c,) = [c for c in comparisons(cells) if c.kind == "amp"]
    return c


def test_retention_comes_with_its_seed_spread_and_verdict():
    c = only_amp(amp_cells([(0.80, 0.81), (0.82, 0.83)], [(0.79, 0.80), (0.81, 0.82)]))
    assert amp_sentence(c) == (
        "sentiment / m: AMP (bf16) kept 98.8% ± 1.7% of FP32 macro-F1 over 2 seeds (0.8000 ± 0.0141 vs 0.8100 ± "
        "0.0141): within the seed spread (|difference| 0.0100, 2 x pooled std 0.0283).")
    c = only_amp(amp_cells([(0.80, 0.81), (0.81, 0.82)], [(0.70, 0.71), (0.71, 0.72)]))
    assert "beyond the seed spread: AMP changed the score" in amp_sentence(c)


def test_identical_test_scores_are_called_so_not_a_retention():
    """The saturated case of issue 16: every model misses the same flipped labels."""
    same = [(0.9099970036332531, 0.91), (0.9099970036332531, 0.91)]
    c = only_amp(amp_cells(same, same))
    assert identical_scores(c) == (2, 2)
    text = amp_sentence(c)
    assert text.startswith("sentiment / m: AMP (bf16) and FP32 gave identical test scores in every metric "
                           "(macro-F1 0.9100) for each of the 2 seeds run in both")
    assert "%" not in text and "kept" not in text


def test_an_exactly_matched_main_metric_with_other_scores_differing_is_said():
    c = only_amp(amp_cells([(0.85, 0.95), (0.86, 0.96)], [(0.85, 0.94), (0.86, 0.97)]))
    assert identical_scores(c) == (2, 0) and identical_scores(c, main_only=True) == (2, 2)
    assert amp_sentence(c).startswith("sentiment / m: AMP (bf16) matched FP32's macro-F1 exactly for each of the 2 "
                                      "seeds run in both (0.8550 ± 0.0071), while other test scores differ")


def test_one_seed_says_there_is_no_spread():
    cells = amp_cells([(0.80, 0.81)], [(0.79, 0.80)])
    assert amp_sentence(only_amp(cells)) == (
        "sentiment / m: AMP (bf16) kept 98.8% of FP32 macro-F1 (0.7900 vs 0.8000; 1 and 1 run(s)): with fewer than "
        "2 seeds a side there is no spread to tell this difference from noise.")


def test_a_student_against_its_teacher_and_the_baseline():
    rows = [row("teacher-s1", "wikiqa", "fp32", 1, 0.87, procedure="teacher", tables="kd"),
            row("teacher-s2", "wikiqa", "fp32", 2, 0.86, procedure="teacher", tables="kd"),
            row("baseline-s1", "wikiqa", "fp32", 1, 0.60, procedure="baseline", tables="kd"),
            row("baseline-s2", "wikiqa", "fp32", 2, 0.70, procedure="baseline", tables="kd"),
            row("kd-s1", "wikiqa", "fp32", 1, 0.84, procedure="kd", stage="distill", tables="kd", needs="teacher-s1"),
            row("kd-s2", "wikiqa", "fp32", 2, 0.85, procedure="kd", stage="distill", tables="kd", needs="teacher-s2")]
    cells = pd.DataFrame(rows, columns=ROW_COLUMNS)
    assert {(c.kind, c.reference, c.compared) for c in comparisons(cells)} == {("teacher", "teacher", "kd"),
                                                                              ("baseline", "baseline", "kd")}
    teacher, baseline = kd_sentences(comparisons(cells))
    assert teacher == ("wikiqa: kd scored F1 0.8450 ± 0.0071 vs 0.8650 ± 0.0071 for its teacher `teacher` (-0.0200): "
                       "below its teacher beyond the seed spread.")
    # (0.845 - 0.65) / (0.865 - 0.65) = 91%; the baseline's spread (0.0707) is wide
    assert baseline.startswith("wikiqa: kd scored F1 0.8450 ± 0.0071 vs 0.6500 ± 0.0707 for the baseline `baseline` "
                               "(+0.1950): above the baseline beyond the seed spread; distillation recovered 91%")


def test_deepspeed_pure16_is_compared_apart_from_autocast():
    """DeepSpeed's fp16 casts the whole model (precision_mode=pure16): its speed and memory are not
    autocast's, so it gets its own comparison, labelled, never a shared AMP column."""
    rows = [row("fp32", "sentiment", "fp32", 1, 0.80), row("ac", "sentiment", "fp16", 1, 0.79),
            row("ds", "sentiment", "fp16", 1, 0.78)]
    for r in rows[1:]:
        r["role"] = "amp"
    rows[1]["precision_mode"], rows[2]["precision_mode"] = "autocast", "pure16"
    amp = [c for c in comparisons(pd.DataFrame(rows, columns=ROW_COLUMNS)) if c.kind == "amp"]
    assert [(c.compared, list(c.cmp.cell), list(c.ref.cell)) for c in amp] == [
        ("fp16", ["ac"], ["fp32"]), ("fp16 pure16", ["ds"], ["fp32"])]


def test_a_fallback_run_says_so_in_its_row():
    """The tags a fallback run carries (fewer processes than planned) show in the cell's launcher."""
    from types import SimpleNamespace

    from pipeline.report.cells import _row

    tags = {"launcher": "torchrun", "world_size": "1", "fallback": "true", "requested_world_size": "8",
            "precision": "fp16", "precision_mode": "pure16"}
    run = SimpleNamespace(data=SimpleNamespace(tags=tags), info=SimpleNamespace(status="RUNNING", run_id="r"))
    r = _row(None, "cell", {}, run)
    assert r["launcher"] == "torchrun x1 (fallback: 1 of 8 processes)"
    assert r["precision"] == "fp16 (pure16)" and r["precision_mode"] == "pure16"


def test_headline_says_when_amp_fell_back_to_fp32():
    """precision=auto on a CPU without bf16 runs fp32: both sides ran one precision, so there is no
    speed-up or memory saving to state, and the headline prints no percentage (a +527% between two
    fp32 runs is the machine, not AMP)."""
    import pandas as pd

    from pipeline.report.markdown import headline

    amp = pd.DataFrame([{"speedup_pct": 527.2, "mem_reduction_pct": 1.5, "retention_pct": 100.0,
                         "fp32_precision": "fp32", "amp_precision": "fp32", "same_precision": True,
                         "speed_confounded": "", "memory": "CPU peak RSS", "task": "t", "model": "m"}])
    text = headline(amp)
    assert text.startswith("AMP resolved to fp32 in every cell") and "nothing to compare" in text
    assert "%" not in text and "faster" not in text
    bf16 = headline(amp.assign(amp_precision="bf16", same_precision=False, speedup_pct=13.1))
    assert bf16.startswith("Averaged over 1 task x model cell, AMP (bf16) trained 13.1% faster")
    both = headline(pd.concat([amp, amp.assign(amp_precision="bf16", same_precision=False, speedup_pct=13.1,
                                               model="m2")], ignore_index=True))
    assert "trained 13.1% faster" in both and "1 more ran one precision on both sides (t / m: fp32)" in both
    assert "527" not in both
