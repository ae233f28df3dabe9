"""Models compared on speed are timed side by side (measure/inference.bench_side_by_side): loaded
first, then taking turns repetition by repetition in rotating order; and the study report's payoff
takes its speed-ups from such a run of the saved models (report/side_by_side.py), never from the
runs' own infer/* figures."""
import math
import os

import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline.measure import inference
from pipeline.models import SavedModel, preset_tokenizer
from pipeline.report import side_by_side
from pipeline.report.cells import ROW_COLUMNS
from pipeline.report.payoff import payoff_table, sentences

CPU = torch.device("cpu")


def tiny(layers: int) -> BertForSequenceClassification:
    torch.manual_seed(layers)
    return BertForSequenceClassification(BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=layers,
                                                    num_attention_heads=2, intermediate_size=64, num_labels=2))


@pytest.fixture(autouse=True)
def one_core():
    """Tiny models timed on one core, as the suite's workers run: serving takes every core of the
    affinity set, and two OpenMP threads on a shared 2-core machine spin for most of each pass."""
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {min(cores)})
    torch.set_num_threads(1)
    yield
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Stage output_dirs holding a best/ each, as a study leaves them: a 4-layer teacher, a student
    and a baseline of one 1-layer architecture."""
    root = tmp_path_factory.mktemp("outputs")
    tokenizer = preset_tokenizer(["a b c d e f g"] * 10, vocab_size=100)
    for cell, layers in (("teacher-s1", 4), ("kd-s1", 1), ("baseline-s1", 1)):
        tiny(layers).save_pretrained(root / cell / "best")
        tokenizer.save_pretrained(root / cell / "best")
    return root


def test_the_models_are_loaded_first_then_take_turns_in_rotating_order(outputs):
    events = []

    def served(cell: str) -> inference.Served:
        saved = SavedModel(str(outputs / cell))

        def load(dtype, device):
            events.append(("load", cell))
            model = saved.load(dtype, device)
            model.register_forward_pre_hook(lambda module, args: events.append(("pass", cell)))
            return model
        return inference.Served(load, saved.config.vocab_size, saved.tokenizer.model_input_names, saved.size_mb)

    cells = ["teacher-s1", "kd-s1", "baseline-s1"]
    results = inference.bench_side_by_side({c: served(c) for c in cells}, CPU, lengths={"median": 8},
                                           precisions=["fp32"], batch_size=2, budget_s=0.01, reps=3)
    loads = [i for i, e in enumerate(events) if e[0] == "load"]
    assert [events[i][1] for i in loads] == cells
    warm_up = 3  # two batch-1 passes and one serving batch right after each load
    timed = events[loads[-1] + 1 + warm_up:]
    assert all(kind == "pass" for kind, _ in timed)
    turns = [cell for i, (_, cell) in enumerate(timed) if i == 0 or timed[i - 1][1] != cell]
    assert turns == ["teacher-s1", "kd-s1", "baseline-s1", "kd-s1", "baseline-s1", "teacher-s1",
                     "baseline-s1", "teacher-s1", "kd-s1"]
    assert turns == [c for rep in range(3) for c in inference.turn_order(cells, rep)]
    for r in results.values():
        (m,) = r.measurements
        assert len(m.samples_per_s_by_rep) == len(m.latency_ms_p50_by_rep) == 3
        assert m.samples_per_s == sorted(m.samples_per_s_by_rep)[1]  # the median of the three turns


def cell_row(cell, procedure, stage, main, output_dir, sps, needs=""):
    r = {c: math.nan for c in ROW_COLUMNS}
    r.update(cell=cell, task="wikiqa", model="m", procedure=procedure, stage=stage, seed=1, precision_requested="fp32",
             precision="fp32", role="fp32", tables="kd", needs=needs, status="finished", main=main, test_scores="",
             launcher="", memory="CPU peak RSS", run_id=f"run-{cell}", output_dir=str(output_dir),
             infer_params=1e6, infer_params_no_embed=5e5, infer_size_mb=4.0, infer_latency_ms=1000 / sps,
             infer_samples_per_s=sps, infer_length=8.0, infer_batch=4.0)
    return r


def study_cells(outputs, teacher_dir=None):
    """The runs as MLflow holds them; their own infer/* figures say the students are 10x the teacher
    (timed minutes apart: the machine's drift), which the payoff must not repeat."""
    rows = [cell_row("teacher-s1", "teacher", "train", 0.80, teacher_dir or outputs / "teacher-s1", sps=10.0),
            cell_row("kd-s1", "kd", "distill", 0.78, outputs / "kd-s1", sps=100.0, needs="teacher-s1"),
            cell_row("baseline-s1", "baseline", "train", 0.70, outputs / "baseline-s1", sps=100.0)]
    return pd.DataFrame(rows, columns=ROW_COLUMNS)


def test_a_study_whose_models_are_elsewhere_says_so_and_divides_nothing(outputs):
    cells = study_cells(outputs, teacher_dir="/elsewhere/outputs/demo/wikiqa-teacher-s1")
    record = side_by_side.measure(cells, "cpu", reps=2, budget_s=0.02)
    assert "teacher-s1" not in record["tasks"].get("wikiqa", {}).get("models", {})
    payoff = payoff_table(cells, record)
    assert payoff.throughput_x.isna().all()
    kd_line = next(s for s in sentences(payoff) if s.startswith("wikiqa: kd "))
    assert "not measured side by side (best/ of /elsewhere/outputs/demo/wikiqa-teacher-s1 is not on this " \
           "machine)" in kd_line
    assert "10.0x" not in kd_line and "its throughput" not in kd_line
