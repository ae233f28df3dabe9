"""Models compared on speed are timed side by side (measure/inference.bench_side_by_side): the tests
that train a model or start a process (the others are in tests/unit/test_side_by_side.py)."""

import pandas as pd
import pytest

from pipeline.report import side_by_side
from pipeline.report.markdown import render
from pipeline.report.payoff import payoff_table
from pipeline.report.tables import kd_table
from unit.test_side_by_side import cell_row, outputs, study_cells, tiny  # noqa: F401


@pytest.mark.slow
def test_the_payoff_headline_is_the_side_by_side_runs_not_the_stages(outputs, tmp_path):
    cells = study_cells(outputs)
    record = side_by_side.measure(cells, "cpu", reps=3, budget_s=0.05)
    assert record["reason"] == "" and set(record["tasks"]["wikiqa"]["models"]) == {"teacher-s1", "kd-s1",
                                                                                    "baseline-s1"}
    assert record["host"] and record["device"] == "cpu" and record["started_utc"] <= record["finished_utc"]
    models = record["tasks"]["wikiqa"]["models"]
    ratios = [s / t for s, t in zip(models["kd-s1"]["samples_per_s_by_rep"],
                                    models["teacher-s1"]["samples_per_s_by_rep"])]
    payoff = payoff_table(cells, record).set_index("procedure")
    kd = payoff.loc["kd"]
    assert kd.throughput_x == pytest.approx(sorted(ratios)[1])
    assert (kd.throughput_x_min, kd.throughput_x_max) == (pytest.approx(min(ratios)), pytest.approx(max(ratios)))
    assert kd.infer_samples_per_s == pytest.approx(models["kd-s1"]["samples_per_s"])
    assert kd.throughput_x != pytest.approx(10.0)  # not the runs' own 100 / 10
    side_by_side.write(record, tmp_path)
    assert side_by_side.stored(tmp_path, cells)["tasks"] == record["tasks"]  # --no-timing reads it back
    text = render("s", "sqlite://", None, cells, pd.DataFrame(), kd_table(cells), pd.DataFrame(), [],
                  payoff.reset_index(), record)
    headline = next(line for line in text.splitlines() if line.startswith("- **wikiqa: kd keeps"))
    assert f"at {kd.throughput_x:.1f}x ({min(ratios):.1f}-{max(ratios):.1f}x over 3 repetitions) its throughput" \
        in headline
    assert f"Inference measured side by side on `{record['host']}`" in text
