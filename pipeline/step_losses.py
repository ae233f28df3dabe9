"""The loop's per-step figures without a host sync per step.

Reading a loss (float(), .item()) or reducing a number over ranks makes the host wait for the
device: on a GPU with millisecond steps that is a visible share of the step, and it shrinks the
measured AMP speed-up. So the step losses stay on the device until a log boundary (or an epoch
end, or a checkpoint), where one host read and one all-reduce bring in all of them; and the ranks
agree on a SIGTERM with an all-reduce started at one step and read at the next, by which time it
has finished.
"""
from __future__ import annotations

import torch
import torch.distributed

from pipeline.runtime import dist


class PendingLosses:
    """The steps since the last read, on the device: each step's loss (a 0-d tensor) and whether
    its update was applied (the backend's decision, also left on the device)."""

    def __init__(self):
        self.losses: list[torch.Tensor] = []
        self.stepped: list[torch.Tensor] = []

    def add(self, loss: torch.Tensor, stepped: torch.Tensor | bool) -> None:
        # a copy: under CUDA graphs the loss lives in a buffer that the next replay overwrites
        self.losses.append(loss.detach().float().reshape(()).clone())
        self.stepped.append(torch.as_tensor(stepped, device=loss.device).reshape(()))

    def __len__(self) -> int:
        return len(self.losses)

    def take(self) -> list[tuple[bool, float, bool]]:
        """Collective: per pending step, (did any rank have a non-finite loss, the sum over ranks of
        the finite losses, was the update skipped); then none pend. One host read and one
        all-reduce for all of them (every rank makes the same skip decision: its gradients are
        the all-reduced ones)."""
        if not self.losses:  # ranks step in lockstep: all of them have none
            return []
        losses = torch.stack(self.losses)
        finite = torch.isfinite(losses)
        skipped = ~torch.stack(self.stepped).to(losses.device)
        values = torch.cat([torch.where(finite, losses, 0.0).double(), (~finite).double(), skipped.double()]).tolist()
        n = len(self.losses)
        reduced = dist.all_reduce(values[:2 * n])
        self.losses, self.stepped = [], []
        return [(flag > 0, total, skip > 0) for total, flag, skip in zip(reduced[:n], reduced[n:], values[2 * n:])]


class AgreedFlag:
    """A host flag (SIGTERM seen) that every rank acts on at the same step without stalling the
    device: each poll starts an all-reduce (max) of this rank's flag and returns the result of the
    previous poll's, which has finished by then; so the ranks stop together, one step after the
    signal. In one process the flag itself is the answer, at once."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pending: tuple | None = None

    def poll(self, local: bool) -> bool:
        if not torch.distributed.is_initialized():
            return local
        agreed = self._finish()
        self._start(local)
        return agreed

    def settle(self) -> bool:
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
        answer = torch.empty(1, pin_memory=True)
        answer.copy_(flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._pending = (None, answer, done, flag)

    def _finish(self) -> bool:
        if self._pending is None:
            return False
        work, answer, done, _ = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        if done is not None:
            done.synchronize()  # the previous step's work only: this step's stays queued
        return bool(answer.item())
