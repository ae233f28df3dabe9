"""What a job is, decided once: the settled plan (settle: the world, the precision policy, the
task, every derived default, and the job's record a resume compares).

May import: everything below it (up to tracking); never stage, train, jobs, report, study or the CLI.
"""
