"""Files that survive a kill and a power loss, and a full disk that says so.

Write-then-rename: a reader never sees a half-written file or directory, and what is renamed
into place has been fsync'ed first (file contents, then the directory entries), so a power loss
cannot leave a published but empty file. A write that fails because the disk is full becomes
DiskFull, one line naming the path.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from glob import escape as glob_escape
from pathlib import Path

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_HOST = socket.gethostname().replace("-", "_")  # temporary names split on "-"
LOW_SPACE = 16 * 2**20
"""Bytes free under which a failed write is blamed on the disk: torch's zip writer loses the
errno of a write to a full disk (RuntimeError: ... unexpected pos), so the disk is asked."""


class DiskFull(OSError):
    """No space left on the device (or quota) while writing `path`: an environment failure,
    reported as one line (exit code 1), never a traceback."""

    def __init__(self, path: Path):
        self.path = Path(path)
        free = free_bytes(self.path)
        where = f" ({free / 2**20:.0f} MiB free there)" if free is not None else ""
        super().__init__(errno.ENOSPC, f"no space left on device: writing {self.path}{where}; "
                                       "free some space and run again with resume=auto")

    def __str__(self) -> str:
        return self.strerror


def cache_root() -> Path:
    """Generated sample sets, tokenizers and teacher caches ($PIPELINE_CACHE overrides)."""
    return Path(os.environ.get("PIPELINE_CACHE", Path.home() / ".cache" / "bangla-amp-pipeline"))


# ---------------------------------------------------------------------- a full disk


def file_sha256(path: Path) -> str:
    """The file's sha256, read in 1 MiB blocks (checkpoint manifests, prepared-data keys)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system of `path` (or its nearest
    existing parent); None if it cannot be asked."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(error: BaseException, path: Path) -> bool:
    """Did this write fail because the disk (or quota) is full? Looks through the exception's
    causes for ENOSPC/EDQUOT; a writer that lost the errno (torch, safetensors) is judged by the
    space left where it wrote."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in FULL_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    if not isinstance(error, (OSError, RuntimeError)) and "safetensor" not in type(error).__name__.lower():
        return False
    free = free_bytes(path)
    return free is not None and free < LOW_SPACE


@contextmanager
def writing(path: Path):
    """Writes inside the block that fail on a full disk raise DiskFull naming `path`."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if is_disk_full(e, path):
            raise DiskFull(path) from e
        raise


# ---------------------------------------------------------------------- durable writes


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a created or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every file under root, then every directory (deepest first): ready to be renamed."""
    root = Path(root)
    dirs = [root]
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            continue
        if path.is_dir():
            dirs.append(path)
        elif path.is_file():
            fsync_file(path)
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def publish(tmp: Path, final: Path) -> None:
    """Rename a complete, fsync'ed `tmp` to `final` and make the rename durable."""
    os.replace(tmp, final)
    fsync_dir(Path(final).parent)


def remove_abandoned(final: Path) -> None:
    """Remove temporary siblings of `final` that a killed writer left behind: those of this host
    whose process is gone (a live process, or another host's on shared storage, is left alone;
    a reused pid only delays the removal)."""
    for tmp in final.parent.glob(f".{glob_escape(final.name)}.tmp-{glob_escape(_HOST)}-*-*"):
        pid = tmp.name[len(f".{final.name}.tmp-{_HOST}-"):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def atomic_dir(final: Path, replace: bool = False):
    """Yield a temporary sibling directory; on success it becomes `final`.

    replace=False: if `final` already exists (another rank won the race) the new copy is
    dropped. replace=True: the old `final` is swapped out only after the new one is complete.
    A failed write (a full disk among others) removes the temporary directory.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(final)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-{_HOST}-{os.getpid()}-"))
    try:
        with writing(final):
            yield tmp
            fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replace and final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
        publish(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return
    fsync_dir(final.parent)


def write_bytes(path: Path, data: bytes) -> None:
    """Write-then-rename one file, fsync'ed; DiskFull on a full disk, no temporary left."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    publish(tmp, path)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: object) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def lock_held(path: Path) -> bool:
    """Whether another process holds a POSIX lock (fcntl.lockf) on path: reads only, creates
    nothing (no file: nobody holds it). The probe's own shared lock goes with its descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails while another process holds it
    except OSError as e:
        return e.errno in (errno.EACCES, errno.EAGAIN)
    finally:
        os.close(fd)
    return False
