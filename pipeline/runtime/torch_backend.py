"""The torch backend: one process, or torchrun DDP (gloo on CPU, NCCL on GPU), with
torch.amp's GradScaler for fp16 and, under precision=bf16-pure, the module in bf16 with fp32
master weights inside the optimizer (runtime/master_weights.py). Implements runtime.backend.Backend."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from pipeline import names
from pipeline.compat import ddp_without_forward_buffer_sync
from pipeline.config.schema import TrainConfig
from pipeline.layout import CheckpointFiles
from pipeline.runtime.backend import StepResult
from pipeline.runtime.compiler import OFF, CompilePolicy
from pipeline.runtime.precision import PrecisionPolicy
from pipeline.runtime.world import Runtime


class TorchBackend:
    """One process, or torchrun DDP (gloo on CPU, NCCL on GPU)."""

    def __init__(self, rt: Runtime, policy: PrecisionPolicy, max_grad_norm: float, compile: CompilePolicy = OFF):
        self.rt = rt
        self.policy = policy
        self.max_grad_norm = max_grad_norm
        self.compile = compile
        self.scaler = policy.make_scaler()
        self.masters = None
        """The optimizer's fp32 copies of a bf16 module's weights (bf16-pure); None otherwise."""

    @property
    def fused_optimizer(self) -> bool:
        return True

    @property
    def shards_parameters(self) -> bool:
        return False  # every rank holds the whole model

    def standing_bytes(self, model: torch.nn.Module) -> int:
        """DDP's gradient buckets: one more copy of the trainable parameters' gradients (torch's
        Reducer, gradient_as_bucket_view off)."""
        if self.rt.backend != "ddp":
            return 0
        return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)

    def describe(self) -> dict[str, object]:
        return self.compile.describe()

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: TrainConfig | None = None
                ) -> torch.nn.Module:
        """Compiled in place before DDP wraps it: DDP's hooks fire on the gradients the compiled
        backward produces, and the state_dict keeps its keys. The batch split (`train`) is the
        loop's to take: nothing here reads it."""
        if not optimizer.defaults.get("fused"):
            raise ValueError("TorchBackend needs a fused optimizer: it skips non-finite updates on the device")
        model.to(self.rt.device)
        self.masters = self.policy.master_weights(model, optimizer)  # before compiling: graphs see bf16 weights
        self.module = self.compile.compile(model)
        self.optimizer = optimizer
        if self.rt.backend == "ddp":
            if self.masters is not None:
                self.masters.broadcast_from(0)  # as DDP broadcasts rank 0's module below
            ids = [self.rt.device.index] if self.rt.device.type == "cuda" else None
            # no buffer broadcast before every forward: the models' buffers are constants (compat.py says
            # how each torch version spells it)
            self.model = ddp_without_forward_buffer_sync(self.module, ids)
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
        AdamW kernel (its found_inf input, as GradScaler uses it), the step count included.

        Clipping costs one read of the gradients (their norm) and no pass of its own: the fused
        kernel divides each gradient by its `grad_scale` input as it reads it (torch/optim/adam.py,
        _fused_adam; the attribute contract GradScaler.step documents), so the clip divisor goes
        there, multiplied by GradScaler's scale under fp16 (GradScaler.step multiplies a
        grad_scale already set on the optimizer by its own)."""
        if self.masters is not None:
            self.masters.grads_to_master()
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)  # of the scaled gradients under fp16
        if self.scaler:
            grad_norm = grad_norm / self.scaler._get_scale_async()  # the true norm: clip and log that
        if self.max_grad_norm > 0:
            self.optimizer.grad_scale = clip_divisor(grad_norm, self.max_grad_norm)
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
            if self.max_grad_norm > 0:
                del self.optimizer.grad_scale
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not None:
            self.masters.copy_down()  # a skipped step copies the unchanged masters: the same weights
            self.module.zero_grad(set_to_none=True)
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
        if rank == 0:  # the weights in fp32 in every mode (bf16-pure: the masters), so any mode resumes exactly
            state = {"model": self.full_state_dict(), "optimizer": self.optimizer.state_dict()}
            if self.scaler:
                state["scaler"] = self.scaler.state_dict()
            with open(Path(directory) / CheckpointFiles.BACKEND, "wb") as f:  # a file object keeps ENOSPC's errno
                torch.save(state, f)

    def load(self, directory: Path) -> None:
        state = torch.load(Path(directory) / CheckpointFiles.BACKEND, map_location=self.rt.device, weights_only=True)
        self.load_full_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def full_state_dict(self) -> dict:
        state = self.masters.state_dict(self.module) if self.masters is not None else self.module.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def load_full_state_dict(self, state: dict) -> None:
        if self.masters is not None:
            self.masters.load_state_dict(self.module, state)
        else:
            self.module.load_state_dict(state)


def clip_divisor(grad_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What to divide the gradients by to clip their norm to max_norm: 1 / the coefficient
    torch.nn.utils.clip_grad_norm_ multiplies them by (max_norm / (norm + 1e-6), at most 1)."""
    return torch.clamp((grad_norm + 1e-6) / max_norm, min=1.0)
