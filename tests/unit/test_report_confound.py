"""A speed comparison between runs that ran on a machine busy with other work, or beside other
cells on one device, is called confounded in the sentence that states it (report/confound.py); on
an idle machine nothing is flagged; a pair whose sides resolved to one precision states no speed-up."""
import math

import pandas as pd

from pipeline.report.cells import ROW_COLUMNS
from pipeline.report.compare import comparisons
from pipeline.report.markdown import headline, render
from pipeline.report.tables import amp_display, amp_table, kd_table
from pipeline.report.training_speed import speed_sentences


def row(cell, precision, ran, seed, sps, others_cpu, procedure="train", stage="train", tables="amp", shared=""):
    r = {c: math.nan for c in ROW_COLUMNS}
    r.update(cell=cell, task="sentiment", model="m1", procedure=procedure, stage=stage, seed=seed,
             precision_requested=precision, precision=ran, role="fp32" if precision == "fp32" else "amp",
             tables=tables, needs="", status="finished", main=0.8, test_scores="", launcher="", memory="CPU peak RSS",
             samples_per_s=sps, peak_mem_mb=1000.0, others_cpu=others_cpu, shared_with=shared)
    return r


def amp_cells(fp32_load, amp_load, amp_ran="bf16", shared=""):
    return pd.DataFrame([row("fp32-s1", "fp32", "fp32", 1, 100.0, fp32_load),
                         row("fp32-s2", "fp32", "fp32", 2, 104.0, fp32_load),
                         row("amp-s1", "auto", amp_ran, 1, 150.0, amp_load, shared=shared),
                         row("amp-s2", "auto", amp_ran, 2, 154.0, amp_load)], columns=ROW_COLUMNS)


def test_two_cells_with_different_load_flag_their_speed_up():
    amp = amp_table(amp_cells(fp32_load=0.02, amp_load=0.45))
    clause = amp.speed_confounded.iloc[0]
    assert clause == ("confounded: other processes used the machine's cores (FP32 2%, AMP 45%; threshold 10%, "
                      "and the sides differ by more)")
    text = headline(amp)
    assert ("trained 49.0% faster than FP32 (samples/s) (confounded in 1 of the 1 cell: sentiment / m1: other "
            "processes used the machine's cores (FP32 2%, AMP 45%; threshold 10%, and the sides differ by more)), "
            "used") in text
    table = render("s", "sqlite://", None, amp_cells(0.02, 0.45), amp, pd.DataFrame(), pd.DataFrame(), [])
    assert "+49.0% ± 2.8% (confounded: other processes used" in table


def test_an_idle_machine_flags_nothing():
    amp = amp_table(amp_cells(fp32_load=0.02, amp_load=0.04))
    assert amp.speed_confounded.iloc[0] == ""
    assert "confounded" not in headline(amp)


def test_cells_sharing_a_device_are_named_as_such():
    amp = amp_table(amp_cells(0.0, 0.0, shared="ner-m1-fp32-s1"))
    clause = amp.speed_confounded.iloc[0]
    assert "the AMP run(s) ran beside other cells on one device (--jobs): ner-m1-fp32-s1" in clause


def test_one_precision_on_both_sides_states_no_speed_up_or_memory_saving():
    amp = amp_table(amp_cells(0.02, 0.45, amp_ran="fp32"))
    assert bool(amp.same_precision.iloc[0])
    text = headline(amp)
    assert "nothing to compare" in text and "%" not in text
    shown = amp_display(amp)
    assert shown.speedup_pct.iloc[0] == shown.mem_reduction_pct.iloc[0] == "same precision: nothing to compare"


def test_kd_training_speed_comparisons_say_when_confounded():
    cells = pd.DataFrame([row("kd_fp32-s1", "fp32", "fp32", 1, 40.0, 0.01, "kd_fp32", "distill", "kd"),
                          row("kd_amp-s1", "auto", "bf16", 1, 60.0, 0.60, "kd_amp", "distill", "kd")],
                         columns=ROW_COLUMNS)
    (line,) = speed_sentences(comparisons(cells))
    assert line.startswith("sentiment: kd_amp trained at 60.0 samples/s against 40.0 for kd_fp32 (AMP against FP32: "
                           "+50.0%); confounded: other processes used the machine's cores (kd_fp32 1%, kd_amp 60%")
    same = cells.assign(precision="fp32")
    assert speed_sentences(comparisons(same)) == ["sentiment: kd_amp and kd_fp32 both ran fp32: no AMP training "
                                                  "speed-up to compare."]
    assert "confounded" in render("s", "sqlite://", None, cells, pd.DataFrame(), kd_table(cells), pd.DataFrame(), [])


def test_the_study_records_which_cells_ran_at_once_on_one_device():
    """--jobs N: cells on the CPU share it with every cell running beside them; cells on GPUs of
    their own share nothing, except with a cell on the CPU (whose threads run on the same host)."""
    from pipeline.study.runner import _note_sharing

    sharing = {}
    running = {}
    for name, gpus in (("a", ["0"]), ("b", ["1"]), ("c", ["1", "2"]), ("d", [])):
        _note_sharing(sharing, name, gpus, running)
        running[name] = (None, None, gpus)
    assert sharing == {"b": {"c", "d"}, "c": {"b", "d"}, "a": {"d"}, "d": {"a", "b", "c"}}
