"""One job per output_dir: an exclusive lock held for the life of the job.

Global rank 0 takes a POSIX lock (fcntl.lockf) on OUTPUT_DIR/.lock before anything is written
there and holds it until the job ends; every rank learns the outcome, so a second job fails on
all its ranks at once, with one line, exit 2, having touched nothing. The same check runs once,
reading only, where the job decides what to do with output_dir (resume.decide), before it loads
its data and model, so a duplicate fails in seconds. The kernel (or the NFS
server) drops the lock when its process dies, SIGKILL included, so a dead job never blocks the
next; the file keeps the holder's pid, host and start time for the messages, and is emptied
when a job ends normally, so a leftover record means the job that wrote it died.

POSIX locks rather than flock: forked DataLoader workers do not inherit them, so a restarted
worker group never waits for the dying workers of the previous one. They hold across nodes on
a file system with coherent locks (NFSv4, Lustre mounted with `flock`, GPFS); where the file
system has none, the job warns and runs unlocked.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from pipeline import fsutil
from pipeline.errors import UserError
from pipeline.layout import OutputDir
from pipeline.runtime import collectives

log = logging.getLogger("pipeline")

NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
"""The file system cannot lock (some network mounts)."""


class OutputLock:
    """This process's lock on one output_dir; release() when the job ends."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self._fd = path, fd

    def __getstate__(self) -> dict:
        # the lock is the taking process's: a copy sent to another rank holds (and releases) nothing
        return {"path": self.path, "_fd": None}

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty file: the last holder ended normally
        except OSError:
            pass
        os.close(self._fd)  # drops the lock
        self._fd = None


def acquire(out: OutputDir) -> OutputLock:
    """Lock output_dir for this process; UserError naming the holder if another job has it."""
    out.root.mkdir(parents=True, exist_ok=True)
    path = out.lock
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # an existing file is not changed
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        previous = _holder(fd)
        os.close(fd)
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise UserError(_in_use(out, previous)) from None
        if e.errno in NO_LOCKS:
            log.warning("output_dir %s: the file system cannot lock %s (%s); a second job writing into "
                        "it would not be detected", out, path, e.strerror)
            return OutputLock(path, None)
        raise
    previous = _holder(fd)
    if previous:
        log.warning("output_dir %s: taking over the lock of a job that ended without releasing it (%s)",
                    out, previous)
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return OutputLock(path, fd)


@contextlib.contextmanager
def job_lock(out: OutputDir):
    """Collective: rank 0 holds the output_dir lock for the block; if another job has it,
    every rank raises the same UserError."""
    held = collectives.on_main(acquire)(out)
    try:
        yield held
    finally:
        held.release()


def refuse_if_busy(out: OutputDir) -> None:
    """Reads only: a UserError if a live job holds out's lock (nothing is created), so a job fails
    at once rather than after minutes of loading its data and model (job_lock takes the lock)."""
    if not fsutil.lock_held(out.lock):
        return
    try:
        fd = os.open(out.lock, os.O_RDONLY)
        holder = _holder(fd)
        os.close(fd)
    except OSError:
        holder = ""
    raise UserError(_in_use(out, holder))


def _in_use(out: OutputDir, holder: str) -> str:
    return (f"output_dir={out}: in use by another job ({holder or 'holder unknown'}); "
            "wait for it to end or choose another output_dir")


def _holder(fd: int) -> str:
    """'pid P on host H since T' from the lock file, or '' if it holds no record."""
    try:
        data = os.pread(fd, 4096, 0)
        record = json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return ""
    if not isinstance(record, dict):
        return ""
    return f"pid {record.get('pid')} on host {record.get('host')} since {record.get('started')}"
