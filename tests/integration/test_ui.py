"""`pipeline ui` leaves nothing behind: SIGTERM or SIGINT to it ends the MLflow server and every
process the server started (its uvicorn workers), and the port is free again."""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT, free_port, tracking_db, wait_for

# a server that, as `mlflow server` does, leaves the port to a process of its own
FAKE_SERVER = textwrap.dedent("""
    import subprocess, sys, time
    worker = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', %s)); s.listen(); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", worker % sys.argv[1]])
    time.sleep(600)
""")


def answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (from /proc; zombies awaiting their reaper left out)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def server_group(ui_pid: int) -> int:
    """The process group of the server `pipeline ui` started: its one child's."""
    children = Path(f"/proc/{ui_pid}/task/{ui_pid}/children").read_text().split()
    assert len(children) == 1, children
    return os.getpgid(int(children[0]))


def stop_and_check(proc: subprocess.Popen, sig: int, port: int) -> None:
    """Stop the ui with `sig`: it exits 0, the port is free, no process of its server's group is left
    (any that is, the test ends after the check)."""
    group = server_group(proc.pid)
    try:
        assert len(group_members(group)) >= 2  # the server and the process holding the port
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        assert port_is_free(port)
        assert group_members(group) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


@pytest.mark.slow  # a process and its fake server: about a second
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_ui_ends_its_server_and_the_servers_children(tmp_path, sig):
    port = free_port()
    code = (f"import sys; from pipeline.commands.ui import serve; "
            f"sys.exit(serve([sys.executable, '-c', {FAKE_SERVER!r}, '{port}'], {{}}))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    wait_for(lambda: answers(port) or proc.poll() is not None, timeout=60, what="the fake server's port")
    stop_and_check(proc, sig, port)


@pytest.mark.slow  # an MLflow server: 10-40 s to answer on a busy 2-core machine
def test_pipeline_ui_stopped_by_sigterm_frees_its_port(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "ui", "--uri", f"sqlite:///{tracking_db(tmp_path)}",
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: answers(port) or proc.poll() is not None, timeout=180, what="the MLflow server's port")
        assert proc.poll() is None
        stop_and_check(proc, signal.SIGTERM, port)
    finally:
        proc.kill()
