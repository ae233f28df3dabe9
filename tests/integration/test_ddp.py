"""torchrun DDP on CPU (gloo): same weights as one process with the same global batch (with
activation checkpointing on the DDP side), and exactly one MLflow run per job however many processes."""
import json

import numpy as np
import pytest
from safetensors.torch import load_file

from helpers import mlflow_runs, run_cli, torchrun, tracking_db
from pipeline import names, predictions
from pipeline.config import load_config
from pipeline.job.run import run

pytestmark = pytest.mark.slow  # every test trains, in process or under torchrun

# dropout off, so that the only difference between the runs is how the batch is split
PARITY = ["model=preset:bangla-tiny", "train.max_length=48", "train.lr=1e-3", "train.max_steps=6",
          "train.warmup_ratio=0", "model_config.hidden_dropout_prob=0",
          "model_config.attention_probs_dropout_prob=0", "train.log_every=2",
          "infer.budget_s=0.2"]  # rank 0 alone measures the best model, the other rank does not wait


def max_weight_diff(a_dir, b_dir):
    a, b = load_file(a_dir / "best" / "model.safetensors"), load_file(b_dir / "best" / "model.safetensors")
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def single_reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("single")
    run(load_config(None, [*PARITY, "train.batch_size=8", f"output_dir={tmp / 'out'}",
                           f"tracking.uri=sqlite:///{tracking_db(tmp)}"]))
    return tmp / "out"


def test_gradient_accumulation_matches_the_full_batch(tmp_path, single_reference):
    run(load_config(None, [*PARITY, "train.batch_size=4", "train.grad_accum=2", f"output_dir={tmp_path / 'out'}",
                           f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))
    assert max_weight_diff(single_reference, tmp_path / "out") < 1e-5


def test_two_process_ddp_matches_single_process_and_logs_one_run(tmp_path, single_reference):
    db = tracking_db(tmp_path)
    # with activation checkpointing (non-reentrant: DDP's hooks fire once per parameter), which
    # must change nothing, against the single process without it
    result = torchrun(2, "train", *PARITY, "train.batch_size=4", "train.gradient_checkpointing=true",
                      f"output_dir={tmp_path / 'out'}", f"tracking.uri=sqlite:///{db}", "tracking.experiment=ddp")
    assert result.returncode == 0, result.stderr[-3000:]

    assert max_weight_diff(single_reference, tmp_path / "out") < 1e-5
    single = json.loads((single_reference / "metrics.json").read_text())
    ddp = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert ddp[names.TRAIN_LOSS] == pytest.approx(single[names.TRAIN_LOSS], abs=1e-5)
    assert ddp[names.EVAL_MAIN] == pytest.approx(single[names.EVAL_MAIN], abs=1e-6)

    (mlrun,) = mlflow_runs(db, "ddp")  # one run for the job, not one per process
    assert mlrun.info.status == "FINISHED"
    assert mlrun.data.tags["world_size"] == "2" and mlrun.data.tags["backend"] == "ddp"
    assert mlrun.data.tags["launcher"] == "torchrun" and mlrun.data.tags["num_nodes"] == "1"
    assert {names.TRAIN_LOSS, names.TRAIN_LR, names.TRAIN_GRAD_NORM, names.EVAL_MAIN, names.SAMPLES_PER_S,
            names.EPOCH_TIME, names.PEAK_RSS, names.SKIPPED_STEPS, names.TEST_MAIN} <= set(mlrun.data.metrics)
    assert ddp[names.TRAIN_STEPS] == 6  # optimizer steps of the job, not of each process
    assert names.infer_metric(names.INFER_SAMPLES_PER_S, "fp32", "median") in mlrun.data.metrics  # rank 0's
    # the predictions files, rank 0's, line up with the single process's: every row once, by id
    for split in predictions.SPLITS:
        one, two = (predictions.read(out / "predictions" / f"{split}.jsonl")
                    for out in (single_reference, tmp_path / "out"))
        assert two.header == {**one.header, "rows": 400} and [r["id"] for r in two.rows] == [r["id"] for r in one.rows]
        np.testing.assert_allclose([r["probs"] for r in two.rows], [r["probs"] for r in one.rows], atol=2e-4)


def test_ddp_without_a_launcher_is_refused(tmp_path):
    result = run_cli("train", "backend=ddp", f"output_dir={tmp_path}")
    assert result.returncode == 2
    assert "backend=ddp: needs a launcher" in result.stderr
