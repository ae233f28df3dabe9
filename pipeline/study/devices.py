"""Which devices a study's cells get when several run at once on one node.

A cell takes as many GPUs as it starts processes (one for a single-process cell, `nproc` for a
torchrun or deepspeed cell) and sees only those (`CUDA_VISIBLE_DEVICES`), so inside it the
fallback rules count its own devices. On a machine without GPUs there is nothing to hand out:
cells share the CPU and only the number running at once (`--jobs`) is limited.
"""
from __future__ import annotations

import os

from pipeline.errors import UserError
from pipeline.study.spec import Cell


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out, as CUDA_VISIBLE_DEVICES names them (indices or
    UUIDs); the GPUs torch sees when it is unset. Empty on a machine without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [i.strip() for i in listed.split(",") if i.strip()]
        return ids[: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def width(cell: Cell, gpus: int) -> int:
    """How many GPUs a cell uses on its node: its processes per node, or all of them for
    torchrun's auto/gpu/cpu (the launcher decides at start)."""
    if cell.launcher.kind == "none":
        return 1
    return cell.launcher.nproc if isinstance(cell.launcher.nproc, int) else gpus


def cpu_threads(cell: Cell, slots: int, cores: int | None = None) -> int:
    """Threads for each process of a cell that shares the CPU with jobs - 1 others: the cores split
    evenly (each torch process would take every core, and N cells at once oversubscribe them:
    bf16 cells measured 7.5x slower that way on 2 cores, benchmarks/results/study_jobs-*.json)."""
    return max(1, (cores or os.cpu_count() or 1) // (slots * max(1, width(cell, 1))))


def default_slots(gpus: list[str]) -> int:
    """One cell per GPU; on a CPU one at a time (each cell's torch already uses every core)."""
    return max(1, len(gpus))


def check_devices(cells: list[Cell], gpus: list[str]) -> None:
    """Refuse, before anything runs, a cell that could never get its devices among `gpus`."""
    if not gpus:  # a CPU machine: cells share the cores
        return
    for cell in cells:
        need = width(cell, len(gpus))
        if need > len(gpus):
            raise UserError(f"study: cell {cell.name} needs {need} GPUs ({cell.launcher.describe()}) but "
                            f"{len(gpus)} are visible ({','.join(gpus)})")
        if cell.launcher.kind == "deepspeed":
            named = [g for g in gpus if not g.isdigit()]
            if named:  # its launcher's --include takes indices only
                raise UserError(f"study: cell {cell.name}: the deepspeed launcher takes GPU indices, not "
                                f"{named[0]!r} (CUDA_VISIBLE_DEVICES); use indices or a torchrun launcher")


def describe(ids: list[str]) -> str:
    return f"GPU {','.join(ids)}" if ids else "CPU"
