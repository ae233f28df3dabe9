"""`python -m pipeline COMMAND ...`; works under `torchrun -m` and `deepspeed --module`.

Exit codes: 0 done; 2 the user's input is wrong (one line on stderr); 1 anything else (a full
disk among them, also one line: it is the environment that failed, and what helps is the same
as for any failure: fix it, run again with resume=auto); 143 stopped by SIGTERM.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from pipeline.errors import MachineError, UserError
from pipeline.runtime import gc_pause

HELP = {"-h", "--help"}
USAGE = """usage:
  python -m pipeline train   [CONFIG.yaml] [key=value ...]   one training stage
  python -m pipeline distill [CONFIG.yaml] [key=value ...]   one knowledge-distillation stage
  python -m pipeline study STUDY.yaml [--jobs N] [k=v ...]   run a matrix of stages, then the report
  python -m pipeline report --experiment NAME [--out DIR]    tables and charts of a study's runs
  python -m pipeline ui [--experiment NAME] [--host H]       MLflow UI on the tracking store
  python -m pipeline sync RUN_DIR|FILE.jsonl [--uri URI]    upload a run's journal to MLflow
  python -m pipeline infer-bench MODEL [MODEL ...] [--json]  what models cost to serve here, side by side
  python -m pipeline config-reference                        every config key as Markdown (docs/configuration.md)
  python -m pipeline COMMAND --help                          a command's arguments; train's and distill's
                                                             list every config key, its default and meaning
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = _strip_local_rank(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    _quiet_libraries()
    if not argv or argv[0] in HELP:
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("train", "distill") and HELP.intersection(rest):
        return _stage_help(command)
    if command not in ("train", "distill"):  # a stage turns it on once set up; the others now
        gc_pause.resume_after_setup()
    try:
        if command in ("train", "distill"):
            return _stage(command, rest)
        if command == "sync":
            return _sync(rest)
        if command == "infer-bench":
            return _infer_bench(rest)
        if command == "config-reference":
            return _config_reference(rest)
        if command == "ui":
            from pipeline import ui

            return ui.main(rest)
        if command == "study":
            from pipeline import study

            return study.main(rest)
        if command == "report":
            from pipeline import report

            return report.main(rest)
        raise UserError(f"unknown command {command!r}\n{USAGE}".splitlines()[0])
    except UserError as e:
        if rank == 0:  # every rank hits the same check; one line is enough
            print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        full = str(e) if isinstance(e, MachineError) else _disk_full(e)
        if full is not None:  # the environment failed, not the input: exit 1, but one line
            if rank == 0:
                print(f"error: {full}", file=sys.stderr)
            return 1
        from pipeline.train import Preempted

        if not isinstance(e, Preempted):
            raise
        logging.getLogger("pipeline").warning("preempted: %s; continue with resume=auto", e)
        return 143  # 128 + SIGTERM, what schedulers expect of a job that stopped on TERM


def _stage(command: str, args: list[str]) -> int:
    from pipeline.config import load_config

    config_path = None
    if args and "=" not in args[0]:
        config_path, args = args[0], args[1:]
    for a in args:
        if "=" not in a:
            raise UserError(f"argument {a!r}: expected key=value (a config file goes first)")
    cfg = load_config(config_path, args)
    from pipeline.jobs.run import run

    run(cfg, kind=command)
    return 0


def _stage_help(command: str) -> int:
    """Usage and every config key; before the collector and the config, as asking must not fail."""
    from pipeline.config import reference

    print(reference.help_text(command), end="")
    return 0


def _config_reference(args: list[str]) -> int:
    from pipeline.config import reference

    if HELP.intersection(args):
        print(f"usage: python -m pipeline config-reference\n\nPrints {reference.PAGE} (Markdown); "
              f"regenerate the page with: {reference.REGENERATE}")
        return 0
    if args:
        raise UserError(f"config-reference: takes no arguments (got {' '.join(args)})")
    print(reference.markdown(), end="")
    return 0


def _sync(args: list[str]) -> int:
    from pipeline.tracking import sync

    parser = argparse.ArgumentParser(prog="python -m pipeline sync")
    parser.add_argument("run_dir", help="a stage's output_dir (it holds journal.jsonl)")
    parser.add_argument("--uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else the journal's)")
    opts = parser.parse_args(args)
    run_id = sync(opts.run_dir, opts.uri)
    print(f"synced {opts.run_dir} into MLflow run {run_id}")
    return 0


def _infer_bench(args: list[str]) -> int:
    """measure/inference.py's benchmark of saved models on this machine: one table (or JSON)."""
    parser = argparse.ArgumentParser(prog="python -m pipeline infer-bench", description=(
        "Latency (batch 1, p50/p95), throughput (serving batch), parameters, size and peak memory of "
        "each model, on token tensors already on the device (no tokenization inside the clock, warm-up "
        "excluded). The models are loaded first, then take turns, repetition by repetition, in rotating "
        "order: each figure is the median over repetitions with its min and max; the first model is the "
        "reference of the speed-up column (per repetition, then the median)."))
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="a model directory, a stage's output_dir (its best/) or a hub id in the local cache")
    parser.add_argument("--lengths", default="64,128", help="sequence lengths in tokens, comma-separated")
    parser.add_argument("--batch-size", type=int, default=32, help="the serving batch of the throughput figure")
    parser.add_argument("--precision", help="comma-separated (fp32, tf32, fp16, bf16); default: every one "
                                            "the device runs inference in")
    parser.add_argument("--device", help="cpu or cuda[:N]; default: cuda if there is one")
    parser.add_argument("--budget-s", type=float, default=20.0, help="seconds of timed passes per model")
    parser.add_argument("--reps", type=int, default=20, help="repetitions: turns each model takes (each turn a few "
                        "passes, so the models alternate closely)")
    parser.add_argument("--threads", type=int, help="torch threads on a CPU (default: torch's, one per core)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    opts = parser.parse_args(args)
    import json

    import torch

    from pipeline.measure import inference
    from pipeline.models import SavedModel
    from pipeline.runtime.precision import resolve

    try:
        lengths = {str(n): n for n in (int(x) for x in opts.lengths.split(",") if x.strip())}
    except ValueError:
        raise UserError(f"infer-bench: --lengths {opts.lengths}: expected whole numbers, e.g. 64,128") from None
    if (not lengths or min(lengths.values()) < 1 or opts.batch_size < 1 or opts.budget_s <= 0 or opts.reps < 1
            or (opts.threads is not None and opts.threads < 1)):
        raise UserError("infer-bench: --lengths, --batch-size, --budget-s, --reps and --threads must be positive")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise UserError(f"infer-bench: --device {opts.device}: not a device (cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"infer-bench: --device {opts.device}: no CUDA device here")
    precisions = (opts.precision.split(",") if opts.precision else inference.inference_precisions("fp32", device))
    for p in precisions:
        if p not in inference.DTYPES:
            raise UserError(f"infer-bench: --precision {p}: one of {', '.join(inference.DTYPES)}")
        resolve(p, device)  # what the device cannot run is refused as a stage refuses it
    saved = {spec: SavedModel(spec) for spec in opts.models}  # every path checked before any timing
    served = {spec: inference.Served(m.load, m.config.vocab_size, m.tokenizer.model_input_names, m.size_mb)
              for spec, m in saved.items()}
    results = inference.bench_side_by_side(served, device, lengths=lengths, precisions=precisions,
                                           settings=inference.BenchSettings(opts.batch_size, opts.budget_s),
                                           reps=opts.reps)
    if opts.json:
        print(json.dumps(inference.rows(results), indent=1))
    else:
        print(inference.table(results), end="")
    return 0


def _disk_full(error: BaseException) -> str | None:
    """The one-line message for an error caused by a full disk (or quota), else None."""
    from pipeline.fsutil import FULL_ERRNOS, DiskFull

    seen = error
    while seen is not None:
        if isinstance(seen, DiskFull):
            return str(seen)
        if isinstance(seen, OSError) and seen.errno in FULL_ERRNOS:
            where = f": writing {seen.filename}" if seen.filename else ""
            return f"no space left on device{where}; free some space and run again with resume=auto"
        seen = seen.__cause__ or seen.__context__
    return None


def _strip_local_rank(argv: list[str]) -> list[str]:
    """The deepspeed launcher appends --local_rank=N; the environment already says the same."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    known, rest = parser.parse_known_args(argv)
    if known.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(known.local_rank))
    return rest


def _quiet_libraries() -> None:
    """Library chatter off, through the variables the libraries read when (if) they are imported:
    importing datasets and transformers here only to call their setters cost every command,
    sync, ui and a study's driver among them, seconds of start-up. A user's own setting wins."""
    for name, value in (("TOKENIZERS_PARALLELISM", "false"),  # fork-safety warnings in DataLoader workers
                        ("MLFLOW_LOGGING_LEVEL", "WARNING"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    for name in ("transformers", "datasets", "alembic", "mlflow", "mlflow.store.db.utils", "urllib3", "DeepSpeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # a library imported before main() ran (a notebook, a test calling main) has read its variables
    # already: set it directly, as importing it costs nothing then
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.set_verbosity_error()
        sys.modules["transformers"].utils.logging.disable_progress_bar()
