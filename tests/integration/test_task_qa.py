"""Extractive QA (squad_bn / SQuAD v2): the tests that train a model or start a process (the others are
in tests/unit/test_task_qa.py)."""
import json

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from helpers import FAST, mlflow_runs, torchrun, tracking_db
from pipeline import names
from pipeline.config import load_config
from pipeline.job.run import run
from unit.test_task_qa import TASK  # noqa: F401

# ---------------------------------------------------------------------- the job end to end

QA_FAST = ["task=qa", *FAST, "train.max_length=64"]
# bangla-tiny at lr 1e-3: 12 epochs of 32 reach test F1 0.51; 6 epochs of 16 take the same
# 450 steps on half the rows seen (0.43). 3 of 8, or 5-6 of 32 at lr 2-3e-3, stay on the null answer.
QA_LEARNS = [*QA_FAST, "train.batch_size=16", "train.epochs=6"]


def assert_learned(figures):
    """Clearly above the trivial answers: "" everywhere scores exactly the unanswerable share of
    F1 and 0 on HasAns; a random span scores about 0. The first ~200 steps sit on that null answer;
    by 450 the model points at the span next to the question's words (see QaTask)."""
    noans_share = np.mean([not e["answers"]["text"] for e in TASK.load(None, "test")])
    # observed: f1 0.43 (QA_LEARNS), HasAns_f1 0.47-0.49; 12 epochs of 32: 0.51, 0.34-0.57
    assert figures[names.EVAL_MAIN] == figures[names.eval_metric("f1")] > noans_share + 0.1
    assert figures[names.test_metric("f1")] > noans_share + 0.1
    assert figures[names.test_metric("HasAns_f1")] > 0.25 and figures[names.eval_metric("HasAns_f1")] > 0.25


@pytest.mark.slow
def test_qa_learns_on_the_sample_set(tmp_path):
    out = tmp_path / "out"
    figures = run(load_config(None, [*QA_LEARNS, f"output_dir={out}", f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))
    assert_learned(figures)
    assert {names.eval_metric("exact"), names.eval_metric("NoAns_f1"), names.test_metric("HasAns_exact"),
            names.test_metric("NoAns_exact")} <= set(figures)
    assert "HasAns" in (out / "report.txt").read_text(encoding="utf-8")


@pytest.mark.slow
def test_qa_under_two_process_ddp_matches_one_process(tmp_path):
    """2 ranks x 16 against one process x 32, dropout off, so that only the batch split (and so
    each batch's padding) differs: the same loss at every step and the same SQuAD v2 scores.
    Learning is the test above's; here the first steps, while the model still answers "".
    Weights are not compared: qa_outputs.bias (and the last LayerNorm's bias along its rows)
    shifts every logit of a window alike, which the softmax ignores; their gradient is 0 up to
    rounding, and Adam turns rounding into steps of up to lr."""
    parity = [*QA_FAST, "train.max_steps=8", "train.log_every=1", "train.warmup_ratio=0",
              "model_config.hidden_dropout_prob=0", "model_config.attention_probs_dropout_prob=0"]
    dbs = [tracking_db(tmp_path, "1.db"), tracking_db(tmp_path, "2.db")]
    run(load_config(None, [*parity, f"output_dir={tmp_path / 'one'}", f"tracking.uri=sqlite:///{dbs[0]}"]))
    result = torchrun(2, "train", *parity, "train.batch_size=16", f"output_dir={tmp_path / 'two'}",
                      f"tracking.uri=sqlite:///{dbs[1]}")
    assert result.returncode == 0, result.stderr[-3000:]
    losses = []
    for db in dbs:
        (mlrun,) = mlflow_runs(db, "pipeline")
        history = MlflowClient(f"sqlite:///{db}").get_metric_history(mlrun.info.run_id, names.TRAIN_LOSS)
        losses.append([m.value for m in sorted(history, key=lambda m: m.step)])
    assert len(losses[0]) >= 8 and losses[1] == pytest.approx(losses[0], abs=1e-5)
    single, ddp = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    scores = [k for k in single if k.startswith((names.EVAL, names.TEST))]
    assert names.test_metric("HasAns_f1") in scores
    for key in scores:
        assert ddp[key] == pytest.approx(single[key], abs=1e-6), key
