"""How the GPU check (gpu_check.py) runs its checks: in phases (an alone check by itself, the others side
by side), planned against a budget by their estimates; each in a child process stopped with its whole
tree at the deadline (process_tree.py); one JSON rewritten after every check, so a kill keeps what
finished."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import process_tree

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[..., dict]
    """The check, given the jobs runner: its result, {"pass": bool, ...figures}."""
    estimate_s: float
    """Seconds on one H100, start-up included (gpu_check.py: from the recorded GPU times)."""
    alone: bool = False
    """A speed or energy figure: nothing else on the GPU meanwhile."""


def phases(checks: list[Check]) -> list[list[Check]]:
    """The checks in order, grouped: each alone check its own phase, each run of the others one phase."""
    out: list[list[Check]] = []
    for check in checks:
        if check.alone or not out or out[-1][0].alone:
            out.append([check])
        else:
            out[-1].append(check)
    return out


def plan(checks: list[Check], estimates: dict[str, float], budget: float, parallel: int) -> tuple[list, dict]:
    """Which checks fit the budget by their estimates, phase after phase (phases): an alone check from
    the clock, the others on `parallel` lanes from it (each starts when a lane frees up). Returns the
    checks to run in order and, for the rest, why not."""
    clock, run, not_run = 0.0, [], {}
    for phase in phases(checks):
        lanes = [clock] * (1 if phase[0].alone else max(1, parallel))
        for check in phase:
            lane = min(range(len(lanes)), key=lanes.__getitem__)
            if lanes[lane] + estimates[check.name] <= budget:
                lanes[lane] += estimates[check.name]
                run.append(check)
            else:
                how = " alone" if check.alone else ""
                not_run[check.name] = (f"not run: ~{estimates[check.name]:.0f} s{how} from ~{lanes[lane]:.0f} s "
                                       f"would pass the {budget:.0f} s budget")
        clock = max(lanes)
    return run, not_run


class Report:
    """The JSON (DIR/gpu-check.json), written again (atomically) after every check."""

    def __init__(self, out: Path, head: dict, estimates: dict[str, float], not_run: dict[str, str]):
        self.out, self.head, self.estimates, self.not_run = out, head, estimates, not_run
        self.checks, self.children = {}, {}
        self.start = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)

    @property
    def json(self) -> Path:
        return self.out / "gpu-check.json"

    def add(self, name: str, result: dict) -> None:
        self.checks[name] = result
        print(f"{name}: {'pass' if result['pass'] else 'FAIL'} ({result.get('check_seconds')} s)", flush=True)
        self.write()

    @property
    def passed(self) -> bool:
        """Every check that ran passed, and one did."""
        return bool(self.checks) and all(c["pass"] for c in self.checks.values())

    def write(self) -> None:
        checks = {n: self.checks[n] for n in self.head["run"] if n in self.checks}
        complete = not self.not_run and len(checks) == len(self.head["run"])
        payload = {**self.head, "pass": self.passed, "complete": complete,
                   "seconds": round(time.perf_counter() - self.start, 1), "checks": checks, "not_run": self.not_run}
        tmp = self.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        tmp.replace(self.json)


def run_here(check: Check, jobs) -> dict:
    t0 = time.perf_counter()
    try:
        result = check.run(jobs)
    except Exception as e:  # noqa: BLE001 - a check that breaks is a failed check, reported; the rest go on
        result = {"pass": False, "log": f"{type(e).__name__}: {e}"}
    return {**result, "check_seconds": round(time.perf_counter() - t0, 1)}


def too_late(check: Check, report: Report, deadline: float) -> bool:
    """Whether `check` cannot finish by `deadline` by its estimate (then listed as not run)."""
    if time.monotonic() + report.estimates[check.name] <= deadline:
        return False
    report.not_run[check.name] = "not run: the checks before it left too little of the budget"
    report.write()
    return True


def children(checks: list[Check], report: Report, work: Path, child: Callable[[Check, Path], list[str]], parallel: int,
             deadline: float) -> None:
    """Each check in a child process (`child(check, part)`: its command, which writes the check's result to
    `part`), up to `parallel` at a time, its output in DIR/CHECK.log; stopped whole at `deadline`."""
    waiting, running = list(checks), {}
    while waiting or running:
        while waiting and len(running) < parallel:
            check = waiting.pop(0)
            if too_late(check, report, deadline):
                continue
            part = work / f"{check.name}.json"
            cmd = child(check, part)
            log = (report.out / f"{check.name}.log").open("w")
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            running[check.name] = (proc, part, time.perf_counter(), log)
            report.children[check.name] = proc
        time.sleep(1)
        for name, (proc, part, t0, log) in list(running.items()):
            late = time.monotonic() > deadline
            if proc.poll() is None and not late:
                continue
            if late and proc.poll() is None:
                process_tree.stop(proc.pid)
                proc.wait()
            log.close()
            seconds = round(time.perf_counter() - t0, 1)
            if part.is_file():
                result = json.loads(part.read_text())
            else:
                tail = (report.out / f"{name}.log").read_text(errors="replace")[-1500:]
                why = "stopped at the end of the budget" if late else f"exit {proc.returncode}"
                result = {"pass": False, "stopped": why, "log": tail}
            report.add(name, {**result, "check_seconds": seconds})
            del running[name], report.children[name]


def stop_children_on_sigterm(report: Report) -> None:
    """A kill (a lease ending) keeps the JSON as written and takes the checks' process trees along."""
    def handler(signum, frame):
        for proc in list(report.children.values()):
            process_tree.stop(proc.pid, grace_s=1)
        report.write()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
