"""One flag, `precision`, decides autocast, loss scaling, the float32 matmul mode and the dtype the
module's weights are held in: its mode (config/precision_modes.py) declares them; a policy here is
that mode on one device type, in torch's terms (dtypes, autocast, GradScaler, matmul mode), and
resolve() refuses what the device cannot run and settles `auto`.

Master weights and optimizer state stay fp32 in every mode. Under fp16 and bf16 they are the
module's own parameters and autocast casts them per op; under bf16-pure the module holds bf16
weights and the fp32 masters live only in the optimizer (runtime/master_weights.py), so no weight
is cast per step.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from pipeline.config.precision_modes import AUTO, MODES, PrecisionMode
from pipeline.errors import UserError
from pipeline.runtime.master_weights import MasterWeights

EMULATED_BF16_ENV = "PIPELINE_EMULATED_BF16"
"""Set to 1 to run bf16 and bf16-pure on a CPU without native bf16 kernels (AVX2 only), emulated:
numerically the same format, slower than fp32. The test suite sets it, so every bf16 path runs on
every CPU; a user may set it to try a bf16 job on such a machine."""


def cpu_supports_bf16() -> bool:
    """Native bf16 kernels (AVX512-BF16 or AMX): where bf16 is worth choosing for speed."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def emulated_bf16_allowed() -> bool:
    return os.environ.get(EMULATED_BF16_ENV, "") not in ("", "0")


def cpu_runs_bf16() -> bool:
    """bf16 on this CPU: native, or emulated where EMULATED_BF16_ENV allows it."""
    return cpu_supports_bf16() or emulated_bf16_allowed()


def cpu_supports_fp16() -> bool:
    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def cuda_supports_bf16() -> bool:
    """Native bf16 only (Ampere, compute capability 8.0, and newer): torch's default also counts
    GPUs that merely emulate it (V100, T4), where bf16 runs slower than fp32."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    """Resolved mode: a name in precision_modes.MODES (never auto)."""
    device_type: str
    """cuda | cpu: the autocast and GradScaler device."""

    @property
    def spec(self) -> PrecisionMode:
        return MODES[self.name]

    @property
    def compute_dtype(self) -> torch.dtype:
        return getattr(torch, self.spec.compute)

    @property
    def arithmetic(self) -> str:
        """The matmuls' number format, the column of a peak-FLOP/s table: fp32 | tf32 | fp16 | bf16."""
        return self.spec.arithmetic

    @property
    def module_dtype(self) -> torch.dtype:
        """The dtype the trained module's weights are held in (the optimizer's are fp32 always)."""
        return getattr(torch, self.spec.weights)

    def master_weights(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> MasterWeights | None:
        """Where the module holds 16-bit weights: the optimizer's parameters become fp32 copies of
        them and the module is cast (call once, before the first step); None in every other mode."""
        return MasterWeights(module, optimizer, self.module_dtype) if self.module_dtype != torch.float32 else None

    @property
    def uses_autocast(self) -> bool:
        return self.spec.autocast

    @property
    def mode(self) -> str:
        """How 16-bit compute is done under this policy with the torch backend."""
        return self.spec.precision_mode

    @property
    def uses_loss_scaling(self) -> bool:
        return self.spec.loss_scaling

    def autocast(self):
        if not self.uses_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        # dynamic scaling: halve and skip on overflow, double after 2000 clean steps
        return torch.amp.GradScaler(self.device_type) if self.uses_loss_scaling else None

    def apply_matmul_mode(self) -> None:
        """Strict IEEE fp32 (TF32 off for matmul and cuDNN) unless the mode allows TF32 tensor cores."""
        allow = self.spec.tf32
        torch.set_float32_matmul_precision("high" if allow else "highest")
        torch.backends.cudnn.allow_tf32 = allow


DEVICE_CHECKS = {  # number format -> device type -> (whether the device runs it, why not)
    "bf16": {"cuda": (lambda device: cuda_supports_bf16(), "this cuda device has no bf16 support; use fp16 or fp32"),
             "cpu": (lambda device: cpu_runs_bf16(), "this cpu device has no bf16 support (emulated, it would run "
                     f"slower than fp32); use fp32, or set {EMULATED_BF16_ENV}=1 to run it emulated")},
    "fp16": {"cpu": (lambda device: cpu_supports_fp16(),
                     "this CPU has no fp16 kernels (oneDNN reports none); use bf16 or fp32")},
    "tf32": {"cuda": (lambda device: torch.cuda.get_device_capability(device)[0] >= 8,
                      "needs an Ampere or newer GPU; use fp32 or fp16")},
}
"""What a device needs for a mode's number format (PrecisionMode.arithmetic); a format or device
type not listed needs nothing."""

AUTO_PICKS = {  # device type -> (whether it holds, the mode auto picks, why), the first that holds
    "cuda": ((lambda: cuda_supports_bf16(), "bf16", "this {device} runs bf16"), (None, "fp16", "this GPU has no bf16")),
    "cpu": ((lambda: cpu_supports_bf16(), "bf16", "this {device} runs bf16"),
            (None, "fp32", "this CPU has no bf16 kernels")),
}
"""precision=auto: bf16 where it is native (picked for speed, so never emulated), else fp16 on a GPU
and fp32 on a CPU; a device type not listed picks as a CPU does."""


def refusal(mode: PrecisionMode, device: torch.device) -> str:
    """Why `device` cannot run the mode's number format; "" where it can."""
    check = DEVICE_CHECKS.get(mode.arithmetic, {}).get(device.type)
    return "" if check is None or check[0](device) else check[1]


def how_resolved(requested: str, resolved: str, device_type: str) -> str:
    """"as set", or what auto found on this device type ("auto: this GPU has no bf16")."""
    if requested != AUTO:
        return "as set"
    picks = AUTO_PICKS.get(device_type, AUTO_PICKS["cpu"])
    why = next((why.format(device=device_type) for _, name, why in picks if name == resolved), device_type)
    return f"auto: {why}"


def _auto_pick(device_type: str) -> str:
    return next(name for holds, name, _ in AUTO_PICKS.get(device_type, AUTO_PICKS["cpu"]) if holds is None or holds())


def resolve(requested: str, device: torch.device) -> PrecisionPolicy:
    """Turn the `precision` key into a policy for this device, refusing what it cannot run; no
    process-wide setting changes here (PrecisionPolicy.apply_matmul_mode, when a stage starts)."""
    name = _auto_pick(device.type) if requested == AUTO else requested
    why = refusal(MODES[name], device)
    if why:
        raise UserError(f"precision={name}: {why}")
    return PrecisionPolicy(name, device.type)  # a stage applies its matmul mode when it starts
