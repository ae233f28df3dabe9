"""One cell's stage process: started with its own environment, its output kept whole in its log
file (and echoed to the console when it is the only cell running), polled for its end (a
study/executor.py Handle).
The log keeps every attempt at the cell (each run of the study), each under a line that marks it.

The stage writes its log itself, so a stage that outlives a killed runner keeps its whole output
(a pipe to the runner would break with it). A thread per process reads the log back as it grows,
so the study watches all its running cells at once.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

ATTEMPT = "=== attempt "
FOLLOW_S = 0.2  # how often a running stage's log is read back


class CellProcess:
    """The process, and once it ended (`poll`) its exit code, the last error line of its output
    (the CLI's one-line error, a traceback's; else its last line) and its wall time."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path, echo: bool):
        self.name, self.cmd, self.env, self.log_path, self.echo = name, cmd, env, log_path, echo
        self.proc: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._follow, name=f"cell-{name}", daemon=True)
        self.start_time = 0.0
        self.offset = 0
        """Where this attempt's output starts in the log."""
        self.exit_code: int | None = None
        self.last_line = ""
        self.wall_s = 0.0

    def start(self) -> None:
        self.start_time = time.perf_counter()
        with open_attempt(self.log_path) as log:
            log.write(f"+ {subprocess.list2cmdline(self.cmd)}\n")
            log.flush()
            self.offset = self.log_path.stat().st_size
            try:  # the stage appends to the log through its own descriptor; in a session of its own, a
                # terminal's Ctrl-C reaches only the runner, which stops it through stop()
                self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                             start_new_session=True)
            except OSError as e:  # the launcher itself is missing (deepspeed not installed)
                log.write(f"{e}\n")
                self.last_line, self.exit_code = f"cannot start {self.cmd[0]}: {e.strerror}", 127
                return
        self.thread.start()

    def stop(self) -> None:
        """Pass a SIGTERM on: the stage checkpoints at its next step and the next invocation resumes it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def poll(self) -> bool:
        """Whether it has ended (its follower read its output to the end)."""
        if self.exit_code is None:
            return False
        self.wait()
        return True

    def wait(self) -> None:
        if self.thread.is_alive():
            self.thread.join()

    def _follow(self) -> None:
        """The stage's output read back from its log as it grows (echoed, its last lines kept), until it ends."""
        rest, last = b"", ("", "")
        with self.log_path.open("rb") as log:
            log.seek(self.offset)
            while True:
                code = self.proc.poll()
                *lines, rest = (rest + log.read()).split(b"\n")
                if code is not None and rest:  # the output's last line, without its newline
                    lines, rest = [*lines, rest], b""
                for raw in lines:
                    text = raw.decode("utf-8", errors="replace") + "\n"
                    if self.echo:
                        sys.stdout.write(text)
                    last = _seen(text, *last)
                if self.echo:
                    sys.stdout.flush()
                if code is not None:
                    break
                time.sleep(FOLLOW_S)
        self.last_line = last[1] or last[0]
        self.wall_s = time.perf_counter() - self.start_time
        self.exit_code = code  # last: poll reads the others once it is set


def open_attempt(log_path: Path) -> TextIO:
    """A cell's log, open to append one more attempt after those before it (a study run again
    keeps what the killed one's cells wrote), its first line `=== attempt N, TIME UTC ===`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    before = log_path.read_bytes() if log_path.is_file() else b""
    n = 1 + sum(1 for line in before.splitlines() if line.startswith(ATTEMPT.encode()))
    f = log_path.open("a", encoding="utf-8")
    fresh = "\n" if before and not before.endswith(b"\n") else ""  # a stage's last line may have none
    f.write(f"{fresh}{ATTEMPT}{n}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC ===\n")
    f.flush()
    return f


def last_line(lines: Iterable[str]) -> str:
    """What a failed stage's output says in one line: its last error line (the CLI's one-line
    error, a traceback's last line), else its last line. Of a whole log, only its last attempt
    counts."""
    last = ("", "")
    for text in lines:
        last = _seen(text, *last)
    return last[1] or last[0]


def _seen(text: str, line: str, error: str) -> tuple[str, str]:
    """(the last line, the last error line) once `text`, the output's next line, is read."""
    if text.startswith(ATTEMPT):  # a log's next attempt: what the one before said is not its
        return "", ""
    if not text.strip():
        return line, error
    line = text.strip()
    return line, line if text.startswith("error") or "Error" in text else error
