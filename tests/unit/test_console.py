"""A batch job can be followed by its log: without a terminal, rank 0 prints a line per logged step
with the figures its MLflow step metrics get; the window's throughput is that of the steps since the
previous logged step (a new epoch's meter counts from its own start)."""
import logging
from types import SimpleNamespace

import pytest
import torch

from pipeline import names
from pipeline.job.records.console import StepLines, step_line


def test_a_step_line_shows_every_figure_it_has_and_leaves_out_the_others():
    metrics = {names.TRAIN_EPOCH: 1.4, names.TRAIN_LOSS: 0.693147, names.TRAIN_LR: 2.96e-4,
               names.TRAIN_SAMPLES_PER_S: 45.31, names.TRAIN_TOKENS_PER_S: 5812.4, names.TRAIN_MFU: 0.3121,
               names.TRAIN_PEAK_MEM: 1234.4, names.TRAIN_GRAD_NORM: 1.0}
    assert step_line(120, 900, metrics, elapsed=130, eta=845.2) == (
        "step 120/900 (13%)  epoch 1.40  loss 0.6931  lr 2.96e-04  45.3 samples/s  5812 tokens/s  MFU 31.2%  "
        "peak 1234 MB  elapsed 0:02:10  ETA 0:14:05")
    cpu = {names.TRAIN_LOSS: 0.5, names.TRAIN_SAMPLES_PER_S: 10.0, names.TRAIN_MFU: None}
    assert step_line(900, 900, cpu, elapsed=3725, eta=0) == (
        "step 900/900 (100%)  loss 0.5000  10.0 samples/s  elapsed 1:02:05  ETA 0:00:00")


def test_a_distillation_step_line_shows_each_term_of_the_loss_in_the_registrys_order():
    terms = {names.train_loss_term(t): v for t, v in (("kd", 0.685), ("attention", 0.0312), ("task", 0.70123),
                                                      ("hidden", 0.25))}
    line = step_line(12, 90, {names.TRAIN_LOSS: 0.693147, **terms, names.TRAIN_LR: 1e-4}, elapsed=10, eta=None)
    assert line == ("step 12/90 (13%)  loss 0.6931 (task 0.7012 kd 0.6850 hidden 0.2500 attention 0.0312)  "
                    "lr 1.00e-04  elapsed 0:00:10")


class Meter:
    def __init__(self):
        self.samples = self.tokens = 0
        self.seconds = 0.0

    def running_seconds(self):
        return self.seconds


def meters(world_size=2, peak_tflops=None):
    return SimpleNamespace(throughput=Meter(), flops=0.0, world_size=world_size, peak_tflops=peak_tflops,
                           flop_model=object(), device=torch.device("cpu"))


def test_the_window_is_since_the_previous_logged_step_and_a_new_epoch_starts_a_new_one():
    m = meters(peak_tflops=100.0)
    lines = StepLines(m, total_steps=100, log_every=10, is_main=True, tty=False)
    m.throughput.samples, m.throughput.tokens, m.throughput.seconds, m.flops = 40, 4000, 2.0, 4e14
    first = lines.step_figures()
    assert first[names.TRAIN_SAMPLES_PER_S] == pytest.approx(40)  # 20/s on each of 2 ranks
    assert first[names.TRAIN_TOKENS_PER_S] == pytest.approx(4000)
    assert first[names.TRAIN_MFU] == pytest.approx(2.0)  # 200 TFLOP/s on a 100 TFLOP/s device
    assert first[names.TRAIN_PEAK_MEM] > 0
    m.throughput.samples, m.throughput.seconds = 60, 4.0
    assert lines.step_figures()[names.TRAIN_SAMPLES_PER_S] == pytest.approx(20)  # 20 more samples in 2 s
    m.throughput = Meter()  # the next epoch's
    m.throughput.samples, m.throughput.seconds = 10, 1.0
    assert lines.step_figures()[names.TRAIN_SAMPLES_PER_S] == pytest.approx(20)
    assert names.TRAIN_MFU not in StepLines(meters(), 100, 10, True, tty=False).step_figures()  # no known peak


@pytest.mark.parametrize("is_main, tty, printed", [(True, False, True), (True, True, False), (False, False, False)])
def test_only_rank_0_without_a_terminal_prints(caplog, is_main, tty, printed):
    caplog.set_level(logging.INFO, logger="pipeline")
    lines = StepLines(meters(), total_steps=20, log_every=10, is_main=is_main, tty=tty)
    for step in (10, 20):
        lines.show(step, {names.TRAIN_LOSS: 0.25})
    shown = [r.getMessage() for r in caplog.records]
    assert len(shown) == (2 if printed else 0)
    if printed:
        assert shown[0].startswith("step 10/20 (50%)  loss 0.2500  elapsed 0:00:00  ETA 0:00:00")


def test_the_eta_is_at_this_processs_pace_from_the_first_line(caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    clock = iter([100.0, 110.0, 130.0])  # the loop starts; steps 10 and 20 are logged
    lines = StepLines(meters(), total_steps=100, log_every=10, is_main=True, tty=False, clock=lambda: next(clock))
    lines.show(10, {})  # 10 steps in 10 s: 90 to go
    lines.show(20, {})  # then 10 steps in 20 s: 80 to go at 2 s a step
    shown = [r.getMessage() for r in caplog.records]
    assert shown == ["step 10/100 (10%)  elapsed 0:00:10  ETA 0:01:30",
                     "step 20/100 (20%)  elapsed 0:00:30  ETA 0:02:40"]
