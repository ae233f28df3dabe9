"""Running a planned study on this node: each cell's stage process (several at once with --jobs,
started by executor.start_local), then its post-stage steps in the same slot, its outcome on the
study's MLflow parent run, and the report at the end. A dry run prints the cells' commands
instead; `slurm.py` submits them to Slurm.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.errors import Interrupted
from pipeline.names import (
    CELL_TAG_PREFIX,
    PARENT_TAG,
    STUDY_CELLS_FAILED,
    STUDY_CELLS_FINISHED,
    TAG_CELL,
    TAG_PARENT_RUN,
    TAG_STUDY,
    TAG_STUDY_FILE,
)
from pipeline.runtime.preemption import Preempted, on_sigterm
from pipeline.study import cell_end
from pipeline.study.cell_process import FOLLOW_S, open_attempt
from pipeline.study.devices import describe
from pipeline.study.executor import Handle, start_local
from pipeline.study.schedule import Schedule
from pipeline.study.spec import POST_STAGE, Cell, Study

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("pipeline")


def dry_run(study: Study, cells: list[Cell]) -> int:
    print(f"study {study.name}: {len(cells)} cells (experiment {study.name}, outputs in "
          f"{study.output_root / study.name}, report in {study.report_dir})")
    for cell in cells:
        done = " [finished: would skip]" if cell.done() else ""
        print(f"- {cell.name}{done}\n    {shlex.join(cell.launcher.command(cell.kind, cell.args(), 'PARENT'))}")
        for step in cell.after:
            print(f"    then {shlex.join(cell.step_command(step, None))}")
    from pipeline.study.preflight import preflight

    print("\n".join(preflight(study, cells)))
    return 0


def run_study(study: Study, cells: list[Cell], slots: int | None = None) -> int:
    """Run the cells on this node, up to `jobs` at once (default: one per GPU, one on a CPU), each
    on GPUs of its own; then the report. Returns 0, 1 (a cell failed) or 143 (SIGTERM)."""
    from mlflow import MlflowClient

    from pipeline.study.devices import check_devices, default_slots, visible_gpus

    gpus = visible_gpus()
    slots = slots or default_slots(gpus)
    check_devices(cells, gpus)
    opened = OpenStudy.open(study, cells)
    log.info("study %s: %d cells, up to %d at once on %s; parent MLflow run %s in %s", study.name, len(cells), slots,
             f"{len(gpus)} GPU(s)" if gpus else "the CPU", opened.parent, opened.uri)
    outcomes = {c.name: opened.skipped(c) for c in cells}
    outcomes = {name: o for name, o in outcomes.items() if o is not None}
    try:
        to_run = len(cells) - len(outcomes)
        with on_sigterm(raise_stopped), tracking_for_cells(study, opened.uri, slots, to_run) as cell_uri:
            # while a server serves the store, it is the store's one writer: the runner writes through it too
            live = opened if cell_uri == opened.uri else dataclasses.replace(
                opened, client=MlflowClient(tracking_uri=cell_uri), uri=cell_uri)
            schedule = Schedule(cells, outcomes, slots, gpus)
            for i, cell in enumerate((c for c in cells if c.name in outcomes), 1):
                log.info("[%d/%d done, 0 running] %s: finished before; skipped", i, len(cells), cell.name)
                _note_skip(study, cell, outcomes[cell.name])
                live.record(cell, outcomes[cell.name])
            _run_schedule(live, schedule, served=cell_uri if cell_uri != opened.uri else None)
    except BaseException as e:
        opened.client.set_terminated(opened.parent, status="KILLED")
        if isinstance(e, Preempted):
            log.warning("study %s: stopped by SIGTERM; run it again to resume", study.name)
            return 143  # 128 + SIGTERM, as a stage that stopped on TERM
        raise
    return opened.finish()


def report_only(study: Study, cells: list[Cell]) -> int:
    """Record what the cells' outputs say (finished, failed and why, not run) on the parent run and
    write the report; start nothing. The last job of a study on Slurm runs this; after a local
    study, the outcomes its runner left (cell_end) make the same report."""
    opened = OpenStudy.open(study, cells)
    outcomes: dict[str, dict] = {}
    for cell in cells:
        finished = opened.skipped(cell)
        outcome = {**(cell_end.read(study, cell) or {}), **finished} if finished else (
            _outcome_from_outputs(study, cell, outcomes))
        outcome.pop("skipped", None)  # its times are its end's, not a previous invocation's
        outcomes[cell.name] = outcome
        opened.record(cell, outcome)
    return opened.finish()


@dataclass(frozen=True)
class OpenStudy:
    """A study open on its store: the client and URI it writes through (while a server serves the
    store, the server's), its experiment, its parent run, and the entries a previous invocation
    left for its cells."""

    study: Study
    configured_uri: str | None
    """tracking.uri as configured (the closing line's UI command)."""
    uri: str
    client: MlflowClient
    experiment_id: str
    parent: str
    previous: dict[str, dict]

    @classmethod
    def open(cls, study: Study, cells: list[Cell]) -> OpenStudy:
        """The study's experiment and parent run (reopened when it runs again), its plan published."""
        from pipeline.config import load_config
        from pipeline.tracking import open_experiment, resolve_uri

        base = load_config(study.config, [t for t, _ in study.overrides + study.extra])
        uri = resolve_uri(base.tracking.uri)
        client, experiment_id = open_experiment(uri, study.name)
        parent = open_parent(client, experiment_id, study)
        return cls(study, base.tracking.uri, uri, client, experiment_id, parent,
                   publish_plan(client, parent, cells))

    def record(self, cell: Cell, outcome: dict) -> None:
        """The cell's plan and outcome as its tag on the parent run."""
        before = self.previous.get(cell.name, {}) if outcome.get("skipped") else {}  # its first run's wall time
        self.client.set_tag(self.parent, CELL_TAG_PREFIX + cell.name, json.dumps({**before, **cell.plan, **outcome}))

    def skipped(self, cell: Cell) -> dict | None:
        """The outcome of a cell that finished before (its run, or its output), else None. A cell whose
        job finished (its runner killed meanwhile, or its tracking server) has what its journal holds
        and the store lacks replayed first, under the parent run."""
        if cell.stage_done() and not cell.done():  # a post-stage step is still to run
            return None
        finished = cell.done()
        run_id = (self.catch_up(cell) if finished else None) or self.finished_run(cell)
        if finished or run_id:
            return {"status": "finished", "exit_code": 0, "run_id": run_id, "skipped": True}
        return None

    def outcome(self, cell: Cell, end: Handle, spent: dict[str, float] | None = None) -> dict:
        """A cell that ended (`end`: its last process) and its times (`_times`); one that finished
        has its run caught up with its journal (what a tracking server that failed it meanwhile did
        not take). `spent`: what each of its processes took, "stage" and each post-stage step it ran
        (default: `end` alone, as its stage)."""
        times = _times(spent or {"stage": end.wall_s})
        if end.exit_code == 0:
            run_id = self.catch_up(cell) or self.finished_run(cell)
            return {"status": "finished", "exit_code": 0, "run_id": run_id, **times}
        return {"status": "failed", "exit_code": end.exit_code, "reason": end.last_line[:300], **times}

    def catch_up(self, cell: Cell) -> str | None:
        """The cell's run made to hold its whole journal (tracking.catch_up), under the parent run."""
        from pipeline.tracking import catch_up

        return catch_up(cell.output_dir, self.uri, {TAG_PARENT_RUN: self.parent})

    def finished_run(self, cell: Cell) -> str | None:
        return newest_run(self.client, self.experiment_id, self.study, cell, status="FINISHED")

    def newest_run(self, cell: Cell) -> str | None:
        """The cell's newest run whatever its status (a failed job's run is FAILED)."""
        return newest_run(self.client, self.experiment_id, self.study, cell)

    def finish(self) -> int:
        """The count, the parent run's end and the report, all from the store as the report reads it
        (report/cells.py: a cell is finished when its run there is), so the closing line and the
        report say the same."""
        from pipeline import report
        from pipeline.report.cells import read_cells
        from pipeline.tracking import ui

        study, client, parent = self.study, self.client, self.parent
        _, rows = read_cells(client, self.experiment_id)
        status = dict(zip(rows.cell, rows.status, strict=True))
        # the report's rows: every cell of the plan, and any run that a cell no longer in the study left
        done = [n for n, st in status.items() if st == "finished"]
        others = [n for n in status if n not in done]
        client.log_metric(parent, STUDY_CELLS_FINISHED, len(done))
        client.log_metric(parent, STUDY_CELLS_FAILED, len(others))
        client.set_terminated(parent, status="FAILED" if others else "FINISHED")
        out = report.write_report(self.uri, study.name, study.report_dir, timing=study.timing)
        unfinished: dict[str, list[str]] = {}
        for name in others:
            unfinished.setdefault(status[name], []).append(name)
        which = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in unfinished.items())
        log.info("study %s: %d/%d cells finished%s; report in %s", study.name, len(done), len(status),
                 f" ({which})" if which else "", out / "report.md")
        if done:
            log.info("compare the cells in the MLflow UI: %s", ui.command(self.configured_uri, study=study.name))
        return 1 if others else 0


def _note_skip(study: Study, cell: Cell, outcome: dict) -> None:
    """A cell skipped as finished says so in its log, after its earlier attempts."""
    with open_attempt(study.cell_log(cell)) as f:
        f.write(f"finished before (its MLflow run: {outcome.get('run_id') or 'none in the store'}); not run again\n")


@contextlib.contextmanager
def tracking_for_cells(study: Study, uri: str, slots: int, to_run: int) -> Iterator[str]:
    """The URI the cells track to: the store itself while one runs at a time, else an MLflow
    server on it (store_server.py says why)."""
    if slots == 1 or to_run <= 1:
        yield uri
        return
    from pipeline.study.store_server import serving

    with serving(uri, study.logs / "_mlflow_server.log") as served:
        if served != uri:
            log.info("study %s: cells track to an MLflow server on the store: %s", study.name, served)
        yield served


def _run_schedule(opened: OpenStudy, schedule: Schedule, served: str | None) -> None:
    """Start what may start, record what ends, until every cell is settled. One cell at a time,
    its output goes to the console as well as its log; several, only to their logs (the console
    gets one line per start and end). The cells track to `opened.uri`: the store itself, or the
    server on it (`served`). A cell whose stage finished runs its post-stage steps in its slot."""
    study = opened.study
    running: dict[str, tuple[Cell, Handle, list[str]]] = {}
    sharing: dict[str, set[str]] = {}  # cell -> the cells that ran beside it on one of its devices
    ran: dict[str, str] = {}  # cell -> what its process runs: "stage" or a post-stage step
    spent: dict[str, dict[str, float]] = {}  # cell -> seconds each of its ended processes took, by what it ran
    echo = schedule.slots == 1
    start = functools.partial(start_local, study, parent=opened.parent, served=served, slots=schedule.slots, echo=echo)
    try:
        while not schedule.done:
            for cell, broken in schedule.blocked():
                outcome = {"status": "failed", "exit_code": None, "reason": f"needs {', '.join(broken)}, which failed"}
                schedule.ended(cell, outcome)
                log.warning("%s %s: not run: it needs %s, which failed", schedule.count(), cell.name,
                            ", ".join(broken))
                cell_end.write(study, cell, outcome)
                opened.record(cell, outcome)
            for cell, gpus in schedule.startable():
                _note_sharing(sharing, cell.name, gpus, running)
                ran[cell.name] = cell.steps_left()[0] if cell.stage_done() else "stage"  # else only steps are left
                cell_end.clear(study, cell)
                process = start(cell, gpus, step=None if ran[cell.name] == "stage" else ran[cell.name])
                running[cell.name] = (cell, process, gpus)
                where = describe(gpus)
                if echo:
                    log.info("%s %s: started on %s: %s", schedule.count(), cell.name, where, shlex.join(process.cmd))
                else:
                    log.info("%s %s: started on %s (log: %s)", schedule.count(), cell.name, where, process.log_path)
            end = next((process for _, process, _ in running.values() if process.poll()), None)
            if end is None:
                if running:
                    time.sleep(FOLLOW_S)
                continue
            cell, process, gpus = running.pop(end.name)
            done, steps = ran.pop(cell.name), list(cell.after)
            spent.setdefault(cell.name, {})[done] = end.wall_s
            later = steps[steps.index(done) + 1:] if done in steps else steps
            left = [step for step in cell.steps_left() if step in later] if end.exit_code == 0 else []
            if left:  # the stage (or a step) finished: the next step, in its slot
                ran[cell.name] = left[0]
                process = start(cell, gpus, step=left[0])
                running[cell.name] = (cell, process, gpus)
                log.info("%s %s: %s finished in %.1fs; %s: %s", schedule.count(), cell.name, done, end.wall_s,
                         POST_STAGE[left[0]][0], shlex.join(process.cmd))
                continue
            outcome = opened.outcome(cell, end, spent.pop(cell.name))
            if sharing.get(cell.name):  # its speed figures are partly its neighbours'
                outcome["shared_device_with"] = sorted(sharing[cell.name])
            schedule.ended(cell, outcome)
            where, took = describe(gpus), outcome.get("wall_s", end.wall_s)
            if end.exit_code == 0:
                log.info("%s %s: finished in %.1fs on %s", schedule.count(), cell.name, took, where)
            else:
                log.warning("%s %s: failed with exit code %d after %.1fs on %s: %s (log: %s)", schedule.count(),
                            cell.name, end.exit_code, took, where, end.last_line, process.log_path)
            cell_end.write(study, cell, outcome)
            opened.record(cell, outcome)
    except BaseException as e:
        # the stages run in process groups of their own: a SIGTERM or Ctrl-C of the study is passed
        # on to each running stage, which checkpoints at its next step, so the next invocation resumes it
        for _, process, _ in running.values():
            process.stop()
        for cell, process, _ in running.values():
            process.wait()
            if process.exit_code is not None:  # how it stopped, for a later --report-only
                cell_end.write(study, cell, opened.outcome(cell, process))
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted(stopped_line(study, schedule, [p for _, p, _ in running.values()])) from None
        raise


def stopped_line(study: Study, schedule: Schedule, stopped: list[Handle]) -> str:
    """What a study stopped by Ctrl-C leaves: the cells that finished, those it stopped (at a
    checkpoint: exit code 143) and those not started."""
    finished = sum(1 for o in schedule.outcomes.values() if o.get("status") == "finished")
    checkpointed = sum(1 for p in stopped if p.exit_code == 143)
    return (f"study {study.name}: {finished}/{schedule.total} cells finished, {len(stopped)} stopped "
            f"({checkpointed} at a checkpoint, resumed by the next run), {len(schedule.pending)} not started")


def _note_sharing(sharing: dict[str, set[str]], name: str, gpus: list[str], running: dict) -> None:
    """`name` starts beside the running cells: those on one of its GPUs, or all of them where it or
    they run on the CPU, share a device with it (both ways)."""
    for other, (_, _, their_gpus) in running.items():
        if not gpus or not their_gpus or set(gpus) & set(their_gpus):
            sharing.setdefault(name, set()).add(other)
            sharing.setdefault(other, set()).add(name)


def _times(spent: dict[str, float]) -> dict:
    """A cell's times as its outcome keeps them: wall_s, its whole life in its slot (its stage's
    process and each post-stage step's after it), where its stage ran in this invocation (else its
    start is not known); STEP_s, each post-stage step's own (export_s)."""
    times = {"wall_s": round(sum(spent.values()), 1)} if "stage" in spent else {}
    return {**times, **{f"{step}_s": round(s, 1) for step, s in spent.items() if step != "stage"}}


def _outcome_from_outputs(study: Study, cell: Cell, outcomes: dict[str, dict]) -> dict:
    """A cell that did not finish, as its end left it beside its log (cell_end): the outcome this
    node's runner recorded, or the exit code its Slurm job wrote and its log's last line; else why
    it never ran."""
    broken = [n for n in cell.needs if outcomes.get(n, {}).get("status") != "finished"]
    end, log_path = cell_end.read(study, cell), study.cell_log(cell)
    if end is None:
        why = (f"needs {', '.join(broken)}, which failed" if broken else
               f"no exit code: its job was cancelled, ran out of time or never started (log: {log_path})")
        return {"status": "failed", "exit_code": None, "reason": why}
    reason = end["reason"] if "reason" in end else cell_end.log_last_line(log_path) or "finished without a run"
    return {**end, "status": "failed", "reason": reason[:300]}


def open_parent(client: MlflowClient, experiment_id: str, study: Study) -> str:
    """The study's one parent run: reopened when the study runs again (found by tag)."""
    found = client.search_runs([experiment_id], f"tags.{PARENT_TAG} = 'true' and tags.{TAG_STUDY} = '{study.name}'",
                               order_by=["attributes.start_time DESC"], max_results=1)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
    run = client.create_run(experiment_id, run_name=study.name,
                            tags={PARENT_TAG: "true", TAG_STUDY: study.name, TAG_STUDY_FILE: str(study.path)})
    if study.path.is_file():
        client.log_artifact(run.info.run_id, str(study.path))
    return run.info.run_id


def publish_plan(client: MlflowClient, parent: str, cells: list[Cell]) -> dict[str, dict]:
    """One tag per cell on the parent run, so the report knows the cells that never produced a run.

    Returns the entries a previous invocation left (cell -> plan and outcome)."""
    from mlflow.entities import RunTag

    existing = client.get_run(parent).data.tags
    names = {c.name for c in cells}
    for key in existing:  # cells no longer in the study file
        if key.startswith(CELL_TAG_PREFIX) and key[len(CELL_TAG_PREFIX):] not in names:
            client.delete_tag(parent, key)
    previous = {c.name: json.loads(existing.get(CELL_TAG_PREFIX + c.name, "{}")) for c in cells}
    tags = [RunTag(CELL_TAG_PREFIX + c.name, json.dumps({"status": "planned", **previous[c.name], **c.plan}))
            for c in cells]
    for i in range(0, len(tags), 100):
        client.log_batch(parent, tags=tags[i : i + 100])
    return previous


def newest_run(client: MlflowClient, experiment_id: str, study: Study, cell: Cell, status: str | None = None
               ) -> str | None:
    """The newest run of this study's cell, of that status where one is given."""
    query = f"tags.{TAG_STUDY} = '{study.name}' and tags.{TAG_CELL} = '{cell.name}'"
    runs = client.search_runs([experiment_id], query + (f" and attributes.status = '{status}'" if status else ""),
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def raise_stopped() -> None:
    """on_sigterm's action for a study's runner: the stop as an exception, so the stages are stopped
    on the way out."""
    raise Preempted("SIGTERM")
