"""train.batch_size=auto: the largest micro-batch that fits this device, the global batch kept.

The job's global batch was settled before anything loaded (settle.AUTO_BATCH x grad_accum x world
size); here, once the model is built on its device and before any run or output exists, it is split
into the largest micro-batch that fits and as many accumulation steps as keep it (Plan.resplit), so
the job optimizes the same thing on a 12 GB card as on an 80 GB one. Candidates are the divisors of
the rows per rank, the largest tried first, then a binary search; a trial is one training step at
the job's longest rows (forward, loss, backward, an optimizer step: stage.py's trials) and fits when
it neither runs out of memory nor peaks above (1 - MARGIN) of the device's memory. Every rank runs
each trial and one all-reduce (max) of (did not fit, peak) makes the ranks agree: the smallest
device decides. The evaluation batch is searched on its own afterwards (forward only, beside the
optimizer's state), over powers of two up to the largest evaluation split per rank; it never
shrinks the training batch. Even one row not fitting is a UserError naming the memory needed and
the device's.

Unlike the Hugging Face Trainer's auto_find_batch_size and accelerate's find_executable_batch_size,
which halve the batch on each out-of-memory error and so change the effective batch with the card,
and Lightning's BatchSizeFinder, which refuses DDP because the ranks would have to agree.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import UserError
from pipeline.measure.memory import MIB
from pipeline.runtime import dist

log = logging.getLogger("pipeline")

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
    largest: int
    """The largest candidate that fit (batch_size, unless a larger micro-batch would exceed the
    global batch's rows per rank)."""
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
    divisors = [b for b in range(1, rows_per_rank + 1) if rows_per_rank % b == 0]
    micro, peak = _largest(divisors, lambda b: _agreed(train_trial, b, capacity, usable))
    if micro is None:
        _refuse("training", train_trial, capacity, what)
    bound = max(1, min(eval_rows, EVAL_MAX))
    sizes = sorted({*(2 ** k for k in range(bound.bit_length()) if 2 ** k < bound), bound})
    evals, eval_peak = _largest(sizes, lambda b: _agreed(eval_trial, b, capacity, usable))
    if evals is None:
        _refuse("evaluation", eval_trial, capacity, what)
    return BatchFit(micro, rows_per_rank // micro, micro, peak / MIB, evals, eval_peak / MIB, capacity / MIB)


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
    failed, most = dist.all_reduce([float(peak is None or peak > usable), float(peak or 0)], "max")
    return not failed, int(most)


def _refuse(phase: str, trial: Trial, capacity: int, what: str) -> None:
    """Even one row does not fit: how much it needs (measured without the cap where the device can
    count past it, a CPU; on a GPU at least the device's memory), on every rank alike."""
    peak = trial(1, 2**62)
    need = dist.all_reduce([float(peak or 0)], "max")[0]
    needed = f"{need / MIB:.1f} MiB" if need > capacity * (1 - MARGIN) else f"more than {capacity / MIB:.1f} MiB"
    raise UserError(f"train.batch_size=auto: one row of {what} does not fit for {phase}: it needs {needed}, the "
                    f"device has {capacity / MIB:.1f} MiB ({capacity * (1 - MARGIN) / MIB:.1f} usable with a "
                    f"{MARGIN:.0%} margin; train.memory_limit_mb or the device's free memory); less memory: "
                    "precision=bf16/fp16, train.gradient_checkpointing=true, a shorter train.max_length, ZeRO offload")
