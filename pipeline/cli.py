"""`python -m pipeline COMMAND ...`; works under `torchrun -m` and `deepspeed --module`.

Exit codes: 0 done; 2 the user's input is wrong (one line on stderr); 1 anything else (a full
disk among them, also one line: it is the environment that failed, and what helps is the same
as for any failure: fix it, run again with resume=auto); 130 stopped by Ctrl-C (one line: what
survived, the command that continues); 143 stopped by SIGTERM.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import shlex
import sys
import warnings
from collections.abc import Callable

from pipeline.errors import Interrupted, MachineError, UserError

HELP = {"-h", "--help"}
COMMANDS = {  # the command -> its function in pipeline/commands/, imported on first use
    "train": "pipeline.commands.stage:train",
    "distill": "pipeline.commands.stage:distill",
    "study": "pipeline.commands.study:main",
    "report": "pipeline.commands.report:main",
    "ui": "pipeline.commands.ui:main",
    "sync": "pipeline.commands.sync:main",
    "infer-bench": "pipeline.commands.infer_bench:main",
    "export": "pipeline.commands.export:main",
    "config-reference": "pipeline.commands.config_reference:main",
}
USAGE = """usage:
  python -m pipeline train   [CONFIG.yaml] [key=value ...]   one training stage
  python -m pipeline distill [CONFIG.yaml] [key=value ...]   one knowledge-distillation stage
  python -m pipeline study STUDY.yaml [--jobs N] [k=v ...]   run a matrix of stages, then the report
  python -m pipeline report --experiment NAME [--out DIR]    tables and charts of a study's runs
  python -m pipeline ui [--experiment NAME] [--host H]       MLflow UI on the tracking store
  python -m pipeline sync RUN_DIR|FILE.jsonl [--uri URI]    upload a run's journal to MLflow
  python -m pipeline infer-bench MODEL [MODEL ...] [--json]  what models cost to serve here, side by side
  python -m pipeline export DIR [--int8] [--check]           best/ as ONNX (and int8), checked, into DIR/export/
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
    for handler in logging.getLogger().handlers:
        handler.addFilter(hub_once())
    _quiet_libraries()
    if not argv or argv[0] in HELP:
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    try:
        if command not in COMMANDS:
            raise UserError(f"unknown command {command!r}\n{USAGE}".splitlines()[0])
        module, _, function = COMMANDS[command].partition(":")
        return getattr(importlib.import_module(module), function)(rest)
    except UserError as e:
        if rank == 0:  # every rank hits the same check; one line is enough
            print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if rank == 0:
            print(f"interrupted: {interrupted_line(e, command, rest)}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
    except Exception as e:
        full = str(e) if isinstance(e, MachineError) else _disk_full(e) or _out_of_memory(e)
        if full is not None:  # the environment failed, not the input: exit 1, but one line
            if rank == 0:
                print(f"error: {full}", file=sys.stderr)
            return 1
        from pipeline.runtime.preemption import Preempted

        if not isinstance(e, Preempted):
            raise
        logging.getLogger("pipeline").warning("preempted: %s; continue with resume=auto", e)
        return 143  # 128 + SIGTERM, what schedulers expect of a job that stopped on TERM


def interrupted_line(error: KeyboardInterrupt, command: str, args: list[str]) -> str:
    """What a Ctrl-C left and the command that continues: the same arguments, with Interrupted's
    `again` in place of the same keys."""
    survived, again = ("stopped before it finished", ())
    if isinstance(error, Interrupted):
        survived, again = error.survived, error.again
    keys = {a.partition("=")[0] for a in again}
    kept = [a for a in args if a.partition("=")[0] not in keys]
    return f"{survived}; to continue: {shlex.join(['python', '-m', 'pipeline', command, *kept, *again])}"


def _out_of_memory(error: BaseException) -> str | None:
    """The one-line message for a device out of memory (torch.OutOfMemoryError, named without
    importing torch), else None: the memory ceiling's rungs that do not fit end on it."""
    if type(error).__name__ != "OutOfMemoryError":
        return None
    return "out of memory: " + (str(error).strip().splitlines() or ["(no message)"])[0]


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


HUB_LIBRARIES = ("huggingface_hub", "transformers", "urllib3")


def hub_once() -> Callable[[logging.LogRecord], bool]:
    """A handler's filter: the Hugging Face Hub's libraries' lines once each (a retried request
    repeats its warning with another count or delay: numbers aside, the same line is dropped)."""
    seen: set[str] = set()

    def once(record: logging.LogRecord) -> bool:
        if not record.name.startswith(HUB_LIBRARIES):
            return True
        key = re.sub(r"\d+(\.\d+)?", "N", f"{record.name} {record.getMessage()}")
        if key in seen:
            return False
        seen.add(key)
        return True
    return once


def _quiet_libraries() -> None:
    """Library chatter off, through the variables the libraries read when (if) they are imported:
    importing datasets and transformers here only to call their setters cost every command,
    sync, ui and a study's driver among them, seconds of start-up. A user's own setting wins."""
    for name, value in (("TOKENIZERS_PARALLELISM", "false"),  # fork-safety warnings in DataLoader workers
                        ("MLFLOW_LOGGING_LEVEL", "WARNING"), ("TRANSFORMERS_VERBOSITY", "error"),
                        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")):  # the report reads runs' files
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
