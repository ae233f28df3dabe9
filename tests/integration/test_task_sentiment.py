"""The BLP-2023 sentiment reader and metrics: the tests that train a model or start a process (the
others are in tests/unit/test_task_sentiment.py)."""
import pytest

from helpers import FAST, tracking_db
from pipeline import names
from pipeline.config import load_config
from pipeline.job.run import run


@pytest.mark.slow
def test_two_seeds_score_differently_below_the_ceiling(tmp_path):
    """The default sample set is not saturated: seeds 1 and 3 of the fast model land between
    chance (~0.33) and the label-noise ceiling (~0.96) at different test scores. On a set every
    model learns to the ceiling both seeds miss exactly the flipped labels (issue 16: fp32, bf16
    and DDP all scored 0.9099970036332531). Not seed 2: with the task's grouped batches it stays at
    0.53 (this config does so for 2-3 seeds in 10, grouped or not: benchmarks/README.md).
    Observed 0.88 and 0.84 (0.8834, 0.8436)."""
    scores = []
    for seed in (1, 3):
        figures = run(load_config(None, [*FAST, "train.epochs=3", f"seed={seed}", f"output_dir={tmp_path / str(seed)}",
                                         f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))
        scores.append(figures[names.test_metric("macro_f1")])
    assert all(0.6 < s < 0.93 for s in scores), scores
    assert scores[0] != scores[1]
