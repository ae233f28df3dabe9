"""The layout of an output_dir: every file and folder name a job writes there, in one place.

OUTPUT_DIR/
  .lock               one job at a time (job/lock.py)
  config.yaml         the config as the job resolved it (job/records/stage_run.py)
  job.json            what the job trains with (job_record.py), for a resume=auto once it finished
                      and for whatever reads the stage back (tracking/finished_stage.py)
  journal.jsonl       every param, tag, metric and artifact as produced (tracking/journal.py);
  journal.abandoned-STAMP.jsonl   a previous job's journal its store could not take
  checkpoints/step-NNNNNNNN/      (job/parts/checkpoint.py; CheckpointFiles below)
  best/               the best model, a Hugging Face model directory in fp32 (job/parts/best_model.py)
  mlflow_model/       best/ as an MLflow transformers-flavor model (tracking.log_model; tracking/served_model.py)
  metrics.json        the final metrics, written last: its presence says the job finished
  stop.request        written by a search study that prunes the job: it ends at its next evaluation
                      as an early stop does (tested, metrics.json written)
  export/             best/ exported for serving (`python -m pipeline export`: pipeline/export/stage_export.py);
                      export/check.json, written with it, says it was checked
  report.txt          the task's report on the test split
  predictions/        dev.jsonl, test.jsonl: the best model's prediction of every row of each split
                      the job has (pipeline/predictions.py holds the format)
  deepspeed_config.json   the resolved DeepSpeed config (under DeepSpeed)

Imports nothing of the pipeline: every layer may use it.
"""
from __future__ import annotations

import time
from pathlib import Path


class CheckpointFiles:
    """The names inside one checkpoint directory."""

    STATE = "state.pt"
    """Every part of the loop's state by name (checkpoint.collect), rank 0."""
    JOB = "job.json"
    """What the job trains with, compared by a resume before anything else is loaded."""
    BACKEND = "backend.pt"
    """The torch backend's model, optimizer and loss scaler."""
    ENGINE = "engine"
    """DeepSpeed's own checkpoint tag (a folder)."""
    MANIFEST = "manifest.json"
    """sha256 of every file, written last."""
    BEST = "best.safetensors"
    """best/'s weights as the checkpoint was saved (a hard link where the filesystem has them): a
    resume restores the best model of its own step, whatever best/ became after it."""

    @staticmethod
    def rng(rank: int) -> str:
        return f"rng-rank{rank}.pt"


class OutputDir:
    """A job's output directory: the path of everything it holds."""

    LOCK = ".lock"
    CONFIG = "config.yaml"
    JOB = CheckpointFiles.JOB
    """The same record as in each checkpoint: the job once it finished."""
    JOURNAL = "journal.jsonl"
    CHECKPOINTS = "checkpoints"
    BEST = "best"
    MLFLOW_MODEL = "mlflow_model"
    METRICS = "metrics.json"
    REPORT = "report.txt"
    DEEPSPEED_CONFIG = "deepspeed_config.json"
    EXPORT = "export"
    EXPORT_CHECK = "check.json"
    STOP_REQUEST = "stop.request"
    PREDICTIONS = "predictions"
    PREVIOUS_JOB = (CHECKPOINTS, BEST, MLFLOW_MODEL, METRICS, REPORT, PREDICTIONS, STOP_REQUEST)
    """What a job that starts over removes, so nothing of two jobs mixes (the journal is settled)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    def __str__(self) -> str:
        return str(self.root)

    def __fspath__(self) -> str:  # open(), Path() and os functions take it as they take its root
        return str(self.root)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    @property
    def lock(self) -> Path:
        return self.root / self.LOCK

    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def job(self) -> Path:
        return self.root / self.JOB

    @property
    def journal(self) -> Path:
        return self.root / self.JOURNAL

    def abandoned_journal(self) -> Path:
        """Where a previous job's journal goes when its store cannot take it (`pipeline sync FILE`)."""
        return self.root / f"journal.abandoned-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:08d}"

    def checkpoint_in_progress(self, step: int) -> Path:
        """A save's temporary directory, renamed to checkpoint(step) when complete."""
        return self.checkpoints / f".step-{step:08d}.tmp"

    def checkpoints_in_progress(self) -> list[Path]:
        return sorted(self.checkpoints.glob(".step-*.tmp")) if self.checkpoints.is_dir() else []

    def checkpoint_dirs(self) -> list[Path]:
        return sorted(self.checkpoints.glob("step-*")) if self.checkpoints.is_dir() else []

    @property
    def best(self) -> Path:
        return self.root / self.BEST

    @property
    def best_weights(self) -> Path:
        """The weights file of best/ (save_pretrained's safetensors)."""
        return self.best / "model.safetensors"

    def trained_model(self) -> Path | None:
        """best/ if a job has written its model there (a Hugging Face model directory), else None."""
        return self.best if (self.best / "config.json").is_file() else None

    @property
    def mlflow_model(self) -> Path:
        return self.root / self.MLFLOW_MODEL

    @property
    def export(self) -> Path:
        return self.root / self.EXPORT

    @property
    def export_check(self) -> Path:
        return self.export / self.EXPORT_CHECK

    @property
    def stop_request(self) -> Path:
        return self.root / self.STOP_REQUEST

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def report(self) -> Path:
        return self.root / self.REPORT

    @property
    def predictions(self) -> Path:
        return self.root / self.PREDICTIONS

    def predictions_file(self, split: str) -> Path:
        return self.predictions / f"{split}.jsonl"
