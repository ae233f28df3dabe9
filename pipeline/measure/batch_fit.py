"""The search of train.batch_size=auto, given its trials: the largest micro-batch dividing the rows
per rank and the largest evaluation batch that fit a device's memory, the ranks agreeing.

A trial runs `rows` rows and gives its peak bytes, or None when it ran out of memory (the batch
finder's trials run the built stage: pipeline/job/batch_finder.py). Candidates are tried largest
first (the common case: one trial), then by a binary search (fitting is monotone in size); a
trial fits when it neither runs out of memory nor peaks above (1 - MARGIN) of the capacity, on
every rank (one all-reduce, max, per trial: the smallest device decides).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import UserError
from pipeline.measure.memory import MIB
from pipeline.runtime import collectives

MARGIN = 0.10
"""Headroom below the device's memory a trial's peak must leave: a trial measures one step at the
longest rows, and the job adds what it does not see (the allocator's fragmentation over many shapes,
DataLoader and NCCL buffers, the CUDA context outside the allocator). Measured: benchmarks/README.md."""
EVAL_MAX = 1024
"""The largest evaluation batch searched: past it a batch saves no time."""

Trial = Callable[[int, int], "int | None"]
"""(rows, limit in bytes) -> the trial's peak bytes, or None when it ran out of memory."""


@dataclass(frozen=True)
class BatchFit:
    """What the finder chose, and what it measured."""

    batch_size: int
    grad_accum: int
    peak_mb: float
    eval_batch_size: int
    eval_peak_mb: float
    capacity_mb: float

    def describe(self) -> str:
        return (f"micro-batch {self.batch_size} x grad_accum {self.grad_accum} (peak {self.peak_mb:.0f} MiB), "
                f"eval batch {self.eval_batch_size} (peak {self.eval_peak_mb:.0f} MiB), of {self.capacity_mb:.0f} "
                f"MiB less {MARGIN:.0%}")


def find(rows_per_rank: int, eval_rows: int, train_trial: Trial, eval_trial: Trial, capacity: int,
         what: str) -> BatchFit:
    """Collective: the largest micro-batch dividing rows_per_rank and the largest evaluation batch
    (up to eval_rows, EVAL_MAX) that fit `capacity` bytes on every rank; `what` names the longest
    rows in a refusal. A UserError when even one row does not fit."""
    usable = int(capacity * (1 - MARGIN))
    bound = max(1, min(eval_rows, EVAL_MAX))
    searched = {"training": ([b for b in range(1, rows_per_rank + 1) if rows_per_rank % b == 0], train_trial),
                "evaluation": (sorted({*(2 ** k for k in range(bound.bit_length()) if 2 ** k < bound), bound}),
                               eval_trial)}
    found = {}
    for phase, (candidates, trial) in searched.items():
        found[phase] = _largest(candidates, lambda b, trial=trial: _agreed(trial, b, capacity, usable))
        if found[phase][0] is not None:
            continue
        # how much one row needs: measured without the cap where the device can count past it (a
        # CPU); on a GPU, at least the device's memory
        need = collectives.all_reduce([float(trial(1, 2**62) or 0)], "max")[0]
        needed = f"{need / MIB:.1f} MiB" if need > usable else f"more than {capacity / MIB:.1f} MiB"
        raise UserError(f"train.batch_size=auto: one row of {what} does not fit for {phase}: it needs {needed}, the "
                        f"device has {capacity / MIB:.1f} MiB ({usable / MIB:.1f} usable with a {MARGIN:.0%} margin; "
                        "train.memory_limit_mb or the device's free memory); less memory: precision=bf16/fp16, "
                        "train.gradient_checkpointing=true, a shorter train.max_length, ZeRO offload")
    (micro, peak), (evals, eval_peak) = found["training"], found["evaluation"]
    return BatchFit(micro, rows_per_rank // micro, peak / MIB, evals, eval_peak / MIB, capacity / MIB)


def _largest(candidates: list[int], fits: Callable[[int], tuple[bool, int]]) -> tuple[int | None, int]:
    """The largest candidate that fits (fitting is monotone in size), and its peak: the largest
    first (the common case: one trial), then a binary search below it."""
    ok, peak = fits(candidates[-1])
    if ok:
        return candidates[-1], peak
    best, best_peak = None, 0
    lo, hi = 0, len(candidates) - 1  # candidates[hi] does not fit
    while lo < hi:
        mid = (lo + hi) // 2
        ok, peak = fits(candidates[mid])
        if ok:
            best, best_peak, lo = candidates[mid], peak, mid + 1
        else:
            hi = mid
    return best, best_peak


def _agreed(trial: Trial, rows: int, capacity: int, usable: int) -> tuple[bool, int]:
    """One trial on every rank, then one all-reduce (max): it fits only if it fits everywhere."""
    peak = trial(rows, capacity)
    failed, most = collectives.all_reduce([float(peak is None or peak > usable), float(peak or 0)], "max")
    return not failed, int(most)
