"""Write-then-rename helpers: a reader never sees a half-written directory or file."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """Generated sample sets, tokenizers and teacher caches ($PIPELINE_CACHE overrides)."""
    return Path(os.environ.get("PIPELINE_CACHE", Path.home() / ".cache" / "bangla-amp-pipeline"))


@contextmanager
def atomic_dir(final: Path, replace: bool = False):
    """Yield a temporary sibling directory; on success it becomes `final`.

    replace=False: if `final` already exists (another rank won the race) the new copy is
    dropped. replace=True: the old `final` is swapped out only after the new one is complete.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-"))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replace and final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        return
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: Path, data) -> None:
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
