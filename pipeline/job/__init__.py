"""A job: one `train` or `distill` run into one output_dir, read top to bottom in run.py
(`run(cfg, kind)`: settle, decide, build, fit the batch, confirm, lock, open the run, fit, end).

plan: the settled plan (the world, the precision policy, the task, every derived default, the job's
record a resume compares); resume: the one entry point of the resume decision and an output_dir's
life between jobs; same_job: the comparison resume=auto makes between a checkpoint's job record and
the job asked for; lock: one job per output_dir; stage: the model, data and backend built for the
plan; batch_finder: the largest batch that fits; loop: the training loop, top to bottom; parts/: the
loop's parts, each saving and restoring its own state; records/: what only a job writes (its MLflow
run, start block, metrics, console lines and finished outputs).

May import: everything below it (up to export and tracking); never report, study or the CLI.

Inside, lowest first: lock parts plan records same_job | stage | batch_finder loop resume | run
"""
