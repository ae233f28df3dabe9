"""One job per output_dir: a second job fails with one line and touches nothing; the lock of a
job that died is taken over with a message."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from helpers import FAST, ROOT, mlflow_runs, run_cli, tracking_db, wait_for

pytestmark = pytest.mark.slow  # every test starts a process

HOLD = """
import sys, time
from pipeline.job import lock
from pipeline.layout import OutputDir
held = lock.acquire(OutputDir(sys.argv[1]))
print("locked", flush=True)
if sys.argv[2] == "die":
    import os; os._exit(0)  # like a SIGKILL: no release
sys.stdin.readline()  # hold until told
held.release()
"""


def holder(path, mode):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), mode], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_held_lock_refuses_a_second_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, caplog):
    from pipeline.errors import UserError
    from pipeline.job import lock
    from pipeline.layout import OutputDir

    alive = holder(tmp_path, "hold")
    with pytest.raises(UserError, match=rf"output_dir={tmp_path}: in use by another job \(pid {alive.pid} on host "):
        lock.acquire(OutputDir(tmp_path))
    alive.communicate("\n", timeout=60)  # it releases and ends normally
    lock.acquire(OutputDir(tmp_path)).release()
    assert "taking over" not in caplog.text

    dead = holder(tmp_path, "die")
    dead.wait(timeout=60)
    lock.acquire(OutputDir(tmp_path)).release()
    assert f"taking over the lock of a job that ended without releasing it (pid {dead.pid} on host" in caplog.text


def test_a_second_job_into_a_busy_output_dir_fails_in_one_line_and_touches_nothing(tmp_path):
    out, db = tmp_path / "out", tracking_db(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "pipeline", "train", *FAST, "train.epochs=50", "seed=1",
                              f"output_dir={out}", f"tracking.uri=sqlite:///{db}"], cwd=ROOT,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=open(tmp_path / "log", "w"),
                             stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: '"type": "run"' in ((out / "journal.jsonl").read_text() if (out / "journal.jsonl").exists()
                                             else "") or first.poll() is not None, what="the first job's run")
        assert first.poll() is None, (tmp_path / "log").read_text()[-2000:]
        config = (out / "config.yaml").read_text()

        second = run_cli("train", *FAST, "train.epochs=1", "seed=2", f"output_dir={out}",
                         f"tracking.uri=sqlite:///{db}")
        assert second.returncode == 2, second.stderr[-2000:]
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, second.stderr[-2000:]
        assert errors[0].startswith(f"error: output_dir={out}: in use by another job (pid {first.pid} on host "
                                    f"{socket.gethostname()} since "), errors
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # still training, undisturbed
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert (out / "config.yaml").read_text() == config  # the second job wrote nothing
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records].count("start") == 1 and records[0]["params"]["seed"] == "1"
    (run,) = mlflow_runs(db, "pipeline")  # no run of the second job
    assert run.data.params["seed"] == "1" and run.info.status == "KILLED"
