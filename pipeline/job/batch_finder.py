"""train.batch_size=auto: the largest micro-batch that fits this device, the global batch kept.

The job's global batch was settled before anything loaded (settle.AUTO_BATCH x grad_accum x world
size); here, once the model is built on its device and before any run or output exists, it is split
into the largest micro-batch that fits and as many accumulation steps as keep it (Plan.resplit), so
the job optimizes the same thing on a 12 GB card as on an 80 GB one. Candidates are the divisors of
the rows per rank, the largest tried first, then a binary search; a trial is one training step at
the job's longest rows (forward, loss, backward, an optimizer step: _trial) and fits when
it neither runs out of memory nor peaks above (1 - MARGIN) of the device's memory (the search:
measure/batch_fit.py). Every rank runs
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

import contextlib
import functools
import logging
import math

import torch

from pipeline.data import features
from pipeline.data.loaders import shaped_collate
from pipeline.job.parts.optim import build_optimizer
from pipeline.job.stage import Stage
from pipeline.measure import batch_fit, memory
from pipeline.tasks.base import SPLITS

log = logging.getLogger("pipeline")


def fit_batch(stage: Stage) -> Stage:
    """Collective, train.batch_size=auto: the same stage, its plan's global batch split into the
    largest micro-batch that fits the device, and its evaluation batch found (Plan.resplit; the
    backend takes the split when the loop prepares it); the model's weights and the RNG as they
    were. A UserError when even one row does not fit.

    The trials run at the longest rows: a whole training step (train), or a forward pass beside the
    optimizer's state (evaluate), at a number of rows; each gives its peak bytes, or None when it
    ran out of memory (_trial)."""
    cfg, rows = stage.cfg, stage.features

    def trial(n: int, limit: int, evaluate: bool = False) -> int | None:
        """One training step at n of the longest training rows (forward, loss, backward, a
        fused-or-not AdamW step as the backend builds it); `evaluate`: a forward pass without
        gradients at n of the longest evaluation rows, beside the optimizer's state (a one-row step
        made it, its gradients freed, as the loop leaves them before evaluating). The rows and
        collate are fit_batch's, set below."""
        picked, one_row = ([eval_row] * n, collate([train_row])) if evaluate else ([train_row] * n, None)
        return _trial(stage, collate(picked), one_row, limit)

    collate = _collate(stage)
    longest = {split: _longest(rows[split], collate) for split in SPLITS if split in rows}  # (its row, its length)
    # a job without dev and test evaluates nothing: its training rows stand in (the finder's shape)
    evaluated = [split for split in ("dev", "test") if split in rows] or ["train"]
    eval_split = max(evaluated, key=lambda split: longest[split][1])
    (train_row, _), (eval_row, _) = longest["train"], longest[eval_split]
    what = f"{max(tokens for _, tokens in longest.values())} tokens"
    # the largest evaluation split's rows per rank: no evaluation batch is larger
    eval_rows = math.ceil(max(len(rows[split]) for split in evaluated) / stage.rt.world_size)
    with _model_kept(stage):
        found = batch_fit.find(cfg.train.batch_size * cfg.train.grad_accum, eval_rows, trial,
                               functools.partial(trial, evaluate=True), _capacity(stage), what)
    if stage.rt.is_main:
        log.info("train.batch_size=auto: %s", found.describe())
    return stage.resplit(found.batch_size, found.grad_accum, found.eval_batch_size, found.describe())


def check_batch(stage: Stage) -> Stage:
    """train.memory_limit_mb with a fixed micro-batch on a CPU: the cap a GPU's allocator enforces
    in every step, emulated once before any run or output exists: one training step at
    train.batch_size of the longest training rows, its tensors counted against the cap
    (measure/memory.py). Past it, torch.OutOfMemoryError, as a capped GPU raises in its first
    step (the CLI's one line, exit 1); else the stage with the step's peak in its batch_fit tag.
    The memory-ceiling study's batch ladder runs its rungs on a CPU so."""
    cfg, collate = stage.cfg, _collate(stage)
    row, tokens = _longest(stage.features["train"], collate)
    capacity = _capacity(stage)
    with _model_kept(stage):
        peak = _trial(stage, collate([row] * cfg.train.batch_size), None, capacity)
    what = f"train.batch_size={cfg.train.batch_size} at {tokens} tokens under train.memory_limit_mb=" \
           f"{cfg.train.memory_limit_mb}"
    if peak is None:
        raise torch.OutOfMemoryError(f"{what}: one training step needs more (the cap emulated on a CPU: "
                                     "the step's tensors counted)")
    found = (f"micro-batch {cfg.train.batch_size} x grad_accum {cfg.train.grad_accum} (peak {peak / memory.MIB:.0f} "
             f"MiB), of {capacity / memory.MIB:.0f} MiB (emulated cap)")
    if stage.rt.is_main:
        log.info("%s: fits (one step peaks at %.0f MiB, emulated on a CPU)", what, peak / memory.MIB)
    return stage.resplit(cfg.train.batch_size, cfg.train.grad_accum, cfg.train.eval_batch_size, found)


def _longest(rows, collate) -> tuple[dict, int]:
    """A split's longest row (the first of the longest) and the length its batches run at (as
    collated: train.pad_to_multiple_of's padding included): every trial runs at it."""
    lengths = features.sequence_lengths(rows)
    index = max(range(len(lengths)), key=lengths.__getitem__)
    return rows[index], collate([rows[index]])["input_ids"].shape[1]


def _collate(stage: Stage):
    return shaped_collate(stage.task.collator(stage.tokenizer), stage.cfg.train, stage.tokenizer.pad_token_id)


def _capacity(stage: Stage) -> int:
    """Bytes the trials may use: the device's (or the cap) less what the backend keeps beside the model."""
    return memory.capacity(stage.rt.device, stage.cfg.train.memory_limit_mb) - stage.backend.standing_bytes(stage.model)


@contextlib.contextmanager
def _model_kept(stage: Stage):
    """The trials leave nothing behind: the model's weights and mode and the RNG as they were, the
    device's cached memory given back."""
    model, device = stage.model, stage.rt.device
    saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    was_training = model.training
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            model.load_state_dict(saved)
            model.train(was_training)
            memory.release(device)


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
    # buffers and gradients (none between trials; the CPU's tensor count starts from them)
    modules = [model] + ([stage.teacher] if stage.teacher is not None else [])
    standing = [t for m in modules for p in (*m.parameters(), *m.buffers()) for t in (p, p.grad) if t is not None]
    model.train()

    def step(rows: dict) -> torch.optim.Optimizer:
        stage.plain_step(dict(rows))
        optimizer, _ = build_optimizer(model, stage.cfg.train, 1, fused=stage.backend.fused_optimizer)
        optimizer.step()
        return optimizer

    if one_row is None:
        return memory.peak_bytes(device, standing, limit, lambda: step(batch))
    optimizer = step(one_row)  # its state exists now, as in the loop
    model.zero_grad(set_to_none=True)
    model.eval()
    state = [t for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]

    @torch.no_grad()
    def forward() -> None:
        inputs = {k: v.to(device) for k, v in batch.items() if k != "idx"}
        with stage.policy.autocast():
            model(**inputs)

    return memory.peak_bytes(device, [*standing, *state], limit, forward)
