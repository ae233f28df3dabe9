"""One cell's stage process: started with its own environment, its output kept whole in its log
file (and echoed to the console when it is the only cell running), its end reported on a queue.

A thread per process reads its output, so the study waits on all its running cells at once and
a cell never blocks on a full pipe.
"""
from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Ended:
    name: str
    exit_code: int
    last_line: str
    """The last error line of its output (the CLI's one-line error, a traceback's), else its last line."""
    wall_s: float


class CellProcess:
    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path, echo: bool,
                 ended: queue.Queue[Ended]):
        self.name, self.cmd, self.env, self.log_path, self.echo, self.ended = name, cmd, env, log_path, echo, ended
        self.proc: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._follow, name=f"cell-{name}", daemon=True)
        self.start_time = 0.0

    def start(self) -> None:
        self.start_time = time.perf_counter()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = self.log_path.open("w", encoding="utf-8")
        self.log.write(f"+ {subprocess.list2cmdline(self.cmd)}\n")
        self.log.flush()
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                         text=True, errors="replace")
        except OSError as e:  # the launcher itself is missing (deepspeed not installed)
            self.log.write(f"{e}\n")
            self.log.close()
            self.ended.put(Ended(self.name, 127, f"cannot start {self.cmd[0]}: {e.strerror}", 0.0))
            return
        self.thread.start()

    def stop(self) -> None:
        """Pass a SIGTERM on: the stage checkpoints at its next step and the next invocation resumes it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def join(self) -> None:
        if self.thread.is_alive():
            self.thread.join()

    def _follow(self) -> None:
        last = LastLine()
        with self.log:
            for line in self.proc.stdout:
                if self.echo:
                    sys.stdout.write(line)
                self.log.write(line)
                last.see(line)
            code = self.proc.wait()
        self.ended.put(Ended(self.name, code, last.text, time.perf_counter() - self.start_time))


class LastLine:
    """What a failed stage's output says in one line: its last error line (the CLI's one-line
    error, a traceback's last line), else its last line."""

    def __init__(self):
        self.line = self.error = ""

    def see(self, line: str) -> None:
        if line.strip():
            self.line = line.strip()
            if line.startswith("error") or "Error" in line:
                self.error = self.line

    @property
    def text(self) -> str:
        return self.error or self.line
