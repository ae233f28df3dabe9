"""A run whose predictions collapsed, named as such: when the best model's test predictions collapse
to a trivial answer (one class for every row, a common class never predicted, no entity, no
candidate called correct, no question answered: Task.stall), the run is tagged `stalled=true`
with `stall_reason` (the MLflow names users filter on), and the log says so in one warning line.
Its scores are then no comparison of recipes, and the study report marks
its cells.
"""
from __future__ import annotations

import logging

from pipeline import names

log = logging.getLogger("pipeline")


def tags(reason: str | None) -> dict[str, str]:
    """The run's tags for a stall reason (Task.stall's verdict; None: not stalled)."""
    if reason is None:
        return {names.TAG_STALLED: "false"}
    return {names.TAG_STALLED: "true", names.TAG_STALL_REASON: reason}


def flag(reason: str | None, split: str, is_main: bool) -> dict[str, str]:
    """The run's tags for a stall reason; one warning line (the main rank's) when the best model's
    predictions on `split` collapsed."""
    if reason is not None and is_main:
        log.warning("stalled: the best model's %s predictions collapsed (%s); this run's scores compare no recipe",
                    split, reason)
    return tags(reason)
