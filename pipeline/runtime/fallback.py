"""Fallback: a job planned for more processes than run keeps its global batch.

A study cell or launch script asking for 8 processes on a machine with one GPU runs 1 process
(`requested_world_size=8`), or torchrun's surplus ranks leave (runtime.world.init); either way the
missing ranks' micro-batches become extra gradient-accumulation steps, so the optimisation is
the one planned (the DDP parity test shows N ranks x B equals 1 rank x N*B). `fallback=false`
refuses such a job instead.
"""
from __future__ import annotations

import dataclasses
import logging

from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.runtime.world import Runtime

log = logging.getLogger("pipeline")


def fit_to_world(cfg: Config, rt: Runtime) -> tuple[Config, Runtime]:
    """The config and runtime of what runs: grad_accum scaled by requested / actual world size (one
    warning line), the request moved to the runtime (rt.requested_world_size, for the tags) so that
    the written config.yaml describes the run as it ran; or a UserError where the global batch
    cannot be kept or fallback=false."""
    requested = cfg.requested_world_size or rt.requested_world_size or rt.world_size
    if requested == rt.world_size:
        return dataclasses.replace(cfg, requested_world_size=0), dataclasses.replace(rt, requested_world_size=0)
    what = f"requested_world_size={requested} but {rt.world_size} process(es) run"
    if requested < rt.world_size:
        raise UserError(f"launch: {what}: launch at most {requested} processes (or set requested_world_size=0)")
    if not cfg.fallback:
        raise UserError(f"launch: {what} and fallback=false: launch {requested} processes on {requested} devices")
    if requested % rt.world_size:
        raise UserError(f"launch: {what}: {requested} is not a multiple of {rt.world_size}, so gradient "
                        "accumulation cannot keep the global batch")
    grad_accum = cfg.train.grad_accum * (requested // rt.world_size)
    if rt.is_main:
        log.warning("fallback: %s; train.grad_accum %d -> %d keeps the global batch of %d processes",
                    what, cfg.train.grad_accum, grad_accum, requested)
    train = dataclasses.replace(cfg.train, grad_accum=grad_accum)
    ran = dataclasses.replace(cfg, requested_world_size=0, train=train)
    return ran, dataclasses.replace(rt, requested_world_size=requested)
