"""train.batch_size=auto: the largest micro-batch that fits this device, the global batch kept.

The job's global batch was settled before anything loaded (settle.AUTO_BATCH x grad_accum x world
size); here, once the model is built on its device and before any run or output exists, it is split
into the largest micro-batch that fits and as many accumulation steps as keep it (Plan.resplit), so
the job optimizes the same thing on a 12 GB card as on an 80 GB one. Candidates are the divisors of
the rows per rank, the largest tried first, then a binary search; a trial is one training step at
the job's longest rows (forward, loss, backward, an optimizer step: _trial) and fits when
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
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.data import features
from pipeline.data.loaders import shaped_collate
from pipeline.errors import UserError
from pipeline.measure import memory
from pipeline.measure.memory import MIB
from pipeline.parts.optim import build_optimizer
from pipeline.runtime import dist
from pipeline.stage import Stage
from pipeline.tasks.base import SPLITS

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
    peak_mb: float
    eval_batch_size: int
    eval_peak_mb: float
    capacity_mb: float

    def describe(self) -> str:
        return (f"micro-batch {self.batch_size} x grad_accum {self.grad_accum} (peak {self.peak_mb:.0f} MiB), "
                f"eval batch {self.eval_batch_size} (peak {self.eval_peak_mb:.0f} MiB), of {self.capacity_mb:.0f} "
                f"MiB less {MARGIN:.0%}")


def fit_batch(stage: Stage) -> Stage:
    """Collective, train.batch_size=auto: the same stage, its plan's global batch split into the
    largest micro-batch that fits the device, and its evaluation batch found (Plan.resplit; the
    backend takes the split when the loop prepares it); the model's weights and the RNG as they
    were. A UserError when even one row does not fit.

    The trials run at the longest rows: a whole training step (train), or a forward pass beside the
    optimizer's state (evaluate), at a number of rows; each gives its peak bytes, or None when it
    ran out of memory (_trial)."""
    cfg, device, model, rows = stage.cfg, stage.rt.device, stage.model, stage.features
    longest = {split: _longest(rows[split]) for split in SPLITS}  # (row, length)
    eval_split = max(("dev", "test"), key=lambda split: longest[split][1])
    train_row, eval_row = rows["train"][longest["train"][0]], rows[eval_split][longest[eval_split][0]]
    # the largest evaluation split's rows per rank: no evaluation batch is larger
    eval_rows = math.ceil(max(len(rows["dev"]), len(rows["test"])) / stage.rt.world_size)
    collate = shaped_collate(stage.task.collator(stage.tokenizer), cfg.train, stage.tokenizer.pad_token_id)

    def train(n: int, limit: int) -> int | None:
        """One training step at n rows (forward, loss, backward, a fused-or-not AdamW step as the
        backend builds it)."""
        return _trial(stage, collate([train_row] * n), None, limit)

    def evaluate(n: int, limit: int) -> int | None:
        """A forward pass without gradients at n rows, beside the optimizer's state (a one-row step
        made it, its gradients freed, as the loop leaves them before evaluating)."""
        return _trial(stage, collate([eval_row] * n), collate([train_row]), limit)

    saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    was_training = model.training
    capacity = memory.capacity(device, cfg.train.memory_limit_mb) - stage.backend.standing_bytes(model)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            found = find(cfg.train.batch_size * cfg.train.grad_accum, eval_rows, train, evaluate, capacity,
                         f"{max(length for _, length in longest.values())} tokens")
        finally:
            model.load_state_dict(saved)
            model.train(was_training)
            memory.release(device)
    if stage.rt.is_main:
        log.info("train.batch_size=auto: %s", found.describe())
    return stage.resplit(found.batch_size, found.grad_accum, found.eval_batch_size, found.describe())


def _trial(stage: Stage, batch: dict, one_row: dict | None, limit: int) -> int | None:
    """A trial's peak bytes (a training step at `batch`, or with `one_row` a forward pass at `batch`
    after a step at one_row), or None when it ran out of memory. The trial's tensors (its optimizer
    among them) go with _measure's frame, an out-of-memory exception's traceback with the handler:
    the memory is given back once both are left."""
    try:
        peak = _measure(stage, batch, one_row, limit)
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not memory.is_out_of_memory(e):
            raise
        peak = None
    finally:
        stage.model.zero_grad(set_to_none=True)
    memory.release(stage.rt.device)
    return peak


def _measure(stage: Stage, batch: dict, one_row: dict | None, limit: int) -> int:
    model, device = stage.model, stage.rt.device
    # what lives on the device through a step: the model's (and a live teacher's) parameters,
    # buffers and gradients (the CPU's tensor count starts from them)
    modules = [model] + ([stage.teacher] if stage.teacher is not None else [])
    model.train()
    if one_row is None:
        def step() -> None:
            stage.plain_step(dict(batch))
            optimizer, _ = build_optimizer(model, stage.cfg.train, 1, fused=stage.backend.fused_optimizer)
            optimizer.step()

        return memory.peak_bytes(device, _tensors(modules), limit, step)
    stage.plain_step(dict(one_row))
    optimizer, _ = build_optimizer(model, stage.cfg.train, 1, fused=stage.backend.fused_optimizer)
    optimizer.step()  # its state exists now, as in the loop
    model.zero_grad(set_to_none=True)
    model.eval()
    state = [t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]

    @torch.no_grad()
    def forward() -> None:
        inputs = {k: v.to(device) for k, v in batch.items() if k != "idx"}
        with stage.policy.autocast():
            model(**inputs)

    return memory.peak_bytes(device, [*_tensors(modules), *state], limit, forward)


def _tensors(modules: list[torch.nn.Module]) -> list[torch.Tensor]:
    return [t for m in modules for p in (*m.parameters(), *m.buffers()) for t in (p, p.grad) if t is not None]


def _longest(rows) -> tuple[int, int]:
    """(index, length) of a split's longest row."""
    lengths = features.sequence_lengths(rows)
    i = max(range(len(lengths)), key=lengths.__getitem__)
    return i, lengths[i]


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
        need = dist.all_reduce([float(trial(1, 2**62) or 0)], "max")[0]
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
    failed, most = dist.all_reduce([float(peak is None or peak > usable), float(peak or 0)], "max")
    return not failed, int(most)
