"""A stalled run named as such: when the best model's test predictions collapse (one class for
every row, a common class never predicted, no entity, no candidate called correct, no question
answered: Task.stall), the run is tagged `stalled=true` with `stall_reason`, and the log says so
in one warning line. Its scores are then no comparison of recipes, and the study report marks
its cells.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pipeline import names

if TYPE_CHECKING:
    from pipeline.evaluation import Evaluation
    from pipeline.tracking import Tracker

log = logging.getLogger("pipeline")


def stall_tags(reason: str | None) -> dict[str, str]:
    """The run's tags for a stall reason (None: not stalled)."""
    if reason is None:
        return {names.TAG_STALLED: "false"}
    return {names.TAG_STALLED: "true", names.TAG_STALL_REASON: reason}


def flag_stall(evaluation: Evaluation, tracker: Tracker, split: str, is_main: bool) -> None:
    """Tag the run with whether `evaluation`'s predictions collapsed; warn when they did."""
    tracker.set_tags(stall_tags(evaluation.stall))
    if evaluation.stall is not None and is_main:
        log.warning("stalled: the best model's %s predictions collapsed (%s); this run's scores compare no recipe",
                    split, evaluation.stall)
