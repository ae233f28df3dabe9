"""When the loop's numbers are logged, and every record they become (torchtitan's MetricsProcessor).

The loop hands it figures by name: after each optimizer step, at each epoch's end, at the job's
end. It decides when a step is logged (every train.log_every steps and the last one) and logs:
the MLflow metrics through the Tracker (which journals them first) and the console lines (a
logged step's: console.py). What a finished stage leaves in output_dir is stage_outputs.py's.
pipeline/names.py spells every name.
"""
from __future__ import annotations

import logging

from pipeline import names
from pipeline.fsutil import write_json
from pipeline.job.records.console import StepLines
from pipeline.layout import OutputDir
from pipeline.measure.telemetry import StageMeters
from pipeline.tracking.tracker import Tracker

log = logging.getLogger("pipeline")


class MetricsProcessor:
    """The records of one stage's run; every method is called on every rank (rank 0 writes)."""

    def __init__(self, tracker: Tracker, meters: StageMeters, log_every: int, total_steps: int, is_main: bool):
        self.tracker, self.meters = tracker, meters
        self.log_every, self.total_steps, self.is_main = log_every, total_steps, is_main
        self.console = StepLines(meters, total_steps, log_every, is_main)

    def begin(self, out: OutputDir, files: dict[str, dict], tags: dict[str, str], datasets: list[dict]) -> None:
        """Collective, as the loop starts: the run's `tags` and its energy_available tag (does any
        rank measure energy? the report tells a missing figure from a zero by it), its `datasets`
        (MLflow dataset inputs); rank 0 writes `files` (the backend's, e.g. the resolved DeepSpeed
        config) into output_dir and the run."""
        available = self.meters.energy_available_anywhere()
        self.tracker.set_tags({**tags, names.TAG_ENERGY_AVAILABLE: "true" if available else "false"})
        self.tracker.log_datasets(datasets)
        if self.is_main:
            for name, content in files.items():
                write_json(out / name, content)
                self.tracker.log_artifact(out / name)

    def should_log(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.total_steps

    def log_step(self, step: int, figures: dict[str, float]) -> None:
        """A logged step: the loop's `figures` by name (the window's losses and their terms, the
        learning rate, the gradient norm, the epoch's progress, AMP health) with the window's
        throughput; to MLflow and, without a TTY, the console."""
        self.meters.check_compiles()
        metrics = {**figures, **self.console.step_figures()}
        self.tracker.log_metrics(metrics, step)
        self.console.show(step, metrics)

    def log_epoch(self, step: int, figures: dict[str, float], epoch: int, epochs: int, main_metric: str) -> None:
        """The epoch's `figures` by name (the meters', its mean loss, AMP health, its dev scores unless
        log_dev logged them at this step) and its console line."""
        self.tracker.log_metrics(figures, step)
        if self.is_main:
            dev = figures.get(names.eval_metric("main"))
            shown = f"  dev {main_metric} {dev:.4f}" if dev is not None else ""
            log.info("epoch %d/%d  step %d  loss %.4f%s  %.1f samples/s  %.1fs", epoch + 1, epochs, step,
                     figures[names.TRAIN_EPOCH_LOSS], shown, figures[names.SAMPLES_PER_S], figures[names.EPOCH_TIME])

    def log_dev(self, step: int, figures: dict[str, float], main_metric: str) -> None:
        """A dev evaluation between an epoch's steps (train.eval_every): its `figures` by name (eval/*)
        and its console line."""
        self.tracker.log_metrics(figures, step)
        if self.is_main:
            log.info("step %d  dev %s %.4f", step, main_metric, figures[names.eval_metric("main")])

    def log_final(self, step: int, figures: dict[str, float | None], tags: dict[str, str]) -> dict[str, float]:
        """The job's final `figures` by name (None: not measured, left out) to MLflow, the eval/ ones
        excepted (logged at their epoch), and the run's `tags` about them; gives the figures back."""
        self.tracker.set_tags(tags)
        final = {k: v for k, v in figures.items() if v is not None}
        self.tracker.log_metrics({k: v for k, v in final.items() if not k.startswith(names.EVAL)}, step)
        return final
