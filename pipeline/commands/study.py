"""`python -m pipeline study STUDY.yaml [--jobs N] [--executor local|slurm] [--dry-run] [--report-only]
[--no-timing] [--space KEY=KIND:A:B ... --trials N ...] [key=value | PROCEDURE:key=value | slurm.KEY=VALUE ...]`:
a matrix of stages run (pipeline/study/, whose docstring describes the study file), or a search over it
(pipeline/study/search.py)."""
from __future__ import annotations

import argparse

from pipeline.errors import UserError
from pipeline.study import dry_run, load_study, report_only, run_study
from pipeline.study.search_spec import from_options


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline study")
    parser.add_argument("study", help="study file (YAML); see launch/studies/")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every cell (after the study file's); "
                        "PROCEDURE:key=value to that procedure's cells alone (teacher:model=bert-base-uncased); "
                        "slurm.KEY=VALUE: the study's slurm settings, over its file's (slurm.partition=gpu)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the cells and their commands (with --executor slurm: every sbatch script and its "
                             "dependencies, checked as a submission checks them); run nothing")
    parser.add_argument("--jobs", type=int, default=None,
                        help="cells at once on this node (default: one per visible GPU; 1 without GPUs); a search "
                             "under --executor slurm: its trials' jobs at once (default 4)")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local",
                        help="local: run the cells here; slurm: submit each cell as a Slurm job (sbatch)")
    parser.add_argument("--report-only", action="store_true",
                        help="record the cells' outcomes from their outputs and write the report; run nothing")
    parser.add_argument("--no-timing", action="store_true",
                        help="write the report without timing models side by side (as report --no-timing)")
    search = parser.add_argument_group("search (over the study file's search block: pipeline/study/search_spec.py)")
    search.add_argument("--space", action="append", default=[], metavar="KEY=KIND:A:B",
                        help="a searched config key: log_uniform:1e-5:1e-3, uniform:0.1:0.9, int:2:6, "
                             "categorical:16,32 (repeat per key; replaces the file's space)")
    search.add_argument("--trials", type=int, help="trials per searched cell")
    search.add_argument("--objective", help="the metric to optimise, METRIC[:max|min] (default eval/main:max)")
    search.add_argument("--sampler", help="tpe | random | cmaes | qmc (default tpe; grid: in the study file)")
    search.add_argument("--pruner", help="median | percentile | hyperband | successive_halving | none (default median)")
    search.add_argument("--timeout-s", type=float, help="ask no trial after this many seconds")
    search.add_argument("--storage", help="Optuna's database URL (default sqlite in OUTPUT_ROOT/NAME/optuna.db)")
    opts = parser.parse_intermixed_args(args)  # overrides may come before or after the options
    if opts.jobs is not None and opts.jobs < 1:
        raise UserError(f"study: --jobs {opts.jobs}: must be >= 1")
    for item in opts.space:
        if "=" not in item or item.startswith("="):
            raise UserError(f"study: --space {item}: expected KEY=KIND:LOW:HIGH or KEY=categorical:A,B")
    searched = from_options(opts.space, opts.trials, opts.objective, opts.pruner, opts.sampler, opts.timeout_s,
                            opts.storage)
    study, cells = load_study(opts.study, opts.overrides, searched)
    study.timing = not opts.no_timing
    if opts.jobs is not None and opts.executor == "slurm" and not study.search:
        raise UserError("study: --jobs: with --executor slurm, Slurm decides how many cells run at once")
    if study.search:
        from pipeline.study.search import dry_run_search, report_search, run_search

        if opts.dry_run:
            return dry_run_search(study, cells)
        if opts.report_only:
            return report_search(study, cells)
        return run_search(study, cells, opts.jobs, opts.executor)  # under slurm: --jobs trials in flight
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
