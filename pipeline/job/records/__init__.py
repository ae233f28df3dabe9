"""What only a job writes: its MLflow run as the job opens it (stage_run), the lines it starts with
(start_block), its figures as the loop produces them (metrics: the MetricsProcessor), a logged
step's line in a batch job's log (console), and what a finished job leaves in output_dir
(stage_outputs). What the job shares with export, study, report and ui is tracking/'s.

May import: the layers below the job (errors ... tracking).

Inside, lowest first: console stage_outputs stage_run start_block | metrics
"""
