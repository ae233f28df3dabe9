"""The report's charts carry the spread the tables carry, and stalled runs are marked,
on hand-built cell rows (no MLflow): the demo's AMP speed-up of +4.9% is within its seed spread
and says so; a comparison with a stalled run says it is none; a run's stalled tag reaches its row."""
import json
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from pipeline.report.cells import ROW_COLUMNS, _row
from pipeline.report.charts import bar_text, kd_marks, plot_amp
from pipeline.report.compare import comparisons
from pipeline.report.markdown import _cells_section, _pct
from pipeline.report.tables import amp_table, kd_table
from pipeline.report.verdicts import amp_sentence, kd_sentences


def row(cell, precision, seed, main, samples_per_s=100.0, stalled="", procedure="train", stage="train",
        tables="amp", task="sentiment", needs=""):
    r = {c: math.nan for c in ROW_COLUMNS}
    r.update(cell=cell, task=task, model="m", procedure=procedure, stage=stage, seed=seed,
             precision_requested=precision, precision=precision, role="amp" if precision == "bf16" else "fp32",
             tables=tables, needs=needs, status="finished", main=main, samples_per_s=samples_per_s,
             peak_mem_mb=1000.0 + seed, train_time_s=10.0 + seed, stalled=stalled,
             test_scores=json.dumps({"test/macro_f1": main, "test/accuracy": main + seed / 100}))
    return r


def demo_cells(stalled=""):
    """The demo's sentiment pair: FP32 1646 ± 35 samples/s, AMP 1727 ± 191 (2 seeds a side)."""
    return pd.DataFrame([row("fp32-s1", "fp32", 1, 0.90, 1646 - 35 / math.sqrt(2)),
                         row("fp32-s3", "fp32", 3, 0.89, 1646 + 35 / math.sqrt(2), stalled=stalled),
                         row("bf16-s1", "bf16", 1, 0.91, 1727 - 191 / math.sqrt(2)),
                         row("bf16-s3", "bf16", 3, 0.88, 1727 + 191 / math.sqrt(2))], columns=ROW_COLUMNS)


def test_the_demo_speedup_is_within_its_spread_in_the_table():
    (amp,) = amp_table(demo_cells()).to_dict("records")
    assert amp["speedup_pct"] == pytest.approx(1727 / 1646 * 100 - 100)  # +4.9%
    # pooled std sqrt((35² + 191²) / 2) = 137.3 samples/s = 8.34% of FP32's 1646
    assert amp["speedup_pct_spread"] == pytest.approx(math.sqrt((35 ** 2 + 191 ** 2) / 2) / 1646 * 100)
    assert amp["speedup_pct_beyond"] == "no"  # 81 samples/s < 2 x 137.3
    assert _pct(amp["speedup_pct"], amp["speedup_pct_spread"], amp["speedup_pct_beyond"]) == \
        "+4.9% ± 8.3% (within the spread)"
    assert amp["fp32_stalled"] == amp["amp_stalled"] == 0


def test_chart_text_says_within_the_spread_or_no_spread():
    assert bar_text(4.92, 8.34, "no") == "4.9 ± 8.3\nwithin\nthe spread"
    assert bar_text(70.4, 3.1, "yes") == "70.4 ± 3.1"
    assert bar_text(4.92, math.nan, "") == "4.9\n1 seed:\nno spread"
    assert bar_text(100.0, 0.0, "no", identical=True) == "identical\nscores"


def test_amp_charts_are_written_with_error_bars(tmp_path):
    assert plot_amp(amp_table(demo_cells()), tmp_path) == ["speedup.png", "memory_reduction.png", "retention.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in ("speedup.png", "memory_reduction.png",
                                                                 "retention.png"))


def test_a_stalled_run_is_counted_and_its_comparison_called_none():
    cells = demo_cells(stalled="predicts only Negative, Neutral, never Positive")
    (amp,) = amp_table(cells).to_dict("records")
    assert (amp["fp32_stalled"], amp["amp_stalled"]) == (1, 0)
    (c,) = [c for c in comparisons(cells) if c.kind == "amp"]
    assert amp_sentence(c).endswith(
        " Not a real comparison: 1 of 2 fp32 run(s) stalled (predictions collapsed to fewer classes: the `stalled` "
        "tag), so the difference is the stall's, not the recipes'.")
    assert "Not a real comparison" not in amp_sentence([c for c in comparisons(demo_cells()) if c.kind == "amp"][0])


def kd_cells():
    rows = [row("baseline-s1", "fp32", 1, 0.60, 50.0, procedure="baseline", tables="kd", task="wikiqa"),
            row("baseline-s2", "fp32", 2, 0.70, 52.0, procedure="baseline", tables="kd", task="wikiqa",
                stalled="no candidate predicted correct"),
            row("teacher-s1", "fp32", 1, 0.87, 20.0, procedure="teacher", tables="kd", task="wikiqa"),
            row("teacher-s2", "fp32", 2, 0.86, 21.0, procedure="teacher", tables="kd", task="wikiqa"),
            row("kd-s1", "fp32", 1, 0.84, 51.0, procedure="kd", stage="distill", tables="kd", task="wikiqa",
                needs="teacher-s1"),
            row("kd-s2", "fp32", 2, 0.85, 51.0, procedure="kd", stage="distill", tables="kd", task="wikiqa",
                needs="teacher-s2")]
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def test_kd_bars_say_how_they_compare_and_stalls_are_counted():
    cells = kd_cells()
    kd, found = kd_table(cells), comparisons(cells)
    assert dict(zip(kd.procedure, kd.stalled)) == {"baseline": 1, "teacher": 0, "kd": 0}
    # main: kd 0.845 ± 0.0071 vs teacher 0.865 ± 0.0071: 0.02 > 2 x 0.0071, below; vs baseline 0.65 ± 0.0707:
    # pooled std sqrt((0.0707² + 0.0071²) / 2) = 0.0502, 0.195 > 2 x 0.0502, above
    assert dict(zip(kd.procedure, kd_marks(kd, found, "main"))) == {"baseline": "", "teacher": "",
                                                                    "kd": "< teacher\n> baseline"}
    # samples/s: 51 ± 0 vs 51 ± 1.41 (baseline) is within; vs 20.5 ± 0.71 (teacher) beyond, above
    assert kd_marks(kd, found, "samples_per_s")[2] == "> teacher\n= baseline"
    (baseline_line,) = [line for line in kd_sentences(found) if "baseline `baseline`" in line]
    assert "Not a real comparison: 1 of 2 baseline run(s) stalled" in baseline_line


def run(tags, status="FINISHED"):
    return SimpleNamespace(info=SimpleNamespace(status=status, run_id="r1"),
                           data=SimpleNamespace(tags=tags, metrics={"test/main": 0.53}))


def test_the_stalled_tag_reaches_the_cell_row():
    stalled = _row(None, "c", {}, run({"stalled": "true", "stall_reason": "no entity predicted", "task": "ner"}))
    assert stalled["stalled"] == "no entity predicted"
    assert _row(None, "c", {}, run({"stalled": "false", "task": "ner"}))["stalled"] == ""
    assert _row(None, "c", {}, run({"task": "ner"}))["stalled"] == ""  # a run from before the check


def test_the_best_epoch_and_a_tie_break_reach_the_cell_row_and_the_listing():
    def finished(metrics, tags):
        return SimpleNamespace(info=SimpleNamespace(status="FINISHED", run_id="r1"),
                               data=SimpleNamespace(tags={"task": "wikiqa", **tags}, metrics=metrics))

    tied = _row(None, "tied", {}, finished({"test/main": 0.0, "best/epoch": 2.0},
                                           {"best/reason": "tie on f1 0.0000: map 0.7840 > 0.7000"}))
    plain = _row(None, "plain", {}, finished({"test/main": 0.6, "best/epoch": 1.0}, {"best/reason": "f1 0.6 > 0.5"}))
    older = _row(None, "older", {}, finished({"test/main": 0.6}, {}))  # a run from before best/epoch
    assert (tied["best_epoch"], plain["best_epoch"], older["best_reason"]) == (2, 1, "")
    assert math.isnan(older["best_epoch"])
    listing = "\n".join(_cells_section(pd.DataFrame([tied, plain, older], columns=ROW_COLUMNS)))
    assert "| 2 (tie-break: map 0.7840 > 0.7000) |" in listing and "| 1 |" in listing
    assert "`best/reason` says which" in listing
