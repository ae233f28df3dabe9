"""The step losses: read from the device without a host sync per step, and the loss window and
AMP health counters they feed (a part of the loop's state that saves and restores itself).

Reading a loss (float(), .item()) or reducing a number over ranks makes the host wait for the
device: on a GPU with millisecond steps that is a visible share of the step, and it shrinks the
measured AMP speed-up. So the step losses stay on the device until a log boundary (or an epoch
end, or a checkpoint), where one host read and one all-reduce bring in all of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from pipeline import names
from pipeline.runtime import dist


class PendingLosses:
    """The steps since the last read, on the device: each step's loss (a 0-d tensor) and whether
    its update was applied (the backend's decision, also left on the device)."""

    def __init__(self):
        self.losses: list[torch.Tensor] = []
        self.stepped: list[torch.Tensor] = []
        self._skipped: list[float] = []

    def add(self, loss: torch.Tensor, stepped: torch.Tensor | bool) -> None:
        # a copy: under CUDA graphs the loss lives in a buffer that the next replay overwrites
        self.losses.append(loss.detach().float().reshape(()).clone())
        self.stepped.append(torch.as_tensor(stepped, device=loss.device).reshape(()))

    def __len__(self) -> int:
        return len(self.losses)

    def local(self) -> dist.Local:
        """This rank's share of the read (one host read of every pending step): per step its finite
        loss (0 where non-finite) and a non-finite flag, summed over ranks; the skip flags stay
        local (every rank makes the same skip decision: its gradients are the all-reduced ones)."""
        if not self.losses:  # ranks step in lockstep: all of them have none
            return dist.Local()
        losses = torch.stack(self.losses)
        finite = torch.isfinite(losses)
        skipped = ~torch.stack(self.stepped).to(losses.device)
        values = torch.cat([torch.where(finite, losses, 0.0).double(), (~finite).double(), skipped.double()]).tolist()
        n = len(self.losses)
        self._skipped = values[2 * n:]
        return dist.Local(sums=values[:2 * n])

    def take(self, reduced: dist.Reduced | None = None) -> list[tuple[bool, float, bool]]:
        """Collective unless `reduced` (local()'s numbers over every rank, read in a collective shared
        with other parts) is given: per pending step, (did any rank have a non-finite loss, the sum
        over ranks of the finite losses, was the update skipped); then none pend."""
        if reduced is None:
            (reduced,) = dist.reduce_together([self.local()])
        n = len(self.losses)
        sums, skipped = reduced.sums, self._skipped
        self.losses, self.stepped, self._skipped = [], [], []
        return [(flag > 0, total, skip > 0) for total, flag, skip in zip(sums[:n], sums[n:], skipped)]


@dataclass
class StepLosses:
    """The steps' losses once read: the window since train/loss was last logged (sum and count of
    the finite step losses, summed over ranks: the same on every rank), the last logged mean, and
    AMP health (updates skipped, non-finite losses, the current streak of them). The pending,
    unread steps are not state: a checkpoint reads them first."""

    window_sum: float = 0.0
    window_count: int = 0
    last_loss: float = math.nan
    skipped: int = 0
    nonfinite: int = 0
    nonfinite_streak: int = 0
    pending: PendingLosses = field(default_factory=PendingLosses, repr=False, compare=False)

    def read(self, step: int, world_size: int, max_nonfinite: int, reduced: dist.Reduced | None = None
             ) -> tuple[int, int | None]:
        """Collective (unless `reduced`: PendingLosses.take): the steps pending since the last read
        into the window (`step` is the last of them). Returns (updates skipped among them, the step
        at which a streak of `max_nonfinite` non-finite losses was reached, or None)."""
        first = step - len(self.pending) + 1
        taken = self.pending.take(reduced)
        skipped = sum(skip for _, _, skip in taken)
        self.skipped += skipped
        for k, (nonfinite, total, _) in enumerate(taken):
            if not nonfinite:
                self.window_sum += total
                self.window_count += world_size
                self.nonfinite_streak = 0
                continue
            self.nonfinite += 1
            self.nonfinite_streak += 1
            if self.nonfinite_streak >= max_nonfinite:
                return skipped, first + k
        return skipped, None

    def close_window(self) -> float:
        """The window's mean loss (NaN when every step in it was non-finite), kept as last_loss;
        the next window starts empty."""
        self.last_loss = self.window_sum / self.window_count if self.window_count else math.nan
        self.window_sum, self.window_count = 0.0, 0
        return self.last_loss

    def amp_metrics(self, loss_scale: float | None) -> dict[str, float]:
        """AMP health: skipped steps, non-finite losses and (fp16) the current loss scale."""
        metrics = {names.SKIPPED_STEPS: self.skipped, names.NONFINITE_LOSSES: self.nonfinite}
        if loss_scale is not None:
            metrics[names.LOSS_SCALE] = loss_scale
        return metrics

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in STEP_LOSSES_STATE}

    def load_state_dict(self, state: dict) -> None:
        for k in STEP_LOSSES_STATE:
            setattr(self, k, state[k])


STEP_LOSSES_STATE = ("window_sum", "window_count", "last_loss", "skipped", "nonfinite", "nonfinite_streak")
