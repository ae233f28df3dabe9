"""Checkpoints that a kill at any moment cannot corrupt.

Layout: OUTPUT_DIR/checkpoints/step-00000123/ with `state.pt` (scheduler and LoopState, the
loop's position and history, rank 0), what the backend writes (`backend.pt`: model, optimizer,
loss scaler; or DeepSpeed's own engine checkpoint under `engine/`), `rng-rank{R}.pt` (every
rank's RNG states) and `manifest.json` (sha256 of each file), written last. Every file goes into
a temporary directory that is fsync'ed (files, then directories) and renamed when complete, so
neither a kill nor a power loss publishes a partial checkpoint; a save that fails (a full disk:
DiskFull, one line) removes its temporary directory. A directory without a valid manifest, or
whose checksums do not match, is skipped with a warning for the previous one. The pipeline's own
files load with torch.load(weights_only=True); DeepSpeed loads its engine/ folder itself.
"""
from __future__ import annotations

import json
import logging
import math
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pipeline import fsutil
from pipeline.runtime import dist

log = logging.getLogger("pipeline")
MANIFEST = "manifest.json"


@dataclass
class LoopState:
    """Everything about the loop's position and history that a resumed job needs."""

    epoch: int = 0
    batches_done: int = 0  # micro-batches of `epoch` already trained (a multiple of grad_accum)
    step: int = 0
    skipped: int = 0
    nonfinite: int = 0
    nonfinite_streak: int = 0
    bad_evals: int = 0
    best_main: float = -math.inf
    best_figures: dict = field(default_factory=dict)
    time_to_best: float | None = None
    train_seconds: float = 0.0
    compile_seconds: float = 0.0  # inside training, left out of train_seconds
    samples: float = 0.0
    tokens: float = 0.0
    flops: float = 0.0  # of the micro-batches trained, summed over ranks (telemetry.FlopModel)
    joules: float = 0.0
    epoch_times: list = field(default_factory=list)
    peak: dict = field(default_factory=dict)
    last_loss: float = math.nan
    loss_window: list = field(default_factory=lambda: [0.0, 0])
    """Sum and count of the finite step losses since train/loss was last logged, summed over
    ranks (the same on every rank; steps not yet read from the device are not in it)."""
    run_id: str | None = None


@dataclass
class Checkpoint:
    path: Path
    step: int

    def load_state(self, map_location="cpu") -> dict:
        return torch.load(self.path / "state.pt", map_location=map_location, weights_only=True)

    def restore_rng(self, rank: int) -> None:
        path = self.path / f"rng-rank{rank}.pt"
        if not path.is_file():  # a job restarted with more ranks: new ranks keep their seeds
            log.warning("checkpoint %s has no RNG state for rank %d", self.path.name, rank)
            return
        set_rng_state(torch.load(path, weights_only=True))


def directory(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save(output_dir: Path, step: int, state: dict, rank: int, keep: int, write_backend=None) -> Path:
    """Collective: every rank calls it at the same step boundary; write_backend(dir, rank) too.

    A failure on any rank (DiskFull on a full disk) removes the temporary directory and raises."""
    root = directory(output_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".step-{step:08d}.tmp"
    try:
        with fsutil.writing(tmp):
            if rank == 0:
                remove_partial(output_dir)  # leftovers of saves that were killed
                tmp.mkdir(parents=True)
            dist.barrier()
            save_torch(rng_state(), tmp / f"rng-rank{rank}.pt")
            if write_backend is not None:
                write_backend(tmp, rank)
            if rank == 0:
                save_torch(state, tmp / "state.pt")
            dist.barrier()
            if rank == 0:
                files = {str(p.relative_to(tmp)): fsutil.file_sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
                (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1))
                fsutil.fsync_tree(tmp)  # every rank's files are complete (barrier): make them durable
                shutil.rmtree(final, ignore_errors=True)
                fsutil.publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if rank == 0:
        for old in complete(output_dir)[:-keep]:
            shutil.rmtree(old.path, ignore_errors=True)
    dist.barrier()
    return final


def save_torch(obj, path: Path) -> None:
    """torch.save through a Python file, so a full disk raises OSError(ENOSPC) rather than
    torch's errno-less RuntimeError from its zip writer."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def remove_partial(output_dir: Path) -> None:
    """Temporary directories of saves that were killed or failed (they only take space)."""
    root = directory(output_dir)
    for tmp in root.glob(".step-*.tmp") if root.is_dir() else []:
        shutil.rmtree(tmp, ignore_errors=True)


def latest(output_dir: Path) -> Checkpoint | None:
    """The newest checkpoint whose files match their manifest; broken ones are skipped."""
    for ckpt in reversed(complete(output_dir)):
        try:
            meta = json.loads((ckpt.path / MANIFEST).read_text())
            for name, digest in meta["files"].items():
                if fsutil.file_sha256(ckpt.path / name) != digest:
                    raise ValueError(f"{name} does not match its checksum")
            return ckpt
        except (OSError, ValueError, KeyError) as e:
            log.warning("checkpoint %s is corrupted (%s); trying the previous one", ckpt.path.name, e)
    return None


def complete(output_dir: Path) -> list[Checkpoint]:
    """Checkpoints with a manifest (i.e. fully written), oldest first."""
    found = []
    root = directory(output_dir)
    for path in sorted(root.glob("step-*")) if root.is_dir() else []:
        try:
            found.append(Checkpoint(path, int(json.loads((path / MANIFEST).read_text())["step"])))
        except (OSError, ValueError, KeyError):
            log.warning("checkpoint %s has no valid manifest; skipping it", path.name)
    return sorted(found, key=lambda c: c.step)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": _py_state(random.getstate()),
             "numpy": _np_state(np.random.get_state())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _py_state(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _np_state(state):  # weights_only loading takes tensors and plain types, not ndarrays
    kind, keys, pos, has_gauss, cached = state
    return [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]


