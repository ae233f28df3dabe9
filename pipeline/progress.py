"""Where the loop is: a part of the loop's state that saves and restores itself."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Progress:
    """The epoch, the micro-batches of it already trained (a multiple of grad_accum) and the
    optimizer steps taken, skipped ones included."""

    epoch: int = 0
    batches_done: int = 0
    step: int = 0

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.batches_done, self.step = state["epoch"], state["batches_done"], state["step"]
