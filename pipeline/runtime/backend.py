"""The Backend: the one seam between the loop and the launch mode.

A backend wraps model and optimizer, runs backward (through the loss scaler for fp16), steps and
says whether the optimizer really stepped, offers no_sync for accumulation micro-steps, and
saves/loads its state. The loop never asks which backend it runs on.

This module states the contract only; the implementations (torch_backend, deepspeed_backend)
import from here, never the other way round, and runtime/factory.py chooses between them.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from pipeline.config.schema import TrainConfig


@dataclass
class StepResult:
    stepped: torch.Tensor | bool
    """False when the update was skipped (fp16 overflow, or a non-finite gradient): a device
    tensor where the backend decides on the device, read at the loop's next log boundary."""
    grad_norm: torch.Tensor
    """Global gradient norm before clipping (unscaled), still on the device."""


@dataclass
class StepLoss:
    """A loss as the loop carries it: the total the backward runs on and its named terms (each
    already weighted or not, as its producer logs it; the same names on every step and rank)."""

    total: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)

    def detach(self) -> StepLoss:
        return StepLoss(self.total.detach(), {k: v.detach() for k, v in self.terms.items()})

    def __add__(self, other: StepLoss) -> StepLoss:
        return StepLoss(self.total + other.total, {k: v + other.terms[k] for k, v in self.terms.items()})

    def __truediv__(self, n: float) -> StepLoss:
        return StepLoss(self.total / n, {k: v / n for k, v in self.terms.items()})


class Backend(Protocol):
    """What every backend provides to the training loop."""

    module: torch.nn.Module
    """The unwrapped model (set by prepare): evaluate it, save it, read its parameters."""
    optimizer: torch.optim.Optimizer
    """The optimizer that steps (set by prepare): the one handed in, or the backend's own
    (DeepSpeed's, built from the JSON's optimizer block); the LR schedule sets its groups' lr."""

    @property
    def fused_optimizer(self) -> bool:
        """Whether the optimizer handed to prepare() must be a fused one (one kernel pass over all
        parameters, whose `found_inf` input skips a non-finite update on the device); False where
        the backend wraps it in its own (DeepSpeed's partitioned optimizer)."""
        ...

    @property
    def shards_parameters(self) -> bool:
        """Whether each rank holds only a shard of every parameter, gathered inside the wrapped
        module's forward (ZeRO-3): a submodule that forward does not run (e.g. a distillation
        projection) cannot be gathered outside it."""
        ...

    def standing_bytes(self, model: torch.nn.Module) -> int:
        """Device memory the backend will keep beside the model's own tensors for the whole job,
        which a trial step of the bare model does not see (batch_size=auto subtracts it)."""
        ...

    def describe(self) -> dict[str, object]:
        """What only the backend knows about how it runs, for the run's `resolved.*` params
        (e.g. deepspeed_stage); empty when there is nothing beyond the launch mode."""
        ...

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: TrainConfig | None = None
                ) -> torch.nn.Module:
        """Move and wrap model and optimizer; return the module to call forward on (it may be a
        wrapper such as DDP or a DeepSpeed engine). `train`: the job's settings as it runs, its batch
        split included (batch_size=auto finds it after the backend is built); None: those it was
        built with. Called once, before any other method but the construction-time ones."""
        ...

    def no_sync(self) -> AbstractContextManager:
        """Context for an accumulation micro-step that is not the last of its group: skips the
        gradient all-reduce where the backend can (a no-op context otherwise)."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss` as given (already divided by the accumulation group length), through
        the loss scaler when fp16 uses one."""
        ...

    def step(self) -> StepResult:
        """Clip, step the optimizer unless the gradients are non-finite, zero the gradients.
        `stepped` says whether the update was really applied: the caller's LR schedule counts
        only the steps that were (it takes back a skipped one when it reads the flag)."""
        ...

    @property
    def loss_scale(self) -> float | None:
        """The current dynamic loss scale under fp16; None in every other precision."""
        ...

    def save(self, directory: Path, rank: int) -> None:
        """Collective: write model, optimizer and loss-scaler state into `directory` (every rank
        calls it; which ranks write is the backend's business)."""
        ...

    def load(self, directory: Path) -> None:
        """Restore exactly what save() wrote into `directory` (after prepare)."""
        ...

    def full_state_dict(self) -> dict:
        """The whole model's state dict on CPU, weights in fp32, detached copies. Collective under
        ZeRO-3 (it gathers the shards): every rank calls it."""
        ...

    def load_full_state_dict(self, state: dict) -> None:
        """Load a state dict from full_state_dict() into the model (collective under ZeRO-3)."""
        ...

    @property
    def extra_artifacts(self) -> dict[str, object]:
        """File name -> JSON content the run saves beside its outputs (e.g. the resolved
        DeepSpeed config); empty when the backend has none."""
        ...

    @property
    def extra_tags(self) -> dict[str, str]:
        """Run tags only the backend knows, e.g. names.TAG_PRECISION_MODE (autocast | pure16 |
        fp32): how 16-bit compute was done, so unlike rows never share a report column."""
        ...
