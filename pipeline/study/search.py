"""Running a search study: every trial a cell, asked of Optuna and told its fate.

Per searched group (search_plan.py) one Optuna study in the RDB storage (OUTPUT_ROOT/NAME/optuna.db
unless search.storage names one), named STUDY.GROUP. The runner asks a trial, starts its cell
where the study's cells run (this node's slots and GPUs with --jobs N, or a Slurm job each), and
while it runs reads the dev figures its job writes to its journal at each evaluation: each is
reported to the trial, and when the pruner says so the runner writes the job's stop request
(OUTPUT_DIR/stop.request), so the job ends at its next evaluation as an early stop does (tested,
its run FINISHED). A trial's run carries its fate, parameters, intermediate values and value as
tags (search/...); the Optuna trial is told the same.

Killed and run again, the runner reopens the same Optuna studies: a trial Optuna holds as running
is that trial's cell, continued (resume=auto: from its checkpoint; one the dead runner's job
finished meanwhile is only told), so no trial is lost or counted twice. Trials are asked until
search.trials exist (of every fate) or search.timeout_s has passed since this invocation started.

Then each group's best trial is re-run with the study's other seeds, and the search report written
(report/search.py) beside the study's report.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shlex
import time

from pipeline.errors import Interrupted
from pipeline.layout import OutputDir
from pipeline.names import (
    TAG_CELL,
    TAG_PARENT_RUN,
    TAG_STALL_REASON,
    TAG_STALLED,
    TAG_STUDY,
    TAG_TRIAL_FATE,
    TAG_TRIAL_REASON,
)
from pipeline.report.search import write_search_report
from pipeline.study.executor import Handle, Waited
from pipeline.study.runner import OpenStudy, publish_plan, tracking_for_cells
from pipeline.study.search_plan import TRIAL_TAG, Group, best_cells, champion_name, plan_search, trial_cell
from pipeline.study.spec import Cell, Study
from pipeline.study.trial_pool import POLL_S, Pool, log_end, objective_values

log = logging.getLogger("pipeline")

FAIL_REASON = "fail_reason"
"""The Optuna user attribute that holds why a failed trial failed (Optuna's own name for it)."""


def storage_url(study: Study) -> str:
    if study.search.storage:
        return study.search.storage
    return f"sqlite:///{(study.output_root / study.name).resolve() / 'optuna.db'}"


def optuna_study(study: Study, group: Group, create: bool = True):
    """The group's Optuna study, created or reopened (the same one on every invocation)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = f"{study.name}.{group.name}"
    spec = study.search
    if not spec.storage:
        (study.output_root / study.name).mkdir(parents=True, exist_ok=True)
    if not create:
        return optuna.load_study(study_name=name, storage=storage_url(study))
    return optuna.create_study(study_name=name, storage=storage_url(study), load_if_exists=True,
                               direction=spec.direction, sampler=spec.make_sampler(), pruner=spec.make_pruner())


def run_search(study: Study, cells: list[Cell], slots: int | None = None, executor: str = "local") -> int:
    """The cells the search needs, each group's trials, the best trials' re-runs, the reports.
    Returns 0, 1 (a cell or trial failed, or every trial of a group) or 143 (SIGTERM)."""
    from pipeline.runtime.preemption import Preempted, on_sigterm
    from pipeline.study.devices import check_devices, default_slots, visible_gpus
    from pipeline.study.runner import raise_stopped

    needed, groups = plan_search(study, cells)
    gpus = visible_gpus() if executor == "local" else []
    slots = slots or (default_slots(gpus) if executor == "local" else 4)
    if executor == "local":
        check_devices(cells, gpus)
    opened = OpenStudy.open(study, needed)
    log.info("study %s: a search of %d group(s) x %d trials (%s), up to %d at once; Optuna storage %s; parent MLflow "
             "run %s", study.name, len(groups), study.search.trials, ", ".join(g.name for g in groups), slots,
             storage_url(study), opened.parent)
    served_ok = executor == "local" and slots > 1
    try:
        with on_sigterm(raise_stopped), (tracking_for_cells(study, opened.uri, slots, 2) if served_ok
                                 else contextlib.nullcontext(opened.uri)) as cell_uri:
            live = opened if cell_uri == opened.uri else dataclasses.replace(
                opened, client=_client(cell_uri), uri=cell_uri)
            pool = Pool(live, slots, gpus, executor, served=cell_uri if cell_uri != opened.uri else None)
            failed = pool.run_cells(needed)
            fruitless = []
            for group in groups:
                if any(n in failed for n in group.template.needs):
                    log.warning("study %s: %s not searched: it needs %s, which failed", study.name, group.name,
                                ", ".join(n for n in group.template.needs if n in failed))
                    continue
                if not Search(live, pool, group).run():
                    fruitless.append(group.name)
            reruns = _best_reruns(live, groups)
            if reruns:  # their plan on the parent run beside the needed cells'
                publish_plan(live.client, live.parent, needed + reruns)
                pool.run_cells(reruns)
    except BaseException as e:
        opened.client.set_terminated(opened.parent, status="KILLED")
        if isinstance(e, Preempted):
            log.warning("study %s: stopped by SIGTERM; run it again to resume the search", study.name)
            return 143
        if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
            raise Interrupted(f"study {study.name}: the running trials stopped at their next step and are "
                              f"resumed by the next run; {storage_url(study)} keeps every trial told") from None
        raise
    out = write_search_report(study.report_dir, search_report(study, groups, opened), opened.client,
                              opened.parent)
    log.info("study %s: search report in %s", study.name, out)
    code = opened.finish()
    if fruitless:
        log.error("study %s: every trial of %s failed: no value to search by (each trial's reason: its run's "
                  "%s tag, the Optuna trial's %s)", study.name, ", ".join(fruitless), TAG_TRIAL_REASON, FAIL_REASON)
    return 1 if fruitless else code


def search_report(study: Study, groups: list[Group], opened: OpenStudy | None = None) -> str:
    """search.md: each group's trials (from its Optuna study) and its best configuration over seeds;
    with search.champion (and the study open), the alias judged too."""
    from pipeline.report.search import SearchSection, render_search
    from pipeline.study.champion import crown

    spec, sections = study.search, []
    stalled = stalled_cells(opened) if opened is not None else {}
    for group in groups:
        sec = SearchSection(group.name, f"{study.name}.{group.name}", [(d.key, d.describe()) for d in spec.space])
        try:
            searched = optuna_study(study, group, create=False)
            sec.stalled = {t.number: stalled[name] for t in searched.get_trials(deepcopy=False)
                           if (name := trial_cell(study, group, t.number, t.params).name) in stalled}
            best = searched.best_trial
        except (ValueError, KeyError):
            sections.append(sec)
            continue
        first = trial_cell(study, group, best.number, best.params)
        runs = [(group.seed or "-", first)] + [(c.values["seeds"], c) for c in best_cells(study, group, best.params)]
        for seed, cell in runs:
            metrics = OutputDir(cell.output_dir).metrics
            if metrics.is_file():
                final = json.loads(metrics.read_text())
                sec.best_by_seed[seed] = {k: final[k] for k in (spec.objective, "test/main") if k in final}
        sec.rerun = rerun_command(study, group, best.params)
        if spec.champion and opened is not None:
            values = [m[spec.objective] for m in sec.best_by_seed.values() if spec.objective in m]
            run_ids = [opened.finished_run(c) for c in best_cells(study, group, best.params)]
            sec.champion = crown(opened.client, champion_name(study, group), [r for r in run_ids if r], values,
                                 spec.objective, spec.direction)
        sections.append(sec)
    settings = (f"{spec.direction}; sampler {spec.sampler['type']}, pruner {spec.pruner['type']}, "
                f"{spec.trials} trials per group" + (f", at most {spec.timeout_s:g} s" if spec.timeout_s else ""))
    return render_search(study.name, storage_url(study), settings, spec.objective, sections)


def stalled_cells(opened: OpenStudy) -> dict[str, str]:
    """Cell -> why its run's test predictions collapsed, for the study's runs tagged stalled."""
    runs = opened.client.search_runs([opened.experiment_id], f"tags.{TAG_STUDY} = '{opened.study.name}' and "
                                     f"tags.{TAG_STALLED} = 'true'")
    return {r.data.tags[TAG_CELL]: r.data.tags.get(TAG_STALL_REASON, "stalled") for r in runs
            if TAG_CELL in r.data.tags}


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _best_reruns(opened: OpenStudy, groups: list[Group]) -> list[Cell]:
    import optuna

    out = []
    for group in groups:
        try:
            best = optuna_study(opened.study, group, create=False).best_trial
        except (ValueError, KeyError):  # no trial completed (or never searched)
            log.warning("study %s: %s has no completed trial: nothing to re-run over seeds", opened.study.name,
                        group.name)
            continue
        if best.state == optuna.trial.TrialState.COMPLETE:
            out += best_cells(opened.study, group, best.params)
    return out


class Search:
    """One group's trials: asked, run, fed to the pruner, told."""

    def __init__(self, opened: OpenStudy, pool: Pool, group: Group):
        self.opened, self.pool, self.group, self.spec = opened, pool, group, opened.study.search
        self.optuna = optuna_study(opened.study, group)
        self.trials: dict[str, object] = {}
        """Cell name -> its optuna Trial, while it runs."""
        self.values: dict[str, list[float]] = {}
        """Cell name -> the objective's values at its evaluations reported to its trial so far."""
        self.exhausted = False
        """The sampler has no point left to try (a grid, every point asked)."""

    def run(self) -> bool:
        """Ask, run and tell trials until the budget is spent; False when every trial the group's
        Optuna study holds failed (none gave a value, none was pruned)."""
        import optuna

        spec, started = self.spec, time.monotonic()
        resumed = [t for t in self.optuna.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.RUNNING]
        if resumed:
            log.info("study %s: %s: %d trial(s) were running when the runner stopped: continued",
                     self.opened.study.name, self.group.name, len(resumed))
        waiting = [(optuna.trial.Trial(self.optuna, t._trial_id), t.params) for t in resumed]
        try:
            while True:
                while waiting and self.pool.free:
                    trial, params = waiting[0]
                    if not self._start(trial, params):
                        break
                    waiting.pop(0)
                timed_out = spec.timeout_s is not None and time.monotonic() - started > spec.timeout_s
                while (not waiting and self.pool.free and not timed_out and not self.exhausted
                       and self._count() < spec.trials):
                    trial = self.optuna.ask()
                    params = {d.key: d.suggest(trial) for d in spec.space}
                    if not self._start(trial, params):  # no device free: asked, it waits its turn
                        waiting.append((trial, params))
                        break
                if not self.pool.running and not waiting:
                    break
                self._feed_pruner()
                for cell, end in self.pool.poll():
                    self._settle(cell, end)
                time.sleep(POLL_S)
        except BaseException:
            self.pool.stop_all()
            raise
        if timed_out:
            log.info("study %s: %s: search.timeout_s reached after %d trials", self.opened.study.name,
                     self.group.name, self._count())
        states = {t.state for t in self.optuna.get_trials(deepcopy=False)}
        return states != {optuna.trial.TrialState.FAIL}

    def _count(self) -> int:
        return len(self.optuna.get_trials(deepcopy=False))

    def _start(self, trial, params: dict) -> bool:
        cell = trial_cell(self.opened.study, self.group, trial.number, params)
        if cell.stage_done():  # its job finished while no runner watched it
            self.trials[cell.name] = trial
            finished = Waited(cell.name, lambda: (0, ""))
            finished.poll()
            self._settle(cell, finished)
            return True
        if self.pool.start(cell) is None:
            return False
        self.trials[cell.name] = trial
        return True

    def _feed_pruner(self) -> None:
        """Each running trial's new evaluations reported to it; one the pruner gives up on is asked
        to stop (its stop request)."""
        for cell, _, _ in self.pool.running.values():
            trial = self.trials.get(cell.name)
            if trial is None:
                continue
            seen, values = len(self.values.get(cell.name, [])), objective_values(cell.output_dir, self.spec.objective)
            for i, value in enumerate(values[seen:], seen + 1):
                trial.report(value, step=i)
            self.values[cell.name] = values
            stop = OutputDir(cell.output_dir).stop_request
            if len(values) > seen and trial.should_prune() and not stop.exists():
                stop.write_text(f"pruned at evaluation {len(values)}\n")
                log.info("%s: pruned after evaluation %d (%s %.4f): it stops at its next evaluation",
                         cell.name, len(values), self.spec.objective, values[-1])

    def _settle(self, cell: Cell, end: Handle) -> None:
        """Tell Optuna the trial's fate; tag its run with it."""
        import optuna

        trial, seen = self.trials.pop(cell.name), len(self.values.pop(cell.name, []))
        outcome = self.opened.outcome(cell, end)
        values = objective_values(cell.output_dir, self.spec.objective)
        for i, value in enumerate(values[seen:], seen + 1):  # what it logged since the last look
            trial.report(value, step=i)
        value = _final_value(cell, self.spec.objective, values, self.spec.direction)
        if end.exit_code != 0:
            fate, state = "failed", optuna.trial.TrialState.FAIL
            outcome["reason"] = outcome.get("reason") or f"exit code {end.exit_code}"
        elif OutputDir(cell.output_dir).stop_request.exists():
            fate, state = "pruned", optuna.trial.TrialState.PRUNED
        elif value is None:
            fate, state = "failed", optuna.trial.TrialState.FAIL
            outcome["reason"] = f"{self.spec.objective}: not logged by the job (search.objective)"
        else:
            fate, state = "complete", optuna.trial.TrialState.COMPLETE
        reason = outcome.get("reason", "") if fate == "failed" else ""
        if reason:  # Optuna keeps it beside the trial's state
            trial.set_user_attr(FAIL_REASON, reason)
        try:
            self.optuna.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state,
                             skip_if_finished=True)
        except RuntimeError as e:  # told and stored; the sampler has no point left (GridSampler calls stop())
            if "Study.stop" not in str(e):
                raise
            self.exhausted = True
        run_id = outcome.get("run_id") or self.opened.newest_run(cell)
        if run_id:
            tags = {TAG_TRIAL_FATE: fate, f"{TRIAL_TAG}params": json.dumps(trial.params),
                    f"{TRIAL_TAG}intermediate": json.dumps(values), TAG_PARENT_RUN: self.opened.parent}
            if value is not None:
                tags[f"{TRIAL_TAG}value"] = repr(value)
            if reason:
                tags[TAG_TRIAL_REASON] = reason[:500]
            for k, v in tags.items():
                self.opened.client.set_tag(run_id, k, v)
        if reason:  # the parent run says why each failed trial failed, whether or not it left a run
            self.opened.client.set_tag(self.opened.parent, f"{TRIAL_TAG}failed.{cell.name}", reason[:500])
        if fate == "failed" and end.exit_code == 0:  # its job ended well: log_end would call it finished
            log.warning("%s: failed after %.1fs: %s", cell.name, end.wall_s, reason)
            return
        shown = f"{fate} ({self.spec.objective} {value:.4f})" if value is not None and fate != "failed" else fate
        log_end(cell, end, shown)


def _final_value(cell: Cell, objective: str, values: list[float], direction: str) -> float | None:
    """The trial's value: the objective in its final metrics (the best evaluation's), else the best
    of its evaluations."""
    metrics = OutputDir(cell.output_dir).metrics
    if metrics.is_file():
        final = json.loads(metrics.read_text())
        if isinstance(final.get(objective), (int, float)):
            return float(final[objective])
    if not values:
        return None
    return max(values) if direction == "maximize" else min(values)


def rerun_command(study: Study, group: Group, params: dict) -> str:
    """The command that runs the group's best configuration as a stage of its own."""
    from pipeline.study.search_plan import stage_args

    cell = group.template
    return shlex.join(cell.launcher.command(cell.kind, stage_args(cell, params), f"{study.name}-{group.name}"))


def report_search(study: Study, cells: list[Cell]) -> int:
    """`--report-only` of a search study: the search report and the study's, from what is stored; runs nothing."""
    _, groups = plan_search(study, cells)
    opened = OpenStudy.open(study, [])
    out = write_search_report(study.report_dir, search_report(study, groups, opened), opened.client,
                              opened.parent)
    log.info("study %s: search report in %s", study.name, out)
    return opened.finish()


SAMPLED = "SAMPLED"
"""A searched key's value in the dry run's trial command: the sampler picks it as the trial starts."""


def dry_run_search(study: Study, cells: list[Cell]) -> int:
    """The cells the search needs, each group's space and a trial's command (the searched keys
    sampled as it starts); runs nothing."""
    needed, groups = plan_search(study, cells)
    spec = study.search
    print(f"study {study.name}: a search, {spec.trials} trials per group ({spec.sampler['type']} sampler, "
          f"{spec.pruner['type']} pruner) of {spec.objective} ({spec.direction}); Optuna storage {storage_url(study)}")
    for cell in needed:
        print(f"- needed first: {cell.name}\n    {shlex.join(cell.launcher.command(cell.kind, cell.args(), 'P'))}")
    for group in groups:
        print(f"- {group.name}: " + "; ".join(f"{d.key} {d.describe()}" for d in spec.space))
        trial = trial_cell(study, group, 0, {d.key: SAMPLED for d in spec.space})
        print(f"    {', '.join(d.key for d in spec.space)}: sampled by the {spec.sampler['type']} sampler as each "
              f"trial starts ({SAMPLED} below); trial 0: "
              f"{shlex.join(trial.launcher.command(trial.kind, trial.args(), 'P'))}")
        seeds = [c.values["seeds"] for c in group.cells[1:]]
        if seeds:
            print(f"    then the best trial with seed(s) {', '.join(seeds)}")
    from pipeline.study.preflight import preflight

    trials = {g.template.name: spec.trials for g in groups}  # each trial runs the template's settings
    print("\n".join(preflight(study, needed + [c for g in groups for c in g.cells], trials)))
    return 0
