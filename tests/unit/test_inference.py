"""The inference benchmark (pipeline/measure/inference.py): what it measures, how it names it, and
the saved models it reads."""
import json

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from pipeline import names
from pipeline.config.precision_modes import MODES
from pipeline.errors import UserError
from pipeline.measure import inference
from pipeline.models import SavedModel
from pipeline.runtime import precision

CPU = torch.device("cpu")
TINY = dict(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny classifier saved as a stage saves best/ (weights and tokenizer); a stage's output_dir holding it."""
    from pipeline.models import preset_tokenizer

    out = tmp_path_factory.mktemp("stage")
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**TINY, num_labels=3))
    model.save_pretrained(out / "best")
    preset_tokenizer(["a b c d e f g"] * 10, vocab_size=100).save_pretrained(out / "best")
    return out


def test_typical_lengths_are_the_median_and_the_longest_row_padded_to_its_bucket():
    assert inference.typical_lengths([5, 9, 12, 30], 8, 64) == {"median": 10, "longest": 32}
    assert inference.typical_lengths([5, 9, 12, 60], 16, 48)["longest"] == 48  # never past max_length


@pytest.mark.parametrize("native, emulated, rows", [
    (True, False, ["fp32", "bf16"]), (False, True, ["fp32", "bf16"]),
    (False, False, ["fp32"]),  # refused on AVX2-only CPUs unless emulation is asked for, as training refuses it
])
def test_the_stage_precision_comes_first_and_a_cpu_adds_only_what_it_runs(monkeypatch, native, emulated, rows):
    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: native)
    monkeypatch.setenv(precision.EMULATED_BF16_ENV, "1" if emulated else "0")
    assert inference.inference_precisions("fp32", CPU) == rows
    assert inference.inference_precisions("tf32", CPU)[:2] == ["tf32", "fp32"]


def test_bf16_pure_is_served_in_bf16_like_bf16():
    served = {p: MODES[MODES[p].served_as].compute for p in ("bf16-pure", "bf16")}
    assert served == {"bf16-pure": "bfloat16", "bf16": "bfloat16"}
    assert inference.inference_precisions("bf16-pure", CPU)[0] == "bf16"
    assert all(MODES[m.served_as].served_as == m.served_as for m in MODES.values())  # a served mode serves as itself


def test_bench_measures_each_length_and_names_each_figure(saved):
    model = SavedModel(str(saved))  # a stage's output_dir: its best/
    lengths = {"median": 8, "longest": 24}
    result = inference.bench(model.served(), CPU, lengths=lengths, precisions=["fp32"], batch_size=4,
                             budget_s=0.05)  # the minimum reps decide
    reference = BertForSequenceClassification(BertConfig(**TINY, num_labels=3))
    embeddings = sum(p.numel() for m in reference.modules() if isinstance(m, torch.nn.Embedding)
                     for p in m.parameters())
    assert result.params == sum(p.numel() for p in reference.parameters())
    assert result.params_no_embed == result.params - embeddings
    assert model.size_mb * 2**20 == (saved / "best" / "model.safetensors").stat().st_size
    by_length = {m.length_name: m for m in result.measurements}
    assert {m.length for m in by_length.values()} == {8, 24}
    for m in by_length.values():
        assert m.latency_reps >= inference.LATENCY_REPS[0] and m.throughput_reps >= inference.THROUGHPUT_REPS[0]
        assert 0 < m.latency_ms_p50 <= m.latency_ms_p95 and m.samples_per_s > 0
    metrics = result.figures()
    p50 = names.infer_metric(names.INFER_LATENCY_P50, "fp32", "longest")
    assert metrics[p50] == by_length["longest"].latency_ms_p50
    assert metrics[names.infer_length("median")] == 8 and metrics[names.INFER_BATCH] == 4
    assert names.infer_metric(names.INFER_PEAK_RSS, "fp32", "median") in metrics  # a CPU: RSS, said so
    assert not any(names.INFER_PEAK_MEM in k for k in metrics)


def test_one_length_twice_is_measured_once(saved):
    model = SavedModel(str(saved / "best"))
    result = inference.bench(model.served(), CPU, lengths={"median": 16, "longest": 16}, precisions=["fp32"],
                             batch_size=2, budget_s=0.01)
    a, b = result.measurements
    assert a.latency_ms_p50 == b.latency_ms_p50 and a.samples_per_s == b.samples_per_s


@pytest.mark.parametrize("spec, reason", [("/no/such/dir", "no such directory"),
                                          (".", "neither a model directory")])
def test_a_path_that_holds_no_model_is_one_line(spec, reason):
    with pytest.raises(UserError, match=reason):
        SavedModel(spec)


def test_infer_bench_measures_models_side_by_side(saved, capsys):
    from pipeline.cli import main

    assert main(["infer-bench", str(saved), str(saved / "best"), "--lengths", "8,16", "--batch-size", "2",
                 "--budget-s", "0.01", "--reps", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    measured = inference.inference_precisions("fp32", CPU)  # fp32, and bf16 where this CPU runs it
    assert [(r["model"], r["precision"], r["length"]) for r in rows] == [
        (m, p, n) for m in (str(saved), str(saved / "best")) for p in measured for n in (8, 16)]
    assert all(r["params"] == rows[0]["params"] for r in rows)
    assert rows[0]["speedup"] == 1.0 and rows[2]["speedup"] > 0  # against the first model
    assert main(["infer-bench", str(saved), "--lengths", "8", "--budget-s", "0.01", "--reps", "2"]) == 0
    table = capsys.readouterr().out
    assert "device cpu" in table and "p50_ms" in table and str(saved) in table


@pytest.mark.parametrize("args, message", [
    (["/no/such/model"], "/no/such/model: no such directory"),
    (["MODEL", "--lengths", "a,b"], "--lengths a,b: expected whole numbers"),
    (["MODEL", "--precision", "fp8"], "--precision fp8: one of"),
    (["MODEL", "--device", "cuda"], "no CUDA device here"),
])
def test_infer_bench_bad_input_is_one_line_and_exit_2(saved, capsys, args, message):
    from pipeline.cli import main

    args = [str(saved) if a == "MODEL" else a for a in args]
    assert main(["infer-bench", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_stage_serves_with_every_core_whatever_threads_its_launch_gave_it():
    """torchrun gives each of N CPU processes one thread; the stage's measurement takes every core the
    process may run on (as a server owning the machine would), then gives the launch's count back."""
    import os

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with inference.serving_threads(CPU) as threads:
            assert threads == torch.get_num_threads() == len(os.sched_getaffinity(0))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
