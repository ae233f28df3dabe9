"""Token-budget batches (train.batch_tokens): the tests that train a model or start a process (the
others are in tests/unit/test_data.py)."""

import pytest

from helpers import FAST, tracking_db
from pipeline import names
from pipeline.config import load_config


@pytest.mark.slow
def test_a_job_with_token_batches_counts_its_real_rows(tmp_path):
    from pipeline.job.run import run

    figures = run(load_config(None, [*FAST, "train.batch_tokens=1024", "train.epochs=1", f"output_dir={tmp_path}",
                                     f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))
    from pipeline.tasks import get_task

    rows = len(get_task("sentiment").load(None, "train"))
    seconds = figures[names.TRAIN_TIME]
    assert figures[names.SAMPLES_PER_S] * seconds == pytest.approx(rows, rel=0.05)  # one epoch, every row
    assert figures[names.TRAIN_STEPS] < rows / 16  # larger batches than the 16-row default
    assert figures[names.TRAIN_LOSS] == figures[names.TRAIN_LOSS]  # a finite, logged loss (not NaN)
