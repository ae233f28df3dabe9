"""A study's time, estimated before it runs from what this machine can measure in a second or two.

Per cell: the rows it trains (its training rows x epochs, or max_steps x its global batch where
that ends it sooner) times a row's training FLOPs (3 x its model's forward FLOPs at
train.max_length, 4 x with activation checkpointing; the forward counted from the model's config
on the meta device, measure/flops.model_size), divided by the matmul rate this device reaches at
the model's own shapes in the cell's compute dtype, timed here. It leaves out evaluation, the
optimizer, data loading and every op that is not a matmul, and counts every epoch (early stopping
ends sooner): an estimate of the order of the time, never a measurement. A cell whose rows or
model are not on this machine, or that distills (its teacher's passes are not counted), is not
estimated, and the line says so.
"""
from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.study.readiness import hub_cached, needs_hub
from pipeline.study.spec import Cell

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from pipeline.tasks.base import Task

AUTO_BATCH = 16
"""batch_size=auto's global batch per grad_accum step and process (config: 16 * grad_accum * world)."""
MATMUL_ROWS = 4096
"""The timed matmul's rows at most: past a few thousand the rate no longer grows."""
TIMED_S = 0.2


@dataclass(frozen=True)
class Work:
    steps: int
    flops: float
    dtype: str
    shape: tuple[int, int, int]
    """(rows, in, out) of the model's feed-forward matmul at the cell's micro-batch, as timed."""


def cell_work(cell: Cell, cfg: Config, device: torch.device) -> Work | str:
    """What the cell trains, or why it is not estimated."""
    from pipeline.tasks import get_task

    if cell.kind == "distill":
        return "distill cells: a teacher's passes are not counted"
    task = get_task(cfg.task, cfg.task_options)
    rows = train_rows(cfg)
    if rows is None:
        return "their training rows are not on this machine (hub data)"
    config = model_config(cfg, task)
    if config is None:
        return "their model's config is not on this machine"
    from pipeline.measure.flops import model_size

    length = cfg.train.max_length
    forward = model_size(task.model_class, config, length).forward_flops
    if forward is None:
        return "their model's forward cannot be counted on the meta device"
    micro = AUTO_BATCH if cfg.train.batch_size == "auto" else cfg.train.batch_size
    world = cell.launcher.nproc * cell.launcher.nnodes if isinstance(cell.launcher.nproc, int) else 1
    batch = micro * cfg.train.grad_accum * world
    epochs = cfg.train.epochs or task.epochs
    steps = epochs * math.ceil(rows / batch)
    if cfg.train.max_steps > 0:
        steps = min(steps, cfg.train.max_steps)
    trained = min(epochs * rows, steps * batch)
    passes = 4 if cfg.train.gradient_checkpointing else 3  # forward, backward (2x), a recomputed forward
    hidden = config.hidden_size
    shape = (min(micro * length, MATMUL_ROWS), hidden, getattr(config, "intermediate_size", 4 * hidden))
    return Work(steps, trained * passes * forward, compute_dtype(cfg.precision, device), shape)


def compute_dtype(precision: str, device: torch.device) -> str:
    """The matmuls' dtype of `precision` on the device (auto: what it picks there)."""
    from pipeline.runtime.precision import resolve

    try:
        return resolve(precision, device).spec.compute
    except UserError:  # refused here: such cells are not estimated (preflight.py)
        return "float32"


def train_rows(cfg: Config) -> int | None:
    """The training split's rows: its file's or the built-in sample set's; None for hub data or a
    file not here."""
    source = cfg.data.source("train")
    if source is not None and (source.startswith("hub:") or not Path(source).is_file()):
        return None
    return _rows(cfg.task, json.dumps(cfg.task_options, sort_keys=True), source)


@functools.cache
def _rows(task_name: str, options: str, source: str | None) -> int:
    from pipeline.tasks import get_task

    return len(get_task(task_name, json.loads(options)).load(source, "train"))


def model_config(cfg: Config, task: Task) -> PretrainedConfig | None:
    """The model's config, from this machine alone (a preset's sizes, a local or packaged folder,
    the Hugging Face cache); None where it is not here (a hub id not cached, a teacher's layers)."""
    from transformers import AutoConfig, BertConfig

    from pipeline.models import PRESET_VOCAB, PRESETS, offline_copy

    spec = cfg.model or task.default_model
    kwargs = task.model_kwargs()
    if spec.startswith("preset:"):
        sizes = PRESETS.get(spec.removeprefix("preset:"))
        if sizes is None:
            return None
        config = BertConfig(vocab_size=PRESET_VOCAB, max_position_embeddings=max(512, cfg.train.max_length),
                            **sizes, **kwargs)
    elif spec.startswith("from_teacher:") or (needs_hub(spec) and not hub_cached(spec, "model")):
        return None
    else:
        try:
            config = AutoConfig.from_pretrained(str(offline_copy(spec) or spec), local_files_only=True, **kwargs)
        except (OSError, ValueError):
            return None
    for key, value in cfg.model_config.items():
        setattr(config, key, value)
    return config


@functools.cache
def matmul_rate(device_type: str, dtype: str, shape: tuple[int, int, int]) -> float:
    """FLOP/s of one (rows x in) @ (in x out) matmul in `dtype` on this device, timed for TIMED_S."""
    import torch

    device = torch.device(device_type)
    rows, k, n = shape
    a = torch.randn(rows, k, dtype=getattr(torch, dtype), device=device)
    b = torch.randn(k, n, dtype=getattr(torch, dtype), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # the first call picks kernels and allocates
    sync()
    reps, start = 0, time.perf_counter()
    while reps < 2 or time.perf_counter() - start < TIMED_S:
        a @ b
        reps += 1
        sync()
    return 2 * rows * k * n * reps / (time.perf_counter() - start)


def estimate(cells: list[tuple[Cell, Config, int]], device: torch.device, unrunnable: int = 0) -> list[str]:
    """The lines for (cell, its config, how many times it runs: a search's trials): the time and
    steps, how they were estimated, and the cell runs left out (`unrunnable`: those this machine
    lacks something for)."""
    works, left = [], {"this machine lacks what they need (above)": unrunnable} if unrunnable else {}
    for cell, cfg, runs in cells:
        work = cell_work(cell, cfg, device)
        if isinstance(work, str):
            left[work] = left.get(work, 0) + runs
        else:
            works += [work] * runs
    lines = ["Time: no estimate; no cell has its rows and model on this machine."]
    if works:
        rates = {(w.dtype, w.shape): matmul_rate(device.type, w.dtype, w.shape) for w in works}
        seconds = sum(w.flops / rates[w.dtype, w.shape] for w in works)
        by_shape: dict[tuple[int, int, int], list[str]] = {}
        for (dtype, shape), rate in rates.items():
            by_shape.setdefault(shape, []).append(f"{_short(dtype)} {rate / 1e9:.0f}")
        timed = "; ".join(f"{'x'.join(map(str, shape))}: {', '.join(found)} GFLOP/s"
                          for shape, found in by_shape.items())
        where = "GPU" if device.type == "cuda" else "CPU"
        lines = [f"Time, an estimate (not a measurement): about {duration(seconds)} for {len(works)} cell run(s) "
                 f"one after another on this {where} ({sum(w.steps for w in works)} optimizer steps, "
                 f"{sum(w.flops for w in works):.2g} FLOPs).",
                 "  How: each cell's trained rows x 3 (4 with activation checkpointing) x its model's forward FLOPs "
                 "per row at train.max_length, counted from its config, at the matmul rate timed here at its model's "
                 f"shapes (rows x in x out {timed}); evaluation, the optimizer, data loading and non-matmul ops are "
                 "left out, and every epoch is counted."]
    return lines + [f"  Not estimated, {n} cell run(s): {why}." for why, n in left.items()]


def _short(dtype: str) -> str:
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
