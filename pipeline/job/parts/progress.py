"""Where the loop is: a part of the loop's state that saves and restores itself."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Progress:
    """The epoch, the optimizer steps of it already taken, and the optimizer steps of the job,
    skipped ones included. The position in the epoch is counted in optimizer steps (global
    batches), not in one rank's micro-batches: a job resumed on another number of processes with
    the same global batch continues at the same rows. Beside it, what the dev evaluations decided:
    the step of the last one (a job that stops right after one between an epoch's steps, or is
    resumed there, is not evaluated again at the epoch's end) and whether a search pruned the job
    (it stops there as an early stop does)."""

    epoch: int = 0
    epoch_steps: int = 0
    step: int = 0
    evaluated_at: int = -1
    pruned: bool = False

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.epoch_steps, self.step = state["epoch"], state["epoch_steps"], state["step"]
        # a checkpoint written before the evaluations' decisions were kept: none taken
        self.evaluated_at, self.pruned = state.get("evaluated_at", -1), state.get("pruned", False)
