"""Planning a search study: which of its cells are searched, grouped over seeds (one Optuna study
per group), the cells they need run first, and the cells of a trial and of the best trial's
re-runs, each a matrix cell with the trial's parameters laid over it.

A group is the matrix's cells that differ only in their seed: its trials run with the first
seed; the best trial is re-run with every other one.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from pipeline.errors import UserError
from pipeline.names import EVAL, TEST
from pipeline.study.matrix import RUNNER, runner_overrides
from pipeline.study.spec import AXES, Cell, Study, study_error

TRIAL_TAG = "search/"
"""Tags a trial's run carries: search/trial, search/group, search/fate, search/params,
search/intermediate, search/value."""


@dataclass
class Group:
    name: str
    """The cells' name without the seed: also the Optuna study's, after the study's name."""
    cells: list[Cell]
    """One per seed, in the matrix's order: the first is the trials' template."""

    @property
    def template(self) -> Cell:
        return self.cells[0]

    @property
    def seed(self) -> str | None:
        return self.template.values.get("seeds")


def plan_search(study: Study, cells: list[Cell]) -> tuple[list[Cell], list[Group]]:
    """(the cells the search needs run first, in run order; the searched groups)."""
    procedure_of = {c.name: c.procedure for c in cells}
    needed = {procedure_of[n] for c in cells for n in c.needs}
    known = sorted({c.procedure for c in cells})
    searched = study.search.procedures or [p for p in known if p not in needed]
    for p in searched:
        if p not in known:
            raise study_error(study.path, "search.procedures", f"{p!r}: no cell runs it (procedures: "
                                                               f"{', '.join(known)})")
    groups: dict[str, Group] = {}
    for cell in cells:
        if cell.procedure in searched:
            key = _group_name(cell)
            groups.setdefault(key, Group(key, [])).cells.append(cell)
    searched_names = {c.name for g in groups.values() for c in g.cells}
    return [c for c in cells if c.name not in searched_names], list(groups.values())


def _group_name(cell: Cell) -> str:
    values = {a: v for a, v in cell.values.items() if a != "seeds"}
    parts = [(v.rstrip("/").split("/")[-1] if a == "models" else v) for a in AXES if (v := values.get(a))]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join(parts)).strip("-.") or cell.procedure


def trial_cell(study: Study, group: Group, number: int, params: dict) -> Cell:
    """Trial `number` of the group: its template cell with `params` over it, its own outputs and run."""
    return _derived(study, group.template, f"{group.name}-t{number:03d}", params,
                    {"trial": number, "group": group.name}, tables=[])


def best_cells(study: Study, group: Group, params: dict) -> list[Cell]:
    """The best trial's re-runs: the group's cells of the seeds after the first, with `params`."""
    register = ({"tracking.log_model": True, "tracking.register_as": champion_name(study, group)}
                if study.search.champion else {})
    return [_derived(study, cell, f"{group.name}-best-s{cell.values['seeds']}", {**params, **register},
                     {"group": group.name, "best": "yes"})
            for cell in group.cells[1:]]


def champion_name(study: Study, group: Group) -> str:
    """The registered model a group's best configuration is judged under: one per group (per task ...)."""
    return f"{study.search.champion}-{group.name}"


def stage_args(cell: Cell, params: dict) -> list[str]:
    """The command line that runs `cell` with `params` as a stage of its own, outside the study."""
    ours = {text for text, _ in _runner_overrides_of(cell)}
    return [t for t, origin in cell.overrides if origin != RUNNER or t not in ours] + _param_args(params)


def _derived(study: Study, cell: Cell, name: str, params: dict, tags: dict, tables: list[str] | None = None) -> Cell:
    base = [(t, o) for t, o in cell.overrides if t not in {x for x, _ in _runner_overrides_of(cell)}]
    new = dataclasses.replace(cell, name=name, output_dir=study.output_root / study.name / name,
                              overrides=[], needs=list(cell.needs), tables=cell.tables if tables is None else tables,
                              plan={**cell.plan, "search_group": tags["group"]}, after={})
    new.overrides = ([("resume=auto", RUNNER)] + base + [(a, "search.space") for a in _param_args(params)]
                     + runner_overrides(study, new)
                     + [(f"tracking.tags.{TRIAL_TAG}{k}={v}", RUNNER) for k, v in tags.items()])
    return new


def _runner_overrides_of(cell: Cell) -> list[tuple[str, str]]:
    """What the runner added to `cell` (its output_dir, run name, tags, resume=auto): replaced in a
    derived cell; what it added for the devices (requested_world_size) stays."""
    return [(t, o) for t, o in cell.overrides if o == RUNNER and (
        t == "resume=auto" or t.startswith(("output_dir=", "tracking.experiment=", "tracking.run_name=",
                                            "tracking.tags.")))]


def _param_args(params: dict) -> list[str]:
    return [f"{k}={_text(v)}" for k, v in params.items()]


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def check_space(study: Study, cells: list[Cell]) -> None:
    """Each searched cell's task logs the objective (objective.py), in a split the cell evaluates,
    and its config takes every bound and choice of the space (unknown key, value out of range):
    else a one-line error naming search.objective or search.space.KEY."""
    from pipeline.config import load_config
    from pipeline.study.objective import objective_problem
    from pipeline.tasks import get_task

    _, groups = plan_search(study, cells)
    for group in groups:
        args = stage_args(group.template, {})
        cfg, objective = load_config(study.config, args), study.search.objective
        data = cfg.data
        problem = objective_problem(objective, get_task(cfg.task, cfg.task_options))
        if problem:
            raise study_error(study.path, "search.objective", f"{problem} (cell {group.name})")
        if objective.startswith(EVAL) and not data.evaluates("dev"):
            raise study_error(study.path, "search.objective", f"{objective} is a dev figure, and cell "
                              f"{group.name} has data.dev=skip (no dev evaluation): give it dev data, or a test/ "
                              "objective")
        if objective.startswith(TEST) and not data.evaluates("test"):
            raise study_error(study.path, "search.objective", f"{objective} is a test figure, and cell "
                              f"{group.name} has no test split (data.test unset): give it data.test, or an eval/ "
                              "objective")
        for dim in study.search.space:
            for value in dim.values:
                try:
                    load_config(study.config, [*args, f"{dim.key}={_text(value)}"])
                except UserError as e:
                    reason = str(e).removeprefix("config: ")
                    raise study_error(study.path, f"search.space.{dim.key}", f"{reason} (cell {group.name})") from None
