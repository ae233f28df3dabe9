"""What a job prints as it starts (rank 0): the resolved precision and why, the run's address, the
block of what it resolved; the Hub's repeated warnings once."""
import logging

from pipeline import names
from pipeline.cli import hub_once
from pipeline.config import load_config
from pipeline.job.records.start_block import (
    FEW_TRAIN_ROWS,
    evaluation_data,
    few_rows_warning,
    model_line,
    precision_line,
    run_url,
    start_block,
)
from pipeline.measure.flops import ModelSize


def test_the_precision_says_what_auto_became_and_why():
    assert precision_line("auto", "bf16", "cpu") == "bf16 (auto: this cpu runs bf16)"
    assert precision_line("auto", "fp32", "cpu") == "fp32 (auto: this CPU has no bf16 kernels)"
    assert precision_line("fp16", "fp16", "cuda") == "fp16 (as set)"


def test_the_run_is_a_link_on_a_server_and_a_command_on_a_file_store():
    assert run_url("http://u:secret@host:5000/", "3", "abc") == "http://***@host:5000/#/experiments/3/runs/abc"
    assert run_url("http://host:5000", "3", "abc") == "http://host:5000/#/experiments/3/runs/abc"
    assert run_url("sqlite:////x/m.db", "3", "abc") == "run abc: python -m pipeline ui --uri sqlite:////x/m.db"
    assert "pipeline sync" in run_url("sqlite:////x/m.db", None, None)


def test_the_start_block_names_everything_the_job_resolved():
    model = model_line("preset:bangla-tiny", ModelSize(1_234_567, 234_567, 3.2e8, 128))
    block = start_block(task="sentiment", model=model,
                        precision="bf16 (auto: this cpu runs bf16)", backend="ddp", world_size=2,
                        examples={"train": 800, "dev": 100, "test": 100}, steps=75, epochs=3, output_dir="out",
                        uri="sqlite:////x/m.db", run="run abc: python -m pipeline ui --uri sqlite:////x/m.db")
    for part in ("task        sentiment",
                 "preset:bangla-tiny (1.2M parameters, 0.2M outside the embeddings; 0.32 GFLOPs per 128-token",
                 "bf16 (auto: this cpu runs bf16)",
                 "ddp x 2 processes", "train 800, dev 100, test 100", "75 optimizer steps over 3 epochs",
                 "output_dir  out", "sqlite:////x/m.db", "run abc"):
        assert part in block, part


def test_a_students_model_line_says_its_share_of_the_teacher_and_its_init():
    teacher = ModelSize(4_000_000, 2_000_000, 1.0e9, 128)
    line = model_line("from_teacher:2", ModelSize(1_000_000, 400_000, 2.5e8, 128), teacher, "weight-selection")
    assert line.endswith("25% of the teacher's parameters, 20% outside the embeddings, 25% of its FLOPs; "
                         "init weight-selection)")


def test_a_hub_warning_repeated_with_other_numbers_is_printed_once():
    once = hub_once()

    def record(name, message):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, None, None)

    lines = [f"Retrying in {i}s [Retry {i}/5]: HEAD https://huggingface.co/x" for i in range(1, 6)]
    shown = [once(record("huggingface_hub.utils._http", line)) for line in lines]
    assert shown == [True, False, False, False, False]
    assert once(record("pipeline", lines[0])) and once(record("pipeline", lines[0]))  # ours: all


def test_a_model_line_without_counted_flops_says_so():
    line = model_line("microsoft/deberta-v3-small", ModelSize(2_000_000, 1_000_000, None, 128),
                      ModelSize(4_000_000, 2_000_000, None, 128), "pretrained")
    assert "forward FLOPs not countable on the meta device" in line and "of its FLOPs" not in line


def test_a_test_file_that_is_the_training_file_is_said_and_tagged(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "train.tsv").write_text("")
    rows = {"train": 800, "dev": 100, "test": 800}
    # the same file by another spelling of its path
    same = load_config(None, [f"data.train={tmp_path / 'sub' / '..' / 'train.tsv'}", "data.dev=samples",
                              f"data.test={tmp_path / 'train.tsv'}"]).data
    tags, note = evaluation_data(same, rows)
    assert tags == {names.TAG_TEST_IS_TRAIN: "true"}
    assert note == f"data.test={tmp_path / 'train.tsv'} is the training file: the test figures are of rows trained on"
    # the sample set's and a hub dataset's splits are their own, whatever the values
    for value in ("samples", "hub:some/set"):
        data = load_config(None, [f"data.train={value}", f"data.dev={value}", f"data.test={value}"]).data
        assert evaluation_data(data, rows) == ({}, "")


def test_few_training_rows_draw_one_warning_naming_where_the_rest_went():
    held = load_config(None, ["data.train=mine.tsv", "data.dev=holdout:0.99"]).data
    assert few_rows_warning(held, {"train": 24, "dev": 2376}) == (
        f"only 24 training rows (data.dev=holdout:0.99 held 2376 of the training file's 2400 rows out): under "
        f"{FEW_TRAIN_ROWS}, this job's figures say little")
    own = load_config(None, ["data.train=mine.tsv", "data.dev=d.tsv"]).data
    assert few_rows_warning(own, {"train": FEW_TRAIN_ROWS - 1, "dev": 10}) == (
        f"only {FEW_TRAIN_ROWS - 1} training rows: under {FEW_TRAIN_ROWS}, this job's figures say little")
    assert few_rows_warning(own, {"train": FEW_TRAIN_ROWS, "dev": 10}) is None
