"""A study: a matrix of stages run as processes (`python -m pipeline study STUDY.yaml [--jobs N]
[--executor local|slurm] [--dry-run] [key=value | PROCEDURE:key=value ...]`, pipeline/commands/study.py).

Every cell of the matrix is one stage (`train` or `distill`) in its own process, started
through its launcher (none, torchrun, deepspeed), logged as a child of the study's one MLflow
parent run, with its outputs in OUTPUT_ROOT/STUDY/CELL. A cell that crashes is recorded (exit
code and last line, on the parent run and beside its log: study/cell_end.py, which `--report-only`
reads back) and the study goes on; cells that already finished are skipped, so running a study
again resumes it. At the end the comparison report is written.

`--jobs N` runs up to N ready cells at once on this node (default: one per visible GPU, one on
a machine without GPUs), each on GPUs of its own (`CUDA_VISIBLE_DEVICES`: one for a
single-process cell, nproc for a torchrun or deepspeed cell); the cells then track through one
MLflow server on the study's sqlite store. `--executor slurm` submits each cell as a Slurm job
instead (`slurm` in the study file), and a last job that writes the report (`--report-only`).

Study file (YAML):

    name: wikiqa_kd                  # the MLflow experiment; outputs/NAME/CELL, reports/NAME
    config: configs/demo.yaml        # optional base config (relative to the working directory,
                                     # else to the study file)
    overrides: [train.epochs=2]      # every cell; a list of key=value or a mapping
    output_root: outputs             # optional (default outputs)
    report_dir: reports/wikiqa_kd    # optional (default reports/NAME)
    slurm:                           # --executor slurm only: what each cell's job asks for
      partition: gpu                 #   required there
      time: "04:00:00"               #   a cell's time limit (quoted: YAML reads 4:00:00 as a number)
      account: proj1                 #   optional: account, qos, cpus_per_task, mem, extra: [--constraint=h100]
      gpus_per_node: 8               #   GPUs of a cell whose nproc is auto/gpu (others: their nproc); 0: CPU jobs
                                     # each also slurm.KEY=VALUE on the command line, over the file's
    launcher: none                   # none | torchrun | deepspeed, or a mapping:
                                     #   {type: torchrun, nproc: 2, nnodes: 1, rdzv_endpoint: HOST:PORT}
                                     #   {type: deepspeed, nproc: 8, config: ds_configs/zero2.json}
    procedures:                      # name -> stage command, overrides, optional launcher
      teacher:  {command: train, overrides: [model=sentence-transformers/all-MiniLM-L6-v2]}
      kd_fp32:  {command: distill, launcher: {type: torchrun, nproc: 2},
                 overrides: [precision=fp32, model=from_teacher:3, "kd.teacher=${teacher.output_dir}"],
                 export: {int8: true}}  # optional: then `pipeline export OUTPUT_DIR --check --int8`
    matrix:                          # one block, or a list of blocks (their union)
      tasks: [wikiqa]                # each axis is optional: a list of values, or a mapping
      models: [...]                  #   value -> overrides for that value (per-task settings)
      precisions: [fp32, auto]
      procedures: [teacher, kd_fp32] # names from `procedures`; absent = one `train` stage
      seeds: [1, 2]
      overrides: [...]               # this block's cells only

A `search:` block makes it a hyperparameter search (study/search_spec.py describes the block;
study/search.py how it runs): each group of cells that differ only in their seed is searched with
Optuna, every trial one cell; the best trial is re-run with the other seeds.

A procedure with `export` (true, or {int8: true, trim_vocab: true}) runs `python -m pipeline export
OUTPUT_DIR --check` (with --int8, --trim-vocab) in the cell's slot once its stage finished; the cell
is done once its export/check.json is there (a study run again runs only a missing export). The
Slurm executor does not run it. Post-stage steps are a list (spec.POST_STAGE, parser.STEP_OPTIONS)
the runner walks in the cell's slot.

`${PROC.output_dir}` in a cell's overrides is the output directory of the cell of procedure
PROC in the same block with the same task, model, precision and seed; that cell runs first,
and if it failed the dependent cell is recorded as failed without running.

Overrides apply in this order (a later one wins): config file, study overrides, block
overrides, task, model, precision, seed, procedure, launcher (backend=deepspeed ...),
command-line overrides (key=value: every cell; PROCEDURE:key=value: that procedure's cells, e.g.
`teacher:model=bert-base-uncased` changes the teacher and not its students), and last the
runner's own (output_dir, tracking.*).

Which report table a cell feeds: the AMP table (FP32 vs AMP per task x model) when its block's
precisions include fp32 and one compared with it; the KD table (per procedure) when its block has
a procedure that distills; a cell under train.memory_limit_mb feeds the memory ceiling alone.

May import: config, runtime.world, runtime.preemption, runtime.precision, tasks, models and measure.flops
(a dry run's checks and estimate: configs and the Hugging Face cache, never weights), names, tracking,
report, ui, optuna: a study starts stages as processes and never imports the loop (stage, train).

A dry run ends with what this machine lacks for the cells (readiness.py: data files, the hub, a
device for their precision) and an estimate of their time here (estimate.py), preflight.py both.

Where a cell runs is one seam, study/executor.py: start a cell -> a handle to poll, wait on and
stop; executor.start_local runs it on this node's slots (the runner's cells, a search's trials),
slurm_job.start_slurm submits it as a Slurm job (a search's trials under --executor slurm).

Inside, lowest first: cell_process champion objective spec store_server | cell_end search_spec devices matrix
readiness | estimate executor search_plan | preflight slurm_job parser schedule | runner | slurm | trial_pool | search
"""
from __future__ import annotations

from pipeline.study.parser import load_study
from pipeline.study.runner import dry_run, report_only, run_study

__all__ = ["load_study", "dry_run", "report_only", "run_study"]
