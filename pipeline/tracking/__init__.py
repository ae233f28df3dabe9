"""One MLflow run per job, created by global rank 0 only, plus a local journal of every
figure in the run's output directory, written as it is produced.

If the tracking server cannot be reached (at start or mid-run) training goes on: the journal
keeps everything, and `python -m pipeline sync RUN_DIR` uploads it later. A job that fails,
even because the journal itself cannot be written, ends its run FAILED (or KILLED).

store: the tracking URI and the MLflow client; journal: the records and their file;
sink: records into an MLflow run; tracker: live logging; replay: `pipeline sync`, replaying a
journal, and catch_up, which replays a finished job's journal where the store lacks part of it;
finished_stage: a finished stage read back from its output_dir (its job record's settled config,
its task, best model and splits), for export, the served model, the model card and the report;
served_model: the registered model a finished stage serves as; model_card: a best model's README;
ui: the MLflow UI's pages and server settings. What only a job writes is job/records/.

May import: the layers below it (errors ... tasks, config, runtime, measure, data, models,
evaluation, kd); never the job, report, study or the CLI.

Inside, lowest first: finished_stage journal | model_card store | served_model sink ui | replay tracker
"""
from pipeline.tracking.journal import JOURNAL, read_journal
from pipeline.tracking.replay import catch_up, settle_abandoned_run, sync, unfinished_run
from pipeline.tracking.sink import dataset_inputs
from pipeline.tracking.store import open_client, open_experiment, resolve_uri, safe_params
from pipeline.tracking.tracker import Tracker

__all__ = ["JOURNAL", "Tracker", "catch_up", "dataset_inputs", "open_client",
           "open_experiment", "read_journal", "resolve_uri", "safe_params",
           "settle_abandoned_run", "sync", "unfinished_run"]
