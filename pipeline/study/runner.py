"""Running a planned study: each cell's stage process, its outcome on the study's MLflow parent run,
and the report at the end. A dry run prints the cells' commands instead.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.names import (
    CELL_TAG_PREFIX,
    PARENT_TAG,
    STUDY_CELLS_FAILED,
    STUDY_CELLS_FINISHED,
    TAG_STUDY,
    TAG_STUDY_FILE,
)
from pipeline.study.spec import Cell, Study

if TYPE_CHECKING:
    from mlflow import MlflowClient

log = logging.getLogger("pipeline")


def dry_run(study: Study, cells: list[Cell]) -> int:
    print(f"study {study.name}: {len(cells)} cells (experiment {study.name}, outputs in "
          f"{study.output_root / study.name}, report in {study.report_dir})")
    for cell in cells:
        done = " [finished: would skip]" if _finished_before(cell) else ""
        print(f"- {cell.name}{done}\n    {shlex.join(cell.launcher.command(cell.command, cell.args(), 'PARENT'))}")
    return 0


def run_study(study: Study, cells: list[Cell]) -> int:
    from pipeline import report, ui
    from pipeline.config import load_config
    from pipeline.tracking import open_experiment, resolve_uri

    base = load_config(study.config, [t for t, _ in study.overrides + study.extra])
    uri = resolve_uri(base.tracking.uri)
    client, experiment_id = open_experiment(uri, study.name)
    parent = open_parent(client, experiment_id, study)
    previous = publish_plan(client, parent, cells)
    log.info("study %s: %d cells; parent MLflow run %s in %s", study.name, len(cells), parent, uri)
    outcomes: dict[str, dict] = {}
    try:
        with _sigterm_stops():
            for i, cell in enumerate(cells, 1):
                outcome = _run_cell(client, experiment_id, study, cell, parent, outcomes, f"[{i}/{len(cells)}]")
                outcomes[cell.name] = outcome
                before = previous.get(cell.name, {}) if outcome.get("skipped") else {}  # its first run's wall time
                client.set_tag(parent, CELL_TAG_PREFIX + cell.name, json.dumps({**before, **cell.plan, **outcome}))
    except BaseException as e:
        client.set_terminated(parent, status="KILLED")
        if isinstance(e, Stopped):
            log.warning("study %s: stopped by SIGTERM; run it again to resume", study.name)
            return 143  # 128 + SIGTERM, as a stage that stopped on TERM
        raise
    failed = [n for n, o in outcomes.items() if o["status"] != "finished"]
    client.log_metric(parent, STUDY_CELLS_FINISHED, len(cells) - len(failed))
    client.log_metric(parent, STUDY_CELLS_FAILED, len(failed))
    client.set_terminated(parent, status="FAILED" if failed else "FINISHED")
    out = report.write_report(uri, study.name, study.report_dir)
    log.info("study %s: %d/%d cells finished%s; report in %s", study.name, len(cells) - len(failed), len(cells),
             f" (failed: {', '.join(failed)})" if failed else "", out / "report.md")
    if len(failed) < len(cells):
        log.info("compare the cells in the MLflow UI: %s", ui.command(base.tracking.uri, study=study.name))
    return 1 if failed else 0


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


def finished_run(client: MlflowClient, experiment_id: str, study: Study, cell: Cell) -> str | None:
    runs = client.search_runs([experiment_id], f"tags.{TAG_STUDY} = '{study.name}' and tags.cell = '{cell.name}' "
                              "and attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                              max_results=1)
    return runs[0].info.run_id if runs else None


def _run_cell(client: MlflowClient, experiment_id: str, study: Study, cell: Cell, parent: str, outcomes: dict,
              counter: str) -> dict:
    run_id = finished_run(client, experiment_id, study, cell)
    if _finished_before(cell) or run_id:
        log.info("%s %s: finished before; skipped", counter, cell.name)
        return {"status": "finished", "exit_code": 0, "run_id": run_id, "skipped": True}
    broken = [n for n in cell.needs if outcomes.get(n, {}).get("status") != "finished"]
    if broken:
        log.warning("%s %s: not run: it needs %s, which failed", counter, cell.name, ", ".join(broken))
        return {"status": "failed", "exit_code": None, "reason": f"needs {', '.join(broken)}, which failed"}
    cmd = cell.launcher.command(cell.command, cell.args() + [f"tracking.parent_run_id={parent}"],
                                f"{study.name}-{cell.name}")
    log_path = study.output_root / study.name / "_logs" / f"{cell.name}.log"
    log.info("%s %s: %s", counter, cell.name, shlex.join(cmd))
    start = time.perf_counter()
    code, last = _execute(cmd, log_path)
    wall = time.perf_counter() - start
    if code == 0:
        run_id = finished_run(client, experiment_id, study, cell)
        log.info("%s %s: finished in %.1fs", counter, cell.name, wall)
        return {"status": "finished", "exit_code": 0, "run_id": run_id, "wall_s": round(wall, 1)}
    log.warning("%s %s: failed with exit code %d after %.1fs: %s (log: %s)", counter, cell.name, code, wall, last,
                log_path)
    return {"status": "failed", "exit_code": code, "reason": last[:300], "wall_s": round(wall, 1)}


def _finished_before(cell: Cell) -> bool:
    """A stage writes metrics.json (its final metrics) only once it has finished."""
    return (cell.output_dir / "metrics.json").is_file()


def _execute(cmd: list[str], log_path: Path) -> tuple[int, str]:
    """Run a stage, echoing its output and keeping it in log_path; (exit code, last error line)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    last_line = last_error = ""
    with log_path.open("w", encoding="utf-8") as f:
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                    errors="replace")
        except OSError as e:  # the launcher itself is missing (deepspeed not installed)
            f.write(f"{e}\n")
            return 127, f"cannot start {cmd[0]}: {e.strerror}"
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                f.write(line)
                if line.strip():
                    last_line = line.strip()
                    if line.startswith("error") or "Error" in line:  # the CLI's one-line error, or a traceback's
                        last_error = last_line
            code = proc.wait()
        except BaseException as e:
            # Ctrl-C reached the stage too (same process group); a SIGTERM of the study is passed
            # on, so the stage checkpoints at its next step and the next invocation resumes it
            if not isinstance(e, KeyboardInterrupt) and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            for line in proc.stdout:  # drain, so the stage never blocks on a full pipe
                sys.stdout.write(line)
                f.write(line)
            proc.wait()
            raise
    return code, last_error or last_line


class Stopped(Exception):
    """The study got SIGTERM (a scheduler's time limit): the running stage was stopped too."""


@contextlib.contextmanager
def _sigterm_stops():
    def stop(signum: int, frame: object) -> None:
        raise Stopped("SIGTERM")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
