"""A dry run's word on this machine: what it lacks for the study's cells still to run
(readiness.py), and how long those it can run would take here (estimate.py)."""
from __future__ import annotations

from pipeline.study.estimate import estimate
from pipeline.study.readiness import lacking, this_device, wants
from pipeline.study.spec import Cell, Study


def preflight(study: Study, cells: list[Cell], runs: dict[str, int] | None = None) -> list[str]:
    """The lines for `cells` (those that finished before are skipped, as a run skips them); `runs`:
    how many times a cell runs where not once (a search's trials)."""
    from pipeline.config import load_config

    cells = [cell for cell in cells if not cell.done()]
    if not cells:
        return ["Every cell finished before: nothing left to run here."]
    device, runs = this_device(), runs or {}
    configs = [(cell, load_config(study.config, cell.args())) for cell in cells]
    found = [(cell, wants(cfg, cell.kind, device)) for cell, cfg in configs]
    fails = {cell.name for cell, want in found if any(w.fails for w in want)}
    runnable = [(cell, cfg, runs.get(cell.name, 1)) for cell, cfg in configs if cell.name not in fails]
    unrunnable = sum(runs.get(name, 1) for name in fails)
    return lacking(found, device) + estimate(runnable, device, unrunnable)
