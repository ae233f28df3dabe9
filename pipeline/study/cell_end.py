"""How a cell ended, kept beside its log (`_logs/CELL.exit`) for whoever reads it later: the runner
waiting on a Slurm job, and `study --report-only`, whose report then says what the finished study's
said. A Slurm job's script writes its exit code there (slurm_job.RUN_AND_KEEP_CODE); this node's
runner writes the cell's whole outcome as JSON (its exit code, the one line that says why, its
times). A cell that starts again has the file of its last attempt removed first.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.fsutil import write_text
from pipeline.study.cell_process import last_line
from pipeline.study.spec import Cell, Study


def exit_file(study: Study, cell: Cell) -> Path:
    """Where a cell's end is written."""
    return study.logs / f"{cell.name}.exit"


def write(study: Study, cell: Cell, outcome: dict) -> None:
    """The outcome this node's runner recorded for the cell, whole or not at all (a reader may be
    another process)."""
    path = exit_file(study, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(outcome))


def read(study: Study, cell: Cell) -> dict | None:
    """What the cell's end left: the outcome this node's runner recorded, or {"exit_code": N} from a
    Slurm job's script (its reason is its log's: `log_last_line`); None before it ended (or while
    the script writes it)."""
    path = exit_file(study, cell)
    text = path.read_text(encoding="utf-8").strip() if path.is_file() else ""
    if not text:
        return None
    found = json.loads(text)
    return found if isinstance(found, dict) else {"exit_code": int(found)}


def clear(study: Study, cell: Cell) -> None:
    """The cell starts again: how its last attempt ended is not how this one will."""
    exit_file(study, cell).unlink(missing_ok=True)


def log_last_line(path: Path) -> str:
    """What a cell's log says in one line (cell_process.last_line), '' where there is no log."""
    if not path.is_file():
        return ""
    with path.open(encoding="utf-8", errors="replace") as f:
        return last_line(f)
