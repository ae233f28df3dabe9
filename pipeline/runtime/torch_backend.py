"""The torch backend: one process, or torchrun DDP (gloo on CPU, NCCL on GPU), with
torch.amp's GradScaler for fp16. Implements runtime.backend.Backend."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from pipeline import names
from pipeline.layout import CheckpointFiles
from pipeline.runtime.backend import StepResult
from pipeline.runtime.compiler import compile_module
from pipeline.runtime.dist import Runtime
from pipeline.runtime.precision import PrecisionPolicy


class TorchBackend:
    """One process, or torchrun DDP (gloo on CPU, NCCL on GPU)."""

    def __init__(self, rt: Runtime, policy: PrecisionPolicy, max_grad_norm: float, compile_mode: str = "off"):
        self.rt = rt
        self.policy = policy
        self.max_grad_norm = max_grad_norm
        self.compile_mode = compile_mode
        self.scaler = policy.make_scaler()

    @property
    def fused_optimizer(self) -> bool:
        return True

    def standing_bytes(self, model: torch.nn.Module) -> int:
        """DDP's gradient buckets: one more copy of the trainable parameters' gradients (torch's
        Reducer, gradient_as_bucket_view off)."""
        if self.rt.backend != "ddp":
            return 0
        return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    def describe(self) -> dict[str, object]:
        return {}

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        """Compiled in place before DDP wraps it: DDP's hooks fire on the gradients the compiled
        backward produces, and the state_dict keeps its keys."""
        if not optimizer.defaults.get("fused"):
            raise ValueError("TorchBackend needs a fused optimizer: it skips non-finite updates on the device")
        self.module = compile_module(model.to(self.rt.device), self.compile_mode)
        self.optimizer = optimizer
        if self.rt.backend == "ddp":
            ids = [self.rt.device.index] if self.rt.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.module, device_ids=ids)
        else:
            self.model = self.module
        return self.model

    def no_sync(self):
        """Skip the gradient all-reduce on accumulation micro-steps (DDP only)."""
        if isinstance(self.model, DistributedDataParallel):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self) -> StepResult:
        """No host sync: whether the update was applied stays a device tensor, read with the losses
        at the next log boundary. A non-finite gradient norm skips the update inside the fused
        AdamW kernel (its found_inf input, as GradScaler uses it), the step count included."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        if self.max_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if self.scaler:
            scale_before = self.scaler._get_scale_async().clone()
            self.scaler.step(self.optimizer)  # skips the update when grads hold inf/nan (fused: on the device)
            self.scaler.update()
            stepped = self.scaler._get_scale_async() >= scale_before  # a skip halves the scale
        else:
            stepped = torch.isfinite(grad_norm)
            self.optimizer.found_inf = (~stepped).float()
            self.optimizer.step()
            del self.optimizer.found_inf
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(stepped, grad_norm)

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler else None

    @property
    def extra_artifacts(self) -> dict[str, object]:
        return {}

    @property
    def extra_tags(self) -> dict[str, str]:
        return {names.TAG_PRECISION_MODE: self.policy.mode}

    # ------------------------------------------------------------------ state
    def save(self, directory: Path, rank: int) -> None:
        """Collective. Model and optimizer are identical on every DDP rank: rank 0 writes them."""
        if rank == 0:
            state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
            if self.scaler:
                state["scaler"] = self.scaler.state_dict()
            with open(Path(directory) / CheckpointFiles.BACKEND, "wb") as f:  # a file object keeps ENOSPC's errno
                torch.save(state, f)

    def load(self, directory: Path) -> None:
        state = torch.load(Path(directory) / CheckpointFiles.BACKEND, map_location=self.rt.device, weights_only=True)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}

    def load_full_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state)
