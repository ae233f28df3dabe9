"""SIGTERM (Slurm time limit, spot preemption) acted on by every rank at the same step:
on_sigterm routes the signal to an action while a block runs, AgreedFlag makes the ranks agree on
it without stalling the device, and Preempted is the stop it ends in."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

import torch

from pipeline.runtime.collectives import held


class Preempted(Exception):
    """SIGTERM arrived: a job wrote a checkpoint at the step boundary, a study's runner stopped its
    running stages (exit code 143)."""


@contextlib.contextmanager
def on_sigterm(action: Callable[[], None]):
    """SIGTERM (Slurm time limit, spot preemption) calls `action` while the block runs (the loop's:
    set the flag it acts on at a step boundary, AgreedFlag; a study's: stop); the handler before
    it comes back after. Only the main thread receives signals: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: action())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class AgreedFlag:
    """A host flag (SIGTERM seen) that every rank acts on at the same step without stalling the
    device: each poll starts an all-reduce (max) of this rank's flag and returns the result of the
    previous poll's, which has finished by then; so the ranks stop together, one step after the
    signal. In one process the flag itself is the answer, at once."""

    def __init__(self):
        self.raised = threading.Event()
        """Set on this rank (on_sigterm's handler); every rank acts on it at the same step."""
        self._pending: tuple | None = None

    def poll(self) -> bool:
        local = self.raised.is_set()
        if not torch.distributed.is_initialized():
            return local
        agreed = self._finish()
        self._start(local)
        return agreed

    def last_answer(self) -> bool:
        """Wait for the running all-reduce (before the loop stops polling); its answer."""
        return self._finish()

    def _start(self, local: bool) -> None:
        on_gpu = torch.distributed.get_backend() == "nccl"
        flag = torch.tensor([float(local)])
        if on_gpu:  # from pinned memory, no host wait; the answer comes back the same way
            flag = flag.pin_memory().to(f"cuda:{torch.cuda.current_device()}", non_blocking=True)
        work = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, async_op=True)
        if not on_gpu:
            self._pending = (work, flag, None, flag)
            return
        work.wait()  # the current stream waits for it; the host does not
        held(flag)
        answer = torch.empty(1, pin_memory=True)
        answer.copy_(flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._pending = (None, answer, done, flag)

    def _finish(self) -> bool:
        if self._pending is None:
            return False
        work, answer, done, flag = self._pending
        self._pending = None
        if work is not None:
            work.wait()
            held(flag)  # waited for: shutdown waits until the backend lets go of it too
        if done is not None:
            done.synchronize()  # the previous step's work only: this step's stays queued
        return bool(answer.item())
