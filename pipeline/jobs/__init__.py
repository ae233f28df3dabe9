"""A job and its output directory: the one function that runs a stage as a job, build-train-close
(run: what the CLI calls), the lock that keeps two jobs out of one output_dir (lock), the one
entry point of the resume decision and an output_dir's life between jobs, the refusal of a job
that would start over on another job's work among them (resume), and the comparison resume=auto
makes between a checkpoint's job record and the job asked for (same_job).
The plan a job runs by is pipeline/plan/'s; the loop, pipeline/train.py.

May import: everything below it (up to train); never report, study or the CLI.

Inside, lowest first: lock same_job | resume | run
"""
