"""Throughput, time and energy are measured over the training steps only, whatever the checkpoint
cadence: the tests that train a model or start a process (the others are in
tests/unit/test_meters.py)."""
import json
import time

import pytest

from helpers import FAST, tracking_db
from pipeline import names
from unit.test_meters import bert_training_flops  # noqa: F401


@pytest.mark.slow
def test_throughput_is_the_same_with_and_without_mid_epoch_saves(tmp_path, monkeypatch):
    from pipeline.config import load_config
    from pipeline.job import loop as job_loop
    from pipeline.job.parts.checkpoint import Checkpointer
    from pipeline.job.run import run

    wall = {}  # seconds of the real calls, timed around them: the epoch, and the saves inside it

    def timed(name, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                wall[name] = wall.get(name, 0.0) + time.perf_counter() - t0
        return call

    monkeypatch.setattr(job_loop, "train_epoch", timed("epoch", job_loop.train_epoch))
    monkeypatch.setattr(Checkpointer, "save", timed("saves", Checkpointer.save))
    figures = {}
    for every in (0, 3):  # 30 steps in one epoch: a save every 3 steps, the last at step 27
        wall.clear()
        out = tmp_path / f"save{every}"
        run(load_config(None, [*FAST, "train.max_steps=30", f"train.save_every={every}", f"output_dir={out}",
                                     f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))
        figures[every] = json.loads((out / "metrics.json").read_text())
    plain, saving = figures[0], figures[3]
    shown = {k: (plain[k], saving[k]) for k in (names.SAMPLES_PER_S, names.TRAIN_TIME)} | wall
    # the epoch's training time is the epoch less its saves (measured in the same run, so the
    # load of a shared machine cannot tell them apart) ...
    assert saving[names.TRAIN_TIME] == pytest.approx(wall["epoch"] - wall["saves"], rel=0.1), shown
    # ... and saving changes throughput little (jobs one after the other on a busy machine: a loose bound)
    assert 1 / 3 < saving[names.SAMPLES_PER_S] / plain[names.SAMPLES_PER_S] < 3, shown


@pytest.mark.slow
def test_flop_figures_follow_the_batches_really_trained(tmp_path, monkeypatch):
    """With length grouping the first batch is the longest: FLOPs extrapolated from it overstate the
    job. The logged FLOPs must equal the analytic count of every micro-batch the job trained."""
    from pipeline import models
    from pipeline.config import load_config
    from pipeline.job import loop as job_loop
    from pipeline.job.run import run

    shapes, lengths = [], []
    real_forward_backward = job_loop.forward_backward

    def recording(s, batch, *args):
        shapes.append(tuple(batch["input_ids"].shape))
        lengths.extend(batch["attention_mask"].sum(1).tolist())
        return real_forward_backward(s, batch, *args)

    monkeypatch.setattr(job_loop, "forward_backward", recording)
    out = tmp_path / "out"
    figures = run(load_config(None, [*FAST, "train.max_steps=8", "train.batch_size=8",
                                           "train.group_by_length=true", f"output_dir={out}",
                                           f"tracking.uri=sqlite:///{tracking_db(tmp_path)}"]))

    tiny = models.PRESETS["bangla-tiny"]
    assert tiny["intermediate_size"] == 4 * tiny["hidden_size"]
    def analytic(rows, length):
        return bert_training_flops(rows, length, tiny["hidden_size"], tiny["num_hidden_layers"], 3)

    padded = sum(analytic(rows, length) for rows, length in shapes)
    real = sum(analytic(1, n) for n in lengths)  # each row at its own length
    assert len({length for _, length in shapes}) > 2  # mixed lengths, the first the longest
    assert shapes[0][1] == max(length for _, length in shapes)
    assert real < padded
    seconds = figures[names.TRAIN_TIME]
    assert figures[names.FLOPS_PER_SAMPLE] * len(lengths) == pytest.approx(real, rel=1e-6)
    assert figures[names.TFLOPS] == pytest.approx(real / seconds / 1e12, rel=1e-6)
    assert figures[names.TFLOPS_PADDED] == pytest.approx(padded / seconds / 1e12, rel=1e-6)
