"""Jobs and their output directories: a job settled once into a typed plan (settle), its record
(job_record) and the comparison resume=auto makes with a checkpoint's (same_job), the one entry
point of the resume decision (resume), the lock that keeps two jobs out of one output_dir (lock),
and an output_dir's life between jobs (outputs).

May import: everything below it (up to tracking); never stage, train, report, study or the CLI.
"""
