"""One flag, `precision`, decides autocast, loss scaling, the float32 matmul mode and the dtype the
module's weights are held in.

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

from pipeline.errors import UserError
from pipeline.runtime.master_weights import MasterWeights

# The values of the run's precision_mode tag (names.TAG_PRECISION_MODE): how 16-bit compute is
# done, so rows that differ in it never share a report column unlabeled.
AUTOCAST = "autocast"
"""fp32 weights, 16-bit matmuls per op under torch.autocast (reductions, softmax, norms, losses in fp32)."""
PURE16 = "pure16"
"""The module itself in 16 bit, fp32 master weights in the optimizer (DeepSpeed's fp16 mode, and
precision=bf16-pure): norms and losses read and write 16 bit."""
FP32 = "fp32"
"""No 16-bit compute (fp32 and tf32)."""


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


BF16_PURE = "bf16-pure"
"""The precision value of bf16 compute weights: the module in bf16, fp32 masters in the optimizer."""

SERVED_AS = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "bf16": "bf16", BF16_PURE: "bf16"}
"""Every resolved precision -> the precision its model is served in (the inference bench's rows and
infer/* names): a model is served cast whole to one dtype, so bf16-pure serves as bf16 does."""
SERVING_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""A served precision -> the dtype the model's weights and activations are cast to (tf32: fp32
tensors, TF32 matmuls)."""


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    """Resolved mode: fp32 | tf32 | fp16 | bf16 | bf16-pure (never auto)."""
    device_type: str
    """cuda | cpu: the autocast and GradScaler device."""

    @property
    def compute_dtype(self) -> torch.dtype:
        return {"fp16": torch.float16, "bf16": torch.bfloat16, BF16_PURE: torch.bfloat16}.get(self.name, torch.float32)

    @property
    def arithmetic(self) -> str:
        """The matmuls' number format, the column of a peak-FLOP/s table: fp32 | tf32 | fp16 | bf16."""
        return "bf16" if self.name == BF16_PURE else self.name

    @property
    def module_dtype(self) -> torch.dtype:
        """The dtype the trained module's weights are held in (the optimizer's are fp32 always)."""
        return torch.bfloat16 if self.name == BF16_PURE else torch.float32

    def master_weights(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> MasterWeights | None:
        """Where the module holds 16-bit weights: the optimizer's parameters become fp32 copies of
        them and the module is cast (call once, before the first step); None in every other mode."""
        return MasterWeights(module, optimizer, self.module_dtype) if self.module_dtype != torch.float32 else None

    @property
    def uses_autocast(self) -> bool:
        return self.name in ("fp16", "bf16")

    @property
    def mode(self) -> str:
        """How 16-bit compute is done under this policy with the torch backend."""
        return PURE16 if self.name == BF16_PURE else AUTOCAST if self.uses_autocast else FP32

    @property
    def uses_loss_scaling(self) -> bool:
        return self.name == "fp16"  # bf16 has fp32's exponent range: nothing underflows

    def autocast(self):
        if not self.uses_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        # dynamic scaling: halve and skip on overflow, double after 2000 clean steps
        return torch.amp.GradScaler(self.device_type) if self.uses_loss_scaling else None

    def apply_matmul_mode(self) -> None:
        """fp32 is strict IEEE (TF32 off for matmul and cuDNN); tf32 allows TF32 tensor cores."""
        allow = self.name == "tf32"
        torch.set_float32_matmul_precision("high" if allow else "highest")
        torch.backends.cudnn.allow_tf32 = allow


def cuda_supports_bf16() -> bool:
    """Native bf16 only (Ampere, compute capability 8.0, and newer): torch's default also counts
    GPUs that merely emulate it (V100, T4), where bf16 runs slower than fp32."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


def resolve(requested: str, device: torch.device) -> PrecisionPolicy:
    """Turn the `precision` key into a policy for this device, refusing what it cannot run; no
    process-wide setting changes here (PrecisionPolicy.apply_matmul_mode, when a stage starts)."""
    kind = device.type
    if requested == "auto":
        if kind == "cuda":
            requested = "bf16" if cuda_supports_bf16() else "fp16"
        else:
            requested = "bf16" if cpu_supports_bf16() else "fp32"
    if requested in ("bf16", BF16_PURE):
        if kind == "cuda" and not cuda_supports_bf16():
            raise UserError(f"precision={requested}: this cuda device has no bf16 support; use fp16 or fp32")
        if kind == "cpu" and not cpu_runs_bf16():
            raise UserError(f"precision={requested}: this cpu device has no bf16 support (emulated, it would run "
                            f"slower than fp32); use fp32, or set {EMULATED_BF16_ENV}=1 to run it emulated")
    if requested == "fp16" and kind == "cpu" and not cpu_supports_fp16():
        raise UserError("precision=fp16: this CPU has no fp16 kernels (oneDNN reports none); use bf16 or fp32")
    if requested == "tf32" and kind == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
        raise UserError("precision=tf32: needs an Ampere or newer GPU; use fp32 or fp16")
    return PrecisionPolicy(requested, kind)  # a stage applies its matmul mode when it starts
