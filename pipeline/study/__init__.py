"""`python -m pipeline study STUDY.yaml [--dry-run] [key=value ...]`: run a matrix of stages.

Every cell of the matrix is one stage (`train` or `distill`) in its own process, started
through its launcher (none, torchrun, deepspeed), logged as a child of the study's one MLflow
parent run, with its outputs in OUTPUT_ROOT/STUDY/CELL. A cell that crashes is recorded (exit
code and last line, on the parent run) and the study goes on; cells that already finished are
skipped, so running a study again resumes it. At the end the comparison report is written.

Study file (YAML):

    name: wikiqa_kd                  # the MLflow experiment; outputs/NAME/CELL, reports/NAME
    config: configs/demo.yaml        # optional base config (relative to the working directory,
                                     # else to the study file)
    overrides: [train.epochs=2]      # every cell; a list of key=value or a mapping
    output_root: outputs             # optional (default outputs)
    report_dir: reports/wikiqa_kd    # optional (default reports/NAME)
    launcher: none                   # none | torchrun | deepspeed, or a mapping:
                                     #   {type: torchrun, nproc: 2, nnodes: 1, rdzv_endpoint: HOST:PORT}
                                     #   {type: deepspeed, nproc: 8, config: ds_configs/zero2.json}
    procedures:                      # name -> stage command, overrides, optional launcher
      teacher:  {command: train, overrides: [model=sentence-transformers/all-MiniLM-L6-v2]}
      kd_fp32:  {command: distill, launcher: {type: torchrun, nproc: 2},
                 overrides: [precision=fp32, model=from_teacher:3, "kd.teacher=${teacher.output_dir}"]}
    matrix:                          # one block, or a list of blocks (their union)
      tasks: [wikiqa]                # each axis is optional: a list of values, or a mapping
      models: [...]                  #   value -> overrides for that value (per-task settings)
      precisions: [fp32, auto]
      procedures: [teacher, kd_fp32] # names from `procedures`; absent = one `train` stage
      seeds: [1, 2]
      overrides: [...]               # this block's cells only

`${PROC.output_dir}` in a cell's overrides is the output directory of the cell of procedure
PROC in the same block with the same task, model, precision and seed; that cell runs first,
and if it failed the dependent cell is recorded as failed without running.

Overrides apply in this order (a later one wins): config file, study overrides, block
overrides, task, model, precision, seed, procedure, launcher (backend=deepspeed ...),
command-line overrides, and last the runner's own (output_dir, tracking.*).

Which report table a cell feeds: the AMP table (FP32 vs AMP per task x model) when its block
has two or more precisions; the KD table (per procedure) when its block has a procedures axis.
"""
from __future__ import annotations

import argparse

from pipeline.study.parser import load_study
from pipeline.study.runner import dry_run, run_study

__all__ = ["main", "load_study", "dry_run", "run_study"]


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline study")
    parser.add_argument("study", help="study file (YAML); see launch/studies/")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every cell (after the study file's)")
    parser.add_argument("--dry-run", action="store_true", help="print the cells and their commands; run nothing")
    opts = parser.parse_intermixed_args(args)  # overrides may come before or after --dry-run
    study, cells = load_study(opts.study, opts.overrides)
    if opts.dry_run:
        return dry_run(study, cells)
    return run_study(study, cells)
