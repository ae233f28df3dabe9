"""The report's payoff (report/payoff.py) on hand-built cell rows (no MLflow) and a hand-built
side-by-side record: each student and the baseline against the teacher in size, inference speed
(from the side-by-side turns, never the runs' own infer/* figures) and score retained, with the
seed spread; the sentence per procedure; the chart; the KD section opening with it."""
import math
import statistics

import pandas as pd
import pytest

from pipeline.report.cells import ROW_COLUMNS
from pipeline.report.markdown import render
from pipeline.report.payoff import payoff_display, payoff_table, plot_payoff, sentences


def row(cell, procedure, stage, seed, main, params, no_embed, size, latency, sps, needs=""):
    r = {c: math.nan for c in ROW_COLUMNS}
    r.update(cell=cell, task="wikiqa", model="m", procedure=procedure, stage=stage, seed=seed,
             precision_requested="fp32", precision="fp32", role="fp32", tables="kd", needs=needs, status="finished",
             main=main, test_scores="", infer_params=params, infer_params_no_embed=no_embed, infer_size_mb=size,
             infer_latency_ms=latency, infer_samples_per_s=sps, launcher="", memory="CPU peak RSS")
    return r


def cells(bench=True):
    teacher = dict(params=22.7e6, no_embed=10.8e6, size=86.7)
    student = dict(params=15.6e6, no_embed=3.7e6, size=59.6)
    rows = [row("teacher-s1", "teacher", "train", 1, 0.80, latency=20.0, sps=40.0, **teacher),
            row("teacher-s2", "teacher", "train", 2, 0.90, latency=22.0, sps=36.0, **teacher),
            row("baseline-s1", "baseline", "train", 1, 0.60, latency=7.0, sps=110.0, **student),
            row("baseline-s2", "baseline", "train", 2, 0.70, latency=7.0, sps=110.0, **student),
            row("kd-s1", "kd", "distill", 1, 0.84, latency=7.0, sps=100.0, needs="teacher-s1", **student),
            row("kd-s2", "kd", "distill", 2, 0.86, latency=7.0, sps=120.0, needs="teacher-s2", **student)]
    df = pd.DataFrame(rows, columns=ROW_COLUMNS)
    if not bench:
        df[[c for c in df.columns if c.startswith("infer_")]] = math.nan
    return df


def side_by_side():
    """Turns of three repetitions: per cell, its samples/s and batch-1 p50 in each repetition."""
    def model(sps, ms):
        return {"samples_per_s_by_rep": sps, "latency_ms_p50_by_rep": ms}

    return {"reps": 3, "reason": "", "tasks": {"wikiqa": {"length": 22, "batch_size": 32, "models": {
        "teacher-s1": model([40.0, 20.0, 40.0], [20.0, 40.0, 20.0]),
        "teacher-s2": model([40.0, 20.0, 40.0], [20.0, 40.0, 20.0]),
        "baseline-s1": model([120.0, 60.0, 110.0], [7.0, 14.0, 7.0]),
        "baseline-s2": model([120.0, 60.0, 110.0], [7.0, 14.0, 7.0]),
        "kd-s1": model([100.0, 62.0, 120.0], [6.0, 13.0, 8.0]),
        "kd-s2": model([120.0, 58.0, 120.0], [8.0, 13.0, 8.0])}}}}


def test_each_student_and_the_baseline_against_the_teacher():
    payoff = payoff_table(cells(), side_by_side()).set_index("procedure")
    assert list(payoff.role) == ["teacher", "student", "baseline"]
    kd = payoff.loc["kd"]
    assert kd.params_pct == pytest.approx(100 * 15.6 / 22.7) and kd.size_pct == pytest.approx(100 * 59.6 / 86.7)
    assert kd.params_no_embed_pct == pytest.approx(100 * 3.7 / 10.8)
    # per repetition the seeds' mean against the teacher's: 110/40, 60/20, 120/40 -> median 3.0, range 2.75-3.0
    assert kd.throughput_x == pytest.approx(3.0)
    assert (kd.throughput_x_min, kd.throughput_x_max) == (pytest.approx(2.75), pytest.approx(3.0))
    assert kd.latency_x == pytest.approx(statistics.median([20 / 7, 40 / 13, 20 / 8]))
    assert kd.infer_samples_per_s == pytest.approx(110.0)  # the median over repetitions of the seeds' mean
    assert kd.throughput_x != pytest.approx(110 / 38)  # the runs' own infer/* figures are not divided
    assert kd.retained_pct == pytest.approx(100 * 0.85 / 0.85)
    pooled = math.sqrt((pd.Series([0.8, 0.9]).std() ** 2 + pd.Series([0.84, 0.86]).std() ** 2) / 2)
    assert kd.retained_spread_pct == pytest.approx(100 * pooled / 0.85) and kd.retained_beyond == "no"
    assert payoff.loc["teacher"].throughput_x == 1 and payoff.loc["teacher"].retained_pct == 100
    assert payoff.loc["teacher"].throughput_x_min == payoff.loc["teacher"].throughput_x_max == 1
    assert payoff.loc["baseline"].retained_pct == pytest.approx(100 * 0.65 / 0.85)


def test_one_sentence_per_procedure_with_its_spread():
    kd, baseline = sentences(payoff_table(cells(), side_by_side()))
    assert kd.startswith("wikiqa: kd keeps 100% ± ")
    assert ("of the teacher's F1 (within the seed spread) at 3.0x (2.8-3.0x over 3 repetitions) its throughput "
            "(2.9x (2.5-3.1x over 3 repetitions) faster at batch 1)") in kd
    assert "with 69% of its parameters (34% of those outside the embeddings) and 69% of its size on disk" in kd
    assert baseline.startswith("wikiqa: baseline (no distillation) keeps 76% ± ")
    not_here = {"reason": "best/ of outputs/demo/wikiqa-kd-s1 is not on this machine", "tasks": {}}
    (unmeasured, _) = sentences(payoff_table(cells(), not_here))
    assert ("its inference speed was not measured side by side (best/ of outputs/demo/wikiqa-kd-s1 is not on this "
            "machine)") in unmeasured
    assert "its throughput" not in unmeasured and "x " not in unmeasured.split("keeps", 1)[1]


def test_the_table_shows_each_models_non_embedding_parameters_and_their_share_of_the_teachers():
    shown = payoff_display(payoff_table(cells(), side_by_side())).set_index("procedure")
    assert list(shown.loc["kd", ["params (M)", "non-embedding params (M)", "% of teacher's non-embedding"]]) == [
        "15.6", "3.7", "34"]
    assert shown.loc["teacher", "non-embedding params (M)"] == "10.8"


def test_the_chart_and_the_kd_section_opening_with_the_payoff(tmp_path):
    c = cells()
    payoff = payoff_table(c, side_by_side())
    assert plot_payoff(payoff, tmp_path) == ["payoff.png"] and (tmp_path / "payoff.png").stat().st_size > 0
    assert plot_payoff(payoff_table(c, None), tmp_path / "none") == []  # no side-by-side: nothing to draw
    from pipeline.report.tables import kd_table

    record = {**side_by_side(), "host": "node7", "device": "cpu", "device_name": "AMD EPYC", "threads": 2,
              "started_utc": "2026-11-27T05:00:00+00:00", "finished_utc": "2026-11-27T05:01:00+00:00",
              "precision": "fp32", "load": {"perf/others_cpu_frac": 0.5}}
    text = render("demo", "sqlite://", None, c, pd.DataFrame(), kd_table(c), pd.DataFrame(), ["payoff.png"], payoff,
                  record)
    assert ("Inference measured side by side on `node7`, AMD EPYC (`cpu`, 2 threads), 2026-11-27T05:00:00+00:00 to "
            "2026-11-27T05:01:00+00:00") in text
    assert "other processes kept 50% of the machine's cores busy" in text
    section = text.split("## Knowledge distillation procedures", 1)[1]
    assert section.lstrip().startswith("### What the student buys")
    assert section.index("- **wikiqa: kd keeps") < section.index("![payoff.png]") < section.index("### Training")


def test_an_exported_student_against_the_teacher_and_its_pytorch_self():
    """`pipeline export --check`'s graphs (export/int8/*) as a row after their student: the score the
    graph kept, its speed in the same turns against the teacher and against the PyTorch student."""
    rows = cells()
    kd = rows.procedure == "kd"
    rows.loc[kd, "export_int8_main"], rows.loc[kd, "export_int8_size_mb"] = [0.83, 0.87], 15.0
    side = side_by_side()
    models = side["tasks"]["wikiqa"]["models"]
    models["kd-s1@int8"] = {"samples_per_s_by_rep": [200.0, 124.0, 240.0], "latency_ms_p50_by_rep": [3.0, 6.5, 4.0]}
    models["kd-s2@int8"] = {"samples_per_s_by_rep": [240.0, 116.0, 240.0], "latency_ms_p50_by_rep": [4.0, 6.5, 4.0]}
    payoff = payoff_table(rows, side).set_index("procedure")
    assert list(payoff.index) == ["teacher", "kd", "kd int8", "baseline"]
    int8 = payoff.loc["kd int8"]
    assert int8.role == "exported" and int8.retained_pct == pytest.approx(100 * 0.85 / 0.85)
    assert int8.size_pct == pytest.approx(100 * 15.0 / 86.7) and int8.throughput_x == pytest.approx(6.0)
    assert int8.vs_student_throughput_x == pytest.approx(2.0)  # 220/110, 120/60, 240/120 in the same turns
    sentence = next(s for s in sentences(payoff.reset_index()) if s.startswith("wikiqa: kd int8"))
    assert "(exported, ONNX Runtime) keeps 100% ± " in sentence and "at 6.0x (5.5-6.0x over 3 repetitions)" in sentence
    assert "2.0x (2.0-2.0x over 3 repetitions) the throughput of the PyTorch student" in sentence
    assert "17% of its size on disk" in sentence


def test_a_student_with_its_vocabulary_trimmed_shows_its_parameters_and_size_after_the_cut():
    """`pipeline export --trim-vocab`'s export/trim/* figures: a row after the student with the
    parameters and size on disk of the trimmed model, the score of its (trimmed) fp32 graph."""
    rows = cells()
    kd = rows.procedure == "kd"
    rows.loc[kd, "export_fp32_main"], rows.loc[kd, "export_fp32_size_mb"] = [0.84, 0.86], 29.0
    rows.loc[kd, ["export_trim_params", "export_trim_params_no_embed", "export_trim_size_mb"]] = [5.6e6, 3.7e6, 21.5]
    rows.loc[kd, ["export_trim_vocab_size", "export_trim_vocab_size_before"]] = [4000, 30522]
    payoff = payoff_table(rows, side_by_side()).set_index("procedure")
    trimmed = payoff.loc["kd, vocabulary trimmed (30522 -> 4000 tokens)"]
    assert trimmed.role == "trimmed" and trimmed.infer_params == pytest.approx(5.6e6)
    assert trimmed.infer_size_mb == pytest.approx(21.5) and trimmed.size_pct == pytest.approx(100 * 21.5 / 86.7)
    assert trimmed.params_no_embed_pct == pytest.approx(100 * 3.7 / 10.8)  # the layers are not cut
    assert trimmed.retained_pct == pytest.approx(100) and math.isnan(trimmed.throughput_x)
    assert payoff.loc["kd"].infer_size_mb == pytest.approx(59.6)  # the student before the cut, beside it
    sentence = next(s for s in sentences(payoff.reset_index()) if "vocabulary trimmed" in s)
    assert "with 25% of its parameters (34% of those outside the embeddings) and 25% of its size on disk" in sentence
