"""`train.compile`: torch.compile for the trained module, the frozen teacher and evaluation.

A module is compiled in place (nn.Module.compile), so its state_dict keeps its own keys (no
`_orig_mod.` prefix): checkpoints, best/ and resume are the same compiled or not, and a job can
resume under the other setting. Shapes are static (dynamic=False): each distinct batch shape is
one specialized graph, and data.ShapedCollate keeps those few (lengths padded to buckets, short
batches filled), which is also what CUDA graphs (`reduce-overhead`) need to replay.

Compilation happens inside the first steps of each new shape; its time is read from Dynamo's
own accounting and left out of the throughput clock (telemetry.ThroughputMeter), and logged on
its own (perf/compile_s), with the number of graphs compiled (perf/compiles).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("pipeline")

RECOMPILE_LIMIT = 64
"""Dynamo's limit of compiled variants per function (its default, 8, is below the shapes a job can
meet: length buckets x {train, eval} x {full, filled}); past it Dynamo runs eager silently."""

WARN_COMPILES = 16
"""More compilations than this in one process: a warning (something varies per batch)."""


def compile_module(module: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Compile `module` in place for `mode` (off: unchanged); returns it."""
    if mode == "off":
        return module
    allow_shapes()
    module.compile(**compile_kwargs(mode))
    return module


def allow_shapes() -> None:
    """Raise Dynamo's per-function limit of compiled variants to RECOMPILE_LIMIT."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


def compile_kwargs(mode: str) -> dict:
    """torch.compile's arguments for `mode` (DeepSpeed's engine.compile takes the same)."""
    return {"mode": None if mode == "default" else mode, "dynamic": False}


def compile_seconds() -> float:
    """Seconds this process has spent compiling (Dynamo's frames and AOT backward graphs)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def compiles() -> int:
    """Graphs Dynamo has compiled in this process (each new shape or mode is one more)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


class RecompileWarning:
    """One warning line, the first time the process's compilations pass WARN_COMPILES."""

    def __init__(self):
        self.warned = False

    def check(self, count: int, hint: str) -> None:
        if not self.warned and count > WARN_COMPILES:
            self.warned = True
            log.warning("torch.compile has compiled %d graphs in this process (more than %d): %s", count,
                        WARN_COMPILES, hint)
