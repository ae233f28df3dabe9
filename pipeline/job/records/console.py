"""The console line of a logged step, for a job whose stderr is not a terminal (a batch job under
Slurm, nohup, a container's log), where the progress bar is off: one line every train.log_every
optimizer steps on rank 0, with the figures the step's MLflow metrics get (the window's throughput
is also logged, step_figures). Host numbers only: no device sync of its own (the loss of a logged
step has been read already, so the clock is current)."""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from pipeline import names
from pipeline.kd.registry import TERMS
from pipeline.measure.telemetry import StageMeters, ThroughputMeter, peak_memory

log = logging.getLogger("pipeline")


class StepLines:
    """The window figures of each logged step and, without a TTY on rank 0, its console line."""

    def __init__(self, meters: StageMeters, total_steps: int, log_every: int, is_main: bool, tty: bool | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.meters, self.total_steps, self.log_every, self.clock = meters, total_steps, log_every, clock
        self.enabled = is_main and not (sys.stderr.isatty() if tty is None else tty)
        self._since: tuple[ThroughputMeter, float, float, float, float] | None = None
        self._started = clock()
        self._first: tuple[float, int] | None = None
        """When, and at which step, the first line was shown: the ETA's pace is measured from there."""

    def step_figures(self) -> dict[str, float]:
        """Throughput over the training time since the previous logged step (the epoch's start
        when a new epoch began): samples/s and real tokens/s of every rank (this rank's times the
        world size: the ranks' shards are equal), MFU where the device's peak is known, peak memory."""
        meter, meters = self.meters.throughput, self.meters
        now = (meter.running_seconds(), meter.samples, meter.tokens, meters.flops)
        seconds, samples, tokens, flops = (a - b for a, b in zip(now, self._window_start(meter)))
        self._since = (meter, *now)
        figures = {}
        if seconds > 0:
            figures = {names.TRAIN_SAMPLES_PER_S: samples * meters.world_size / seconds,
                       names.TRAIN_TOKENS_PER_S: tokens * meters.world_size / seconds}
            if meters.peak_tflops and meters.flop_model is not None:
                figures[names.TRAIN_MFU] = flops / seconds / 1e12 / meters.peak_tflops
        memory = peak_memory(meters.device)
        return {**figures, names.TRAIN_PEAK_MEM: next(iter(memory.values()))}

    def _window_start(self, meter: ThroughputMeter) -> tuple[float, float, float, float]:
        if self._since is None or self._since[0] is not meter:  # a new epoch: a new meter from zero
            return 0.0, 0.0, 0.0, 0.0
        return self._since[1:]

    def show(self, step: int, metrics: dict[str, float]) -> None:
        """The line of a logged step (nothing with a TTY, where the bar shows progress, or off rank 0),
        its ETA at this process's pace: since the first line, and for the first line since the loop
        started, over the log_every steps before it (a resumed job may have run fewer)."""
        if not self.enabled:
            return
        now = self.clock()
        since, from_step = self._first or (self._started, max(step - self.log_every, 0))
        if self._first is None:
            self._first = (now, step)
        done = step - from_step
        eta = (now - since) / done * (self.total_steps - step) if done > 0 else None
        log.info("%s", step_line(step, self.total_steps, metrics, now - self._started, eta))


LOSS_TERMS = ("task", *TERMS)
"""The named terms of a distillation step's loss, in the order the console line shows them: the
task loss, then the registry's terms (kd/registry.py)."""


def step_line(step: int, total_steps: int, metrics: dict[str, float], elapsed: float, eta: float | None) -> str:
    """step 120/900 (13%)  epoch 1.40  loss 0.6931 (task 0.7012 kd 0.6850)  lr 2.96e-04  45.3 samples/s
    5812 tokens/s  MFU 31.2%  peak 1234 MB  elapsed 0:02:10  ETA 0:14:05 (a figure not measured is
    left out; the loss's terms, unweighted, where it has them: distillation)."""
    parts = [f"step {step}/{total_steps} ({100 * step / max(total_steps, 1):.0f}%)"]
    terms = " ".join(f"{term} {metrics[names.train_loss_term(term)]:.4f}" for term in LOSS_TERMS
                     if names.train_loss_term(term) in metrics)
    shown = ((names.TRAIN_EPOCH, "epoch {:.2f}"),
             (names.TRAIN_LOSS, "loss {:.4f}" + (f" ({terms})" if terms else "")), (names.TRAIN_LR, "lr {:.2e}"),
             (names.TRAIN_SAMPLES_PER_S, "{:.1f} samples/s"), (names.TRAIN_TOKENS_PER_S, "{:.0f} tokens/s"),
             (names.TRAIN_MFU, "MFU {:.1%}"), (names.TRAIN_PEAK_MEM, "peak {:.0f} MB"))
    parts += [text.format(metrics[key]) for key, text in shown if metrics.get(key) is not None]
    parts.append(f"elapsed {_clock(elapsed)}")
    if eta is not None:
        parts.append(f"ETA {_clock(eta)}")
    return "  ".join(parts)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
