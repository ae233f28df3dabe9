"""Checkpoints that a kill at any moment cannot corrupt, and the Checkpointer that owns them for a
job: when to save, what, the durable write, the last K kept, the restore.

Layout: OUTPUT_DIR/checkpoints/step-00000123/ with `state.pt` (every part of the loop's state by
name, collected from parts that save and restore themselves; rank 0), `job.json` (what the job
trains with: job_record.py; rank 0), what the backend writes
(`backend.pt`: model, optimizer, loss scaler; or DeepSpeed's own engine checkpoint under
`engine/`), `rng-rank{R}.pt` (every rank's RNG states), `best.safetensors` (best/'s weights
as of the checkpoint, hard-linked: no copy; rank 0) and `manifest.json` (sha256 of each file),
written last. Every file goes into a temporary directory that is fsync'ed (files, then
directories) and renamed when complete, so neither a kill nor a power loss publishes a partial
checkpoint; a save that fails (a full disk: DiskFull, one line) removes its temporary directory.
A directory without a valid manifest, or whose checksums do not match, is skipped with a warning
for the previous one. The pipeline's own files load with torch.load(weights_only=True);
DeepSpeed loads its engine/ folder itself.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np
import torch

from pipeline import fsutil
from pipeline.config import TrainConfig
from pipeline.errors import MachineError, UserError
from pipeline.layout import CheckpointFiles, OutputDir
from pipeline.runtime import collectives
from pipeline.runtime.backend import Backend

log = logging.getLogger("pipeline")
MANIFEST = CheckpointFiles.MANIFEST
FORMAT = 3
"""state.pt's layout (collect): a bundle of another format is refused in one line."""


class Pausable(Protocol):
    def pause(self) -> None: ...

    def resume(self) -> None: ...


class ReadBeforeSave(Protocol):
    """A part whose state trails the step until it is read from the device (the step losses):
    a save reads it first, a collective on every rank."""

    def read(self, step: int) -> None: ...


class Stateful(Protocol):
    """A part of the loop's state that saves and restores itself (torchtitan's Stateful):
    progress, meter totals, the best model, the step losses, the LR schedule."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


S = TypeVar("S", bound=Stateful)


def collect(parts: Mapping[str, Stateful], run_id: str | None) -> dict:
    """The bundle state.pt holds: every part's state by its name, and the MLflow run it logs to."""
    return {"format": FORMAT, "run_id": run_id, "parts": {name: part.state_dict() for name, part in parts.items()}}


def restore(bundle: dict, parts: Mapping[str, Stateful]) -> None:
    """Each part from its own entry of a bundle that collect() made."""
    for name, part in parts.items():
        part.load_state_dict(bundle["parts"][name])


@dataclass
class Checkpoint:
    path: Path
    step: int
    bundle: dict | None = field(default=None, repr=False, compare=False)
    """state.pt's bundle (collect), once load_bundle() read it."""

    @property
    def job(self) -> Path:
        """Its job.json: the record of the job that wrote it (as OutputDir.job is a finished job's)."""
        return self.path / CheckpointFiles.JOB

    def load_state(self) -> dict:
        """What save() was given as `state`, as saved."""
        return torch.load(self.path / CheckpointFiles.STATE, map_location="cpu", weights_only=True)

    def load_bundle(self) -> dict:
        """The bundle of collect(), read once; a checkpoint of another format is the user's to move aside."""
        if self.bundle is None:
            bundle = self.load_state()
            if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
                raise UserError(f"checkpoint {self.path}: written in another checkpoint format than this version's "
                                f"({FORMAT}); resume=never overwrite=true starts over, or use another output_dir")
            self.bundle = bundle
        return self.bundle

    def best_weights(self, out: OutputDir) -> Path:
        """The best model's weights as of this checkpoint: its own link, else (a checkpoint saved
        without one) best/'s."""
        own = self.path / CheckpointFiles.BEST
        return own if own.is_file() else out.best_weights

    def saved(self, name: str, part: S) -> S:
        """`part` (a fresh one) with the state the checkpoint holds for the loop's part `name`, read
        through the part's own load_state_dict: what a part saved is that part's to read."""
        part.load_state_dict(self.load_bundle()["parts"][name])
        return part

    @property
    def run_id(self) -> str | None:
        """The MLflow run it logs to (from its bundle)."""
        return self.load_bundle()["run_id"]

    def restore_rng(self, rank: int) -> None:
        path = self.path / CheckpointFiles.rng(rank)
        if not path.is_file():  # a job restarted with more ranks: new ranks keep their seeds
            log.warning("checkpoint %s has no RNG state for rank %d", self.path.name, rank)
            return
        set_rng_state(torch.load(path, weights_only=True))


class Checkpointer:
    """The loop's checkpoints, built once with the loop (torchtitan's CheckpointManager): when to
    save (every `save_every` optimizer steps inside an epoch, at an epoch's end unless training is
    over, and at once when the ranks agreed on a SIGTERM), what (every part of the loop's state by
    name, the backend's state, every rank's RNG, the job's record), the durable write, the last
    `keep` kept; and the restore of all of it. The loop calls after_step once per optimizer step
    and at_epoch_end once per epoch."""

    def __init__(self, out: OutputDir, parts: Mapping[str, Stateful], backend: Backend, rank: int,
                 train: TrainConfig, run_id: str | None, job: dict, pending: ReadBeforeSave, clock: Pausable):
        self.out, self.parts, self.backend, self.rank = out, parts, backend, rank
        self.save_every, self.keep, self.run_id, self.job = train.save_every, train.keep_checkpoints, run_id, job
        self.pending = pending
        """Read first on every rank (a collective): its state brought up to the step."""
        self.clock = clock
        """Paused while saving: a save is neither training time nor training energy."""

    def write_job(self) -> None:
        """Rank 0: the job's record into output_dir too, what a later resume=auto compares with once
        this job finished (its checkpoints carry their own)."""
        if self.rank == 0:
            self.out.root.mkdir(parents=True, exist_ok=True)
            fsutil.write_json(self.out.job, self.job)

    def after_step(self, step: int, preempted: bool, last_of_epoch: bool) -> Path | None:
        """Collective, once per optimizer step: a checkpoint when the ranks agreed to stop
        (`preempted`) or every save_every steps (the epoch's last step leaves it to its end);
        the training clock paused meanwhile."""
        due = bool(self.save_every) and step % self.save_every == 0 and not last_of_epoch
        if not (preempted or due):
            return None
        self.clock.pause()
        try:
            return self.save(step)
        finally:
            self.clock.resume()

    def at_epoch_end(self, step: int, training_over: bool) -> Path | None:
        """Collective: a checkpoint at each epoch's end (its clocks have stopped), except the last:
        the job finishes instead."""
        return None if training_over else self.save(step)

    def save(self, step: int) -> Path:
        """Collective: everything, now."""
        self.pending.read(step)
        return save(self.out, step, collect(self.parts, self.run_id), self.rank, keep=self.keep,
                    write_backend=self.backend.save, files={CheckpointFiles.JOB: self.job},
                    links={CheckpointFiles.BEST: self.out.best_weights})

    def load(self, ckpt: Checkpoint) -> None:
        """Collective: the backend's state, every part's and this rank's RNG from a checkpoint; a
        MachineError when its files or the libraries cannot load it (its job's record matched)."""
        bundle = ckpt.load_bundle()
        try:
            self.backend.load(ckpt.path)
            restore(bundle, self.parts)
        except (RuntimeError, KeyError, ValueError, OSError) as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise MachineError(f"resume: checkpoint {ckpt.path}: cannot be loaded ({reason}); resume=never starts "
                               "over") from e
        ckpt.restore_rng(self.rank)
        if self.rank == 0:
            progress = bundle["parts"]["progress"]
            log.info("resumed from %s (epoch %d, step %d)", ckpt.path, progress["epoch"] + 1, progress["step"])

    def latest(self) -> Checkpoint | None:
        return latest(self.out)


def save(out: OutputDir, step: int, state: dict, rank: int, keep: int,
         write_backend: Callable[[Path, int], None] | None = None, files: Mapping[str, dict] | None = None,
         links: Mapping[str, Path] | None = None) -> Path:
    """Collective: every rank calls it at the same step boundary; write_backend(dir, rank) too.
    `files`: JSON files rank 0 writes beside the state (job.json: what the job trains with, which
    a resume compares before loading the rest); `links`: files rank 0 links in by name, those that
    exist (best/'s weights).

    A failure on any rank (DiskFull on a full disk) removes the temporary directory and raises."""
    final, tmp = out.checkpoint(step), out.checkpoint_in_progress(step)
    try:
        with fsutil.writing(tmp):
            if rank == 0:
                remove_partial(out)  # leftovers of saves that were killed
                tmp.mkdir(parents=True)
            collectives.barrier()
            save_torch(rng_state(), tmp / CheckpointFiles.rng(rank))
            if write_backend is not None:
                write_backend(tmp, rank)
            if rank == 0:
                save_torch(state, tmp / CheckpointFiles.STATE)
                for name, content in (files or {}).items():
                    fsutil.write_json(tmp / name, content)
                for name, source in (links or {}).items():
                    if source.is_file():
                        link_or_copy(source, tmp / name)
            collectives.barrier()
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
        for old in complete(out)[:-keep]:
            shutil.rmtree(old.path, ignore_errors=True)
    collectives.barrier()
    return final


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link (best/ is replaced whole, never written in place, so the link keeps its content),
    or a copy where the filesystem has no links."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def save_torch(obj: object, path: Path) -> None:
    """torch.save through a Python file, so a full disk raises OSError(ENOSPC) rather than
    torch's errno-less RuntimeError from its zip writer."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def remove_partial(out: OutputDir) -> None:
    """Temporary directories of saves that were killed or failed (they only take space)."""
    for tmp in out.checkpoints_in_progress():
        shutil.rmtree(tmp, ignore_errors=True)


def latest(out: OutputDir) -> Checkpoint | None:
    """The newest checkpoint whose files match their manifest; broken ones are skipped."""
    for ckpt in reversed(complete(out)):
        try:
            _verify(ckpt.path)
            return ckpt
        except (OSError, ValueError, KeyError) as e:
            log.warning("checkpoint %s is corrupted (%s); trying the previous one", ckpt.path.name, e)
    return None


def named(path: Path) -> Checkpoint:
    """The checkpoint at `path` (resume=PATH), its files checked against their manifest; a UserError
    naming it when it is not one or is damaged."""
    if not path.is_dir():
        raise UserError(f"resume={path}: no such directory")
    try:
        return Checkpoint(path, _verify(path))
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"resume={path}: not a complete checkpoint ({e}); resume=auto takes the newest "
                        "complete one") from None


def _verify(path: Path) -> int:
    """The step of the checkpoint at `path`; an error when its manifest is missing or a file does not
    match its checksum."""
    meta = json.loads((path / MANIFEST).read_text())
    for name, digest in meta["files"].items():
        if fsutil.file_sha256(path / name) != digest:
            raise ValueError(f"{name} does not match its checksum")
    return int(meta["step"])


def complete(out: OutputDir) -> list[Checkpoint]:
    """Checkpoints with a manifest (i.e. fully written), oldest first."""
    found = []
    for path in out.checkpoint_dirs():
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


def _py_state(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _np_state(state: tuple) -> list:  # weights_only loading takes tensors and plain types, not ndarrays
    kind, keys, pos, has_gauss, cached = state
    return [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]


