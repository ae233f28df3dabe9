"""The step losses and the LR schedule around skipped steps: one part owns both, from the step that
left its loss and skip flag on the device to the read that brings them in (a part of the loop's
state that saves and restores itself).

Reading a loss (float(), .item()) or reducing a number over ranks makes the host wait for the
device: on a GPU with millisecond steps that is a visible share of the step, and it shrinks the
measured AMP speed-up. So each step's loss and its skip flag (fp16 overflow, a non-finite gradient:
the backend's decision, also a device tensor) stay on the device until they are asked for (a log
step, an epoch end, a checkpoint), where one host read and one all-reduce bring in all of them. The
schedule steps on every optimizer step and is given the skipped ones back at that read (it is
closed-form, so the LR is exact again after it; until then it runs ahead by at most log_every).

A step's loss is a `StepLoss`: the total the backward runs on and its named terms (under
distillation: task, kd, hidden, attention, ...), which travel by name with the total, through the
same read, into the window and out as `train/loss_<term>`: a new term is a new name where the loss
is made, and nothing here changes.
"""
from __future__ import annotations

import copy
import math
import warnings

import torch

from pipeline import names
from pipeline.job.parts.checkpoint import latest
from pipeline.layout import OutputDir
from pipeline.runtime import collectives
from pipeline.runtime.backend import StepLoss

# The schedule steps on every optimizer step and gives skipped ones back at the read; when the
# first step is skipped (fp16's first loss scale), torch would call that a misordered call.
warnings.filterwarnings("ignore", "Detected call of `lr_scheduler", UserWarning)

STEP_LOSSES_STATE = ("window_sum", "window_count", "last_loss", "skipped", "nonfinite", "nonfinite_streak",
                     "term_sums", "last_terms", "epoch_sum", "epoch_count")
# what a checkpoint written before the terms and the epoch's mean existed restores them as
ABSENT_FROM_OLDER = {"term_sums": {}, "last_terms": {}, "epoch_sum": 0.0, "epoch_count": 0}


class Diverged(RuntimeError):
    """Too many consecutive non-finite losses (exit code 1; the last checkpoint is kept)."""


class StepLosses:
    """The steps' losses and the schedule they move. Read: the window since train/loss was last
    logged (sum and count of the finite step losses, summed over ranks: the same on every rank), the
    last logged mean, the same sum and count over the epoch so far, AMP health (updates skipped,
    non-finite losses, the current streak of them), and per named term its window sum and last
    logged mean. Pending, not state: the steps since the last read, on the device (a checkpoint
    reads them first). The LR schedule (`scheduler`) saves itself as its own entry of a checkpoint."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler, out: OutputDir, world_size: int,
                 max_nonfinite: int):
        self.scheduler, self.out, self.world_size, self.max_nonfinite = scheduler, out, world_size, max_nonfinite
        self.window_sum, self.window_count, self.last_loss = 0.0, 0, math.nan
        self.epoch_sum, self.epoch_count = 0.0, 0
        self.skipped, self.nonfinite, self.nonfinite_streak = 0, 0, 0
        self.term_sums: dict[str, float] = {}
        self.last_terms: dict[str, float] = {}
        self._losses: list[torch.Tensor] = []
        self._terms: list[dict[str, torch.Tensor]] = []
        self._stepped: list[torch.Tensor] = []
        self._skip_flags: list[float] = []

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def add(self, loss: StepLoss | torch.Tensor, stepped: torch.Tensor | bool) -> None:
        """An optimizer step: its loss (a tensor: a total without terms) and whether its update was
        applied, both left on the device; the schedule steps provisionally (a skipped step is taken
        back when its flag is read)."""
        if isinstance(loss, torch.Tensor):
            loss = StepLoss(loss)
        # a copy: under CUDA graphs the loss lives in a buffer that the next replay overwrites
        self._losses.append(loss.total.detach().float().reshape(()).clone())
        self._terms.append({k: v.detach().float().reshape(()).clone() for k, v in loss.terms.items()})
        self._stepped.append(torch.as_tensor(stepped, device=loss.total.device).reshape(()))
        self.scheduler.step()

    def local(self) -> collectives.Figures:
        """This rank's share of a read (one host read of every pending step), summed over ranks and
        named by step (k: the step's place among the pending ones): `loss/k` its finite loss (0
        where non-finite), `nonfinite/k` its non-finite flag, `<term>/k` each named term (0 where
        the total is non-finite). The skip flags stay local (every rank makes the same skip
        decision: its gradients are the all-reduced ones)."""
        if not self._losses:  # ranks step in lockstep: all of them have none
            return collectives.Figures()
        losses = torch.stack(self._losses)
        finite = torch.isfinite(losses)
        skipped = ~torch.stack(self._stepped).to(losses.device)
        series = {"loss": torch.where(finite, losses, 0.0), "nonfinite": ~finite,
                  **{f"term:{name}": torch.where(finite, torch.stack([step[name] for step in self._terms]), 0.0)
                     for name in self._term_names()}}
        values = torch.stack([skipped, *series.values()]).double().tolist()  # one host read
        self._skip_flags = values[0]
        return collectives.Figures(sums={_at(name, k): v for name, row in zip(series, values[1:])
                                       for k, v in enumerate(row)})

    def _term_names(self) -> list[str]:
        return sorted(self._terms[0]) if self._terms else []

    def read(self, step: int) -> None:
        """Collective, one all-gather: the steps pending since the last read (`step` is the last of
        them) into the window; the skipped ones taken back from the schedule; a streak of
        max_nonfinite non-finite losses on any rank raises Diverged, naming the last good checkpoint."""
        self.take(collectives.reduce_local(self.local()), step)

    def take(self, reduced: collectives.Figures, step: int) -> None:
        """read()'s work on local()'s figures over every rank (reduced with other parts' at an epoch's end)."""
        sums = reduced.sums
        n, term_names = len(self._losses), self._term_names()
        first, flags = step - n + 1, self._skip_flags
        self._losses, self._stepped, self._skip_flags, self._terms = [], [], [], []
        for name in term_names:  # a non-finite step's terms are 0: the window leaves it out
            self.term_sums[name] = self.term_sums.get(name, 0.0) + sum(sums[_at(f"term:{name}", k)] for k in range(n))
        skipped = int(sum(flag > 0 for flag in flags))
        self.skipped += skipped
        rewind(self.scheduler, skipped)
        for k in range(n):
            if not sums[_at("nonfinite", k)] > 0:
                self.window_sum += sums[_at("loss", k)]
                self.window_count += self.world_size
                self.epoch_sum += sums[_at("loss", k)]
                self.epoch_count += self.world_size
                self.nonfinite_streak = 0
                continue
            self.nonfinite += 1
            self.nonfinite_streak += 1
            if self.nonfinite_streak >= self.max_nonfinite:
                last = latest(self.out)
                raise Diverged(f"{self.nonfinite_streak} consecutive non-finite losses at step {first + k}; "
                               f"last good checkpoint: {last.path if last else 'none'}")

    def close_window(self) -> float:
        """The window's mean loss (NaN when every step in it was non-finite), kept as last_loss;
        the next window starts empty."""
        self.last_loss = self.window_sum / self.window_count if self.window_count else math.nan
        self.last_terms = {k: v / self.window_count if self.window_count else math.nan
                           for k, v in self.term_sums.items()}
        self.window_sum, self.window_count, self.term_sums = 0.0, 0, {}
        return self.last_loss

    def close_epoch(self) -> float:
        """The epoch's mean loss over its finite steps (NaN when none was finite), whatever
        train.log_every is; the next epoch starts empty. Call after the epoch's last read."""
        mean = self.epoch_sum / self.epoch_count if self.epoch_count else math.nan
        self.epoch_sum, self.epoch_count = 0.0, 0
        return mean

    def figures(self) -> dict[str, float]:
        """The last closed window by name: train/loss and each term's train/loss_<term>."""
        return {names.TRAIN_LOSS: self.last_loss,
                **{names.train_loss_term(k): v for k, v in sorted(self.last_terms.items())}}

    def amp_figures(self, loss_scale: float | None) -> dict[str, float]:
        """AMP health: skipped steps, non-finite losses and (fp16) the current loss scale."""
        metrics = {names.SKIPPED_STEPS: self.skipped, names.NONFINITE_LOSSES: self.nonfinite}
        if loss_scale is not None:
            metrics[names.LOSS_SCALE] = loss_scale
        return metrics

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in STEP_LOSSES_STATE}

    def load_state_dict(self, state: dict) -> None:
        for k in STEP_LOSSES_STATE:
            setattr(self, k, state[k] if k in state else copy.copy(ABSENT_FROM_OLDER[k]))


def rewind(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> None:
    """Take `steps` provisional steps back from a closed-form schedule (the linear warm-up/decay
    is one: its LR is a function of the step count)."""
    if steps:
        scheduler.last_epoch -= steps + 1
        scheduler.step()


def _at(series: str, k: int) -> str:
    """The name of a pending step's figure: its series and its place among the pending steps."""
    return f"{series}/{k:06d}"
