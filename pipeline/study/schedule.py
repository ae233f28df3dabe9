"""Which cells of a study may start now: their cells needed have finished, a slot is free (`--jobs`)
and so are the devices they need. A cell whose needed cell failed is never started.

Only the bookkeeping: the runner starts the processes and reports back when each one ends.
"""
from __future__ import annotations

from collections.abc import Iterator

from pipeline.study.devices import width
from pipeline.study.spec import Cell


class Schedule:
    def __init__(self, cells: list[Cell], outcomes: dict[str, dict], slots: int, gpus: list[str]):
        """`outcomes`: cells ended before the first start (finished before: skipped); `gpus`: the
        node's GPUs to hand out (none on a CPU)."""
        self.total = len(cells)
        self.pending = [c for c in cells if c.name not in outcomes]  # in run order
        self.outcomes = dict(outcomes)
        self.running: dict[str, list[str]] = {}
        """Cell -> the GPUs it holds: the GPUs free are the others."""
        self.slots = slots
        self.gpus = list(gpus)

    @property
    def done(self) -> bool:
        return not self.pending and not self.running

    def blocked(self) -> list[tuple[Cell, list[str]]]:
        """Pending cells that can no longer run, with the needed cells that did not finish; they
        leave the schedule (the caller records why)."""
        out = []
        for cell in self.pending:
            broken = [n for n in cell.needs if n in self.outcomes and self.outcomes[n].get("status") != "finished"]
            if broken:
                out.append((cell, broken))
        self.pending = [c for c in self.pending if all(c is not b for b, _ in out)]
        return out

    def startable(self) -> Iterator[tuple[Cell, list[str]]]:
        """Cells to start now, in run order, each with the GPUs it takes ([] on a CPU), one at a
        time (each counts as running once yielded). A cell that does not fit the free GPUs waits;
        a later one that fits may start before it."""
        started = False
        for cell in list(self.pending):
            if len(self.running) >= self.slots:
                break
            if not all(self.outcomes.get(n, {}).get("status") == "finished" for n in cell.needs):
                continue
            ids = self.take(cell)
            if ids is None:
                continue
            self.pending.remove(cell)
            self.running[cell.name] = ids
            started = True
            yield cell, ids
        if not started and not self.running and self.pending:  # planning orders needs first: cannot happen
            raise RuntimeError(f"study: nothing can start: {', '.join(c.name for c in self.pending)}")

    def take(self, cell: Cell) -> list[str] | None:
        """The lowest free GPUs `cell` needs, or None while too few are free; [] on a CPU machine
        (cells share the cores)."""
        if not self.gpus:
            return []
        held = {g for ids in self.running.values() for g in ids}
        free = [g for g in self.gpus if g not in held]
        need = width(cell, len(self.gpus))
        return free[:need] if need <= len(free) else None

    def ended(self, cell: Cell, outcome: dict) -> None:
        """A cell ended (or will never run): its outcome; its GPUs are free again."""
        self.running.pop(cell.name, None)
        self.outcomes[cell.name] = outcome

    def count(self) -> str:
        """The running count of progress lines: [3/12 done, 2 running]."""
        return f"[{len(self.outcomes)}/{self.total} done, {len(self.running)} running]"
