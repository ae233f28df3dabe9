"""How busy the machine was while a segment was timed (pipeline/measure/load.py): the tests that train
a model or start a process (the others are in tests/unit/test_load.py)."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pipeline import names
from pipeline.measure.load import LoadSampler
from pipeline.measure.telemetry import StageMeters
from unit.test_load import CPU  # noqa: F401


def orphan(code: str) -> psutil.Process:
    """A real process outside this process's tree (started by a shell that exits at once, so it is
    reparented and no descendant of the test): other work on the machine."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c '{code}' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    process = psutil.Process(int(out.stdout.strip()))
    assert process.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    return process


@pytest.fixture
def busy_elsewhere():
    """A stand-in for other work: a real busy process spinning one core, outside this job."""
    spinner = orphan("while True: pass")
    yield spinner
    os.kill(spinner.pid, signal.SIGKILL)


def cpu_share(process: psutil.Process, since: tuple[float, float]) -> float:
    """The process's CPU time since (wall, cpu) as a share of the machine's cores."""
    t = process.cpu_times()
    return (t.user + t.system - since[1]) / ((time.monotonic() - since[0]) * psutil.cpu_count())


@pytest.mark.slow
def test_a_busy_process_elsewhere_shows_in_the_stages_logged_figures(busy_elsewhere):
    """The stage's meters log the share of the machine other processes used while it trained; the
    same window seen from the busy process's side (a sampler whose job is the spinner) reads lower
    by about the spinner's own share: it is counted as other work, and only there."""
    meters = StageMeters(CPU, "fp32", world_size=1)
    meters.load.interval_s = 0.1
    as_the_spinner = LoadSampler(CPU, interval_s=0.1, root_pid=busy_elsewhere.pid)
    t = busy_elsewhere.cpu_times()
    since = (time.monotonic(), t.user + t.system)
    meters.start_epoch()
    as_the_spinner.start()
    meters.add_batch([8], 1, 8)
    time.sleep(1.5)  # the stage idles while the spinner runs
    metrics = meters.end_epoch()
    seen_by_spinner = as_the_spinner.stop()
    spinner = cpu_share(busy_elsewhere, since)
    assert spinner > 0.1  # it did run (the machine may be shared by more than this test)
    others = metrics[names.load_metric(names.LOAD_OTHERS_CPU)]
    assert others >= 0.8 * spinner
    assert others - seen_by_spinner.others_cpu >= 0.5 * spinner
    assert metrics[names.load_metric(names.LOAD_OTHERS_CPU_MAX)] >= others
    assert not any("gpu" in k for k in metrics if k.startswith(names.PERF + "others"))  # a CPU: no GPU figures
    final = meters.final_figures(time_to_best=None)
    assert final[names.load_metric(names.LOAD_OTHERS_CPU)] == pytest.approx(others)


@pytest.mark.slow
def test_this_jobs_own_processes_are_not_other_work():
    """A child of this process (a DataLoader worker, a launcher's other rank) is the job's own."""
    sampler = LoadSampler(CPU, interval_s=0.1)
    idle = orphan("import time; time.sleep(60)")
    as_outsider = LoadSampler(CPU, interval_s=0.1, root_pid=idle.pid)  # the same window seen by another job
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        child_process = psutil.Process(child.pid)
        t = child_process.cpu_times()
        since = (time.monotonic(), t.user + t.system)
        sampler.start()
        as_outsider.start()
        time.sleep(1.5)
        mine, outside = sampler.stop(), as_outsider.stop()
        share = cpu_share(child_process, since)
    finally:
        child.kill()
        child.wait()
        idle.kill()
    assert share > 0.1
    assert outside.others_cpu - mine.others_cpu >= 0.4 * share
