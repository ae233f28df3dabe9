"""A search's objective checked against what a trial's job will log, before any trial starts.

eval/NAME and test/NAME are the task's scores (Task.metric_names, with `main`, and `loss` where its
evaluations have one); any other name must be one of the job's own figures (pipeline/names.py's,
infer/* included). A name outside them would train every trial to its end for no value.
"""
from __future__ import annotations

import difflib
import fnmatch

from pipeline import names


def logged_names(task) -> list[str]:
    """The objectives a job of `task` can be judged by, eval/ ones first ("f1_*": any suffix)."""
    scores = ["main", *(["loss"] if task.scores_loss else []), *task.metric_names()]
    return [prefix + name for prefix in (names.EVAL, names.TEST) for name in scores] + sorted(job_figures())


def job_figures() -> frozenset[str]:
    """The metric names names.py spells whole that a stage's run may log outside eval/ and test/."""
    return frozenset(v for k, v in vars(names).items()
                     if k.isupper() and not k.startswith(("TAG_", "STUDY_")) and isinstance(v, str) and "/" in v
                     and not v.endswith(("/", "_")) and not v.startswith((names.EVAL, names.TEST)))


def objective_problem(objective: str, task) -> str | None:
    """Why a job of `task` never logs `objective` (with the nearest name it does log), or None."""
    known = logged_names(task)
    if objective.startswith(names.INFER) or any(fnmatch.fnmatchcase(objective, n) for n in known):
        return None
    near = _nearest(objective, known)
    scored = ", ".join(n for n in known if n.startswith(names.EVAL))
    hint = f"did you mean {near}? " if near else ""
    return f"{objective}: task {task.name} logs no such metric ({hint}its dev scores: {scored}; test/ the same)"


def _nearest(name: str, known: list[str]) -> str | None:
    """The known name closest to `name` (difflib's ratio, case aside, at least 0.6); a tie goes to the one
    listed first (eval/ before test/, the main metric before the others)."""
    ratios = [(difflib.SequenceMatcher(None, name.lower(), k.lower()).ratio(), -i, k) for i, k in enumerate(known)]
    best = max(ratios, default=None)
    return best[2] if best and best[0] >= 0.6 else None
