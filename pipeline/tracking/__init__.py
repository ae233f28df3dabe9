"""One MLflow run per job, created by global rank 0 only, plus a local journal of every
figure in the run's output directory, written as it is produced.

If the tracking server cannot be reached (at start or mid-run) training goes on: the journal
keeps everything, and `python -m pipeline sync RUN_DIR` uploads it later. A job that fails,
even because the journal itself cannot be written, ends its run FAILED (or KILLED).

store: the tracking URI and the MLflow client; journal: the record types and their file;
sink: records into an MLflow run; tracker: live logging; start_block: the lines a job starts
with; stage_run: a stage's run as a job opens it; stage_outputs:
what a finished stage leaves in output_dir; console: a logged step's line in a batch job's
log; replay: `pipeline sync`, replaying a journal, and catch_up, which replays a finished job's
journal where the store lacks part of it.

May import: the layers below it (errors ... tasks, config, runtime, parts, measure, data, models,
evaluation, kd); never plan, stage, train, jobs, report, study or the CLI.

Inside, lowest first: console journal served_model start_block store | sink | replay tracker | metrics
stage_outputs stage_run
"""
from pipeline.tracking.journal import JOURNAL, read_journal
from pipeline.tracking.replay import CaughtUp, catch_up, settle_abandoned_run, sync
from pipeline.tracking.sink import dataset_inputs
from pipeline.tracking.stage_run import StageRun, start_stage_run, what_ran
from pipeline.tracking.store import open_client, open_experiment, resolve_uri, safe_params
from pipeline.tracking.tracker import Tracker

__all__ = ["JOURNAL", "CaughtUp", "StageRun", "Tracker", "catch_up", "dataset_inputs", "open_client",
           "open_experiment", "read_journal", "resolve_uri", "safe_params",
           "settle_abandoned_run", "start_stage_run", "sync", "what_ran"]
