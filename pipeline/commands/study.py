"""`python -m pipeline study STUDY.yaml [--jobs N] [--executor local|slurm] [--dry-run] [--report-only]
[key=value | PROCEDURE:key=value ...]`: a matrix of stages run (pipeline/study/, whose docstring describes
the study file)."""
from __future__ import annotations

import argparse

from pipeline.errors import UserError
from pipeline.study import dry_run, load_study, report_only, run_study


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline study")
    parser.add_argument("study", help="study file (YAML); see launch/studies/")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every cell (after the study file's); "
                        "PROCEDURE:key=value to that procedure's cells alone (teacher:model=bert-base-uncased)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the cells and their commands (with --executor slurm: every sbatch script and its "
                             "dependencies, checked as a submission checks them); run nothing")
    parser.add_argument("--jobs", type=int, default=None,
                        help="cells at once on this node (default: one per visible GPU; 1 without GPUs)")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="local: run the cells here; slurm: submit each cell as a Slurm job (sbatch)")
    parser.add_argument("--report-only", action="store_true",
                        help="record the cells' outcomes from their outputs and write the report; run nothing")
    opts = parser.parse_intermixed_args(args)  # overrides may come before or after the options
    if opts.jobs is not None and opts.jobs < 1:
        raise UserError(f"study: --jobs {opts.jobs}: must be >= 1")
    if opts.jobs is not None and opts.executor == "slurm":
        raise UserError("study: --jobs: with --executor slurm, Slurm decides how many cells run at once")
    study, cells = load_study(opts.study, opts.overrides)
    if opts.dry_run and opts.executor == "slurm":
        from pipeline.study import slurm

        return slurm.dry_run(study, cells, opts.overrides)
    if opts.dry_run:
        return dry_run(study, cells)
    if opts.report_only:
        return report_only(study, cells)
    if opts.executor == "slurm":
        from pipeline.study.slurm import submit_study

        return submit_study(study, cells, opts.overrides)
    return run_study(study, cells, opts.jobs)
