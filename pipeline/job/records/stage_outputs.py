"""What a finished stage leaves behind: output_dir's predictions/ (pipeline/predictions.py),
report.txt, best/'s completed model card, metrics.json (last: its presence says the job finished),
each logged to the run with the model (MLflow's transformers flavor) where tracking.log_model
asks; and the closing console line.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pipeline import names, predictions
from pipeline.data.features import examples_digest
from pipeline.fsutil import write_json, write_text
from pipeline.layout import OutputDir
from pipeline.measure.telemetry import StageMeters
from pipeline.tracking.model_card import write_card
from pipeline.tracking.served_model import MODEL_NAME, save_for_logging
from pipeline.tracking.tracker import Tracker

if TYPE_CHECKING:
    from pipeline.evaluation import Evaluation
    from pipeline.tasks.base import Task

log = logging.getLogger("pipeline")


NO_TEST = "No test split (data.test unset beside a given data key): no test figures.\n"
"""report.txt of a job without a test split."""


def announce(meters: StageMeters, final: dict[str, float], main_metric: str, test_main: float | None,
             out: OutputDir) -> None:
    """Rank 0: the job's closing console line (no test score in a job without a test split)."""
    tested = "no test split" if test_main is None else f"test {main_metric} {test_main:.4f}"
    log.info("%s  |  %.1f samples/s over %.1fs of training  |  outputs in %s", tested,
             final[names.SAMPLES_PER_S], meters.totals.train_seconds, out)


def write_predictions(out: OutputDir, task: Task, kept: dict[str, Evaluation], examples: dict, features: dict,
                      model: str, precision: str, seed: int) -> None:
    """Rank 0: predictions/SPLIT.jsonl of each split evaluated with keep=True (`kept`), its header's
    data the split's digest as its MLflow dataset input records it."""
    for split, evaluation in kept.items():
        rows = task.prediction_rows(evaluation.predictions, examples[split], features[split])
        predictions.write(out.predictions_file(split), rows, task=task.name, split=split,
                          labels=task.prediction_labels(), data=examples_digest(examples[split]), model=model,
                          precision=precision, seed=seed)


def write_outputs(tracker: Tracker, out: OutputDir, final: dict[str, float], report: str, step: int, task: Task,
                  examples: list[dict], log_model: bool) -> None:
    """Rank 0: the final metrics and the task's report into output_dir and the run (with best/
    as an MLflow model if `log_model`: the task's serving pipeline, `examples` its input
    example); metrics.json last of all, so its presence says the job finished."""
    write_text(out.report, report)
    if out.trained_model() is not None:  # its card completed: the test scores, the inference figures
        write_card(out.best, out, final)
    saved = log_model and save_for_logging(out, task, examples)
    write_json(out.metrics, final)
    for path in (out.metrics, out.report):
        tracker.log_artifact(path)
    tracker.log_artifact(out.predictions, OutputDir.PREDICTIONS)  # none where the job has neither split
    if saved:
        tracker.log_model(out.mlflow_model, MODEL_NAME, step,  # after the metrics: it links them
                          f"test {task.main_metric} {final[names.TEST_MAIN]:.4f}" if names.TEST_MAIN in final
                          else f"dev {task.main_metric} {final.get(names.EVAL_MAIN, float('nan')):.4f} (no test split)")
    elif log_model:
        tracker.log_artifact(out.best, OutputDir.BEST)


def example_rows(examples: dict) -> list[dict]:
    """A few rows the logged model shows as its input example: the test split's, else dev's, else
    the training split's (a stage's examples by split)."""
    for split in ("test", "dev"):
        if split in examples:
            return examples[split][:5]
    return examples["train"].dataset().select(range(min(5, len(examples["train"])))).to_list()
